"""The results pages and the README's headline table are what the committed results folders
render (tools/results_pages.py), and what they say agrees with those folders' files, read
here with the json module alone."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "results_pages.py"
FOLDERS = {"docs/results.md": ROOT / "results" / "cpu", "docs/results-paper.md": ROOT / "results" / "paper"}


@pytest.fixture(scope="module")
def tool():
    """tools/results_pages.py, imported into this process (so that mutation testing, which
    changes this process's code only, sees every line that renders a page)."""
    spec = importlib.util.spec_from_file_location("results_pages", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_pages_are_what_their_folders_render(tool):
    """What ``tools/results_pages.py --check`` checks."""
    stale = [page for page, text in tool.rendered(ROOT).items() if (ROOT / page).read_text() != text]
    assert not stale, f"{stale} differ from what their results folders render (run python tools/results_pages.py)"


@pytest.mark.parametrize("page", sorted(FOLDERS))
def test_each_page_states_the_provenance_its_runs_recorded(page):
    folder = FOLDERS[page]
    text = (ROOT / page).read_text().replace("\\", "")  # the Markdown escapes punctuation with backslashes
    manifest = json.loads((folder / "reproduce.json").read_text())
    starts = [start for run in manifest["runs"]
              for start in json.loads((folder / run["run_dir"] / "provenance.json").read_text())["starts"]]
    assert f"- **command:** {manifest['command']}\n" in text
    assert f"- **runs:** {len(manifest['runs'])} trained" in text
    assert f"- **wall time:** {manifest['wall_s'] / 60:.1f} min" in text
    for key in ("commit", "torch", "device_name", "precision"):
        for value in {start[key] for start in starts}:
            assert value in text, (key, value)
    if page == "docs/results.md":  # the CPU scale's copy keeps no weights (the paper scale keeps its final ones)
        assert not [p for p in folder.rglob("*") if p.suffix in {".safetensors", ".pt", ".bin"}]


@pytest.mark.parametrize("page", sorted(FOLDERS))
def test_each_page_lists_every_run_with_its_configured_steps(page):
    folder = FOLDERS[page]
    text = (ROOT / page).read_text().replace("\\", "")
    manifest = json.loads((folder / "reproduce.json").read_text())
    rows = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines() if line.startswith("| ")}
    for run in manifest["runs"]:
        config = json.loads((folder / run["run_dir"] / "config.json").read_text())
        assert run["name"] in rows, run["name"]
        assert f" | {config['train']['steps']} | " in rows[run["name"]] or f"of {config['train']['steps']:,}" in text


def test_the_readme_headline_shows_each_claims_verdict_as_its_page_does():
    readme = (ROOT / "README.md").read_text()
    block = readme.split("<!-- headline results")[1].split("<!-- end of headline results -->")[0]
    rows = [line.split(" | ") for line in block.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == 16
    for column, page in enumerate(sorted(FOLDERS, key=lambda p: p != "docs/results.md"), 1):
        text = (ROOT / page).read_text().replace("\\", "")
        table = text.split("| claim | holds? |")[1].split("\n\n")[0]
        verdicts = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[1] for line in table.splitlines()[2:]}
        assert {row[0].lstrip("| "): row[column].rstrip(" |") for row in rows} == verdicts, page
    holding = sum(row[1].startswith("yes") for row in rows)
    tally = re.search(r"(\d+) of (\d+) claims hold", (ROOT / "docs/results.md").read_text())
    assert tally and int(tally[1]) == holding


def test_save_refuses_an_existing_folder_or_a_folder_that_is_not_a_reproduction(tmp_path, tool, capsys):
    (tmp_path / "there").mkdir()
    for source, target, words in ((ROOT / "results" / "paper", tmp_path / "there", "exists"),
                                  (tmp_path, tmp_path / "new", "not a reproduction folder")):
        code = tool.main(["save", str(source), str(target), "--how", "x"])
        stderr = capsys.readouterr().err
        assert code == 2 and words in stderr and stderr.count("\n") == 1, stderr
        assert not (tmp_path / "new").exists() and list((tmp_path / "there").iterdir()) == []


def test_save_names_the_folder_it_refuses_and_replaces_a_partial_copy_a_killed_save_left(tmp_path):
    """A results folder is a reproduction's folder without its weights, so a committed one can be
    saved again: the refusals name the folder in question, and the staging folder a killed save
    left behind (``<folder>.partial``) is replaced, not merged into the new folder."""
    from windtunnel.report.folder import ReportError
    from windtunnel.report.results_page import save_results

    source = ROOT / "results" / "model-selection"
    (tmp_path / "there").mkdir()
    with pytest.raises(ReportError, match=re.escape(f"{str(tmp_path / 'there')!r} exists")):
        save_results(source, tmp_path / "there", "x")
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    manifest = json.loads((source / "reproduce.json").read_text())
    (unfinished / "reproduce.json").write_text(json.dumps({**manifest, "stage": "training"}))
    with pytest.raises(ReportError, match=re.escape(f"{str(unfinished)!r} is an unfinished reproduction (stage 'training')")):
        save_results(unfinished, tmp_path / "new", "x")

    (tmp_path / "new.partial" / "runs").mkdir(parents=True)
    (tmp_path / "new.partial" / "runs" / "stale.json").write_text("{}")
    written = save_results(source, tmp_path / "new", "two cores")
    assert not (tmp_path / "new.partial").exists() and not (tmp_path / "new" / "runs" / "stale.json").exists()
    kept = sorted(p.relative_to(tmp_path / "new") for p in (tmp_path / "new").rglob("*") if p.is_file())
    assert kept == sorted(p.relative_to(tmp_path / "new") for p in written)
    assert json.loads((tmp_path / "new" / "how.json").read_text()) == {"how": "two cores"}


def test_the_training_table_reads_a_start_record_that_lacks_fields_as_blanks_and_zeros(tmp_path):
    """A start record written by another tool (or by hand) may lack fields: the device's type
    stands in for its name, missing step counts read 0, a missing wall time is blank; a full
    record shows each field where its column says."""
    from windtunnel.report.folder import Manifest
    from windtunnel.report.results_page import _training_table

    source = ROOT / "results" / "model-selection"
    manifest = Manifest.read(source)
    run = manifest.runs[0]
    full = {"device": "cuda", "device_name": "NVIDIA H100", "precision": "float32", "start_step": 1200, "end_step": 3400,
            "configured_steps": 5000, "stopped": "time_limit", "steps_per_s_median": 41.5, "wall_s": 93.0,
            "commit": "0123456789abcdef"}
    (tmp_path / run.run_dir).mkdir(parents=True)
    (tmp_path / run.run_dir / "provenance.json").write_text(json.dumps({"starts": [full, {"device": "cpu"}]}))
    rows = _training_table(tmp_path, manifest).rows
    assert rows == [[run.name, "NVIDIA H100", "float32", "1,200-3,400 of 5,000", "time_limit", 41.5, 1.6, "0123456"],
                    [run.name, "cpu", None, "0-0 of 0", "", None, None, None]]


def test_a_report_rebuilt_from_a_results_folder_draws_the_phase_diagrams_and_shows_a_scale_beside(tmp_path):
    """build_report on the committed folders' copies: the phases study's diagrams are drawn from
    its saved results into the report and shown there; the claims study's table gains the column
    of the reproduction given beside it (and a claims folder gets no phase diagrams)."""
    from windtunnel.report.build import PHASE_DIAGRAMS_DIR, build_report
    from windtunnel.report.html import MissingFigureWarning
    from windtunnel.run_layout import REPORT_DIR

    phases, cpu = tmp_path / "phases", tmp_path / "cpu"
    shutil.copytree(ROOT / "results" / "phases", phases)
    shutil.copytree(ROOT / "results" / "cpu", cpu)
    build_report(phases)
    drawn = sorted(p.name for p in (phases / REPORT_DIR / PHASE_DIAGRAMS_DIR).glob("*.png"))
    assert "hmm_depth_width.png" in drawn and "bijection_size.png" in drawn
    markdown = (phases / REPORT_DIR / "report.md").read_text()
    # The report shows each as its own numbered copy (figures/NN_<name>).
    assert all(re.search(rf"\]\(figures/\d+_{re.escape(name)}\)", markdown) for name in drawn) and "figure missing" not in markdown
    with pytest.warns(MissingFigureWarning, match="figure"):  # a results folder keeps no analysis figures
        build_report(cpu, ROOT / "results" / "paper")
    assert not (cpu / REPORT_DIR / PHASE_DIAGRAMS_DIR).exists()
    markdown = (cpu / REPORT_DIR / "report.md").read_text()
    assert "holds at paper scale?" in markdown and "is the verdict of the paper-scale reproduction given beside this one" in markdown
