"""The phases study's report, from a reproduction's saved ``training_phases`` results.

``windtunnel reproduce --only phases`` trains small transformers over a grid of depth, width
and the size of the hypothesis space (the bijection's V, the HMM's S = M), and with one
training knob changed at a time, several seeds each. This module reads the saved per-run
phases and draws:

- **phase diagrams**: per tunnel, the plateau-exit step, the frame-formation step and the
  final error over depth x width (heat maps of the median over seeds, each cell annotated
  with the seeds' range and how many seeds left the plateau);
- **the size axis**: the same quantities, and the final geometry (key orthogonality against
  chance, PC1 share and its entropy correlation, attention entropy by layer), against V or S,
  every seed plotted;
- **what moves the exit**: per knob, the shift of the median exit step from the centre's,
  with a bootstrap interval over seeds (:func:`median_shift`);
- **the dissociation**: the fraction of runs in which the frame formed while the error still
  had to fall by the stated factor, per configuration and overall.

Seeds are never averaged into one curve without their spread beside it. It reads saved
results only.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np

from windtunnel.figures import save
from windtunnel.report.html import Figure, Section, Table
from windtunnel.results import AnalysisResult
from windtunnel.results.phases import PhaseRun, TrainingPhases
from windtunnel.studies import PHASES_CENTRE, PHASES_DEPTHS, PHASES_KNOBS, PHASES_SIZES, PHASES_WIDTHS, phases_preset_name

__all__ = ["BOOTSTRAP_SAMPLES", "median_shift", "phases_sections"]

#: Resamples of the seeds for the interval of a median shift.
BOOTSTRAP_SAMPLES = 2000


def median_shift(
    base: Sequence[float], changed: Sequence[float], *, samples: int = BOOTSTRAP_SAMPLES, seed: int = 0
) -> tuple[float, float, float]:
    """The median of ``changed`` minus the median of ``base``, and its 95% percentile-bootstrap
    interval (each sample resamples both sets of seeds with replacement)."""
    if not base or not changed:
        raise ValueError("a median shift needs at least one value on each side")
    rng = random.Random(seed)
    shift = statistics.median(changed) - statistics.median(base)
    draws = sorted(
        statistics.median(rng.choices(changed, k=len(changed))) - statistics.median(rng.choices(base, k=len(base)))
        for _ in range(samples)
    )
    return shift, draws[int(0.025 * (samples - 1))], draws[int(0.975 * (samples - 1))]


def _phases(results: Mapping[str, Mapping[str, AnalysisResult]], name: str) -> TrainingPhases | None:
    result = results.get(name, {}).get("training_phases")
    return result if isinstance(result, TrainingPhases) else None


def _values(runs: Sequence[PhaseRun], field: str) -> list[float]:
    return [float(getattr(run, field)) for run in runs if getattr(run, field) is not None]


def _median_range(values: Sequence[float], fmt: str = "{:.3g}") -> str | None:
    if not values:
        return None
    return f"{fmt.format(statistics.median(values))} [{fmt.format(min(values))}, {fmt.format(max(values))}]"


def _left(runs: Sequence[PhaseRun]) -> str:
    return f"{sum(run.left_plateau for run in runs)}/{len(runs)}"


def _heatmaps(tunnel: str, grid: Mapping[tuple[int, int], TrainingPhases], path: Path) -> None:
    """Exit step, frame step and final mae_bits over depth x width: medians, annotated with the range."""
    fields = (("exit_step", "plateau exit step", "{:.0f}"), ("frame_step", "frame formed (step)", "{:.0f}"),
              ("final_mae_bits", "final mae_bits", "{:.2g}"))
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.9))
    for ax, (field, title, fmt) in zip(axes, fields):
        medians = np.full((len(PHASES_DEPTHS), len(PHASES_WIDTHS)), np.nan)
        for i, depth in enumerate(PHASES_DEPTHS):
            for j, width in enumerate(PHASES_WIDTHS):
                result = grid.get((depth, width))
                values = _values(result.runs, field) if result else []
                if values:
                    medians[i, j] = statistics.median(values)
                text = "not run" if result is None else (
                    "none" if not values else f"{fmt.format(statistics.median(values))}\n"
                    f"[{fmt.format(min(values))}, {fmt.format(max(values))}]\n{len(values)}/{len(result.runs)} seeds")
                ax.text(j, i, text, ha="center", va="center", fontsize=7)
        shown = np.log10(medians) if field == "final_mae_bits" else medians
        image = ax.imshow(np.ma.masked_invalid(shown), cmap="viridis_r", aspect="auto", alpha=0.6)
        fig.colorbar(image, ax=ax, fraction=0.046, label=("log10 " if field == "final_mae_bits" else "") + title)
        ax.set_xticks(range(len(PHASES_WIDTHS)), [f"d {w}" for w in PHASES_WIDTHS])
        ax.set_yticks(range(len(PHASES_DEPTHS)), [f"{d} layer{'s' if d > 1 else ''}" for d in PHASES_DEPTHS])
        ax.set_title(title, fontsize=9)
    fig.suptitle(f"{tunnel}: median over seeds [range], seeds that have the value", fontsize=10)
    save(fig, path)


def _size_axis(tunnel: str, sizes: Mapping[int, TrainingPhases], path: Path) -> None:
    """Every seed's exit step, frame step, final error and final geometry against the size."""
    letter = PHASES_SIZES[tunnel][0]
    panels = (("exit_step", "plateau exit step"), ("frame_step", "frame formed (step)"), ("final_mae_bits", "final mae_bits"),
              ("key_cos_layer0", "layer-0 key mean |cos|"), ("pc1_variance_explained", "residual PC1 share"),
              ("pc1_entropy_spearman_abs", "|Spearman ρ| (PC1, H_Bayes)"))
    fig, axes = plt.subplots(2, 3, figsize=(12, 6.4))
    for ax, (field, title) in zip(axes.flat, panels):
        for size, result in sorted(sizes.items()):
            values = _values(result.runs, field)
            ax.plot([size] * len(values), values, "o", color="#4c72b0", alpha=0.6, ms=5)
            if values:
                ax.plot([size - 0.3, size + 0.3], [statistics.median(values)] * 2, color="black", lw=2)
            if field == "key_cos_layer0" and result.runs and result.runs[0].key_cos_chance is not None:
                ax.plot([size - 0.4, size + 0.4], [result.runs[0].key_cos_chance] * 2, color="grey", ls=":", lw=1.5)
        if field == "final_mae_bits":
            ax.set_yscale("log")
        ax.set_xticks(sorted(sizes))
        ax.set_xlabel(letter)
        ax.set_title(title + (" (dotted: chance)" if field == "key_cos_layer0" else ""), fontsize=9)
    fig.suptitle(f"{tunnel}: each seed (dots) and the median (bar), against {letter}", fontsize=10)
    save(fig, path)


def _grid_table(tunnel: str, results: Mapping[str, Mapping[str, AnalysisResult]]) -> Table:
    rows = []
    letter, sizes = PHASES_SIZES[tunnel]
    centre = PHASES_CENTRE[tunnel]
    points = [(n, d, centre) for n in PHASES_DEPTHS for d in PHASES_WIDTHS]
    points += [(PHASES_CENTRE["n_layers"], PHASES_CENTRE["d_model"], s) for s in sizes if s != centre]
    for n, d, s in points:
        result = _phases(results, phases_preset_name(tunnel, n, d, s))
        if result is None:
            rows.append([n, d, s, "not run", None, None, None, None, None])
            continue
        runs = result.runs
        rows.append([n, d, s, _left(runs), _median_range(_values(runs, "exit_step"), "{:.0f}"),
                     _median_range(_values(runs, "frame_step"), "{:.0f}"), _median_range(_values(runs, "slope_after_exit"), "{:.2f}"),
                     _median_range(_values(runs, "final_kl_bits")), _dissociation_cell(runs)])
    return Table(["layers", "d_model", letter, "left plateau", "exit step", "frame step", "slope after exit",
                  "final kl_bits", "dissociation"], rows,
                 caption="Median over seeds [min, max]; a seed that never left its plateau has no exit step, one whose "
                         "attention never settled no frame step. Slope: of log10 mae_bits on log10 step after the exit.")


def _dissociation_cell(runs: Sequence[PhaseRun]) -> str:
    judged = [run.dissociation for run in runs if run.dissociation is not None]
    return f"{sum(judged)}/{len(judged)}" if judged else "no frame"


def _knob_table(tunnel: str, results: Mapping[str, Mapping[str, AnalysisResult]]) -> Table | None:
    n, d, centre = PHASES_CENTRE["n_layers"], PHASES_CENTRE["d_model"], PHASES_CENTRE[tunnel]
    base = _phases(results, phases_preset_name(tunnel, n, d, centre))
    if base is None:
        return None
    base_exits = _values(base.runs, "exit_step")
    rows: list[list[Any]] = [["centre (none changed)", _left(base.runs), _median_range(base_exits, "{:.0f}"), None, None]]
    for knob, override in PHASES_KNOBS[tunnel].items():
        changed = _phases(results, phases_preset_name(tunnel, n, d, centre, knob))
        if changed is None:
            rows.append([override, "not run", None, None, None])
            continue
        exits = _values(changed.runs, "exit_step")
        if base_exits and exits:
            shift, low, high = median_shift(base_exits, exits)
            moved = "earlier" if high < 0 else "later" if low > 0 else "no shift outside the interval"
            rows.append([override, _left(changed.runs), _median_range(exits, "{:.0f}"), f"{shift:+.0f} [{low:+.0f}, {high:+.0f}]", moved])
        else:
            rows.append([override, _left(changed.runs), _median_range(exits, "{:.0f}"), None, "too few exits to compare"])
    return Table(["knob (changed at the centre)", "left plateau", "exit step", "median shift [95% CI]", "reading"], rows,
                 caption="Exit step: median over the seeds that left [min, max]. The shift of the median against the centre's, "
                         f"with a {BOOTSTRAP_SAMPLES}-sample percentile bootstrap over seeds; a seed that never left is "
                         "not in the medians, so compare the 'left plateau' counts too.")


def dissociation_summary(results: Mapping[str, Mapping[str, AnalysisResult]]) -> dict[str, tuple[int, int, int, int]]:
    """Per tunnel: (runs where the dissociation holds, runs with a frame step, runs whose frame formed
    at or before their exit, runs with both a frame and an exit step)."""
    summary: dict[str, tuple[int, int, int, int]] = {}
    for tunnel in PHASES_SIZES:
        found = [_phases(results, name) for name in results if name.startswith(f"{tunnel}_")]
        runs = [run for result in found if result is not None for run in result.runs]
        judged = [run.dissociation for run in runs if run.dissociation is not None]
        ordered = [run.frame_before_exit for run in runs if run.frame_before_exit is not None]
        summary[tunnel] = (sum(judged), len(judged), sum(ordered), len(ordered))
    return summary


def phases_sections(results: Mapping[str, Mapping[str, AnalysisResult]], analysis_dir: Path, figures_dir: Path,
                    *, meaning: str = "") -> list[Section]:
    """The report's sections: per tunnel the phase diagrams, the size axis, the grid table and the
    knobs; then the dissociation across the grid. ``figures_dir`` receives the diagrams."""
    figures_dir.mkdir(parents=True, exist_ok=True)
    sections = []
    for tunnel, (letter, sizes) in PHASES_SIZES.items():
        centre = PHASES_CENTRE[tunnel]
        grid = {(n, d): r for n in PHASES_DEPTHS for d in PHASES_WIDTHS
                if (r := _phases(results, phases_preset_name(tunnel, n, d, centre))) is not None}
        by_size = {s: r for s in sizes
                   if (r := _phases(results, phases_preset_name(tunnel, PHASES_CENTRE["n_layers"], PHASES_CENTRE["d_model"], s))) is not None}
        if not grid and not by_size:
            continue
        figures = []
        if grid:
            _heatmaps(tunnel, grid, figures_dir / f"{tunnel}_depth_width.png")
            figures.append(Figure(figures_dir / f"{tunnel}_depth_width.png", f"{tunnel}: depth x width at {letter} = {centre}",
                                  "Median over seeds, with the range and the number of seeds that have the value."))
        if by_size:
            _size_axis(tunnel, by_size, figures_dir / f"{tunnel}_size.png")
            figures.append(Figure(figures_dir / f"{tunnel}_size.png", f"{tunnel}: against {letter} (2 layers, d_model 48)",
                                  "Every seed; the bar is the median. The dotted line is the mean |cos| of random keys of the head width."))
        centre_name = phases_preset_name(tunnel, PHASES_CENTRE["n_layers"], PHASES_CENTRE["d_model"], centre)
        curve = analysis_dir / centre_name / "training_phases.png"
        if curve.is_file():
            figures.append(Figure(curve, f"{tunnel}: the centre's seeds", "Each seed's held-out error; circle: exit; triangle: frame formed."))
        tables = [_grid_table(tunnel, results)]
        knobs = _knob_table(tunnel, results)
        if knobs is not None:
            tables.append(knobs)
        sections.append(Section(
            f"Phases of the {tunnel} tunnel",
            "When each run's held-out error leaves its plateau (half of the way down to its final error on a log scale), "
            "when its attention frame forms (the attention stays within the threshold of the final model's), how fast "
            "the error falls after, and the final error, over depth x width and the size of the hypothesis space; "
            "then three training knobs changed one at a time at the centre of the grid.",
            note=meaning if not sections else "", figures=figures, tables=tables))
    summary = dissociation_summary(results)
    factors = sorted({result.dissociation_factor for name in results if (result := _phases(results, name)) is not None})
    rows = [[tunnel, f"{held}/{judged}", f"{held / judged:.0%}" if judged else None, f"{ordered}/{both}"]
            for tunnel, (held, judged, ordered, both) in summary.items() if judged or both]
    if rows:
        total_held = sum(v[0] for v in summary.values())
        total_judged = sum(v[1] for v in summary.values())
        sections.append(Section(
            "The frame-precision dissociation across the grid",
            "Does attention settle before precision improves in every configuration? A run shows the dissociation when "
            f"its frame formed while its error was still at least {' or '.join(f'{f:g}' for f in factors)} times its final error. "
            f"Across every run with a frame: {total_held}/{total_judged}. The per-configuration counts are in each "
            "tunnel's table; 'frame before exit' counts the runs whose frame formed at or before their plateau exit.",
            tables=[Table(["tunnel", "dissociation holds", "share", "frame before exit"], rows)],
        ))
    return sections
