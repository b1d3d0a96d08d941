"""`windtunnel reproduce --scale tiny` end to end: runs, analyses, and a report that lists
every figure and every claim; then resumption and bad requests."""

from __future__ import annotations

import ast
import html
import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from matplotlib import image

import windtunnel.report.build as report_build
import windtunnel.report.folder as report_folder
from windtunnel.cli import main
from windtunnel.report.build import FIGURE_PLAN, figure_section_title
from windtunnel.report.claims import CLAIMS, evaluate_claims
from windtunnel.report.folder import load_results
from windtunnel.run_layout import INIT_DIR
from windtunnel.figures import SAVE_DPI
from windtunnel.reproduce import plan_analyses, plan_runs
from windtunnel.run_config import load_run_config
from windtunnel.studies import GROUPS, PRESET_NAMES, SCALES, configs_folder

from test_results_paths import machine_paths_under

#: A finished tiny reproduction to copy instead of running one: `make mutate` builds it once
#: with the unmutated code, so that each mutant's report tests take seconds, not minutes.
PREBUILT = os.environ.get("WINDTUNNEL_TINY_REPRODUCTION")
pytestmark = [] if PREBUILT else [pytest.mark.slow]


class _Page(HTMLParser):
    """Headings, images and table rows of the report, read by the standard library's parser."""

    def __init__(self) -> None:
        super().__init__()
        self.headings: list[str] = []
        self.images: list[str] = []
        self.rows: list[list[str]] = []
        self.captions: list[str] = []
        self._in: str | None = None
        self._cell = ""

    def handle_starttag(self, tag, attrs):
        if tag in ("h2", "h3", "td", "th", "figcaption"):
            self._in, self._cell = tag, ""
        if tag == "tr":
            self.rows.append([])
        if tag == "img":
            self.images.append(dict(attrs)["src"])

    def handle_endtag(self, tag):
        if tag == self._in:
            if tag in ("h2", "h3"):
                self.headings.append(self._cell.strip())
            elif tag in ("td", "th"):
                self.rows[-1].append(self._cell.strip())
            else:
                self.captions.append(" ".join(self._cell.split()))
            self._in = None

    def handle_data(self, data):
        if self._in:
            self._cell += data


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("repro") / "tiny"
    if PREBUILT:
        shutil.copytree(PREBUILT, out)
    else:
        assert main(["reproduce", "--scale", "tiny", "--out", str(out)]) == 0
    return out


def test_every_run_and_analysis_group_is_there(tiny):
    for job in plan_runs(SCALES["tiny"], tiny):
        assert (job.run_dir / "resume.safetensors").is_file(), job.name
    # The tiny scale leaves out the floored transformers; their MLP twin is trained.
    trained = {job.name.rsplit("_seed", 1)[0] for job in plan_runs(SCALES["tiny"], tiny)}
    assert trained == set(PRESET_NAMES) - {"hmm_transformer_floor", "hmm_late_attention_off_floor"}
    for group in ("bijection_transformer", "bijection", "bijection_with_replacement", "hmm_transformer", "hmm", "hmm_floor"):
        assert list((tiny / "analysis" / group).glob("*.json")), group
        assert list((tiny / INIT_DIR / group).glob("*.json")), group
    # A comparison group with one model trained gets its per-position analysis instead of Table 1.
    assert [p.stem for p in (tiny / "analysis" / "hmm_floor").glob("*.json")] == ["length_generalization"]
    floored = json.loads((tiny / "analysis" / "hmm_floor" / "length_generalization.json").read_text())
    assert floored["model"] == "mlp" and floored["tunnel"]["floor"] == 0.05 and floored["tunnel"]["grid"] == 0.01
    # Training histories are not analyzed at initialization.
    assert not (tiny / INIT_DIR / "bijection_transformer" / "training_dynamics.json").exists()
    assert json.loads((tiny / "reproduce.json").read_text())["stage"] == "done"


def test_random_init_passes_no_claim(tiny):
    """The same analyses of every run's initial weights: each claim fails there, or cannot be
    evaluated (the training history of the dissociation claim) — never holds."""
    verdicts = {v.claim.key: v for v in evaluate_claims(load_results(tiny, INIT_DIR))}
    assert {key for key, v in verdicts.items() if v.holds is None} == {"dissociation"}
    assert not [key for key, v in verdicts.items() if v.holds], {k: v.ours for k, v in verdicts.items() if v.holds}
    assert json.loads((tiny / "reproduce.json").read_text())["stage"] == "done"


def test_report_lists_every_figure_and_claim(tiny):
    page = _Page()
    page.feed((tiny / "report" / "index.html").read_text())
    for title, paper_figure, _, _ in FIGURE_PLAN:  # every figure of the paper, the seeds overlay included (2 bijection seeds)
        assert figure_section_title(title, paper_figure) in page.headings, title
    expected_figures = sum(
        (tiny / "analysis" / group / f"{name}.png").is_file() for _, _, _, figures in FIGURE_PLAN for group, name, _ in figures
    )
    assert expected_figures >= 20 and len(page.images) == expected_figures
    assert all(src.startswith("data:image/png;base64,") for src in page.images)
    named = [row for row in page.rows if row and row[0] in {c.claim for c in CLAIMS}]
    claim_rows, number_rows = named[:len(CLAIMS)], named[len(CLAIMS):]  # the claim table, then the numbers behind it
    assert [row[0] for row in claim_rows] == [row[0] for row in number_rows] == [c.claim for c in CLAIMS]
    # Every claim was measured (its analysis ran); at tiny scale many do not hold, which is fine.
    # A verdict over several seeds also says how each seed fares alone ("no; 0 of 2 seeds hold").
    verdict_cell = re.compile(r"^(yes|no)(; \d+ of 2 seeds holds?)?$")
    assert all(verdict_cell.match(row[1]) for row in claim_rows), [row for row in claim_rows if not verdict_cell.match(row[1])]
    assert any(";" in row[1] for row in claim_rows)  # the tiny scale trains 2 bijection seeds: their rows are split out
    verdict_header, numbers_header = [row for row in page.rows if row and row[0] == "claim"]
    assert verdict_header == ["claim", "holds?", "criterion", "paper passes?", "random init holds? (must be no)"]
    assert numbers_header[2] == "ours (tiny scale)"
    paper = {c.claim: c.paper_holds() for c in CLAIMS}
    assert all(row[3] == {True: "yes", False: "no", None: "n/a"}[paper[row[0]]] for row in claim_rows)
    assert all(row[2] == next(c.criterion for c in CLAIMS if c.claim == row[0]) for row in claim_rows)
    assert all(len(row) == len(numbers_header) for row in number_rows)
    # One figure numbering: the page's own; the paper's figure is named in the section title.
    assert page.captions and all(re.match(r"Figure \d+\. [A-Z]", c) and "Fig " not in c.split(".")[1] for c in page.captions)
    # What a tiny-scale verdict means, said above the claim table (a callout; a quote in Markdown).
    text = (tiny / "report" / "index.html").read_text()
    assert text.index('<p class="note">Tiny scale is a smoke test') < text.index('id="table-1"')
    markdown = (tiny / "report" / "report.md").read_text()
    assert "\n> Tiny scale is a smoke test" in markdown
    unescaped = markdown.replace("\\", "")  # the Markdown escapes punctuation with backslashes
    assert all(claim.claim in unescaped for claim in CLAIMS)
    assert "figure missing" not in markdown


def test_the_manifest_lists_the_scale_and_every_run(tiny):
    """reproduce.json holds what the report needs besides the runs' and analyses' own files."""
    manifest = json.loads((tiny / "reproduce.json").read_text())
    scale = SCALES["tiny"]
    assert set(manifest) == {"scale", "stage", "wall_s", "command", "hardware", "cuts", "runs", "study", "planned", "meaning"}
    assert manifest["study"] == "claims"
    assert manifest["planned"] == [run["name"] for run in manifest["runs"]]  # every planned run is there
    assert (manifest["scale"], manifest["stage"], manifest["hardware"]) == ("tiny", "done", scale.hardware)
    assert manifest["cuts"] == list(scale.cuts) and manifest["wall_s"] > 0
    out = manifest["command"].partition(" --out ")[2]
    assert manifest["command"] == f"windtunnel reproduce --scale tiny --out {out}"
    # relative to the folder it ran in, else the folder's name: never a path of the machine
    assert not Path(out).is_absolute() and Path(out).name == Path(PREBUILT or tiny).name
    jobs = plan_runs(scale, tiny)
    assert [run["name"] for run in manifest["runs"]] == [job.name for job in jobs]  # plan order: the runs table's
    for run, job in zip(manifest["runs"], jobs):
        assert run["run_dir"] == f"runs/{job.name}" and tiny / run["run_dir"] == job.run_dir
        assert run["name"] == f"{run['preset']}_seed{run['seed']}" and run["seed"] == job.resolved().train.seed


def test_nothing_the_reproduction_writes_holds_a_path_of_this_machine(tiny):
    """Its --out is an absolute temporary folder: the manifest, the runs' files and logs, the
    analyses and the report name what they need relative to it, or by name."""
    assert machine_paths_under(tiny) == []
    for result in (tiny / "analysis").glob("*/*.json"):  # each run as the manifest names it
        run_dirs = json.loads(result.read_text())["run_dirs"]
        assert run_dirs and all(d == f"runs/{Path(d).name}" for d in run_dirs), result


def test_the_report_rebuilt_from_the_saved_folder_alone_is_the_same(tiny, tmp_path, capsys):
    """`windtunnel report` on a copy of the folder without any weights or the report, in a call
    that is given the path alone, writes the report reproduce wrote (its writing time aside)."""
    copy = tmp_path / "copy"
    shutil.copytree(tiny, copy, ignore=shutil.ignore_patterns("*.safetensors", "report", ".lock"))
    assert main(["report", str(copy)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == {"report": str(copy / "report" / "index.html"), "markdown": str(copy / "report" / "report.md")}
    written = {  # the one line that says when the report was written
        "report.md": re.compile(r"^- \*\*written:\*\* .*$", re.M),
        "index.html": re.compile(r"<dt>written</dt><dd>[^<]*</dd>"),
    }
    for name, pattern in written.items():
        original, rebuilt = (tiny / "report" / name).read_text(), (copy / "report" / name).read_text()
        assert len(pattern.findall(original)) == 1 == len(pattern.findall(rebuilt)), name
        assert pattern.sub("", rebuilt) == pattern.sub("", original), name
    unescaped = original.replace("\\", "")  # the Markdown escapes punctuation with backslashes
    assert "hmm_mlp_seed0" in unescaped and "A smoke test of the pipeline" in unescaped


@pytest.mark.parametrize(("file", "damage", "fragment"), [
    ("metrics.jsonl", lambda text: text.replace("\n", "\ngarbage\n", 1), "line 2 is not a metrics record"),
    ("provenance.json", lambda text: "{", "provenance.json' is damaged"),
    ("config.json", lambda text: text[:20], "config.json' is damaged"),
])
def test_a_damaged_run_file_stops_the_report_before_it_reads_anything(tiny, tmp_path, capsys, file, damage, fragment):
    copy = tmp_path / "copy"
    shutil.copytree(tiny, copy, ignore=shutil.ignore_patterns("*.safetensors", ".lock"))
    run = sorted((copy / "runs").glob("*_seed0"))[0]
    (run / file).write_text(damage((run / file).read_text()))
    before = {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()}
    assert main(["report", str(copy)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and str(run) in lines[0], lines
    assert {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()} == before


def test_the_report_imports_nothing_of_the_reproduction():
    """Every import of report/build.py and report/folder.py (functions and type-checking blocks
    included) is of the report, the history, a run's provenance, the check of a run's files, the
    result types, the run layout's file names or the standard library: never the plan it reports on."""

    def ours(module) -> set[str]:
        tree = ast.parse(Path(module.__file__).read_text())
        names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        names |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
        return {name for name in names if name.startswith("windtunnel")}

    assert ours(report_build) == {"windtunnel.history", "windtunnel.provenance", "windtunnel.report.claim_types", "windtunnel.report.claims",
                                  "windtunnel.report.folder", "windtunnel.report.html", "windtunnel.report.model_selection", "windtunnel.report.phases", "windtunnel.report.primitives",
                                  "windtunnel.results", "windtunnel.results.generalization", "windtunnel.run_files", "windtunnel.run_layout"}
    assert ours(report_folder) == {"windtunnel.results", "windtunnel.run_layout"}  # the result types and the file names (leaves)


CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]

#: Run in the page by the browser: where each table ends, against the window and its scrolling
#: wrapper, and where each of its column headings ends. Written into the page as JSON.
LAYOUT_PROBE = """<script>
const tables = [...document.querySelectorAll('table')].map(t => ({
  id: t.id, right: t.getBoundingClientRect().right,
  wrapper_scroll: t.parentElement.scrollWidth, wrapper_width: t.parentElement.clientWidth,
  headings: [...t.querySelectorAll('thead th')].map(h => [h.textContent, h.getBoundingClientRect().right])}));
const out = document.createElement('pre'); out.id = 'layout-probe';
out.textContent = JSON.stringify({window: window.innerWidth, page: document.documentElement.scrollWidth, tables});
document.body.appendChild(out);
</script>"""


def _browser() -> str:
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        pytest.skip("no Chromium on PATH (apt-get install chromium; .ci/run installs it); browser check not run")
    return browser


def _layout(page: Path, width: int, tmp_path: Path, extra_css: str = "") -> dict:
    """The report's layout as Chromium lays it out in a window ``width`` pixels wide. The page
    forbids scripts (its Content-Security-Policy): the probe runs in a copy without that line."""
    text = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>\n', "", page.read_text())
    assert "Content-Security-Policy" not in text
    probed = tmp_path / f"probed_{width}.html"
    probed.write_text(text.replace("</body>", f"<style>{extra_css}</style>{LAYOUT_PROBE}</body>"))
    command = [_browser(), *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", f"--window-size={width},1000",
               "--dump-dom", probed.resolve().as_uri()]
    result = subprocess.run(command, check=False, capture_output=True, text=True, timeout=60)
    found = re.search(r'<pre id="layout-probe">(.*?)</pre>', result.stdout, re.S)
    assert result.returncode == 0 and found, result.stderr[-2000:]
    return json.loads(html.unescape(found[1]))


def _overflows(layout: dict) -> list[str]:
    """What sticks out of a window: the page, a table past its wrapper, a claim-table heading
    whose column ends off-screen (1 pixel of rounding allowed)."""
    width = layout["window"]
    problems = [f"page {layout['page']} px wide in a {width} px window"] if layout["page"] > width else []
    for table in layout["tables"]:
        if table["wrapper_scroll"] > table["wrapper_width"] or table["right"] > width + 1:
            problems.append(f"{table['id']} ends at {table['right']:.0f} px (scrolls {table['wrapper_scroll']} in {table['wrapper_width']})")
        problems += [f"{table['id']} column {name!r} ends at {right:.0f} px" for name, right in table["headings"] if right > width + 1]
    return problems


@pytest.mark.parametrize("width", [1280, 1920])
def test_the_report_fits_a_browser_window_and_shows_its_verdicts(tiny, tmp_path, width):
    """Headless Chromium at 1,280 and 1,920 pixels: no table is wider than the page, the claim
    table's verdict and criterion columns are on screen, and its verdict cells are shaded green
    (holds) and red (does not). The same probe reports the overflow of a page whose cells may
    not wrap: the check can fail."""
    page = tiny / "report" / "index.html"
    layout = _layout(page, width, tmp_path)
    assert layout["window"] == width
    assert _overflows(layout) == []
    claims = next(t for t in layout["tables"] if t["headings"][:2] == [["claim", t["headings"][0][1]], ["holds?", t["headings"][1][1]]])
    assert {"holds?", "criterion"} <= {name for name, _ in claims["headings"]}
    unwrapped = _overflows(_layout(page, width, tmp_path, extra_css="td, th { white-space: nowrap; }"))
    assert any("table-1" in problem for problem in unwrapped), unwrapped

    shot = tmp_path / "report.png"
    command = [_browser(), *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", f"--window-size={width},2400",
               f"--screenshot={shot}", page.resolve().as_uri()]
    result = subprocess.run(command, check=False, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and shot.is_file(), result.stderr[-2000:]
    pixels = np.round(image.imread(shot)[..., :3] * 255).astype(int)  # [H, W, 3], decoded by matplotlib
    assert pixels.shape == (2400, width, 3) and pixels.std() > 20
    for css_color in ((0xDA, 0xFB, 0xE1), (0xFF, 0xEB, 0xE9)):  # td.yes and td.no backgrounds (report/html.py)
        assert (np.abs(pixels - css_color).sum(-1) == 0).sum() > 1000, css_color


def _headings(fig) -> list:
    """The texts of a figure a reader must see whole: titles, axis labels, offset labels,
    legend entries, colour-bar labels (tick labels excluded: matplotlib keeps hidden ones)."""
    import matplotlib.text

    ticks = {id(label) for ax in fig.axes for axis in (ax.xaxis, ax.yaxis)
             for tick in axis.get_major_ticks() + axis.get_minor_ticks() for label in (tick.label1, tick.label2)}
    return [t for t in fig.findobj(matplotlib.text.Text)
            if id(t) not in ticks and t.get_visible() and t.get_text().strip() and t.figure is not None]


def _figure_problems(fig, png: Path) -> list[str]:
    """Headings cut off by the saved PNG's edges (its size read from the file's header), and
    titles or offset labels drawn on top of each other."""
    import itertools
    import struct

    width, height = struct.unpack(">II", png.read_bytes()[16:24])
    fig.set_dpi(SAVE_DPI)  # laid out again as savefig drew it: extents in the PNG's pixels
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    texts = _headings(fig)
    boxes = [t.get_window_extent(renderer) for t in texts]
    spread_x = max(b.x1 for b in boxes) - min(b.x0 for b in boxes) if boxes else 0
    spread_y = max(b.y1 for b in boxes) - min(b.y0 for b in boxes) if boxes else 0
    problems = [f"headings span {spread_x:.0f} x {spread_y:.0f} px in a {width} x {height} px PNG"
                ] if spread_x > width + 2 or spread_y > height + 2 else []
    tops = [(t, b) for t, b in zip(texts, boxes) if t in {ax.title for ax in fig.axes} | {fig._suptitle}
            or t in {axis.offsetText for ax in fig.axes for axis in (ax.xaxis, ax.yaxis)}]
    problems += [f"{a.get_text()[:40]!r} overlaps {b.get_text()[:40]!r}"
                 for (a, box_a), (b, box_b) in itertools.combinations(tops, 2) if box_a.overlaps(box_b)]
    return problems


def test_every_figure_shows_its_titles_whole(tiny, tmp_path, monkeypatch):
    """Each figure of the tiny reproduction, trained and at initialization, drawn again from its
    saved analysis: no title, label or offset label cut off by the PNG's edges or drawn over
    another. The check finds a clipped title and a colour bar's offset over a title."""
    import matplotlib.figure
    import matplotlib.pyplot as plt

    from windtunnel.figures import FIGURES, SAVE_DPI as saved_dpi

    assert saved_dpi == SAVE_DPI
    problems: dict[str, list[str]] = {}
    savefig = matplotlib.figure.Figure.savefig

    def checked(fig, target, **options):
        savefig(fig, target, **options)
        if hasattr(target, "getvalue"):  # drawn in memory before the atomic write: check those bytes
            (tmp_path / "drawn.png").write_bytes(target.getvalue())
            target = tmp_path / "drawn.png"
        problems[current] = _figure_problems(fig, Path(target))

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", checked)
    drawn = 0
    for result in sorted([*tiny.glob("analysis/*/*.json"), *tiny.glob(f"{INIT_DIR}/*/*.json")]):
        if result.stem in FIGURES:
            current = f"{result.parent.parent.name}/{result.parent.name}/{result.stem}"
            FIGURES[result.stem](json.loads(result.read_text()), tmp_path / "figure.png")
            drawn += 1
    assert drawn >= 40 and len(problems) == drawn
    assert {name: found for name, found in problems.items() if found} == {}

    monkeypatch.undo()
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.set_title("a title far wider than its two-inch figure, saved without cropping")
    bar = fig.colorbar(ax.imshow([[1.0, 1.00001]]), ax=ax)
    bar.ax.yaxis.get_offset_text().set_position((0.5, 1.0))  # offset label raised into the title
    fig.savefig(tmp_path / "bad.png", dpi=SAVE_DPI)
    found = _figure_problems(fig, tmp_path / "bad.png")
    plt.close(fig)
    assert any("headings span" in p for p in found), found


@pytest.mark.slow  # rebuilds the whole tiny report (20 s): out of make mutate's selection, whose report tests read it faster
def test_resume_reuses_everything_and_a_plain_rerun_is_refused(tiny, capsys):
    before = {p: p.stat().st_mtime_ns for p in (tiny / "analysis").glob("*/*.json")}
    assert main(["reproduce", "--scale", "tiny", "--out", str(tiny), "--resume"]) == 0
    assert f"all {len(plan_runs(SCALES['tiny'], tiny))} runs already done" in capsys.readouterr().err
    assert {p: p.stat().st_mtime_ns for p in (tiny / "analysis").glob("*/*.json")} == before
    assert main(["reproduce", "--scale", "tiny", "--out", str(tiny)]) == 2
    assert "continue that reproduction with --resume" in capsys.readouterr().err
    assert main(["reproduce", "--scale", "cpu", "--out", str(tiny), "--resume"]) == 2
    assert "holds a reproduction at --scale tiny" in capsys.readouterr().err


def test_unknown_scale_is_refused(tmp_path, capsys):
    assert main(["reproduce", "--scale", "huge", "--out", str(tmp_path / "x")]) == 2
    assert "unknown --scale 'huge'; choose from: tiny, cpu, paper" in capsys.readouterr().err


@pytest.mark.parametrize("scale", ["cpu", "paper"])
def test_cpu_and_paper_plans_resolve(scale, tmp_path):
    jobs = plan_runs(SCALES[scale], tmp_path)
    configs = {job.name: job.resolved() for job in jobs}  # every preset + override is valid
    seeds = {name: config.train.seed for name, config in configs.items()}
    assert seeds["bijection_transformer_seed2"] == 2
    hmm_seeds = {name for name in configs if name.startswith("hmm_transformer_seed")}
    assert hmm_seeds == {f"hmm_transformer_seed{s}" for s in range(5 if scale == "paper" else 3)}  # claims take their median
    if scale == "paper":
        assert all(config.train.steps >= 100_000 for config in configs.values())
    # The CPU scale cuts the floored transformer, so its group is not planned.
    planned = {group.name for group, _ in plan_analyses(jobs)}
    cut = {"hmm_transformer_floor"} if scale == "cpu" else set()
    assert planned == {group.name for group in GROUPS} - cut
    # The authors' task variants: twins of the presets, on their sampling.
    twin = configs["hmm_mlp_floor_seed0"].tunnel
    assert (twin.floor, twin.grid) == (0.05, 0.01)
    assert configs["bijection_replacement_mlp_seed0"].tunnel.with_replacement
    assert configs["bijection_replacement_mlp_seed0"].tunnel.L == 19
    # The twin trains on the same stream as the with-replacement transformer preset (docs/protocol.md §5).
    transformer_preset = load_run_config(configs_folder(SCALES[scale]) / "bijection_replacement_transformer.toml")
    assert configs["bijection_replacement_mlp_seed0"].train.curriculum == transformer_preset.train.curriculum
    assert configs["bijection_replacement_mlp_seed0"].tunnel == transformer_preset.tunnel
    floored = {name for name in configs if name.endswith("floor_seed0")}
    assert floored == ({"hmm_mlp_floor_seed0"} if scale == "cpu" else
                       {"hmm_transformer_floor_seed0", "hmm_mlp_floor_seed0", "hmm_late_attention_off_floor_seed0"})


def test_a_scale_with_a_warmup_states_each_runs_measured_time_before_training(tmp_path, monkeypatch):
    """Issue 15: `--scale paper` projects each run's time from steps timed on the device it
    found, before anything trains (here the tiny scale given the paper's warm-up, and the
    training stage stopped where it would start); the projection is the steps over the
    measured rate, and the runs are packed by it."""
    import dataclasses

    import windtunnel.reproduce as reproduce_module
    from windtunnel.jobs import LocalEngine

    assert SCALES["paper"].warmup_steps >= 3
    monkeypatch.setitem(SCALES, "tiny", dataclasses.replace(SCALES["tiny"], warmup_steps=4))
    planned = {}

    class Stop(Exception):
        pass

    def stop_before_training(self, jobs, **kwargs):
        planned.update({job.name: job for job in jobs})
        raise Stop

    monkeypatch.setattr(LocalEngine, "run_jobs", stop_before_training)
    lines: list[str] = []
    with pytest.raises(Stop):
        reproduce_module.reproduce("tiny", tmp_path / "out", report=lines.append)
    measured = [line for line in lines if line.startswith("[reproduce] measured ")]
    presets = {job.preset for job in planned.values()}
    assert {line.split()[2].rstrip(":") for line in measured} == presets  # one warm-up per preset, seeds share it
    assert lines.index(measured[-1]) < next(i for i, line in enumerate(lines) if "stage 1/3" in line)
    for line in measured:
        preset, rate = line.split()[2].rstrip(":"), float(line.split()[3])
        job = next(job for job in planned.values() if job.preset == preset)
        # The line prints the rate to 2 decimals (at least 1 step/s here): within 1% of the projection.
        assert rate > 0 and job.expected_s == pytest.approx(job.resolved().train.steps / rate, rel=0.01)
        assert "steps/s on cpu" in line and f"for its {job.resolved().train.steps:,} steps" in line
    expected = [job.expected_s for job in planned.values()]
    assert expected == sorted(expected, reverse=True)  # longest first, by the measurement
    assert not list((tmp_path / "out" / "runs").glob("*/metrics.jsonl"))  # the warm-ups wrote nothing there


def test_a_results_folder_keeps_no_weights_and_renders_the_reports_tables(tiny, tmp_path):
    """`tools/results_pages.py save`: the weight-free copy of a reproduction, from which the
    results page renders the same claim table as the report the reproduction wrote."""
    from windtunnel.report.results_page import results_page, save_results

    written = save_results(tiny, tmp_path / "results", "two cores, nothing else running")
    assert all(path.is_file() for path in written) and not (tmp_path / "results.partial").exists()
    assert not [p for p in (tmp_path / "results").rglob("*") if p.suffix in {".safetensors", ".png", ".pt"}]
    weights = sum(p.stat().st_size for p in tiny.rglob("*.safetensors"))
    kept = sum(p.stat().st_size for p in (tmp_path / "results").rglob("*") if p.is_file())
    assert weights > 0 and kept < sum(p.stat().st_size for p in tiny.rglob("*") if p.is_file()) - weights
    page = results_page(tmp_path / "results", "Results")
    report = (tiny / "report" / "report.md").read_text()

    def claim_table(markdown: str) -> str:
        return markdown.split("| claim | holds? |")[1].split("\n\n")[0]

    assert claim_table(page) == claim_table(report)
    assert "- **how:** two cores, nothing else running\n" in page and "figures/" not in page


def test_a_group_of_history_analyses_alone_is_not_analyzed_at_initialization(tmp_path, monkeypatch):
    """The initial weights have no history: a group that asks only for history analyses (the
    phases study's) gets none at initialization, rather than every analysis (``only=()`` means all)."""
    import windtunnel.analysis as analysis_package
    import windtunnel.analysis.runner as runner
    from windtunnel.reproduce import _analyze, _Folder
    from windtunnel.studies import STUDIES, AnalysisGroup

    calls: list[tuple[str, tuple[str, ...]]] = []
    monkeypatch.setattr(analysis_package, "load_runs", lambda dirs, step=None: [])
    monkeypatch.setattr(runner, "analyze_runs", lambda runs, folder, only=(), **_: calls.append((folder.parent.name, tuple(only))) or {})
    study = STUDIES["phases"]
    folder = _Folder(tmp_path, study, study.scales["tiny"], "cmd", runs=(), planned=(), spent_s=0.0)
    groups = [(AnalysisGroup("g", ("p",), ("training_phases",)), [tmp_path / "run"]),
              (AnalysisGroup("h", ("p",), ("training_phases", "calibration")), [tmp_path / "run"])]
    _analyze(folder, groups, lambda line: None)
    assert calls == [("analysis", ("training_phases",)), ("analysis", ("training_phases", "calibration")),
                     ("analysis_at_init", ("calibration",))]


# --- A slice of the plan and its time budget (`--only-runs`, `--time-limit`) ---------------------


def _job(name: str, expected_s: float | None, tmp_path: Path) -> "TrainJob":
    from windtunnel.jobs import TrainJob

    return TrainJob(name, tmp_path / "c.toml", tmp_path / "runs" / name, ("train.seed=0",), expected_s=expected_s, preset=name[0])


def test_a_slice_is_the_named_runs_in_plan_order_each_given_the_time_limit_as_an_override(tmp_path):
    """``_slice``'s rule (its docstring): the runs of the plan that ``only_runs`` names (all
    when it is empty), each with ``train.time_limit_s`` among its overrides when a limit is
    given; a limit of 0 means none. Worked out by hand for a plan a, b, c, d."""
    from windtunnel.reproduce import _slice

    plan = [_job("a", 50.0, tmp_path), _job("b", 40.0, tmp_path), _job("c", 30.0, tmp_path), _job("d", None, tmp_path)]
    chosen = _slice(plan, ("d", "b"), 90.0)
    # The plan's order (longest first, for packing), not the order the names were given in.
    assert [job.name for job in chosen] == ["b", "d"]
    assert [job.overrides for job in chosen] == [("train.seed=0", "train.time_limit_s=90.0")] * 2
    # expected_s takes no part in a job's equality: the slice must carry it over all the same.
    assert [job.expected_s for job in chosen] == [40.0, None]
    assert [(job.run_dir, job.preset) for job in chosen] == [(plan[1].run_dir, "b"), (plan[3].run_dir, "d")]
    # No names: the whole plan; no limit (0): the overrides as they were.
    assert _slice(plan, (), 0.0) == plan and [job.overrides for job in _slice(plan, (), 0.0)] == [("train.seed=0",)] * 4
    assert [job.overrides for job in _slice(plan, ("c",), 0.0)] == [("train.seed=0",)]
    # A limit under one second is still a limit.
    assert [job.overrides for job in _slice(plan, ("a",), 0.5)] == [("train.seed=0", "train.time_limit_s=0.5")]
    assert [job.name for job in _slice(plan, ("a", "b", "c", "d"), 1.0)] == ["a", "b", "c", "d"]


def test_a_slice_refuses_a_run_not_in_the_plan_and_a_negative_limit_but_takes_a_limit_of_zero(tmp_path):
    from windtunnel.config import ConfigError
    from windtunnel.reproduce import _slice

    plan = [_job("a", 50.0, tmp_path), _job("b", 40.0, tmp_path)]
    with pytest.raises(ConfigError, match=r"^--only-runs 'x' is not a run of this plan; choose from: a, b$"):
        _slice(plan, ("a", "x"), 0.0)
    with pytest.raises(ConfigError, match=r"^--time-limit -0.5 is out of range: need seconds >= 0$"):
        _slice(plan, ("a",), -0.5)
    assert [job.name for job in _slice(plan, ("b",), 0.0)] == ["b"]  # 0 is in range: no limit


class _RecordingEngine:
    """An engine that trains nothing: it keeps the jobs it was given, and refuses a warm-up."""

    def __init__(self) -> None:
        self.calls: list[tuple[list, dict]] = []

    def measurer(self, lanes, nproc_per_run, measure):
        raise AssertionError("a slice with a time limit must not time a warm-up")

    def run_jobs(self, jobs, **kwargs):
        self.calls.append((list(jobs), kwargs))


def _folder_at(tmp_path: Path, warmup_steps: int):
    import dataclasses

    from windtunnel.reproduce import _Folder
    from windtunnel.studies import STUDIES

    study = STUDIES["claims"]
    scale = dataclasses.replace(study.scales["tiny"], warmup_steps=warmup_steps)
    return _Folder(tmp_path, study, scale, "cmd", runs=(), planned=(), spent_s=0.0)


def test_a_time_limit_caps_each_runs_expected_time_and_the_eta_counts_the_runs_not_done(tmp_path, monkeypatch):
    """The budget of a slice: each run is expected to take its own estimate or the limit,
    whichever is less (a run without an estimate: the limit), no warm-up is timed (the limit
    bounds each run already), and the ETA is the capped times of the runs not yet done over
    the lanes. By hand, limit 150 s on 2 lanes: 500 -> 150, 60 -> 60, none -> 150, and a done
    run's 1000 -> 150 left out of the ETA: (150 + 60 + 150) / 2 / 60 = 3 min."""
    import windtunnel.reproduce as reproduce_module

    monkeypatch.setattr(reproduce_module, "job_state", lambda job: "done" if job.name == "done" else "new")
    jobs = [_job("long", 500.0, tmp_path), _job("short", 60.0, tmp_path), _job("unknown", None, tmp_path),
            _job("done", 1000.0, tmp_path)]
    engine, lines = _RecordingEngine(), []
    reproduce_module._train(_folder_at(tmp_path, warmup_steps=4), jobs, 3, engine, 2, 1, 150.0, None, lines.append, group=False)  # the budget, not the grouping: these jobs name no config file
    [(trained, kwargs)] = engine.calls
    assert [job.name for job in trained] == ["long", "short", "unknown", "done"]
    assert [job.expected_s for job in trained] == [150.0, 60.0, 150.0, 150.0]
    assert kwargs == {"parallel": 2, "nproc_per_run": 1, "report": None}
    assert lines[0] == ("[reproduce] scale tiny, claims: 4 runs, 3 analysis groups; expects "
                        f"{SCALES['tiny'].hardware}; training ETA ~3 min")
    assert json.loads((tmp_path / "reproduce.json").read_text())["stage"] == "train"


def test_without_a_time_limit_the_expected_times_stand_and_a_scale_with_a_warmup_times_one(tmp_path, monkeypatch):
    """No limit (0): the estimates are not capped, and a scale that asks for a warm-up gets
    one (here recorded, not run), with the threads each of the 2 lanes gets. By hand: ETA
    (600 + 120) / 2 / 60 = 6 min."""
    import windtunnel.reproduce as reproduce_module
    from windtunnel.jobs import threads_per_run

    monkeypatch.setattr(reproduce_module, "job_state", lambda job: "new")
    warmups = []

    def recorded_warmup(jobs, steps, threads, say, measure):
        warmups.append((steps, threads))
        return list(jobs)

    monkeypatch.setattr(reproduce_module, "project_from_warmup", recorded_warmup)

    class Engine(_RecordingEngine):
        def measurer(self, lanes, nproc_per_run, measure):
            return measure

    jobs = [_job("long", 600.0, tmp_path), _job("short", 120.0, tmp_path)]
    engine, lines = Engine(), []
    reproduce_module._train(_folder_at(tmp_path, warmup_steps=4), jobs, 1, engine, 2, 1, 0.0, None, lines.append, group=False)
    assert warmups == [(4, threads_per_run(2, 1))]
    [(trained, _)] = engine.calls
    assert [job.expected_s for job in trained] == [600.0, 120.0]
    assert [job.overrides for job in trained] == [("train.seed=0",)] * 2
    assert lines[0].endswith("; training ETA ~6 min")
    # And a scale without a warm-up times none.
    warmups.clear()
    reproduce_module._train(_folder_at(tmp_path, warmup_steps=0), jobs, 1, Engine(), 2, 1, 0.0, None, lines.append, group=False)
    assert warmups == []


def test_reproduce_trains_only_the_slice_each_with_the_limit_and_a_budget_of_at_most_the_limit(tmp_path, monkeypatch):
    """`reproduce --only-runs ... --time-limit 7` at the tiny scale (training stopped where it
    would start): the engine gets the two named runs, in the plan's order (hmm's 20 s estimate
    before bijection's 12 s), each with ``train.time_limit_s=7.0`` and expected to take 7 s;
    the manifest lists those two and plans every run."""
    import windtunnel.reproduce as reproduce_module
    from windtunnel.jobs import LocalEngine

    given = []

    class Stop(Exception):
        pass

    def stop_before_training(self, jobs, **kwargs):
        given.extend(jobs)
        raise Stop

    monkeypatch.setattr(LocalEngine, "run_jobs", stop_before_training)
    out = tmp_path / "out"
    with pytest.raises(Stop):
        reproduce_module.reproduce("tiny", out, report=lambda line: None, only_runs=("bijection_mlp_seed0", "hmm_transformer_seed0"),
                                   time_limit_s=7.0)
    assert [job.name for job in given] == ["hmm_transformer_seed0", "bijection_mlp_seed0"]
    assert [job.overrides[-1] for job in given] == ["train.time_limit_s=7.0"] * 2
    assert [job.resolved().train.time_limit_s for job in given] == [7.0, 7.0]
    assert [job.expected_s for job in given] == [7.0, 7.0]
    manifest = report_folder.Manifest.read(out)
    assert [run.name for run in manifest.runs] == ["hmm_transformer_seed0", "bijection_mlp_seed0"]
    assert len(manifest.planned) == len(plan_runs(SCALES["tiny"], out))
    assert "--only-runs bijection_mlp_seed0 hmm_transformer_seed0" in manifest.command
