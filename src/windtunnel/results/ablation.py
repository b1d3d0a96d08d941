"""Typed results of the layer and head ablations (:mod:`windtunnel.analysis.ablation`).

An ablation removes one part of a trained model (a whole layer, attention and feed-forward,
with the residual stream passing through; or one attention head, zeroed) and measures how
far its predictions move from the exact posterior: the three error metrics of the ablated
model, and their ratios to the intact model's, each run against itself before the ratios
are averaged over runs (seeds), with their spread. A ratio near 1 says the part does
nothing the task needs; a large one, that the model depends on it (the paper's Fig 3 for
layers and Fig 4 for heads, whose heat map is ``mae_ratio`` by layer and head).
"""

from __future__ import annotations

from dataclasses import dataclass

from windtunnel.results.base import AnalysisResult, MetricSummaries, Metrics, Summary, result_type

__all__ = [
    "AblatedHead",
    "AblatedLayer",
    "HeadAblation",
    "HeadRanking",
    "LayerAblation",
    "MostDestructiveHead",
    "RankedHead",
]


@dataclass(frozen=True, kw_only=True)
class AblatedLayer:
    """The models with one layer removed whole.

    Attributes:
        layer: the layer removed (0 is the first block).
        mae_aggregate_bits: the ablated models' ``mae_aggregate_bits`` over runs.
        mae_bits: the ablated models' ``mae_bits`` over runs.
        kl_bits: the ablated models' ``kl_bits`` over runs.
        ratios: per metric, ablated over intact, taken per run (each seed against itself)
            and then summarized over runs.
        mae_ratio: the mean over runs of the ``mae_bits`` ratio (what Fig 3 plots).
        mae_ratio_std: the spread (population std) over runs of that ratio.
        kl_ratio: the mean over runs of the ``kl_bits`` ratio.
        per_run: each run's ablated metrics, in the order of the runs (with the result's
            ``intact_per_run``, each seed's own ratios).
    """

    layer: int
    mae_aggregate_bits: Summary
    mae_bits: Summary
    kl_bits: Summary
    ratios: MetricSummaries
    mae_ratio: float
    mae_ratio_std: float
    kl_ratio: float
    per_run: tuple[Metrics, ...]


@result_type("layer_ablation")
@dataclass(frozen=True, kw_only=True)
class LayerAblation(AnalysisResult):
    """Each layer removed whole, one at a time (Fig 3), averaged over runs.

    Attributes:
        runs: the number of runs (seeds) averaged over.
        intact: the intact models' metrics over runs.
        intact_per_run: each run's intact metrics, in the order of the runs.
        layers: one entry per layer, in layer order: the models with that layer removed.
    """

    runs: int
    intact: MetricSummaries
    intact_per_run: tuple[Metrics, ...]
    layers: tuple[AblatedLayer, ...]


@dataclass(frozen=True, kw_only=True)
class AblatedHead:
    """The models with one attention head zeroed.

    Attributes:
        layer: the layer of the head.
        head: the head's index within its layer.
        mae_aggregate_bits: the ablated models' ``mae_aggregate_bits`` over runs.
        mae_bits: the ablated models' ``mae_bits`` over runs.
        kl_bits: the ablated models' ``kl_bits`` over runs.
        ratios: per metric, ablated over intact, taken per run (each seed against itself)
            and then summarized over runs.
        mae_ratio: the mean over runs of the ``mae_bits`` ratio (a cell of Fig 4's heat map).
        mae_ratio_std: the spread (population std) over runs of that ratio.
        kl_ratio: the mean over runs of the ``kl_bits`` ratio.
        per_run: each run's ablated metrics, in the order of the runs.
    """

    layer: int
    head: int
    mae_aggregate_bits: Summary
    mae_bits: Summary
    kl_bits: Summary
    ratios: MetricSummaries
    mae_ratio: float
    mae_ratio_std: float
    kl_ratio: float
    per_run: tuple[Metrics, ...]


@dataclass(frozen=True, kw_only=True)
class MostDestructiveHead:
    """The head, by index over runs, whose removal raises ``mae_bits`` most.

    Attributes:
        layer: the head's layer.
        head: the head's index within its layer.
        mae_ratio: its ``mae_bits`` ratio to the intact model, mean over runs.
    """

    layer: int
    head: int
    mae_ratio: float


@dataclass(frozen=True, kw_only=True)
class RankedHead:
    """One head in one run's ranking by how much its removal raises that run's ``mae_bits``.

    Attributes:
        layer: the head's layer.
        head: the head's index within its layer.
        delta_mae_bits: the run's ablated ``mae_bits`` minus its intact ``mae_bits``.
        mae_ratio: the run's ablated ``mae_bits`` over its intact ``mae_bits``.
    """

    layer: int
    head: int
    delta_mae_bits: float
    mae_ratio: float


@dataclass(frozen=True, kw_only=True)
class HeadRanking:
    """One run's heads ranked by ΔMAE (heads do not line up across seeds, so each run is
    ranked on its own, never by head index over runs).

    Attributes:
        intact_mae_bits: the run's intact ``mae_bits``.
        worst: the head whose removal raises the run's ``mae_bits`` most.
        second: the runner-up; None when the model has a single head.
        top_over_second: the worst head's ΔMAE over the second's; None when there is no
            second head or its ΔMAE is not positive.
    """

    intact_mae_bits: float
    worst: RankedHead
    second: RankedHead | None
    top_over_second: float | None


@result_type("head_ablation")
@dataclass(frozen=True, kw_only=True)
class HeadAblation(AnalysisResult):
    """Each attention head zeroed, one at a time (Fig 4), averaged over runs by head index.

    Attributes:
        runs: the number of runs (seeds) averaged over.
        intact: the intact models' metrics over runs.
        heads: one entry per head, by layer and then head.
        mae_ratio: the ``[layer][head]`` grid of ``mae_bits`` ratios (mean over runs) for
            the heat map; None in a layer without attention (and past a layer's last head).
        most_destructive: the cell of that grid with the largest ratio.
        per_run: each run's own ranking of its heads, in the order of the runs.
    """

    runs: int
    intact: MetricSummaries
    heads: tuple[AblatedHead, ...]
    mae_ratio: tuple[tuple[float | None, ...], ...]
    most_destructive: MostDestructiveHead
    per_run: tuple[HeadRanking, ...]
