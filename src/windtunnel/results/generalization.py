"""Typed results of the analyses beyond the training distribution and against the controls
(:mod:`windtunnel.analysis.generalization`): length generalization, relabeling, Table 1
(model comparison), late attention and seeds. Most embed one shape per model and horizon,
:class:`HorizonScores` (the metrics summarized over runs, each run's row with its bootstrap
intervals, the context-free prior's row and the run-averaged per-position curves); where a
group of keys appears only in some cases and one of them may be null (the jump at the
training horizon, the gap to the MLP over the seed spread), the richer case is a subclass
with those keys required, and a field accepts either class, the richer first, so that a
saved null is written back as null and damage is still reported at its own path.
"""

from __future__ import annotations

from dataclasses import dataclass

from windtunnel.results.base import AnalysisResult, Metrics, Summary, omitted_when_none, result_type

__all__ = [
    "BeyondHorizonScores",
    "BeyondTraining",
    "BoundaryStep",
    "Curves",
    "HorizonScores",
    "LateAttention",
    "LateAttentionHorizon",
    "LengthGeneralization",
    "MetricBeyondTraining",
    "MlpReference",
    "ModelComparison",
    "ModelScores",
    "RatiosToReference",
    "Relabeling",
    "RelabelingRun",
    "RelabelingScatter",
    "RunScores",
    "SeedMetrics",
    "SeedScores",
    "SeedSpread",
    "SeedSpreadAgainstMlp",
    "Seeds",
    "SeedsHorizon",
    "SeedsHorizonAgainstMlp",
]


@dataclass(frozen=True, kw_only=True)
class Curves:
    """Per-position curves averaged over runs; entry ``i`` is position ``t = i + 1``.

    Attributes:
        abs_error_bits: |H_model − H_Bayes| per position, in bits.
        kl_bits: KL(posterior ‖ model) per position, in bits.
        model_entropy_bits: the model's predictive entropy per position, in bits.
        bayes_entropy_bits: the exact posterior's predictive entropy per position, in bits.
    """

    abs_error_bits: tuple[float, ...]
    kl_bits: tuple[float, ...]
    model_entropy_bits: tuple[float, ...]
    bayes_entropy_bits: tuple[float, ...]


@dataclass(frozen=True, kw_only=True)
class BoundaryStep:
    """How the error changes across the training horizon against how it changes nearby
    (:func:`windtunnel.analysis.generalization.boundary_step`).

    Attributes:
        step: the curve at K + 1 minus the curve at K (K the training horizon).
        largest_neighbor_step: the largest |step| between consecutive positions in the
            window before K and after K + 1.
        ratio: ``step / largest_neighbor_step``; None when no neighbor moves.
    """

    step: float
    largest_neighbor_step: float
    ratio: float | None


@dataclass(frozen=True, kw_only=True)
class MetricBeyondTraining:
    """One metric's per-position curve read on both sides of the training horizon.

    Attributes:
        within_training: mean per-position error for t <= the training horizon.
        beyond_training: mean per-position error for t > the training horizon.
        boundary: the step at the training horizon against its neighbors.
    """

    within_training: float
    beyond_training: float
    boundary: BoundaryStep


@dataclass(frozen=True, kw_only=True)
class BeyondTraining:
    """Each metric with a per-position curve, read across the training horizon.

    Attributes:
        mae_bits: from the ``abs_error_bits`` curve.
        kl_bits: from the ``kl_bits`` curve.
    """

    mae_bits: MetricBeyondTraining
    kl_bits: MetricBeyondTraining


@dataclass(frozen=True, kw_only=True)
class RunScores:
    """One run's metrics at one horizon, on the tunnel's fixed held-out set.

    Attributes:
        mae_aggregate_bits: the run's ``mae_aggregate_bits``.
        mae_bits: the run's ``mae_bits``.
        kl_bits: the run's ``kl_bits``.
        mae_aggregate_bits_ci: its bootstrap interval over sequences (95%) ``[low, high]``;
            absent when the run's config draws no bootstrap resamples.
        mae_bits_ci: the same for ``mae_bits``.
        kl_bits_ci: the same for ``kl_bits``.
        beyond: the run's own curves read across the training horizon; only in
            ``length_generalization``, at horizons past the training horizon.
    """

    mae_aggregate_bits: float
    mae_bits: float
    kl_bits: float
    mae_aggregate_bits_ci: tuple[float, float] | None = omitted_when_none()
    mae_bits_ci: tuple[float, float] | None = omitted_when_none()
    kl_bits_ci: tuple[float, float] | None = omitted_when_none()
    beyond: BeyondTraining | None = omitted_when_none()


@dataclass(frozen=True, kw_only=True)
class HorizonScores:
    """One model (its seeds) at one evaluation horizon: what every comparison here embeds.

    Attributes:
        mae_aggregate_bits: ``mae_aggregate_bits`` over the runs.
        mae_bits: ``mae_bits`` over the runs.
        kl_bits: ``kl_bits`` over the runs.
        per_run: each run's metrics with their bootstrap intervals, in run order (with one
            seed, its interval is the interval).
        prior: the context-free prior's metrics on the same sequences (the first run's).
        curves: the per-position curves averaged over the runs.
        position_wise: the metrics of the exact predictive given one position's token alone,
            the floor of a model that mixes no positions (a tunnel that declares
            ``PositionWiseFloor``; absent otherwise).
        permutation: the metrics of the exact predictive when the hypothesis is any
            permutation, the reference of model selection (a tunnel that declares
            ``PermutationReference``; absent otherwise).
    """

    mae_aggregate_bits: Summary
    mae_bits: Summary
    kl_bits: Summary
    per_run: tuple[RunScores, ...]
    prior: Metrics
    curves: Curves
    position_wise: Metrics | None = omitted_when_none()
    permutation: Metrics | None = omitted_when_none()


@dataclass(frozen=True, kw_only=True)
class BeyondHorizonScores(HorizonScores):
    """:class:`HorizonScores` at a horizon past the training horizon, as
    ``length_generalization`` writes it (each ``per_run`` row then has its ``beyond``).

    Attributes:
        within_training_mae_bits: mean per-position |H_model − H_Bayes| for t <= the
            training horizon.
        beyond_training_mae_bits: the same for t > the training horizon.
        jump_at_training_horizon: mean error over the 5 positions after the training
            horizon over that of the 5 before; None when the error before is 0.
        beyond: the run-averaged curves read across the training horizon.
    """

    within_training_mae_bits: float
    beyond_training_mae_bits: float
    jump_at_training_horizon: float | None
    beyond: BeyondTraining


@result_type("length_generalization")
@dataclass(frozen=True, kw_only=True)
class LengthGeneralization(AnalysisResult):
    """Fig 6: per-position error at each evaluation horizon, the training horizon marked.

    Attributes:
        model: the model in words (``"transformer"``).
        n_runs: how many runs (seeds) are summarized.
        training_horizon: the horizon the runs were trained at.
        horizons: per evaluation horizon, its scores; a :class:`BeyondHorizonScores` past
            the training horizon.
    """

    model: str
    n_runs: int
    training_horizon: int
    horizons: dict[int, BeyondHorizonScores | HorizonScores]


@dataclass(frozen=True, kw_only=True)
class RelabelingRun:
    """One run's error before and after a random relabeling of the hidden states
    (:func:`windtunnel.evaluation.score_relabeling`, without the per-sequence values).

    Attributes:
        mae_bits_before: per-sequence MAE on the held-out sequences, mean over sequences.
        mae_bits_after: the same on the relabeled sequences.
        delta_mae_bits: mean over sequences of after − before.
        delta_mae_bits_ci: its bootstrap interval over sequences ``[low, high]``.
        mae_bits_prior: the context-free prior's per-sequence MAE on the same sequences
            (the scale to read ΔMAE against).
        kl_bits_before: per-sequence KL on the held-out sequences, mean over sequences.
        kl_bits_after: the same on the relabeled sequences.
        delta_kl_bits: mean over sequences of after − before: the stricter measure, since it
            compares each prediction with the permuted posterior state by state.
        delta_kl_bits_ci: its bootstrap interval over sequences ``[low, high]``.
    """

    mae_bits_before: float
    mae_bits_after: float
    delta_mae_bits: float
    delta_mae_bits_ci: tuple[float, float]
    mae_bits_prior: float
    kl_bits_before: float
    kl_bits_after: float
    delta_kl_bits: float
    delta_kl_bits_ci: tuple[float, float]


@dataclass(frozen=True, kw_only=True)
class RelabelingScatter:
    """The first run's per-sequence MAE, for the scatter plot (sequence order).

    Attributes:
        before: each held-out sequence's MAE.
        after: the same sequence's MAE after the relabeling.
    """

    before: tuple[float, ...]
    after: tuple[float, ...]


@result_type("relabeling")
@dataclass(frozen=True, kw_only=True)
class Relabeling(AnalysisResult):
    """Fig 8: per-sequence error before vs after a random relabeling of the hidden states.

    Attributes:
        model: the model in words.
        n_runs: how many runs (seeds) are summarized.
        per_run: each run's before/after numbers, in run order.
        mae_bits_before: ``mae_bits_before`` over the runs.
        mae_bits_after: ``mae_bits_after`` over the runs.
        delta_mae_bits: ``delta_mae_bits`` over the runs.
        relative_change: |mean ΔMAE| over the mean MAE before; None when that MAE is 0.
        scatter: the first run's per-sequence values.
    """

    model: str
    n_runs: int
    per_run: tuple[RelabelingRun, ...]
    mae_bits_before: Summary
    mae_bits_after: Summary
    delta_mae_bits: Summary
    relative_change: float | None
    scatter: RelabelingScatter


@dataclass(frozen=True, kw_only=True)
class ModelScores:
    """One model (a configuration with its seeds) in Table 1.

    Attributes:
        n_runs: how many runs (seeds) of it.
        n_parameters: parameters of its model (the first run's).
        horizons: its scores per evaluation horizon.
    """

    n_runs: int
    n_parameters: int
    horizons: dict[int, HorizonScores]


@dataclass(frozen=True, kw_only=True)
class RatiosToReference:
    """A model's error over the full transformer's at one horizon (ratio of the medians
    over seeds).

    Attributes:
        mae_bits: the ratio of the ``mae_bits`` medians.
        kl_bits: the ratio of the ``kl_bits`` medians.
    """

    mae_bits: float
    kl_bits: float


@result_type("model_comparison")
@dataclass(frozen=True, kw_only=True)
class ModelComparison(AnalysisResult):
    """Table 1 and Fig 10: every model at every horizon, and its per-position error.

    Attributes:
        horizons: the evaluation horizons, in order.
        training_horizon: the horizon the runs were trained at.
        primitive: the inference primitive the tunnel declares; None if it names none.
        reference: the full transformer's name, the denominator of ``ratios``; None when no
            run is a full transformer.
        models: per model name (``"transformer (no attention in 4,5)"``), its scores.
        ratios: per model other than the reference, per horizon, its errors over the
            reference's (empty without a reference).
        markdown: Table 1 as a Markdown table (median over seeds, the smallest and largest
            seed in brackets, the prior last).
    """

    horizons: tuple[int, ...]
    training_horizon: int
    primitive: str | None
    reference: str | None
    models: dict[str, ModelScores]
    ratios: dict[str, dict[int, RatiosToReference]]
    markdown: str


@dataclass(frozen=True, kw_only=True)
class LateAttentionHorizon:
    """The full transformer and the variant without late attention at one horizon.

    Attributes:
        full: the full transformer's scores (over its seeds).
        variant: the variant's scores (over its seeds).
        factors: per metric, the degradation factor: variant over full, ratio of the
            medians over seeds.
        mae_factor: ``factors.mae_bits`` again.
        kl_factor: ``factors.kl_bits`` again.
    """

    full: HorizonScores
    variant: HorizonScores
    factors: Metrics
    mae_factor: float
    kl_factor: float


@result_type("late_attention")
@dataclass(frozen=True, kw_only=True)
class LateAttention(AnalysisResult):
    """Fig 9: the transformer without late-layer attention against the full model, per horizon.

    Attributes:
        full: the full transformer's name.
        variant: the variant's name (``"transformer (no attention in 4,5)"``).
        no_attention_layers: the variant's layers built without attention, in order.
        training_horizon: the horizon the runs were trained at.
        horizons: per evaluation horizon, the two models and the factors.
    """

    full: str
    variant: str
    no_attention_layers: tuple[int, ...]
    training_horizon: int
    horizons: dict[int, LateAttentionHorizon]


@dataclass(frozen=True, kw_only=True)
class SeedScores:
    """One seed of the overlaid configuration at one horizon.

    Attributes:
        seed: the run's training seed.
        mae_aggregate_bits: its ``mae_aggregate_bits``.
        mae_bits: its ``mae_bits``.
        kl_bits: its ``kl_bits``.
        abs_error_bits: its per-position |H_model − H_Bayes| (t = index + 1).
    """

    seed: int
    mae_aggregate_bits: float
    mae_bits: float
    kl_bits: float
    abs_error_bits: tuple[float, ...]


@dataclass(frozen=True, kw_only=True)
class SeedSpread(Summary):
    """One metric over the seeds: its :class:`Summary` (mean, std, median, min, max), then
    the spread.

    Attributes:
        spread: max − min over the seeds.
    """

    spread: float


@dataclass(frozen=True, kw_only=True)
class SeedSpreadAgainstMlp(SeedSpread):
    """:class:`SeedSpread` when an MLP control is among the runs.

    Attributes:
        mlp: the MLP control's mean of the metric.
        gap_to_mlp: ``mlp`` minus the seeds' mean.
        gap_over_spread: how many seed spreads fit in that gap; None when the spread is 0.
    """

    mlp: float
    gap_to_mlp: float
    gap_over_spread: float | None


@dataclass(frozen=True, kw_only=True)
class SeedMetrics:
    """Every scalar metric over the seeds (against the MLP control when there is one).

    Attributes:
        mae_aggregate_bits: ``mae_aggregate_bits`` over the seeds.
        mae_bits: ``mae_bits`` over the seeds.
        kl_bits: ``kl_bits`` over the seeds.
    """

    mae_aggregate_bits: SeedSpreadAgainstMlp | SeedSpread
    mae_bits: SeedSpreadAgainstMlp | SeedSpread
    kl_bits: SeedSpreadAgainstMlp | SeedSpread


@dataclass(frozen=True, kw_only=True)
class MlpReference:
    """The MLP control at one horizon, mean over its runs.

    Attributes:
        mae_bits: its mean ``mae_bits``.
        abs_error_bits: its run-averaged per-position |H_model − H_Bayes|.
    """

    mae_bits: float
    abs_error_bits: tuple[float, ...]


@dataclass(frozen=True, kw_only=True)
class SeedsHorizon:
    """The seeds of one configuration overlaid at one horizon.

    Attributes:
        per_seed: each seed's metrics and error curve, in run order.
        mae_bits: ``mae_bits`` over the seeds.
        spread_bits: max − min ``mae_bits`` over the seeds.
        curve_std_bits: the between-seed std of the per-position error, averaged over
            positions.
        metrics: every metric over the seeds.
    """

    per_seed: tuple[SeedScores, ...]
    mae_bits: Summary
    spread_bits: float
    curve_std_bits: float
    metrics: SeedMetrics


@dataclass(frozen=True, kw_only=True)
class SeedsHorizonAgainstMlp(SeedsHorizon):
    """:class:`SeedsHorizon` when an MLP control is among the runs.

    Attributes:
        mlp: the MLP control's mean ``mae_bits`` and curve.
        gap_to_mlp_bits: the MLP's mean ``mae_bits`` minus the seeds'.
        gap_over_spread: how many seed spreads fit in that gap; None when the spread is 0.
    """

    mlp: MlpReference
    gap_to_mlp_bits: float
    gap_over_spread: float | None


@result_type("seeds")
@dataclass(frozen=True, kw_only=True)
class Seeds(AnalysisResult):
    """Fig 11: per-position error of every seed overlaid; spread between seeds vs the MLP gap.

    Attributes:
        model: the overlaid configuration (the one with the most seeds) in words.
        seeds: its runs' training seeds, in run order.
        training_horizon: the horizon the runs were trained at.
        horizons: per evaluation horizon, the seeds overlaid; a
            :class:`SeedsHorizonAgainstMlp` when an MLP control is among the runs.
    """

    model: str
    seeds: tuple[int, ...]
    training_horizon: int
    horizons: dict[int, SeedsHorizonAgainstMlp | SeedsHorizon]
