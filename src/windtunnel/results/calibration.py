"""Typed result of the entropy calibration (:mod:`windtunnel.analysis.calibration`).

Calibration asks whether the model's uncertainty tracks the exact posterior's: at each
supervised position, the model's predictive entropy against the exact Bayes entropy, two
ways. The mean curves average both over the held-out sequences (Fig 1 for the bijection
tunnel, where the exact curve is ``log2(V - k + 1)`` in closed form; Fig 5 for the HMM
tunnel); the single-sequence traces follow eight sequences whose exact entropy varies most
(staircases for the bijection with replacement, rises and falls for the HMM; Fig 2 and
Fig 7), since a model can match the mean curve while missing every trace.
"""

from __future__ import annotations

from dataclasses import dataclass

from windtunnel.results.base import AnalysisResult, result_type

__all__ = ["Calibration", "RunCalibration", "Trace", "Traces"]


@dataclass(frozen=True, kw_only=True)
class RunCalibration:
    """One run scored on the shared held-out sequences.

    Attributes:
        label: the run's legend name (model, variant and seed: ``"transformer seed 0"``).
        model_entropy_bits: ``[P]`` the run's mean model entropy at each position.
        mae_aggregate_bits: mean over positions of |mean model entropy - mean exact entropy|.
        mae_bits: mean over sequences and positions of |model entropy - exact entropy|.
        kl_bits: mean KL(exact posterior || model), in bits.
        step: the training step of the weights scored.
    """

    label: str
    model_entropy_bits: tuple[float, ...]
    mae_aggregate_bits: float
    mae_bits: float
    kl_bits: float
    step: int


@dataclass(frozen=True, kw_only=True)
class Trace:
    """One held-out sequence's entropies, position by position.

    Attributes:
        index: the sequence's index in the eval set.
        bayes_entropy_bits: ``[P]`` its exact entropy at each position.
        model_entropy_bits: ``[P]`` the traced run's entropy at each position.
        mae_bits: mean over its positions of |model entropy - exact entropy|.
    """

    index: int
    bayes_entropy_bits: tuple[float, ...]
    model_entropy_bits: tuple[float, ...]
    mae_bits: float


@dataclass(frozen=True, kw_only=True)
class Traces:
    """The single-sequence traces (Fig 2 and Fig 7), drawn for the first run.

    Attributes:
        run: the label of the run traced.
        selection: in words, how the sequences were chosen (from the exact posterior only).
        sequences: the traces, most varied exact entropy first.
    """

    run: str
    selection: str
    sequences: tuple[Trace, ...]


@result_type("calibration")
@dataclass(frozen=True, kw_only=True)
class Calibration(AnalysisResult):
    """Model entropy against exact entropy, per position (mean over sequences) and per sequence.

    Attributes:
        tunnel: the tunnel's name alone (``"bijection"``); the analysis writes it over the
            header's name-and-parameters (``task_variant`` and ``tunnel_label`` keep those).
        horizon: the sequence length the held-out set was drawn at.
        positions: the supervised position numbers 1..P (the x axis).
        n_sequences: the number of sequences averaged over.
        bayes_entropy_bits: ``[P]`` mean over sequences of the exact entropy.
        closed_form_bits: ``[P]`` the exact entropy in closed form where it is the same for
            every sequence (the bijection without replacement: ``log2(V - k + 1)``, equal to
            ``bayes_entropy_bits``), else None.
        model_entropy_bits: ``[P]`` mean over runs of each run's mean model entropy.
        runs: each run's curve and metrics, in the order of the runs.
        mae_aggregate_bits: mean over runs of ``mae_aggregate_bits``.
        mae_bits: mean over runs of ``mae_bits``.
        kl_bits: mean over runs of ``kl_bits``.
        mae_of_mean_curve_bits: mean over positions of |mean-over-runs curve - Bayes curve|
            (what the mean-curve panel shows; equals ``mae_aggregate_bits`` for one run).
        traces: the single-sequence traces of the first run.
        trace_mae_bits: mean of the traces' ``mae_bits``.
    """

    # Redeclared: a dataclass field keeps its place in the parent's order, so the key stays
    # third in the JSON, where the header put it before the analysis replaced its value.
    tunnel: str  # type: ignore[assignment]
    horizon: int
    positions: tuple[int, ...]
    n_sequences: int
    bayes_entropy_bits: tuple[float, ...]
    closed_form_bits: tuple[float, ...] | None
    model_entropy_bits: tuple[float, ...]
    runs: tuple[RunCalibration, ...]
    mae_aggregate_bits: float
    mae_bits: float
    kl_bits: float
    mae_of_mean_curve_bits: float
    traces: Traces
    trace_mae_bits: float
