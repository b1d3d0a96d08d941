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
results only: the grid from the groups' names (``hmm_L2_d48_S3``, a knob changed at the centre
``hmm_L2_d48_S3_lr``, as the study names its presets) and each knob's value from the runs' saved
configs (:func:`knob_settings`).
"""

from __future__ import annotations

import json
import random
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np

from windtunnel.figures import save
from windtunnel.report.html import Figure, Section, Table
from windtunnel.results import AnalysisResult
from windtunnel.results.phases import PhaseRun, TrainingPhases
from windtunnel.run_layout import CONFIG_FILE

__all__ = ["BOOTSTRAP_SAMPLES", "KNOB_SETTINGS", "PHASE_DIAGRAMS_DIR", "Grid", "dissociation_summary", "draw_phase_diagrams", "knob_settings", "median_shift", "parse_grid", "phases_sections"]

#: The training settings a knob can change, as ``section.key`` of a run's saved config.
KNOB_SETTINGS = ("model.init_std", "train.lr", "train.batch_size")
_NAME = re.compile(r"^(?P<tunnel>[a-z]+)_L(?P<n_layers>\d+)_d(?P<d_model>\d+)_(?P<letter>[A-Z])(?P<size>\d+)(?:_(?P<knob>\w+))?$")


@dataclass(frozen=True)
class Grid:
    """One tunnel's configurations in a phases reproduction, read from its group names.

    Attributes:
        tunnel: the tunnel's name; letter: its size parameter (``V``, ``S``).
        points: ``{(n_layers, d_model, size): group}`` of the configurations without a knob changed.
        knobs: ``{knob: group}`` of the centre with one knob changed.
        centre: ``(n_layers, d_model, size)`` the knobs are changed at (the depth x width plane is
            at its size; the size axis at its depth and width).
    """

    tunnel: str
    letter: str
    points: dict[tuple[int, int, int], str]
    knobs: dict[str, str]
    centre: tuple[int, int, int]

    def depths(self) -> list[int]:
        return sorted({n for n, _, _ in self.points})

    def widths(self) -> list[int]:
        return sorted({d for _, d, _ in self.points})

    def sizes(self) -> list[int]:
        n, d, _ = self.centre
        return sorted({s for pn, pd, s in self.points if (pn, pd) == (n, d)})


def knob_settings(run_dirs: Mapping[str, Path]) -> dict[str, dict[str, Any]]:
    """Per group, the :data:`KNOB_SETTINGS` of the saved config in its run directory (one seed's:
    seeds differ in nothing else); a group whose config is unreadable is left out."""
    settings = {}
    for group, run_dir in run_dirs.items():
        try:
            config = json.loads((Path(run_dir) / CONFIG_FILE).read_text())
            settings[group] = {key: config[key.split(".")[0]][key.split(".")[1]] for key in KNOB_SETTINGS}
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return settings


def parse_grid(names: Sequence[str]) -> list[Grid]:
    """The grids of the phases groups among ``names``, per tunnel in first-seen order; the centre is
    where the knobs are changed, else the median depth, width and size."""
    found: dict[str, dict[str, Any]] = {}
    for name in names:
        match = _NAME.match(name)
        if not match:
            continue
        tunnel = match["tunnel"]
        entry = found.setdefault(tunnel, {"letter": match["letter"], "points": {}, "knobs": {}, "knob_at": None})
        point = (int(match["n_layers"]), int(match["d_model"]), int(match["size"]))
        if match["knob"]:
            entry["knobs"][match["knob"]] = name
            entry["knob_at"] = point
        else:
            entry["points"][point] = name
    grids = []
    for tunnel, entry in found.items():
        points = entry["points"]

        def middle(i: int) -> int:
            values = sorted({p[i] for p in points}) or [0]
            return values[(len(values) - 1) // 2]

        centre = entry["knob_at"] or (middle(0), middle(1), middle(2))
        grids.append(Grid(tunnel, entry["letter"], points, entry["knobs"], centre))
    return grids

#: Where in a reproduction's report folder the phase diagrams are drawn.
PHASE_DIAGRAMS_DIR = "phases"
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


def _phases(results: Mapping[str, Mapping[str, AnalysisResult]], name: str | None) -> TrainingPhases | None:
    """The group's phases (None where ``name`` is None, a grid point not trained, or has none)."""
    result = results.get(name, {}).get("training_phases")
    return result if isinstance(result, TrainingPhases) else None


def _values(runs: Sequence[PhaseRun], field: str) -> list[float]:
    return [float(getattr(run, field)) for run in runs if getattr(run, field) is not None]


def _median_range(values: Sequence[float], fmt: str = "{:.3g}") -> str | None:
    if not values:
        return None
    return f"{fmt.format(statistics.median(values))} [{fmt.format(min(values))}, {fmt.format(max(values))}]"


def _left(runs: Sequence[PhaseRun]) -> str:
    """Seeds that left their plateau / seeds, and how many had none (their error fell from the start)."""
    none = sum(run.left_plateau is None for run in runs)
    return f"{sum(bool(run.left_plateau) for run in runs)}/{len(runs)}" + (f" ({none} no plateau)" if none else "")


def _heatmaps(grid: Grid, results: Mapping[str, Mapping[str, AnalysisResult]], path: Path) -> None:
    """Exit step, frame step and final mae_bits over depth x width at the centre's size: medians,
    annotated with the range and how many seeds have the value."""
    depths, widths, size = grid.depths(), grid.widths(), grid.centre[2]
    fields = (("learning_step", "learning step (half-way)", "{:.0f}"), ("exit_step", "plateau exit step", "{:.0f}"),
              ("frame_step", "frame formed (step)", "{:.0f}"), ("final_mae_bits", "final mae_bits", "{:.2g}"))
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.9))
    for ax, (field, title, fmt) in zip(axes, fields):
        medians = np.full((len(depths), len(widths)), np.nan)
        for i, depth in enumerate(depths):
            for j, width in enumerate(widths):
                result = _phases(results, grid.points.get((depth, width, size)))
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
        ax.set_xticks(range(len(widths)), [f"d {w}" for w in widths])
        ax.set_yticks(range(len(depths)), [f"{d} layer{'s' if d > 1 else ''}" for d in depths])
        ax.set_title(title, fontsize=9)
    fig.suptitle(f"{grid.tunnel} at {grid.letter} = {size}: median over seeds [range], seeds that have the value", fontsize=10)
    save(fig, path)


def _size_axis(grid: Grid, results: Mapping[str, Mapping[str, AnalysisResult]], path: Path) -> None:
    """Every seed's exit step, frame step, final error and final geometry against the size."""
    n, d, _ = grid.centre
    panels = (("learning_step", "learning step (half-way)"), ("exit_step", "plateau exit step"),
              ("frame_step", "frame formed (step)"), ("final_mae_bits", "final mae_bits"),
              ("key_cos_layer0", "layer-0 key mean |cos|"), ("pc1_variance_explained", "residual PC1 share"),
              ("pc1_entropy_spearman_abs", "|Spearman ρ| (PC1, H_Bayes)"), ("plateau_mae_bits", "plateau mae_bits"))
    fig, axes = plt.subplots(2, 4, figsize=(16, 6.4))
    sizes = grid.sizes()
    for ax, (field, title) in zip(axes.flat, panels):
        for size in sizes:
            result = _phases(results, grid.points[(n, d, size)])
            if result is None:
                continue
            values = _values(result.runs, field)
            ax.plot([size] * len(values), values, "o", color="#4c72b0", alpha=0.6, ms=5)
            if values:
                ax.plot([size - 0.3, size + 0.3], [statistics.median(values)] * 2, color="black", lw=2)
            if field == "key_cos_layer0" and result.runs and result.runs[0].key_cos_chance is not None:
                ax.plot([size - 0.4, size + 0.4], [result.runs[0].key_cos_chance] * 2, color="grey", ls=":", lw=1.5)
        if field == "final_mae_bits":
            ax.set_yscale("log")
        ax.set_xticks(sizes)
        ax.set_xlabel(grid.letter)
        ax.set_title(title + (" (dotted: chance)" if field == "key_cos_layer0" else ""), fontsize=9)
    fig.suptitle(f"{grid.tunnel} ({n} layers, d_model {d}): each seed (dots) and the median (bar), against {grid.letter}",
                 fontsize=10)
    save(fig, path)


def _dissociation_cell(runs: Sequence[PhaseRun]) -> str:
    judged = [run.dissociation for run in runs if run.dissociation is not None]
    return f"{sum(judged)}/{len(judged)}" if judged else "no frame"


def _grid_table(grid: Grid, results: Mapping[str, Mapping[str, AnalysisResult]]) -> Table:
    rows = []
    for (n, d, size), name in sorted(grid.points.items(), key=lambda item: (item[0][2] != grid.centre[2], item[0])):
        result = _phases(results, name)
        if result is None:
            rows.append([n, d, size, None, "not analyzed", None, None, None, None, None])
            continue
        runs = result.runs
        rows.append([n, d, size, _median_range(_values(runs, "learning_step"), "{:.0f}"), _left(runs),
                     _median_range(_values(runs, "exit_step"), "{:.0f}"),
                     _median_range(_values(runs, "frame_step"), "{:.0f}"), _median_range(_values(runs, "slope_after_exit"), "{:.2f}"),
                     _median_range(_values(runs, "final_kl_bits")), _dissociation_cell(runs)])
    return Table(["layers", "d_model", grid.letter, "learning step", "left plateau", "exit step", "frame step", "slope after exit",
                  "final kl_bits", "dissociation"], rows,
                 caption="Median over seeds [min, max]. Learning step: where the error is half of the way (log scale) from "
                         "the first evaluation's to the final one's. A seed that never left its plateau, or had none, has "
                         "no exit step; one whose "
                         "attention never settled (or never moved from its initial pattern) no frame step. Slope: of "
                         "log10 mae_bits on log10 step after the exit. Dissociation: runs where it holds / runs with a frame.")


def _setting_text(settings: Mapping[str, Any] | None, knob: str) -> str:
    """``knob`` and, where the saved configs say, the setting it changed: ``lr: train.lr 2e-3 (centre 5e-3)``."""
    if not settings:
        return knob
    return f"{knob}: {settings['changed']}"


def _shift(base: Sequence[float], changed: Sequence[float], what: str) -> list[Any]:
    """The median shift with its interval and its reading, or why there is none."""
    if not base or not changed:
        return [None, f"too few {what} to compare"]
    shift, low, high = median_shift(base, changed)
    moved = "earlier" if high < 0 else "later" if low > 0 else "no shift beyond the interval"
    return [f"{shift:+.0f} [{low:+.0f}, {high:+.0f}]", moved]


def _knob_table(grid: Grid, results: Mapping[str, Mapping[str, AnalysisResult]],
                settings: Mapping[str, Mapping[str, Any]]) -> Table | None:
    base = _phases(results, grid.points.get(grid.centre, ""))
    if base is None or not grid.knobs:
        return None
    base_exits, base_learning = _values(base.runs, "exit_step"), _values(base.runs, "learning_step")
    rows: list[list[Any]] = [["centre (nothing changed)", _left(base.runs), _median_range(base_exits, "{:.0f}"), None, None,
                              _median_range(base_learning, "{:.0f}"), None, None]]
    for knob, name in grid.knobs.items():
        changed = _phases(results, name)
        label = _setting_text(_changed_setting(settings.get(grid.points[grid.centre]), settings.get(name)), knob)
        if changed is None:
            rows.append([label, "not analyzed", None, None, None, None, None, None])
            continue
        exits, learning = _values(changed.runs, "exit_step"), _values(changed.runs, "learning_step")
        rows.append([label, _left(changed.runs), _median_range(exits, "{:.0f}"), *_shift(base_exits, exits, "exits"),
                     _median_range(learning, "{:.0f}"), *_shift(base_learning, learning, "learning steps")])
    return Table(["knob (changed at the centre)", "left plateau", "exit step", "median shift [95% CI]", "reading",
                  "learning step", "its median shift [95% CI]", "its reading"], rows,
                 caption="Exit and learning steps: median over the seeds that have one [min, max]. Each shift is of the "
                         f"median against the centre's, with a {BOOTSTRAP_SAMPLES}-sample percentile bootstrap over seeds; "
                         "a seed that never left its plateau is not in the exit medians, so read the 'left plateau' "
                         "counts beside them.")


def _changed_setting(centre: Mapping[str, Any] | None, knob: Mapping[str, Any] | None) -> dict[str, str] | None:
    """The setting that differs between the centre's saved config and the knob's, in words."""
    if not centre or not knob:
        return None
    differ = [key for key in KNOB_SETTINGS if centre.get(key) != knob.get(key)]
    if not differ:
        return None
    return {"changed": "; ".join(f"{key} {knob[key]:g} (centre {centre[key]:g})" for key in differ)}


def dissociation_summary(results: Mapping[str, Mapping[str, AnalysisResult]]) -> dict[str, tuple[int, int, int, int]]:
    """Per tunnel: (runs where the dissociation holds, runs with a frame step, runs whose frame formed
    at or before their exit, runs with both a frame and an exit step)."""
    summary: dict[str, tuple[int, int, int, int]] = {}
    for grid in parse_grid(list(results)):
        names = [*grid.points.values(), *grid.knobs.values()]
        runs = [run for name in names if (result := _phases(results, name)) is not None for run in result.runs]
        judged = [run.dissociation for run in runs if run.dissociation is not None]
        ordered = [run.frame_before_exit for run in runs if run.frame_before_exit is not None]
        summary[grid.tunnel] = (sum(judged), len(judged), sum(ordered), len(ordered))
    return summary


def _diagrams(grid: Grid, figures_dir: Path) -> list[tuple[Figure, Any]]:
    """The phase diagrams of ``grid`` (a Figure each, and the function that draws it from the results)."""
    n, d, size = grid.centre
    diagrams = []
    if len(grid.depths()) > 1 or len(grid.widths()) > 1:
        diagrams.append((Figure(figures_dir / f"{grid.tunnel}_depth_width.png", f"{grid.tunnel}: depth x width at {grid.letter} = {size}",
                                "Median over seeds, with the range and the number of seeds that have the value."), _heatmaps))
    if len(grid.sizes()) > 1:
        diagrams.append((Figure(figures_dir / f"{grid.tunnel}_size.png", f"{grid.tunnel}: against {grid.letter} ({n} layers, d_model {d})",
                                "Every seed; the bar is the median. The dotted line is the mean |cos| of random keys of the head width."),
                         _size_axis))
    return diagrams


def draw_phase_diagrams(results: Mapping[str, Mapping[str, AnalysisResult]], figures_dir: Path) -> list[Path]:
    """Draw every tunnel's phase diagrams into ``figures_dir`` (what :func:`phases_sections` shows); returns their paths."""
    figures_dir.mkdir(parents=True, exist_ok=True)
    drawn = []
    for grid in parse_grid(list(results)):
        for figure, draw in _diagrams(grid, figures_dir):
            draw(grid, results, figure.path)
            drawn.append(figure.path)
    return drawn


def phases_sections(results: Mapping[str, Mapping[str, AnalysisResult]], analysis_dir: Path, figures_dir: Path,
                    settings: Mapping[str, Mapping[str, Any]] | None = None, *, meaning: str = "") -> list[Section]:
    """The report's sections: per tunnel the phase diagrams (in ``figures_dir``, drawn by
    :func:`draw_phase_diagrams`; nothing is written here), the size axis, the grid table and the
    knobs; then the dissociation across the grid. ``settings``: per group, the :data:`KNOB_SETTINGS`
    of its runs' saved config (to name what each knob changed)."""
    settings = settings or {}
    sections = []
    for grid in parse_grid(list(results)):
        figures = [figure for figure, _ in _diagrams(grid, figures_dir)]
        curve = analysis_dir / grid.points.get(grid.centre, "") / "training_phases.png"
        if grid.centre in grid.points and curve.is_file():
            figures.append(Figure(curve, f"{grid.tunnel}: the centre's seeds", "Each seed's held-out error; circle: exit; triangle: frame formed."))
        tables = [_grid_table(grid, results)]
        knobs = _knob_table(grid, results, settings)
        if knobs is not None:
            tables.append(knobs)
        sections.append(Section(
            f"Phases of the {grid.tunnel} tunnel",
            "When each run's held-out error leaves its plateau (half of the way down to its final error on a log scale), "
            "when its attention frame forms (the attention stays within the threshold of the final model's), how fast "
            "the error falls after, and the final error, over depth x width and the size of the hypothesis space; "
            "then training knobs changed one at a time at the centre of the grid.",
            note=meaning if not sections else "", figures=figures, tables=tables))
    summary = dissociation_summary(results)
    factors = sorted({result.dissociation_factor for name in results if (result := _phases(results, name)) is not None})
    rows = [[tunnel, f"{held}/{judged}", f"{held / judged:.0%}" if judged else None, f"{ordered}/{both}"]
            for tunnel, (held, judged, ordered, both) in summary.items()]
    if rows:
        total_held = sum(v[0] for v in summary.values())
        total_judged = sum(v[1] for v in summary.values())
        sections.append(Section(
            "The frame-precision dissociation across the grid",
            "Does attention settle before precision improves in every configuration? A run shows the dissociation when "
            f"its frame formed while its error was still at least {' or '.join(f'{f:g}' for f in factors)} times its "
            f"final error. Across every run with a frame: {total_held}/{total_judged}. The per-configuration counts are "
            "in each tunnel's table; 'frame before exit' counts the runs whose frame formed at or before their plateau exit.",
            tables=[Table(["tunnel", "dissociation holds", "share", "frame before exit"], rows)],
        ))
    return sections
