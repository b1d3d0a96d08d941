"""Typed result of the linear probes (:mod:`windtunnel.analysis.probes`).

Linear probes measure how much of the exact posterior each depth of the model holds
linearly: at the embedding, after each block and at the final LayerNorm the head reads, a
ridge regression from the residual stream at the supervised positions to the exact
posterior (its probabilities, and its centered, floored log-probabilities: the model's own
kind of readout) and to its entropy, fitted on some sequences and scored on others (a split
of sequences, since the positions of one sequence share their hypothesis). The scores are
averaged over runs, next to the model's own KL and a constant predictor's.
"""

from __future__ import annotations

from dataclasses import dataclass

from windtunnel.results.base import AnalysisResult, Summary, result_type

__all__ = ["ConstantBaseline", "LinearProbes", "ProbedDepth"]


@dataclass(frozen=True, kw_only=True)
class ProbedDepth:
    """The probes of one depth's residual stream, scored on the test sequences.

    Attributes:
        layer: the depth: -1 for the embedding, a block's index, or ``n_layers`` for the
            final LayerNorm.
        name: the depth for a reader (``"input"``, ``"block 0"``, ``"ln_final"``).
        activation: the traced activation probed (``"blocks.0.resid_post"``).
        posterior_r2: R² of the probe of the posterior probabilities, over runs.
        posterior_kl_bits: KL(posterior || that probe, clipped at the floor and
            renormalized), mean over test positions, over runs.
        log_posterior_r2: R² of the probe of the centered, floored log-posterior, over runs.
        log_posterior_kl_bits: KL(posterior || softmax of that probe), over runs.
        entropy_r2: R² of the probe of the exact entropy, over runs.
        entropy_mae_bits: mean |entropy probe - exact entropy| in bits, over runs.
        posterior_alpha: the ridge strength chosen for the posterior probe, per run.
        log_posterior_alpha: the ridge strength chosen for the log-posterior probe, per run.
        entropy_alpha: the ridge strength chosen for the entropy probe, per run.
    """

    layer: int
    name: str
    activation: str
    posterior_r2: Summary
    posterior_kl_bits: Summary
    log_posterior_r2: Summary
    log_posterior_kl_bits: Summary
    entropy_r2: Summary
    entropy_mae_bits: Summary
    posterior_alpha: tuple[float, ...]
    log_posterior_alpha: tuple[float, ...]
    entropy_alpha: tuple[float, ...]


@dataclass(frozen=True, kw_only=True)
class ConstantBaseline:
    """The constant predictor (the training sequences' mean) on the test sequences; its R²
    is ~0 by definition.

    Attributes:
        posterior_kl_bits: KL(posterior || mean posterior, clipped and renormalized).
        entropy_mae_bits: mean |mean entropy - exact entropy| in bits.
    """

    posterior_kl_bits: float
    entropy_mae_bits: float


@result_type("linear_probes")
@dataclass(frozen=True, kw_only=True)
class LinearProbes(AnalysisResult):
    """Ridge probes of the exact posterior and its entropy at every depth, over runs.

    Attributes:
        runs: the number of runs averaged over.
        n_train_sequences: the sequences the probes are fitted on (the first ones).
        n_test_sequences: the sequences they are scored on (the rest).
        alphas: the ridge strengths tried, relative to the mean feature variance.
        probability_floor: the smallest probability a posterior probe may give (and the
            floor of the log-posterior probed).
        layers: one entry per depth, from the embedding to the final LayerNorm.
        model_kl_bits: the model's own KL(posterior || model) on the test sequences, over runs.
        baseline: the constant predictor's scores.
    """

    runs: int
    n_train_sequences: int
    n_test_sequences: int
    alphas: tuple[float, ...]
    probability_floor: float
    layers: tuple[ProbedDepth, ...]
    model_kl_bits: Summary
    baseline: ConstantBaseline
