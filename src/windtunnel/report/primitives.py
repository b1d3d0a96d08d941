"""The primitives table of the paper's later versions, from a reproduction's saved analyses.

``windtunnel reproduce --only architectures`` trains every architecture on every tunnel and
compares them per tunnel (``analysis/<tunnel>/model_comparison.json``: Table 1 of that
tunnel, each run's error with its bootstrap interval, the parameter counts, and the
inference primitive the tunnel declares). This module turns those saved files into the
architecture-by-primitive table, each cell judged by one stated criterion beside the
paper's verdict. It reads saved results only, like the rest of the report.

The criterion (:func:`cell_verdict`): a model *realizes* a primitive on a tunnel when it
closes at least :data:`REALIZES` of the gap between the context-free prior (the best
prediction without looking at other tokens, what a model that never reads its context
scores) and the exact posterior, on both the paper's metric (``mae_bits``) and ``kl_bits``;
it *fails* when it closes less than :data:`FAILS` of it on either; in between it realizes it
*partly*. Both metrics must agree because entropy alone can be matched by a wrong
distribution: a point mass on the wrong value has the right entropy at a stored key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from windtunnel.report.html import Figure, Section, Table
from windtunnel.results import AnalysisResult, Summary
from windtunnel.results.generalization import ModelComparison, RunScores

__all__ = [
    "FAILS",
    "PAPER",
    "PRIMITIVES",
    "REALIZES",
    "PaperVerdict",
    "PrimitiveCell",
    "cell_verdict",
    "gap_closed",
    "primitive_cells",
    "primitive_sections",
    "primitive_verdict",
]

#: The three inference primitives, in the paper's order (each tunnel declares its own).
PRIMITIVES = ("belief accumulation", "belief transport", "random-access binding")
#: The architectures in the paper's order; families it does not name follow in the order seen.
ARCHITECTURE_ORDER = ("transformer", "mamba", "lstm", "mlp")

#: Fraction of the prior-to-Bayes gap a model must close, on both metrics, to realize a primitive.
REALIZES = 0.9
#: Below this fraction, on either metric, it fails the primitive.
FAILS = 0.5

#: The verdicts in the order of merit (a primitive's verdict over its tunnels is the worst).
VERDICTS = ("realizes", "partly", "fails")


@dataclass(frozen=True)
class PaperVerdict:
    """The paper's verdict on one architecture and primitive, and its published number."""

    verdict: str
    number: str


#: The paper's verdicts (arXiv 2512.22471 v3+ abstract: the transformer realizes all three
#: primitives, Mamba accumulation and transport and "struggles" with binding, the LSTM
#: accumulation only, the MLP none) and the authors' published numbers where there are any
#: (their README and jlens note; docs/protocol.md §7). Their Mamba is a
#: simplified hand-written block; ours is the published one.
PAPER: dict[tuple[str, str], PaperVerdict] = {
    ("transformer", "belief accumulation"): PaperVerdict("realizes", "0.007 mae_bits (bijection V = 20)"),
    ("transformer", "belief transport"): PaperVerdict("realizes", "7.5e-5 mae_bits (HMM, K = 20)"),
    ("transformer", "random-access binding"): PaperVerdict("realizes", "no number published"),
    ("mamba", "belief accumulation"): PaperVerdict("realizes", "0.010-0.013 mae_bits (bijection V = 20)"),
    ("mamba", "belief transport"): PaperVerdict("realizes", "0.024 mae_bits (HMM, K = 20)"),
    ("mamba", "random-access binding"): PaperVerdict("partly", "\"struggles\"; no number published"),
    ("lstm", "belief accumulation"): PaperVerdict("realizes", "0.009-0.018 mae_bits (bijection V = 20)"),
    ("lstm", "belief transport"): PaperVerdict("fails", "\"fails\"; no number published"),
    ("lstm", "random-access binding"): PaperVerdict("fails", "no number published"),
    ("mlp", "belief accumulation"): PaperVerdict("fails", "1.85 mae_bits (bijection V = 20)"),
    ("mlp", "belief transport"): PaperVerdict("fails", "0.40 mae_bits (HMM)"),
    ("mlp", "random-access binding"): PaperVerdict("fails", "no number published"),
}


def gap_closed(value: float, prior: float) -> float:
    """The fraction of the context-free prior's error that ``value`` removes: 1 at the exact
    posterior, 0 at the prior, negative when worse than the prior."""
    if prior <= 0.0:
        raise ValueError(f"the prior's error must be positive, got {prior}: a tunnel whose prior is exact tests nothing")
    return 1.0 - value / prior


def cell_verdict(mae_bits: float, kl_bits: float, prior_mae_bits: float, prior_kl_bits: float) -> str:
    """``realizes``, ``partly`` or ``fails`` (see the module docstring): the smaller of the
    two metrics' fractions of the prior's gap closed, against :data:`REALIZES` and :data:`FAILS`."""
    closed = min(gap_closed(mae_bits, prior_mae_bits), gap_closed(kl_bits, prior_kl_bits))
    if closed >= REALIZES:
        return "realizes"
    return "partly" if closed >= FAILS else "fails"


def primitive_verdict(verdicts: Sequence[str]) -> str:
    """A primitive's verdict over its tunnels (the binding one has two sizes): the worst."""
    if not verdicts:
        raise ValueError("a primitive's verdict needs at least one tunnel's")
    return max(verdicts, key=VERDICTS.index)


@dataclass(frozen=True)
class PrimitiveCell:
    """One architecture on one tunnel, as the table shows it.

    Attributes:
        mae_bits, kl_bits: the median over seeds (one seed: that run's value).
        mae_range, kl_range: ``(low, high)``: the smallest and largest seed's value with
            several seeds, else the run's 95% bootstrap interval over sequences.
        interval: what the ranges are (``"seeds"`` or ``"95% bootstrap"``).
        closed: the fraction of the prior's gap closed (the smaller of the two metrics').
        verdict: :func:`cell_verdict` of the medians.
        seed_verdicts: :func:`cell_verdict` of each seed's run, in seed order.
    """

    architecture: str
    n_runs: int
    n_parameters: int
    mae_bits: float
    kl_bits: float
    mae_range: tuple[float, float]
    kl_range: tuple[float, float]
    interval: str
    closed: float
    verdict: str
    seed_verdicts: tuple[str, ...] = ()

    @property
    def seeds_split(self) -> str:
        """How the seeds' own verdicts split where they disagree (``"2 realize, 1 fails"``), else ""."""
        counts = {v: self.seed_verdicts.count(v) for v in VERDICTS if v in self.seed_verdicts}
        if len(counts) < 2:
            return ""
        plural = {"realizes": "realize", "partly": "partly", "fails": "fail"}
        return ", ".join(f"{n} {plural[v] if n > 1 else v}" for v, n in counts.items())


def _range(stats: Summary, per_run: Sequence[RunScores], metric: str) -> tuple[tuple[float, float], str]:
    if len(per_run) > 1:
        return (stats.min, stats.max), "seeds"
    low, high = getattr(per_run[0], f"{metric}_ci")
    return (low, high), "95% bootstrap"


def primitive_cells(comparison: ModelComparison) -> tuple[dict[str, float], list[PrimitiveCell]]:
    """The prior row (``mae_bits``, ``kl_bits``) and one cell per architecture of a tunnel's
    saved ``model_comparison`` result, at its training horizon."""
    horizon = comparison.training_horizon
    models = comparison.models
    first = next(iter(models.values())).horizons[horizon]
    prior = {"mae_bits": first.prior.mae_bits, "kl_bits": first.prior.kl_bits}
    cells = []
    for name, model in models.items():
        row = model.horizons[horizon]
        mae, kl = row.mae_bits.median, row.kl_bits.median
        mae_range, interval = _range(row.mae_bits, row.per_run, "mae_bits")
        kl_range, _ = _range(row.kl_bits, row.per_run, "kl_bits")
        closed = min(gap_closed(mae, prior["mae_bits"]), gap_closed(kl, prior["kl_bits"]))
        verdict = cell_verdict(mae, kl, prior["mae_bits"], prior["kl_bits"])
        seeds = tuple(cell_verdict(run.mae_bits, run.kl_bits, prior["mae_bits"], prior["kl_bits"]) for run in row.per_run)
        cells.append(
            PrimitiveCell(name, model.n_runs, model.n_parameters, mae, kl, mae_range, kl_range, interval, closed, verdict, seeds)
        )
    order = {name: i for i, name in enumerate(ARCHITECTURE_ORDER)}
    cells.sort(key=lambda cell: order.get(cell.architecture, len(order)))
    return prior, cells


def _cell_text(cell: PrimitiveCell) -> str:
    seeds = f"{cell.n_runs} seeds" if cell.n_runs > 1 else "1 seed"
    if cell.seeds_split:
        seeds += f", which split: {cell.seeds_split}"
    return (
        f"{cell.verdict}: mae {cell.mae_bits:.3g} [{cell.mae_range[0]:.3g}, {cell.mae_range[1]:.3g}], "
        f"kl {cell.kl_bits:.3g} [{cell.kl_range[0]:.3g}, {cell.kl_range[1]:.3g}] ({seeds}; {round(cell.closed, 2) + 0.0:.0%} of the gap)"
    )


def primitive_sections(
    results: Mapping[str, Mapping[str, AnalysisResult]],
    analysis_dir: Path,
    at_init: Mapping[str, Mapping[str, AnalysisResult]] | None = None,
) -> list[Section]:
    """The report's sections for an architectures study: the verdict table (ours beside the
    paper's), the numbers per tunnel with intervals and parameter counts, and each tunnel's
    per-position curves. ``results`` is ``{group: {analysis: result}}``; ``analysis_dir`` the
    folder holding ``<group>/model_comparison.png``; ``at_init`` the same analyses of the
    runs' initial weights, whose verdicts are shown beside (random init must realize nothing)."""
    at_init = at_init or {}
    tunnels = []  # (primitive, group, tunnel label, prior, cells)
    for group, analyses in results.items():
        comparison = analyses.get("model_comparison")
        if comparison is None or comparison.primitive not in PRIMITIVES:
            continue
        prior, cells = primitive_cells(comparison)
        tunnels.append((comparison.primitive, group, comparison.tunnel_label, prior, cells))
    if not tunnels:
        return [Section("Primitives", "No tunnel of this reproduction declares an inference primitive: nothing to tabulate.")]
    tunnels.sort(key=lambda t: (PRIMITIVES.index(t[0]), t[1]))
    architectures = []
    for *_, cells in tunnels:
        architectures += [c.architecture for c in cells if c.architecture not in architectures]

    verdict_rows = []
    for architecture in architectures:
        row: list[Any] = [architecture]
        for primitive in PRIMITIVES:
            mine_cells = [(label, c) for p, _, label, _, cells in tunnels if p == primitive for c in cells if c.architecture == architecture]
            ours = [c.verdict for _, c in mine_cells]
            paper = PAPER.get((architecture, primitive))
            verdict = primitive_verdict(ours) if ours else "not trained"
            theirs = paper.verdict if paper else "not in the paper"
            agree = "" if not ours or not paper else (" (agrees)" if verdict == theirs else " (differs)")
            split = "; ".join(f"seeds split on {label}: {c.seeds_split}" for label, c in mine_cells if c.seeds_split)
            mine = f"{verdict} ({split})" if split else verdict
            row.append(f"{mine} / paper: {theirs}{agree}")
        verdict_rows.append(row)
    verdict_table = Table(
        ["architecture", *PRIMITIVES],
        verdict_rows,
        caption=f"Ours / the paper's verdict per primitive. A model realizes a primitive on a tunnel when it closes at "
        f"least {REALIZES:.0%} of the gap between the context-free prior and the exact posterior on both mae_bits and "
        f"kl_bits, and fails it below {FAILS:.0%} on either; a primitive with two tunnels takes the worse verdict. "
        "Verdicts are decided on the median over seeds; where the seeds' own verdicts disagree, the cell says how.",
    )

    number_rows = []
    for primitive, group, label, prior, cells in tunnels:
        initial = at_init.get(group, {}).get("model_comparison")
        init_cells = {c.architecture: c for c in primitive_cells(initial)[1]} if initial else {}
        for cell in cells:
            paper = PAPER.get((cell.architecture, primitive))
            init = init_cells.get(cell.architecture)
            init_text = f"{init.verdict} ({round(init.closed, 2) + 0.0:.0%})" if init else None
            number_rows.append([primitive, label, cell.architecture, f"{cell.n_parameters:,}", _cell_text(cell),
                                init_text, paper.number if paper else None])
        number_rows.append([primitive, label, "context-free prior", None,
                            f"mae {prior['mae_bits']:.3g}, kl {prior['kl_bits']:.3g}", None, None])
    numbers_table = Table(
        ["primitive", "tunnel", "architecture", "parameters", "ours: verdict, bits (interval), share of the gap closed",
         "its initial weights: verdict (share of the gap)", "the paper's number"],
        number_rows,
        caption="Bits from the exact posterior at the training horizon: the median over seeds with the smallest and "
        "largest seed in brackets, or with one seed the run's 95% bootstrap interval over held-out sequences. The "
        "same criterion applied to each model's initial weights (step 0) must not pass.",
    )
    figures = [
        Figure(analysis_dir / group / "model_comparison.png", f"{primitive}: {label}",
               f"Per-position |entropy error| of each architecture, {label}.")
        for primitive, group, label, _, _ in tunnels
        if (analysis_dir / group / "model_comparison.png").is_file()
    ]
    return [
        Section("Which architecture realizes which primitive",
                "Every architecture trained on every tunnel under one protocol per tunnel, capacity-matched within 1% "
                "to the transformer, judged by one criterion beside the paper's verdict.", tables=[verdict_table]),
        Section("The numbers per tunnel", "Each architecture's error on each tunnel, with its parameter count.",
                tables=[numbers_table]),
        Section("Per-position curves", "Where along the sequence each architecture departs from the exact posterior.",
                figures=figures),
    ]
