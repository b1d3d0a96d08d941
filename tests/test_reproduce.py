"""`windtunnel reproduce --scale tiny` end to end: runs, analyses, and a report that lists
every figure and every claim; then resumption and bad requests."""

from __future__ import annotations

import ast
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
from windtunnel.report.build import FIGURE_PLAN
from windtunnel.report.claims import CLAIMS, evaluate_claims
from windtunnel.report.folder import INIT_DIR, load_results
from windtunnel.reproduce import plan_analyses, plan_runs
from windtunnel.run_config import load_run_config
from windtunnel.studies import GROUPS, PRESET_NAMES, SCALES, configs_folder

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
    for title, _, _ in FIGURE_PLAN:  # every figure of the paper, the seeds overlay included (2 bijection seeds)
        assert any(title in heading for heading in page.headings), title
    expected_figures = sum(
        (tiny / "analysis" / group / f"{name}.png").is_file() for _, _, figures in FIGURE_PLAN for group, name, _ in figures
    )
    assert expected_figures >= 20 and len(page.images) == expected_figures
    assert all(src.startswith("data:image/png;base64,") for src in page.images)
    claim_rows = [row for row in page.rows if row and row[0] in {c.claim for c in CLAIMS}]
    assert [row[0] for row in claim_rows] == [c.claim for c in CLAIMS]
    # Every claim was measured (its analysis ran); at tiny scale many do not hold, which is fine.
    # A verdict over several seeds also says how each seed fares alone ("no; 0 of 2 seeds hold").
    verdict_cell = re.compile(r"^(yes|no)(; \d+ of 2 seeds holds?)?$")
    assert all(verdict_cell.match(row[1]) for row in claim_rows), [row for row in claim_rows if not verdict_cell.match(row[1])]
    assert any(";" in row[1] for row in claim_rows)  # the tiny scale trains 2 bijection seeds: their rows are split out
    header = next(row for row in page.rows if row and row[0] == "claim")
    assert header[1] == "holds?" and header[3] == "paper passes?" and header[6] == "random init (holds?)" and "tiny" in header[4]
    paper = {c.claim: c.paper_holds() for c in CLAIMS}
    assert all(row[3] == {True: "yes", False: "no", None: "n/a"}[paper[row[0]]] for row in claim_rows)
    markdown = (tiny / "report" / "report.md").read_text()
    unescaped = markdown.replace("\\", "")  # the Markdown escapes punctuation with backslashes
    assert all(claim.claim in unescaped for claim in CLAIMS)
    assert "figure missing" not in markdown


def test_the_manifest_lists_the_scale_and_every_run(tiny):
    """reproduce.json holds what the report needs besides the runs' and analyses' own files."""
    manifest = json.loads((tiny / "reproduce.json").read_text())
    scale = SCALES["tiny"]
    assert set(manifest) == {"scale", "stage", "wall_s", "command", "hardware", "cuts", "runs", "study", "planned"}
    assert manifest["study"] == "claims"
    assert manifest["planned"] == [run["name"] for run in manifest["runs"]]  # every planned run is there
    assert (manifest["scale"], manifest["stage"], manifest["hardware"]) == ("tiny", "done", scale.hardware)
    assert manifest["cuts"] == list(scale.cuts) and manifest["wall_s"] > 0
    assert manifest["command"] == f"windtunnel reproduce --scale tiny --out {PREBUILT or tiny}"
    jobs = plan_runs(scale, tiny)
    assert [run["name"] for run in manifest["runs"]] == [job.name for job in jobs]  # plan order: the runs table's
    for run, job in zip(manifest["runs"], jobs):
        assert run["run_dir"] == f"runs/{job.name}" and tiny / run["run_dir"] == job.run_dir
        assert run["name"] == f"{run['preset']}_seed{run['seed']}" and run["seed"] == job.resolved().train.seed


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


def test_the_report_imports_nothing_of_the_reproduction():
    """Every import of report/build.py and report/folder.py (functions and type-checking blocks
    included) is of the report, the history, a run's provenance or the standard library: never the plan it
    reports on."""

    def ours(module) -> set[str]:
        tree = ast.parse(Path(module.__file__).read_text())
        names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        names |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
        return {name for name in names if name.startswith("windtunnel")}

    assert ours(report_build) == {"windtunnel.history", "windtunnel.provenance", "windtunnel.report.claim_types", "windtunnel.report.claims",
                                  "windtunnel.report.folder", "windtunnel.report.html", "windtunnel.report.primitives"}
    assert ours(report_folder) == set()


def test_the_report_renders_in_a_real_browser(tiny, tmp_path):
    """Headless Chromium screenshots the tiny report's first 2400 pixels: the claim table
    is there with its verdict cells shaded green (holds) and red (does not)."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        pytest.skip("no Chromium on PATH (apt-get install chromium; .ci/run installs it); browser check not run")
    shot = tmp_path / "report.png"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync"]
    command = [browser, *flags, f"--user-data-dir={tmp_path / 'profile'}", "--hide-scrollbars",
               "--window-size=1200,2400", f"--screenshot={shot}", (tiny / "report" / "index.html").resolve().as_uri()]
    result = subprocess.run(command, check=False, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and shot.is_file(), result.stderr[-2000:]
    pixels = np.round(image.imread(shot)[..., :3] * 255).astype(int)  # [H, W, 3], decoded by matplotlib
    assert pixels.shape == (2400, 1200, 3) and pixels.std() > 20
    for css_color in ((0xDA, 0xFB, 0xE1), (0xFF, 0xEB, 0xE9)):  # td.yes and td.no backgrounds (report/html.py)
        assert (np.abs(pixels - css_color).sum(-1) == 0).sum() > 1000, css_color


@pytest.mark.slow  # a resumed reproduction re-checks every run (half a minute): not the report's test
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

    assert SCALES["paper"].warmup_steps >= 3
    monkeypatch.setitem(SCALES, "tiny", dataclasses.replace(SCALES["tiny"], warmup_steps=4))
    planned = {}

    class Stop(Exception):
        pass

    def stop_before_training(jobs, **kwargs):
        planned.update({job.name: job for job in jobs})
        raise Stop

    monkeypatch.setattr(reproduce_module, "run_jobs", stop_before_training)
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
