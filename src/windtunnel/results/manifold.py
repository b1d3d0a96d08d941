"""Typed result of the value manifold (:mod:`windtunnel.analysis.manifold`, the paper's Fig 16-17).

The value manifold asks whether the last layer's geometry is one-dimensional in the
posterior entropy: a PCA of activations at the supervised positions (the residual stream
leaving the last block, and for models with attention the last attention layer's values and
their per-head mix), the variance explained by PC1 and PC2 and the |Spearman| correlation of
each with the exact posterior entropy, over runs, with a sample of run 0's points for the
scatter plot. ``measures`` holds the question under each definition in use (ours, and the
authors' Paper-I and HMM-script point sets), each with the runs' randomly initialized models
beside it; a measure the tunnel has no positions for is listed in ``measures_skipped``.
"""

from __future__ import annotations

from dataclasses import dataclass

from windtunnel.results.base import AnalysisResult, Summary, result_type

__all__ = ["EntropyCorrelation", "InitialManifold", "ManifoldMeasure", "ManifoldSpace", "Scatter", "ValueManifold"]


@dataclass(frozen=True, kw_only=True)
class Scatter:
    """A random subset of run 0's points for the scatter plot (values rounded to 5 significant digits).

    Attributes:
        pc1: each point's PC1 score, oriented to correlate positively with the entropy.
        pc2: each point's PC2 score, oriented the same way.
        entropy_bits: each point's exact posterior entropy, in bits.
    """

    pc1: tuple[float, ...]
    pc2: tuple[float, ...]
    entropy_bits: tuple[float, ...]


@dataclass(frozen=True, kw_only=True)
class ManifoldSpace:
    """The PCA of one activation space at the supervised positions, over runs.

    Attributes:
        activation: the traced activation read (``"blocks.1.resid_post"``; heads concatenated
            for the attention spaces).
        dim: its width.
        variance_ratio: the variance share of the first (up to 5) components, mean over runs.
        pc1_variance: PC1's variance share, over runs.
        pc2_variance: PC2's variance share, over runs.
        spearman_pc1_entropy: |Spearman| of PC1 with the exact entropy, over runs.
        spearman_pc2_entropy: |Spearman| of PC2 with the exact entropy, over runs.
        scatter: a subset of run 0's points on PC1 and PC2 with their entropy.
    """

    activation: str
    dim: int
    variance_ratio: tuple[float, ...]
    pc1_variance: Summary
    pc2_variance: Summary
    spearman_pc1_entropy: Summary
    spearman_pc2_entropy: Summary
    scatter: Scatter


@dataclass(frozen=True, kw_only=True)
class EntropyCorrelation:
    """A measure's correlation of the principal components with the exact entropy.

    Attributes:
        statistic: what is taken (``"abs_spearman_pc1"``, ``"abs_pearson_pc1"``,
            ``"max_abs_pearson_pc1_to_pc5"``).
        value: that statistic, over runs.
        pc: the 1-based component that gave it, in run 0 (1 except for the max over PCs).
    """

    statistic: str
    value: Summary
    pc: int


@dataclass(frozen=True, kw_only=True)
class InitialManifold:
    """One measure read off the runs' randomly initialized models.

    Attributes:
        pc1_variance: PC1's variance share, over runs.
        correlation: the measure's correlation with the exact entropy.
    """

    pc1_variance: Summary
    correlation: EntropyCorrelation


@dataclass(frozen=True, kw_only=True)
class ManifoldMeasure:
    """One definition of the value-manifold claim
    (:data:`windtunnel.analysis.manifold.MANIFOLD_MEASURES`), trained and at initialization.

    Attributes:
        definition: the measure in one sentence: which activation, which positions, which statistic.
        activation: the traced activation read (``"ln_final"``, ``"blocks.1.resid_post"``).
        positions: where it is read, in words (the supervised positions, or the value token
            after each).
        n_points: the number of points in the PCA (per run).
        pc1_variance: PC1's variance share, over runs.
        correlation: the measure's correlation with the exact entropy.
        random_init: the same two numbers for the initial models; None without them.
    """

    definition: str
    activation: str
    positions: str
    n_points: int
    pc1_variance: Summary
    correlation: EntropyCorrelation
    random_init: InitialManifold | None


@result_type("value_manifold")
@dataclass(frozen=True, kw_only=True)
class ValueManifold(AnalysisResult):
    """PCA of the final representations against the exact posterior entropy, over runs (Fig 16-17).

    Attributes:
        runs: the number of runs read.
        n_points: the supervised positions read per run (sequences times positions).
        spaces: each activation space by name (``resid_post``, and ``attn_v`` and ``attn_z``
            for models with attention), its PCA against the entropy.
        measures: each value-manifold measure by name (ours and the authors'), trained and
            at initialization.
        measures_skipped: why each measure the tunnel has no positions for was left out, by name.
    """

    runs: int
    n_points: int
    spaces: dict[str, ManifoldSpace]
    measures: dict[str, ManifoldMeasure]
    measures_skipped: dict[str, str]
