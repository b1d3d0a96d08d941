"""Typed result of the class-posterior analysis (:mod:`windtunnel.analysis.classes`).

Where a tunnel's hypotheses come in classes (model selection), the exact class posterior is a
quantity of its own. It is read from a model two ways: out of the model's next-answer
distribution, as the mixture weights of the classes' own predictives that best reproduce it
(where the classes predict differently: elsewhere the answer says nothing of the class), and
by a ridge probe of the residual stream at each depth. Both are scored against the exact class
posterior by the class-posterior MAE of the authors' model-selection paper (the mean over
classes of the absolute error; for two classes the error of either one's posterior).
"""

from __future__ import annotations

from dataclasses import dataclass

from windtunnel.results.base import AnalysisResult, omitted_when_none, result_type

__all__ = ["ClassPosterior", "ClassProbeLayer", "RunClassPosterior"]


@dataclass(frozen=True, kw_only=True)
class ClassProbeLayer:
    """A ridge probe of the class posterior at one depth, scored on the test sequences.

    Attributes:
        layer: -1 for the embedding, ``n_layers`` for the final LayerNorm, else the block.
        name: the depth in words (``"block 1"``).
        mae: the class-posterior MAE of the probe's prediction (projected onto the simplex).
        alpha: the ridge strength chosen on held-out training sequences.
    """

    layer: int
    name: str
    mae: float
    alpha: float


@dataclass(frozen=True, kw_only=True)
class RunClassPosterior:
    """One run's class posterior, read out and probed.

    Attributes:
        run_dir: the run, as :func:`~windtunnel.runs.recorded_run_dir` names it.
        readout_mae: the class-posterior MAE of the read-out, over every informative
            position of the test sequences (absent where no position is informative).
        readout_positions: the supervised positions (index into ``positions``) with at least
            one informative sequence.
        readout_mae_by_position: the read-out's MAE at each of those positions.
        informative_share_by_position: ``[P]`` the share of sequences where the classes'
            predictives differ enough to read the class posterior from the answer's.
        probe_layers: the probes, from the embedding to the final LayerNorm.
    """

    run_dir: str
    readout_positions: tuple[int, ...]
    readout_mae_by_position: tuple[float, ...]
    informative_share_by_position: tuple[float, ...]
    probe_layers: tuple[ClassProbeLayer, ...]
    readout_mae: float | None = omitted_when_none()


@result_type("class_posterior")
@dataclass(frozen=True, kw_only=True)
class ClassPosterior(AnalysisResult):
    """The class posterior read out of each run and probed from its residual stream.

    Attributes:
        classes: the hypothesis classes, in the order of the class axis.
        n_train_sequences, n_test_sequences: the probes' split (the read-out scores the test ones).
        prior_mae: the MAE of the prior over classes (uniform) on the test sequences: the
            floor a read-out or probe must beat.
        runs: one entry per run.
    """

    classes: tuple[str, ...]
    n_train_sequences: int
    n_test_sequences: int
    prior_mae: float
    runs: tuple[RunClassPosterior, ...]
