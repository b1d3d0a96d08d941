"""Results pages: a saved reproduction's tables as one Markdown page, with where they came from.

A results folder is a reproduction's folder without its weights (``save_results`` copies
one): the manifest, each run's config, metrics, evaluation and provenance, and every
analysis's JSON. ``results_page(folder, title)`` renders the report's tables from it (the
claim table and the numbers behind it, the paper's Table 1, the runs, what the scale cuts)
under a provenance list read from the same files: the command, the machine and the
software each run trained on, the windtunnel commit, the wall time. The documentation's
results pages are this function's output (``tools/results_pages.py``), never typed.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

from windtunnel.files import atomic_write_text
from windtunnel.provenance import read_provenance
from windtunnel.report.build import assemble_report
from windtunnel.report.folder import REPORTABLE_STAGES, Manifest, ReportError
from windtunnel.run_layout import ANALYSIS_DIR, INIT_DIR, MANIFEST_FILE
from windtunnel.report.html import Cell, Report, Section, Table, render_markdown

__all__ = ["HOW_FILE", "RUN_FILES", "results_page", "save_results"]

#: What a results folder keeps of each run: everything the report reads, no weights.
RUN_FILES = ("config.json", "metrics.jsonl", "eval.json", "provenance.json")
#: How the reproduction was made, in words (the machine, what else ran): written by ``save_results``.
HOW_FILE = "how.json"


def save_results(reproduction: Path, folder: Path, how: str) -> list[Path]:
    """Copy the weight-free part of a finished ``reproduction`` into ``folder`` (which must
    not exist), with ``how`` (the machine and the conditions, in words) in ``folder/how.json``.
    Returns the files written.

    Raises:
        ReportError: ``reproduction`` is not a finished reproduction, or ``folder`` exists.
    """
    reproduction, folder = Path(reproduction), Path(folder)
    manifest = Manifest.read(reproduction)
    if manifest.stage not in REPORTABLE_STAGES:
        raise ReportError(f"{str(reproduction)!r} is an unfinished reproduction (stage {manifest.stage!r}): "
                          f"finish it with `{manifest.command} --resume` first")
    if folder.exists():
        raise ReportError(f"{str(folder)!r} exists: give a new folder (a results folder is written once, whole)")
    sources = [reproduction / MANIFEST_FILE]
    for run in manifest.runs:
        sources += [reproduction / run.run_dir / name for name in RUN_FILES if (reproduction / run.run_dir / name).is_file()]
    for analyses in (ANALYSIS_DIR, INIT_DIR):
        sources += sorted((reproduction / analyses).glob("*/*.json"))
    staging = folder.with_name(folder.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    for source in sources:
        target = staging / source.relative_to(reproduction)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    atomic_write_text(staging / HOW_FILE, json.dumps({"how": how}, indent=1) + "\n")
    staging.rename(folder)  # the folder appears whole or not at all
    return [folder / source.relative_to(reproduction) for source in sources] + [folder / HOW_FILE]


def _provenance(folder: Path, manifest: Manifest) -> dict[str, str]:
    """Where the numbers came from, from the runs' own provenance records."""
    starts = [start for run in manifest.runs for start in read_provenance(folder / run.run_dir)]

    def each(*keys: str) -> str:
        values = sorted({" ".join(str(start.get(key)) for key in keys if start.get(key)) for start in starts})
        return "; ".join(value for value in values if value) or "not recorded"

    lines = {
        "command": manifest.command,
        "runs": f"{len(manifest.runs)} trained" + (f", {len(manifest.not_yet_run)} not yet run" if manifest.not_yet_run else ""),
        "device": each("device_name"),
        "host CPU": each("cpu"),
        "precision": each("precision"),
        "software": "torch " + each("torch") + ", Python " + each("python"),
        "windtunnel commit": each("commit"),
        "wall time": f"{manifest.wall_s / 60:.1f} min (the reproduction's own clock, summed over its sessions)",
    }
    how = folder / HOW_FILE
    if how.is_file():
        lines["how"] = json.loads(how.read_text())["how"]
    return lines


def _training_table(folder: Path, manifest: Manifest) -> Table:
    """Each start of each run as its provenance recorded it: where, how fast, at which commit."""
    rows: list[list[Cell]] = []
    for run in manifest.runs:
        for start in read_provenance(folder / run.run_dir):
            steps = f"{start.get('start_step', 0):,}-{start.get('end_step', 0):,} of {start.get('configured_steps', 0):,}"
            rows.append([run.name, start.get("device_name") or start.get("device"), start.get("precision"), steps,
                         start.get("stopped") or "", start.get("steps_per_s_median"),
                         round(start["wall_s"] / 60, 1) if start.get("wall_s") is not None else None,
                         (start.get("commit") or "")[:7] or None])
    return Table(["run", "device", "precision", "steps", "stopped by", "steps/s (median)", "wall min", "commit"], rows,
                 caption="How each run trained, one row per start (a resumed run has several), from its provenance.json.",
                 number_format="{:.3g}")


def results_page(folder: Path, title: str, shown_as: str | None = None) -> str:
    """The Markdown results page of the results folder ``folder`` (named ``shown_as`` on the
    page: its path in the repository; default its own name).

    Raises:
        ReportError: as :func:`~windtunnel.report.build.assemble_report`.
    """
    folder = Path(folder)
    report = assemble_report(folder)
    manifest = Manifest.read(folder)
    summary = (report.summary + " The tables below are rendered from the JSON files in "
               f"`{shown_as or folder.name}/` alone; the figures are in the report a reproduction writes "
               "(`reproduction/report/index.html`).")
    # Figures stay in the report; a section's tables come without them (a section of figures alone is left out).
    tables_only = [dataclasses.replace(section, figures=[]) for section in report.sections if section.tables or not section.figures]
    tables_only.insert(-1, Section("How each run trained", tables=[_training_table(folder, manifest)]))
    return render_markdown(Report(title, summary, tables_only, metadata=_provenance(folder, manifest)))
