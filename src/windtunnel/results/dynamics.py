"""Typed result of the training dynamics (:mod:`windtunnel.analysis.dynamics`).

Training dynamics test the frame-precision dissociation (docs/protocol.md §6, Fig 16-17):
over training, the attention maps (the frame: which earlier tokens each position reads)
settle early, while the geometry of the representations (the precision: PC1 of the last
block's residual stream, and how well it tracks the exact entropy) and the calibration keep
improving. Each permanent weight snapshot of one run is rebuilt and run on one fixed batch:
the Jensen-Shannon divergence of its attention rows to the final model's, the residual
stream's PC1, and the three error metrics. The frame has stabilized at the first snapshot
after which that divergence stays below a threshold; the dissociation is the error there
against the error at the end. Models without attention get the geometry and error curves only.
"""

from __future__ import annotations

from dataclasses import dataclass

from windtunnel.results.base import AnalysisResult, Metrics, result_type

__all__ = ["MetricRatios", "TrainingDynamics"]


@dataclass(frozen=True, kw_only=True)
class MetricRatios:
    """Each metric at the stabilization step over the same metric at the end (above 1:
    precision kept improving after the frame settled).

    Attributes:
        mae_aggregate_bits: the ratio of ``mae_aggregate_bits``; None where the final value is 0.
        mae_bits: the ratio of ``mae_bits``; None where the final value is 0.
        kl_bits: the ratio of ``kl_bits``; None where the final value is 0.
    """

    mae_aggregate_bits: float | None
    mae_bits: float | None
    kl_bits: float | None


@result_type("training_dynamics")
@dataclass(frozen=True, kw_only=True)
class TrainingDynamics(AnalysisResult):
    """Attention change, value-manifold state and calibration at every snapshot of one run.

    Every ``[S]`` list has one value per snapshot, in the order of ``steps``.

    Attributes:
        run: the label of the run read (one run's history is the measurement).
        run_dir: the run's directory, as :func:`~windtunnel.runs.recorded_run_dir` names it.
        steps: ``[S]`` the snapshot steps on disk, ascending.
        reference_step: the last of them: the final model every divergence is taken to.
        n_sequences: the size of the fixed batch every snapshot is run on.
        jsd_threshold_bits: the mean attention-row divergence to the final model below
            which the frame counts as settled.
        resid_name: the activation whose PCA gives PC1 (the last block's residual stream).
        attention_layers: the layers with attention (empty for the MLP control).
        attention_jsd_bits: ``[S]`` mean Jensen-Shannon divergence (bits, 0..1) to the final
            model over layers, heads, sequences and supervised queries; None without attention.
        attention_jsd_by_layer_bits: ``[S][attention layers]`` the same per attention layer;
            None without attention.
        pc1_variance_explained: ``[S]`` the fraction of residual variance on PC1 (None
            where it is undefined: a residual with no variance).
        pc1_entropy_spearman_abs: ``[S]`` |Spearman rho| between PC1 and the exact entropy
            (None where it is undefined: a constant PC1).
        mae_aggregate_bits: ``[S]`` mean over positions of |mean model entropy - mean exact
            entropy| on the fixed batch.
        mae_bits: ``[S]`` mean over sequences and positions of |model entropy - exact
            entropy| on the fixed batch.
        kl_bits: ``[S]`` mean KL(exact posterior || model) on the fixed batch.
        stabilization_step: the first step after which the divergence stays below the
            threshold; None without attention, or when it never does.
        stabilization_fraction: that step over ``reference_step``; None without it (or when
            the reference step is 0).
        mae_bits_at_stabilization: ``mae_bits`` at the stabilization step; None without it.
        mae_bits_final: ``mae_bits`` at the reference step.
        mae_ratio_stabilization_to_final: the first over the second (above 1: precision
            keeps improving after the frame has settled); None without a stabilization step
            or where the final ``mae_bits`` is 0.
        at_stabilization: every metric at the stabilization step; None without it.
        final: every metric at the reference step.
        ratio_stabilization_to_final: every metric's ratio, stabilization over final; None
            without a stabilization step.
        pc1_variance_explained_at_stabilization: ``pc1_variance_explained`` at the
            stabilization step; None without it (or where undefined there).
        pc1_entropy_spearman_abs_at_stabilization: ``pc1_entropy_spearman_abs`` at the
            stabilization step; None without it (or where undefined there).
    """

    run: str
    run_dir: str
    steps: tuple[int, ...]
    reference_step: int
    n_sequences: int
    jsd_threshold_bits: float
    resid_name: str
    attention_layers: tuple[int, ...]
    attention_jsd_bits: tuple[float, ...] | None
    attention_jsd_by_layer_bits: tuple[tuple[float, ...], ...] | None
    pc1_variance_explained: tuple[float | None, ...]
    pc1_entropy_spearman_abs: tuple[float | None, ...]
    mae_aggregate_bits: tuple[float, ...]
    mae_bits: tuple[float, ...]
    kl_bits: tuple[float, ...]
    stabilization_step: int | None
    stabilization_fraction: float | None
    mae_bits_at_stabilization: float | None
    mae_bits_final: float
    mae_ratio_stabilization_to_final: float | None
    at_stabilization: Metrics | None
    final: Metrics
    ratio_stabilization_to_final: MetricRatios | None
    pc1_variance_explained_at_stabilization: float | None
    pc1_entropy_spearman_abs_at_stabilization: float | None
