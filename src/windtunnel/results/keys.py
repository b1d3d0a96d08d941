"""Typed result of key orthogonality (:mod:`windtunnel.analysis.keys`, the paper's Fig 14).

Key orthogonality asks whether an attention layer's keys over the input tokens form a
near-orthogonal basis (bijection: the inputs ``x``; HMM: the observation symbols): the keys
each head gives each token, averaged over every occurrence, their cosine matrix and its mean
|off-diagonal| per head and layer, raw and centered (the mean key over tokens subtracted,
since a component every key shares cannot change where a query attends). Heads are not
aligned across seeds, so per-layer numbers are summarized over runs and per-head numbers are
kept per run; the frame head is each run's head of the first attention layer with the lowest
raw cosine. The same numbers for the runs' randomly initialized models sit beside them, and
``measures`` holds the question under each definition in use (ours and the authors' two),
each with its chance level.
"""

from __future__ import annotations

from dataclasses import dataclass

from windtunnel.results.base import AnalysisResult, Summary, result_type

__all__ = [
    "AbsCosineChance",
    "FrameHead",
    "HeadGrid",
    "KeyGeometry",
    "KeyLayer",
    "KeyMeasure",
    "KeyMeasureLayer",
    "KeyOrthogonality",
    "SignedCosineChance",
]

#: One run's ``[layer][head]`` numbers: a list per layer, None for a layer without attention.
HeadGrid = tuple[tuple[float, ...] | None, ...]


@dataclass(frozen=True, kw_only=True)
class KeyLayer:
    """One attention layer's mean |off-diagonal cosine| between the token keys, over runs.

    Attributes:
        layer: the layer's index.
        mean_abs_offdiag_cos: the raw keys' mean |off-diagonal cos|, mean over heads, over runs.
        mean_abs_offdiag_cos_centered: the same after subtracting the mean key over tokens
            (orthonormal keys score ``1/(X-1)`` on it, not 0), over runs.
    """

    layer: int
    mean_abs_offdiag_cos: Summary
    mean_abs_offdiag_cos_centered: Summary


@dataclass(frozen=True, kw_only=True)
class FrameHead:
    """One run's frame head: the head of the first attention layer whose raw keys are the
    most nearly orthogonal.

    Attributes:
        layer: the layer it is in (the first attention layer).
        head: its index in that layer.
        mean_abs_offdiag_cos: its raw keys' mean |off-diagonal cos| (the layer's lowest).
    """

    layer: int
    head: int
    mean_abs_offdiag_cos: float


@dataclass(frozen=True, kw_only=True)
class KeyGeometry:
    """The key cosines of the randomly initialized models: the trained result's per-layer,
    per-head and frame-head fields, read by the same code off the runs' step-0 models.

    Attributes:
        layers: per attention layer, the raw and centered mean |off-diagonal cos| over runs.
        heads_mean_abs_offdiag_cos: per run, the ``[layer][head]`` raw mean |off-diagonal cos|.
        heads_mean_abs_offdiag_cos_centered: per run, the same for the centered keys.
        frame_heads: per run, its frame head.
        frame_head_mean_abs_offdiag_cos: the frame heads' mean |off-diagonal cos|, over runs.
        frame_head_cos: ``[X][X]`` raw cosine matrix of run 0's frame head's token keys.
        frame_head_cos_centered: ``[X][X]`` the same after centering the keys.
    """

    layers: tuple[KeyLayer, ...]
    heads_mean_abs_offdiag_cos: tuple[HeadGrid, ...]
    heads_mean_abs_offdiag_cos_centered: tuple[HeadGrid, ...]
    frame_heads: tuple[FrameHead, ...]
    frame_head_mean_abs_offdiag_cos: Summary
    frame_head_cos: tuple[tuple[float, ...], ...]
    frame_head_cos_centered: tuple[tuple[float, ...], ...]


@dataclass(frozen=True, kw_only=True)
class KeyMeasureLayer:
    """One attention layer under one key measure, trained and at initialization, over runs.

    Attributes:
        layer: the layer's index.
        mean_over_heads: the measure's statistic, mean over the layer's heads, over runs.
        best_head: the statistic of the layer's lowest-scoring head (min over heads), over runs.
        random_init_mean_over_heads: ``mean_over_heads`` of the initial models; None without them.
        random_init_best_head: ``best_head`` of the initial models; None without them.
    """

    layer: int
    mean_over_heads: Summary
    best_head: Summary
    random_init_mean_over_heads: Summary | None
    random_init_best_head: Summary | None


@dataclass(frozen=True, kw_only=True)
class AbsCosineChance:
    """What keys with no structure would score on a mean |cos| measure.

    Attributes:
        expected_abs_cos: ``E|cos|`` of two independent isotropic random vectors of the
            head width.
        welch_rms_bound: the smallest root-mean-square off-diagonal |cos| that the measure's
            number of unit vectors can have in the head width (Welch; 0 where they fit
            orthonormally).
    """

    expected_abs_cos: float
    welch_rms_bound: float


@dataclass(frozen=True, kw_only=True)
class SignedCosineChance:
    """What keys with no structure would score on a signed mean cos measure.

    Attributes:
        expected_signed_cos: the expected signed cosine of random keys (0).
    """

    expected_signed_cos: float


@dataclass(frozen=True, kw_only=True)
class KeyMeasure:
    """One definition of key orthogonality (:data:`windtunnel.analysis.keys.KEY_MEASURES`)
    applied to the trained runs and to their initial models.

    Attributes:
        definition: the measure in one sentence: which keys, which tokens, which statistic.
        statistic: ``"mean_abs_cos"`` or ``"signed_mean_cos"`` (the off-diagonal mean taken).
        tokens: the token ids whose keys are compared.
        n_tokens: how many there are.
        d_head: the head width the keys live in (what the chance level depends on).
        layers: per attention layer, the statistic over heads, trained and at initialization.
        heads: per run, the ``[layer][head]`` statistic of the trained model.
        random_init_heads: per run, the same for the initial model; None without them.
        chance: the statistic's chance level for ``n_tokens`` keys of width ``d_head``:
            :class:`AbsCosineChance` for a mean |cos|, :class:`SignedCosineChance` for a
            signed mean.
    """

    definition: str
    statistic: str
    tokens: tuple[int, ...]
    n_tokens: int
    d_head: int
    layers: tuple[KeyMeasureLayer, ...]
    heads: tuple[HeadGrid, ...]
    random_init_heads: tuple[HeadGrid, ...] | None
    chance: AbsCosineChance | SignedCosineChance


@result_type("key_orthogonality")
@dataclass(frozen=True, kw_only=True)
class KeyOrthogonality(AnalysisResult):
    """Cosine geometry of the keys each head gives the input tokens, over runs (Fig 14).

    Attributes:
        runs: the number of runs read.
        token_values: the ``X`` token ids whose keys are compared (the tunnel's symbols).
        token_labels: those tokens for a reader (``"x=0"``, ``"o=1"``).
        layers: per attention layer, the raw and centered mean |off-diagonal cos| over runs.
        heads_mean_abs_offdiag_cos: per run, the ``[layer][head]`` raw mean |off-diagonal
            cos| (None for layers without attention).
        heads_mean_abs_offdiag_cos_centered: per run, the same for the centered keys.
        frame_heads: per run, its frame head (the first attention layer's most orthogonal head).
        frame_head_mean_abs_offdiag_cos: the frame heads' mean |off-diagonal cos|, over runs.
        frame_head_cos: ``[X][X]`` raw cosine matrix of run 0's frame head's token keys.
        frame_head_cos_centered: ``[X][X]`` the same after centering the keys.
        centered_orthonormal_reference: ``1/(X-1)``, what orthonormal keys score once centered.
        random_init: the same per-layer, per-head and frame-head fields for the runs' initial
            models; None without them.
        measures: each key measure by name (ours and the authors'), trained and at
            initialization, with its chance level.
        measures_skipped: why each measure the tunnel has no tokens for was left out, by name.
    """

    runs: int
    token_values: tuple[int, ...]
    token_labels: tuple[str, ...]
    layers: tuple[KeyLayer, ...]
    heads_mean_abs_offdiag_cos: tuple[HeadGrid, ...]
    heads_mean_abs_offdiag_cos_centered: tuple[HeadGrid, ...]
    frame_heads: tuple[FrameHead, ...]
    frame_head_mean_abs_offdiag_cos: Summary
    frame_head_cos: tuple[tuple[float, ...], ...]
    frame_head_cos_centered: tuple[tuple[float, ...], ...]
    centered_orthonormal_reference: float
    random_init: KeyGeometry | None
    measures: dict[str, KeyMeasure]
    measures_skipped: dict[str, str]
