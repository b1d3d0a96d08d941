"""Typed result of the training phases (:mod:`windtunnel.analysis.phases`): per run, the
plateau of its held-out error and the step it left it, the slope of the error after, the
step its attention frame formed, whether the frame-precision dissociation holds, and the
geometry of its final weights."""

from __future__ import annotations

from dataclasses import dataclass

from windtunnel.results.base import AnalysisResult, result_type

__all__ = ["PhaseRun", "TrainingPhases"]


@dataclass(frozen=True, kw_only=True)
class PhaseRun:
    """One run's phases.

    Attributes:
        run: the run's label; run_dir: its directory, as :func:`~windtunnel.runs.recorded_run_dir`
            names it; seed: its training seed.
        eval_steps, eval_mae_bits: its held-out error curve (every ``train.eval_every`` steps).
        learning_step: the first evaluation below the geometric mean of the first evaluation's
            error and the final one; None where the error fell by less than ``left_factor``.
        plateau_step: where the first flat stretch of ``plateau_window`` evaluations after the
            warm-up starts (log-log slope above ``flat_slope``); None where there is none (the
            error fell from the start).
        plateau_mae_bits: that stretch's median error; None without a plateau.
        final_mae_bits, final_kl_bits: the last held-out evaluation.
        left_plateau: whether the final error is at least ``left_factor`` times below the plateau;
            None without a plateau.
        exit_step: the first evaluation from the plateau's start below the geometric mean of
            plateau and final error; None where the run has no plateau or did not leave it.
        slope_after_exit: slope of log10 error on log10 step from the exit on; None without an
            exit or with fewer than three evaluations after it.
        frame_step: the first snapshot after which the attention stays within the threshold of
            the final model's (Jensen-Shannon divergence); None where it never did.
        mae_bits_at_frame: ``mae_bits`` of that snapshot on the fixed batch; None without it.
        frame_before_exit: whether the frame formed at or before the exit; None without both.
        dissociation: whether the error at the frame step is at least ``dissociation_factor``
            times the final error; None without a frame step.
        pc1_variance_explained, pc1_entropy_spearman_abs: the last block's residual PC1 at the
            end: its share of the variance and its |Spearman rho| with the exact entropy.
        key_cos_layer0: layer 0's mean |off-diagonal cosine| of the token keys (mean over heads);
            key_cos_chance: what independent random keys of the head width score; d_head: the
            head width (None where the tunnel declares no symbols to key).
        attention_entropy_bits_by_layer: each attention layer's mean attention entropy;
            uniform_attention_entropy_bits: uniform attention's; evidence_lift_by_layer: mass
            on the evidence over uniform's, per layer (None where the tunnel names no evidence).
    """

    run: str
    run_dir: str
    seed: int
    eval_steps: tuple[int, ...]
    eval_mae_bits: tuple[float, ...]
    learning_step: int | None
    plateau_step: int | None
    plateau_mae_bits: float | None
    final_mae_bits: float
    final_kl_bits: float
    left_plateau: bool | None
    exit_step: int | None
    slope_after_exit: float | None
    attention_moved: bool
    frame_step: int | None
    mae_bits_at_frame: float | None
    frame_before_exit: bool | None
    dissociation: bool | None
    pc1_variance_explained: float | None
    pc1_entropy_spearman_abs: float | None
    key_cos_layer0: float | None
    key_cos_chance: float | None
    d_head: int | None
    attention_entropy_bits_by_layer: tuple[float, ...] | None
    uniform_attention_entropy_bits: float | None
    evidence_lift_by_layer: tuple[float | None, ...] | None


@result_type("training_phases")
@dataclass(frozen=True, kw_only=True)
class TrainingPhases(AnalysisResult):
    """The phases of every seed of one configuration.

    Attributes:
        n_layers, d_model: the transformer's depth and width.
        plateau_window, flat_slope: a plateau is that many evaluations whose log-log slope is above that.
        left_factor: how far below its plateau a run's final error must be for it to have left.
        dissociation_factor: how far above the final error the error at the frame step must be
            for the dissociation to hold.
        runs: one :class:`PhaseRun` per seed.
    """

    n_layers: int
    d_model: int
    plateau_window: int
    flat_slope: float
    left_factor: float
    dissociation_factor: float
    runs: tuple[PhaseRun, ...]
