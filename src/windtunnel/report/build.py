"""Assemble a reproduction's report from its saved analyses (never from models).

Reads only what the reproduction saved in its folder ``DIR``: its manifest
``DIR/reproduce.json`` (the scale, its cuts, the runs), each run's ``config.json`` and
``metrics.jsonl``, and ``DIR/analysis/<group>/<name>.json`` with the PNGs beside them; and
writes ``DIR/report/index.html`` and ``DIR/report/report.md``: the claim table, Table 1, each
figure of the paper (docs/protocol.md §6) that the reproduction made, the runs, and what the scale
cut relative to the paper. So ``windtunnel report DIR`` rebuilds the same report from the
folder alone (read through :mod:`windtunnel.report.folder`), and nothing here imports the
reproduction's plan (``windtunnel.reproduce``, which imports the folder module to write the manifest).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from windtunnel.history import (
    HMM_PLATEAU_EXIT_MAE_BITS,
    MetricsError,
    plateau_exit_step,
    read_metrics,
    stop_record,
    training_seconds,
)
from windtunnel.provenance import read_provenance
from windtunnel.report.claim_types import Results, Verdict
from windtunnel.report.claims import evaluate_claims, tally
from windtunnel.report.folder import (
    REPORTABLE_STAGES,
    Manifest,
    ReportError,
    RunRecord,
    SavedRun,
    load_results,
)
from windtunnel.report.html import NOT_YET_RUN, Figure, Report, Section, Table, verdict, write_report
from windtunnel.report.model_selection import model_selection_sections
from windtunnel.report.phases import PHASE_DIAGRAMS_DIR, draw_phase_diagrams, knob_settings, phases_sections
from windtunnel.report.primitives import primitive_sections
from windtunnel.results import AnalysisResult, Summary
from windtunnel.results.generalization import HorizonScores
from windtunnel.run_files import check_run_files
from windtunnel.run_layout import ANALYSIS_DIR, INIT_DIR, REPORT_DIR

__all__ = ["FIGURE_PLAN", "assemble_report", "build_report", "claim_tables", "figure_section_title", "stopped_early"]

#: The paper's figures in order: (section title, the paper's figure, text, [(group, analysis, caption)]).
#: The report numbers its own figures; the paper's number is named in the section title only.
FIGURE_PLAN: tuple[tuple[str, str, str, tuple[tuple[str, str, str], ...]], ...] = (
    ("Bijection calibration", "Fig 1",
     "Mean model entropy against the exact posterior's, H_Bayes(k) = log2(V − k + 1), by position.",
     (("bijection_transformer", "calibration", "Bijection transformer: mean and single-sequence entropy against Bayes."),)),
    ("Bijection with replacement, per sequence", "Fig 2",
     "With repeated inputs the exact entropy stays flat when an input is seen again: each trace is a staircase.",
     (("bijection_replacement_transformer", "calibration", "Eight single sequences, with replacement: model against the exact staircase."),)),
    ("Layer ablation", "Fig 3",
     "Each layer removed whole (attention and feed-forward; the residual passes through), error relative to the "
     "intact model, averaged over seeds.",
     (("bijection_transformer", "layer_ablation", "Bijection."), ("hmm_transformer", "layer_ablation", "HMM."))),
    ("Head ablation", "Fig 4",
     "Each attention head zeroed in turn: ratio of mae_bits to the intact model.",
     (("bijection_transformer", "head_ablation", "Bijection."), ("hmm_transformer", "head_ablation", "HMM."))),
    ("HMM calibration, mean and per sequence", "Figs 5 and 7",
     "Mean entropy of the model's state posterior against the forward algorithm's, and eight single sequences.",
     (("hmm_transformer", "calibration", "HMM transformer."),)),
    ("Length generalization", "Fig 6",
     "Per-position error at K = 20, 30, 50 for a model trained at K = 20 (dashed line). Positions past the training "
     "length were never trained.",
     (("hmm_transformer", "length_generalization", "HMM transformer."),)),
    ("Relabeling invariance", "Fig 8",
     "Per-sequence error before and after a random permutation of the hidden states.",
     (("hmm_transformer", "relabeling", "HMM transformer."),)),
    ("Late attention disabled", "Fig 9",
     "The HMM transformer trained without attention in its top two layers, against the full model.",
     (("hmm", "late_attention", "Per-position error at each horizon."),)),
    ("The MLP control, and Table 1's curves", "Fig 10",
     "Per-position error of every model; the capacity-matched MLP cannot see other tokens.",
     (("hmm", "model_comparison", "HMM."), ("bijection", "model_comparison", "Bijection."),
      ("hmm_mlp", "calibration", "HMM MLP control: its entropy against Bayes."))),
    ("Seeds", "Fig 11",
     "Per-position error of each seed overlaid, with the MLP control for scale.",
     (("hmm", "seeds", "HMM."), ("bijection", "seeds", "Bijection."))),
    ("Key orthogonality", "Fig 14",
     "Cosine similarity between the keys each input token produces; the hypothesis-frame head.",
     (("bijection_transformer", "key_orthogonality", "Bijection."), ("hmm_transformer", "key_orthogonality", "HMM."))),
    ("Query-key sharpening across depth", "Fig 15",
     "Where supervised positions attend, layer by layer, and how concentrated that attention is.",
     (("bijection_transformer", "qk_sharpening", "Bijection."), ("hmm_transformer", "qk_sharpening", "HMM."))),
    ("Value manifold", "Figs 16-17",
     "PCA of the last layer's representations at supervised positions, colored by the exact posterior entropy.",
     (("bijection_transformer", "value_manifold", "Bijection."), ("hmm_transformer", "value_manifold", "HMM."),
      ("hmm_mlp", "value_manifold", "HMM MLP control, for contrast."))),
    ("Linear probes: the belief state by depth", "",
     "Ridge regression from the residual stream to the exact posterior and its entropy, held-out sequences.",
     (("bijection_transformer", "linear_probes", "Bijection."), ("hmm_transformer", "linear_probes", "HMM."),
      ("hmm_mlp", "linear_probes", "HMM MLP control."))),
    ("Frame-precision dissociation: training dynamics", "",
     "Over the saved snapshots: attention-map change relative to the final model, value-manifold state, and error.",
     (("bijection_transformer", "training_dynamics", "Bijection."), ("hmm_transformer", "training_dynamics", "HMM."))),
)


#: The studies whose report is the architecture-by-primitive table: (title, what the table is).
PRIMITIVE_TABLE_TITLES = {
    "architectures": ("Bayesian wind tunnels: which architecture realizes which inference primitive",
                      "The architecture-by-primitive table of the paper's later versions (arXiv 2512.22471 v3+)"),
    "future_work": ("Bayesian wind tunnels beyond the paper: Laplace accumulation and Gaussian filtering",
                    "The architecture-by-primitive table on the tunnels of the paper's future work"),
}

def figure_section_title(title: str, paper_figure: str) -> str:
    """A figure section's heading: its subject, and the paper's figure it reproduces."""
    return f"{title} (the paper's {paper_figure})" if paper_figure else title


#: Table 1's comparison groups (see ``studies.GROUPS``): ours, then the authors' variant.
TABLE1_GROUPS = ("bijection", "bijection_with_replacement", "hmm", "hmm_floor")


def _verdict_cell(judged: Verdict, *, pending: bool) -> str:
    """``"yes"``, ``"no"`` or ``"n/a"``, with the seeds' split where each was judged alone;
    ``pending``: the folder still lacks planned runs, so a claim with no result yet is "not yet run"."""
    if judged.holds is None and pending:
        return NOT_YET_RUN
    return verdict(judged.holds) + (f"; {judged.seed_split}" if judged.seed_split else "")


#: Another reproduction's claim results shown beside this one's: its scale, its results, and
#: whether it still lacks planned runs (then its claims without a result read "not yet run").
Beside = tuple[str, Results, bool]


def claim_tables(
    results: Results,
    at_init: Results,
    scale: str,
    *,
    pending: bool = False,
    beside: Beside | None = None,
) -> tuple[Table, Table]:
    """The claim table (each claim's verdict, the criterion that decides it, and the criterion
    applied to the paper's own number and to the runs' initial weights), then the numbers
    behind each verdict (the paper's, ours, our stricter measures, the initial weights').

    Two tables so that the verdict and its criterion fit a page: the long measures are one
    table further down. ``pending``: the folder is filled slice by slice and still lacks runs
    (a claim without a result reads "not yet run"). ``beside``: another scale's verdicts in a
    column of their own."""
    verdict_rows, number_rows = [], []
    other = evaluate_claims(beside[1]) if beside else None
    for index, (ours, init) in enumerate(zip(evaluate_claims(results), evaluate_claims(at_init))):
        claim = ours.claim
        paper = claim.paper.number
        if claim.paper.authors_fail:
            paper += f". The authors' own result fails it: {claim.paper.authors_fail}"
        # At initialization a claim is not yet run only where the trained claim is too (a
        # training-history claim has no initial counterpart: n/a).
        waiting = pending and ours.measured is None
        if init.measured is None:
            init_verdict = init_number = NOT_YET_RUN if waiting else "n/a"
        else:
            init_verdict, init_number = _verdict_cell(init, pending=False), init.ours
        row = [claim.claim, _verdict_cell(ours, pending=pending)]
        if beside is not None and other is not None:
            row.append(_verdict_cell(other[index], pending=beside[2]))
        verdict_rows.append([*row, claim.criterion, verdict(claim.paper_holds()), init_verdict])
        number_rows.append([claim.claim, paper, ours.ours if ours.measured or not pending else NOT_YET_RUN,
                            ours.stricter or None, init_number])
    columns = ["claim", "holds?"]
    if beside:
        columns.append(f"holds at {beside[0]} scale?")
    verdicts = Table(
        [*columns, "criterion", "paper passes?", "random init holds? (must be no)"],
        verdict_rows,
        caption=f"Claims of the paper (windtunnel's docs/protocol.md §7) judged on this {scale}-scale reproduction, each "
        "on the paper's metric and, where this scale trains it, its task variant. 'paper passes?' applies the criterion "
        "to the paper's own published number; 'random init holds?' applies it to the same analyses of every run's "
        "initial weights, which must not pass. Claims over seeds are decided on the median; where the claim's number "
        "is one per run, 'k of n seeds hold' applies the same criterion to each seed's run alone. The numbers behind "
        "each verdict are in the next table."
        + (f" 'holds at {beside[0]} scale?' is the verdict of the {beside[0]}-scale reproduction given beside this one." if beside else "")
        + (f" '{NOT_YET_RUN}': the runs this claim reads are not in the folder yet." if pending or (beside and beside[2]) else ""),
    )
    numbers = Table(
        ["claim", "the paper's number (metric, task variant)", f"ours ({scale} scale)",
         "ours, stricter or other measures", "random init"],
        number_rows,
        caption=f"The numbers behind each verdict of the claim table: the paper's, ours ({scale}-scale) on the same "
        "metric, our stricter or other measures, and the same analyses of the runs' initial weights.",
    )
    return verdicts, numbers


def _table1_models(group: Mapping[str, AnalysisResult]) -> tuple[str, list[tuple[str, int, Mapping[int, HorizonScores]]], list[int]] | None:
    """``(variant, [(model, runs, horizons)], horizons)`` of a comparison group, from its Table 1
    or, where the scale trained one model of it, that model's per-position analysis."""
    if "model_comparison" in group:
        table = group["model_comparison"]
        models = [(name, m.n_runs, m.horizons) for name, m in table.models.items()]
        return table.task_variant, models, list(table.horizons)
    if "length_generalization" in group:
        single = group["length_generalization"]
        return single.task_variant, [(single.model, single.n_runs, single.horizons)], list(single.horizons)
    return None


#: Table 1's columns, as the analysis writes them (``analysis.generalization.TABLE1_METRICS``;
#: the report reads saved results and imports no analysis).
_TABLE1_COLUMNS = ("mae_bits", "mae_aggregate_bits", "kl_bits")


def _kl_range(stats: Summary) -> str | None:
    """``min–max`` over seeds where they differ, else None."""
    if stats.min == stats.max:
        return None
    return f"{stats.min:.3g}–{stats.max:.3g}"


def _table1(results: Results) -> list[Table]:
    tables = []
    for group in TABLE1_GROUPS:
        found = _table1_models(results.get(group, {}))
        if found is None:
            continue
        variant, models, horizons = found
        rows: list[list[Any]] = []
        for name, n_runs, by_horizon in models:
            for h in horizons:
                row = by_horizon[h]
                rows.append([name, n_runs, h, *(getattr(row, m).median for m in _TABLE1_COLUMNS), _kl_range(row.kl_bits)])
        first = models[0][2]
        for h in horizons:
            prior = first[h].prior
            rows.append(["context-free prior", None, h, *(getattr(prior, m) for m in _TABLE1_COLUMNS), None])
        tables.append(
            Table(
                ["model", "seeds", "horizon", *_TABLE1_COLUMNS, "kl_bits over the seeds"],
                rows,
                caption=f"Table 1, {group.split('_')[0]} ({variant}): bits from the exact posterior, the median over "
                "seeds (what the claims are decided on), and the smallest and largest seed's kl_bits.",
            )
        )
    return tables


#: The claims study's presets whose runs are HMM transformers: the runs that can sit on the
#: plateau (the preset a run seeds says what it is, so the report need not know tunnels).
PLATEAU_PRESETS = ("hmm_transformer", "hmm_late_attention_off", "hmm_transformer_floor", "hmm_late_attention_off_floor")


def _plateau_cell(preset: str, records: list[dict[str, Any]]) -> tuple[str, bool]:
    """Whether an HMM transformer run left the plateau, and where ("—" for other runs);
    and whether it is one that never did."""
    if preset not in PLATEAU_PRESETS:
        return "—", False
    step = plateau_exit_step(records)
    if step is not None:
        return f"at step {step:,}", False
    evaluated = [r["step"] for r in records if "eval_mae_bits" in r]
    if not evaluated:
        return "not evaluated yet", False
    return f"no: mae_bits ≥ {HMM_PLATEAU_EXIT_MAE_BITS} at every evaluation to step {evaluated[-1]:,}", True


def _steps_cell(configured: int, records: list[dict[str, Any]]) -> Any:
    """The run's steps: the configured number, or ``"21,830 of 100,000 (time limit)"`` for a
    run its time limit stopped early."""
    stopped = stop_record(records)
    return configured if stopped is None else f"{stopped['step']:,} of {configured:,} (time limit)"


def _trained_on_cell(run_dir: Path) -> str | None:
    """Where the run trained, in what precision and how fast (its ``provenance.json``), or None."""
    starts = read_provenance(run_dir)
    if not starts:
        return None
    last = starts[-1]
    rate = f", {last['steps_per_s_median']:.1f} steps/s" if last.get("steps_per_s_median") else ""
    return f"{last.get('device_name', '?')}, {last.get('precision', '?')}{rate}, torch {last.get('torch', '?')}"


def stopped_early(runs: Sequence[RunRecord]) -> list[str]:
    """``"name (21,830 of 100,000 steps)"`` for each run that its time limit stopped early."""
    found = []
    for run in runs:
        stopped = stop_record(read_metrics(run.run_dir))
        if stopped is not None:
            found.append(f"{run.name} ({stopped['step']:,} of {run.resolved().train.steps:,} steps)")
    return found


def _runs_section(runs: Sequence[RunRecord], *, plateau: bool = True, not_yet_run: Sequence[str] = ()) -> Section:
    """The runs table; ``plateau``: with the column saying whether each HMM transformer run
    left the plateau of the CPU HMM preset (the claims study's); ``not_yet_run``: planned runs
    the folder does not hold yet, listed as such."""
    rows: list[list[Any]] = []
    stuck: list[str] = []
    for run in runs:
        config = run.resolved()
        records = read_metrics(run.run_dir)
        wall = round(training_seconds(records) / 60, 1) if records else None
        evals = [r["eval_mae_bits"] for r in records if "eval_mae_bits" in r]
        row = [run.name, config.model_kind, _steps_cell(config.train.steps, records), config.train.batch_size, wall,
               evals[-1] if evals else None, _trained_on_cell(run.run_dir)]
        if plateau:
            cell, never_left = _plateau_cell(run.preset, records)
            row.append(cell)
            if never_left:
                stuck.append(run.name)
        rows.append(row)
    for name in not_yet_run:
        rows.append([name, NOT_YET_RUN, *([None] * (6 if plateau else 5))])
    columns = ["run", "model", "steps", "batch", "train minutes", "final eval mae_bits", "trained on"]
    caption = ("Every training run (train minutes: the run's own clock, summed over its starts where it was resumed; "
               "trained on: the device, the precision and the median steps/s of its last start).")
    if not plateau:
        return Section("Runs", "", tables=[Table(columns, rows, caption=caption)])
    text = (
        f"The HMM transformer first reads E but not T and sits on a plateau near 0.105 bits mae_bits; a run has "
        f"left it at its first held-out evaluation below {HMM_PLATEAU_EXIT_MAE_BITS}. "
    )
    if stuck:
        text += f"Never left the plateau: {', '.join(stuck)}. Their numbers are the plateau's, not a filter's."
    else:
        text += "Every HMM transformer run here left it."
    return Section("Runs", text, tables=[Table([*columns, "left the HMM plateau"], rows, caption=caption)])


def build_report(out: Path, beside: Path | None = None) -> Path:
    """Write ``out/report/index.html`` and ``report.md`` from what the reproduction in folder
    ``out`` saved (see the module docstring); returns the HTML path. ``beside``: the folder of
    a reproduction of the claims at another scale, whose verdicts the claim table shows in a
    column of their own (the paper scale's beside the CPU scale's).

    Raises:
        ReportError: as :func:`assemble_report`.
    """
    out = Path(out)
    if Manifest.read(out).study == "phases":  # its diagrams are drawn from the saved results, as the analyses' figures were
        draw_phase_diagrams(load_results(out), out / REPORT_DIR / PHASE_DIAGRAMS_DIR)
    report = assemble_report(out, beside)
    written = {**report.metadata, "written": datetime.datetime.now().strftime("%Y-%m-%d %H:%M")}
    html_path, _ = write_report(dataclasses.replace(report, metadata=written), out / REPORT_DIR)
    return html_path


def assemble_report(out: Path, beside: Path | None = None) -> Report:
    """The report of the reproduction in folder ``out``, as data (nothing is written): what
    :func:`build_report` renders, and the results pages' source.

    Raises:
        ReportError: ``out`` is not a reproduction whose analyses are done, or a file it
            saved is missing or unreadable.
    """
    out = Path(out)
    manifest = Manifest.read(out)
    for run in manifest.runs:  # before anything is read or drawn
        check_run_files(out / run.run_dir)
    other: Beside | None = None
    if beside is not None:
        other_manifest = Manifest.read(Path(beside))
        if other_manifest.study != "claims" or manifest.study != "claims":
            raise ReportError(f"--beside {str(beside)!r}: verdicts are shown side by side for reproductions of the claims only")
        other = (other_manifest.scale, load_results(Path(beside)), bool(other_manifest.not_yet_run))
    if manifest.stage not in REPORTABLE_STAGES:
        raise ReportError(
            f"{str(out)!r} is an unfinished reproduction (stopped at stage {manifest.stage!r}): finish it with "
            f"`{manifest.command} --resume`"
        )
    runs = [SavedRun.read(out, run) for run in manifest.runs]
    results = load_results(out)
    if manifest.study in PRIMITIVE_TABLE_TITLES:
        sections = primitive_sections(results, out / ANALYSIS_DIR, load_results(out, INIT_DIR))
        sections[0] = dataclasses.replace(sections[0], note=manifest.meaning)  # beside the verdict table
        title, what = PRIMITIVE_TABLE_TITLES[manifest.study]
        summary = (
            f"{what} at {manifest.scale} scale: {len(runs)} training runs, each architecture capacity-matched to the "
            "transformer. Each verdict applies the stated criterion to our numbers, beside the published verdict."
        )
    elif manifest.study == "model_selection":
        sections = model_selection_sections(results, out / ANALYSIS_DIR, load_results(out, INIT_DIR), meaning=manifest.meaning)
        title = "Bayesian wind tunnels for model selection: reproduction report"
        summary = (
            f"The findings of 'Bayesian Wind Tunnels for Model Selection' (arXiv 2607.19379) at {manifest.scale} scale: "
            f"{len(runs)} training runs on functions of Z_n, one class in three symbol modes and two classes compared. "
            "Each claim applies the stated criterion to our numbers, beside the paper's."
        )
    elif manifest.study == "phases":
        settings = knob_settings({run.preset: run.run_dir for run in reversed(runs)})  # each preset's first seed
        sections = phases_sections(results, out / ANALYSIS_DIR, out / REPORT_DIR / PHASE_DIAGRAMS_DIR, settings, meaning=manifest.meaning)
        title = "When the frame forms: the training phases across depth, width and the hypothesis space"
        summary = (
            f"A measurement at {manifest.scale} scale, beyond the paper (its future work): {len(runs)} training runs of small "
            "transformers on the bijection and the HMM, over depth, width and the size of the hypothesis space and under "
            "three training knobs, each configuration over several seeds."
        )
    else:
        sections = _claims_sections(out, results, manifest.scale, runs, pending=bool(manifest.not_yet_run), beside=other,
                                    meaning=manifest.meaning)
        title = "Bayesian wind tunnels: reproduction report"
        summary = (
            f"A reproduction of 'The Bayesian Geometry of Transformer Attention' (arXiv 2512.22471) at {manifest.scale} "
            f"scale: {len(runs)} training runs, {sum(len(v) for v in results.values())} analyses. Numbers are "
            f"{manifest.scale}-scale and are compared with the paper's in the claim table; 'holds?' applies the stated "
            "criterion."
        )
        if manifest.not_yet_run:
            summary += (f" The folder is filled one slice of runs at a time: {len(manifest.not_yet_run)} of the "
                        f"{len(manifest.planned)} planned runs are not yet run, and the claims that read them say so.")
    try:
        sections.append(_runs_section(runs, plateau=manifest.study == "claims", not_yet_run=manifest.not_yet_run))
    except MetricsError as error:  # a damaged history (it names the file and line)
        raise ReportError(str(error)) from None
    scale = manifest.scale
    cuts = "\n\n".join(manifest.cuts) if manifest.cuts else "Nothing: this is the paper's protocol."
    sections.append(Section(f"What the {scale} scale cuts relative to the paper", cuts))
    metadata = {
        "scale": scale,
        "command": manifest.command,
        "wall time": f"{manifest.wall_s / 60:.1f} min",
        "expects": manifest.hardware,
    }
    return Report(title, summary, sections, metadata=metadata)


def _claims_sections(
    out: Path,
    results: Results,
    scale: str,
    runs: Sequence[RunRecord],
    *,
    pending: bool,
    beside: Beside | None = None,
    meaning: str,
) -> list[Section]:
    """The claims study's sections: the claim table, Table 1 and the paper's figures.
    ``meaning``: what the scale's verdicts mean, shown beside the claim table."""
    at_init = load_results(out, INIT_DIR)
    text = ("Each claim of the paper, the number it reports, ours, and the criterion that decides whether it holds here. "
            f"{tally(evaluate_claims(results), pending=pending)}.")
    short = stopped_early(runs)
    if short:
        text += (f" Runs stopped by their time limit before the protocol's steps: {'; '.join(short)}. Every number read "
                 "from them is of a shorter run than the paper's protocol.")
    tables = claim_tables(results, at_init, scale, pending=pending, beside=beside)
    sections = [Section("Claims", text, note=meaning, tables=list(tables))]
    sections.append(
        Section(
            "The paper's Table 1: error by model and horizon",
            "Every model at every horizon, with the context-free prior for reference.",
            tables=_table1(results),
        )
    )
    for title, paper_figure, text, figures in FIGURE_PLAN:
        made = [
            Figure(out / ANALYSIS_DIR / group / f"{name}.png", f"{title.split(':')[0]} — {group}", caption)
            for group, name, caption in figures
            if name in results.get(group, {})
        ]
        if made:
            sections.append(Section(figure_section_title(title, paper_figure), text, figures=made))
    return sections
