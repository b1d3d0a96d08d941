"""Typed result of query-key sharpening (:mod:`windtunnel.analysis.attention`, the paper's Fig 15).

Query-key sharpening asks where each attention layer's queries at the supervised positions
attend, and how sharply: the keys a query can see are split into the kinds its tunnel
declares (its attention categories; for the bijection the evidence that fixes the exact
posterior, the query's own input, other inputs and outputs; for the HMM the header's T and
E, and the observations), and per layer the attention mass on each kind and the attention
entropy in bits are set against what uniform attention over the causal keys would give
(their ratio is the lift). Sharpening with depth shows as rising evidence mass and falling
entropy. The same numbers for the runs' randomly initialized models sit beside them, and so
does the authors' own quantity: the cosine of each supervised query with the keys of the
earlier supervised positions, a heat map with no scalar or threshold.
"""

from __future__ import annotations

from dataclasses import dataclass

from windtunnel.results.base import AnalysisResult, Summary, result_type

__all__ = ["AttentionLayer", "AuthorsQueryKeyCosine", "HeadAttention", "InitialAttention", "QKSharpening", "QueryKeyCosineLayer"]


@dataclass(frozen=True, kw_only=True)
class HeadAttention:
    """One layer's attention per head, in run 0 (heads are not aligned across seeds).

    Attributes:
        mass: per attention category, ``[H]`` the mass the supervised queries put on it.
        entropy_bits: ``[H]`` the entropy of the queries' attention, in bits.
    """

    mass: dict[str, tuple[float, ...]]
    entropy_bits: tuple[float, ...]


@dataclass(frozen=True, kw_only=True)
class InitialAttention:
    """One layer's lift and attention entropy in the runs' randomly initialized models.

    Attributes:
        lift: per attention category, the mean mass over uniform attention's mass; None
            where uniform attention gives the category no mass.
        entropy_bits: the attention entropy in bits, mean over heads, over runs.
    """

    lift: dict[str, float | None]
    entropy_bits: Summary


@dataclass(frozen=True, kw_only=True)
class AttentionLayer:
    """Where one attention layer's supervised queries attend, and how sharply.

    Attributes:
        layer: the layer's index.
        mass: per attention category, the mass on it (mean over heads), over runs.
        lift: per attention category, the mean mass over uniform attention's mass (above 1:
            attended more than uniform); None where uniform attention gives it no mass.
        entropy_bits: the attention entropy in bits (mean over heads), over runs.
        heads: the mass and entropy per head, in run 0.
        random_init: the lift and entropy of the initial models; None without them.
    """

    layer: int
    mass: dict[str, Summary]
    lift: dict[str, float | None]
    entropy_bits: Summary
    heads: HeadAttention
    random_init: InitialAttention | None


@dataclass(frozen=True, kw_only=True)
class QueryKeyCosineLayer:
    """One attention layer's mean query-key cosine between supervised positions (the
    authors' measure), over all query-key pairs with an earlier key, sequences and heads.

    Attributes:
        layer: the layer's index.
        mean_cos: the mean cosine, over runs.
        random_init_mean_cos: the same for the initial models; None without them.
    """

    layer: int
    mean_cos: Summary
    random_init_mean_cos: Summary | None


@dataclass(frozen=True, kw_only=True)
class AuthorsQueryKeyCosine:
    """The authors' query-key cosine: each supervised query against the keys of the earlier
    supervised positions, read from the layer's LayerNorm output.

    Attributes:
        definition: the measure in one sentence.
        layers: per attention layer, the mean cosine, trained and at initialization.
        heatmap: run 0's ``[layer][query index][key index]`` cosine over the supervised
            positions (mean over sequences and heads); None for a layer without attention,
            and None in the cells whose key index is not earlier than the query's.
        note: why there is no scalar to decide on (the authors define no threshold).
    """

    definition: str
    layers: tuple[QueryKeyCosineLayer, ...]
    heatmap: tuple[tuple[tuple[float | None, ...], ...] | None, ...]
    note: str


@result_type("qk_sharpening")
@dataclass(frozen=True, kw_only=True)
class QKSharpening(AnalysisResult):
    """Attention mass on each category of key and attention entropy at the supervised
    positions, by layer, over runs (Fig 15).

    The attention categories depend on the tunnel, so every per-category object is keyed by
    the category's name, in the order of ``categories``.

    Attributes:
        tunnel: the tunnel's name (here the name alone: the analysis writes it over the
            header's parameters, which ``tunnel_label`` and ``task_variant`` still carry).
        runs: the number of runs read.
        categories: the tunnel's attention categories, in order; they partition the keys a
            query can see.
        category_meanings: per category, what its keys are, in words.
        uniform_mass: per category, the mass attention spread evenly over the causal keys
            would give it.
        uniform_entropy_bits: the entropy of such uniform attention, in bits.
        layers: per attention layer, the mass, lift and entropy, per head and at initialization.
        authors_query_key_cosine: the authors' query-key cosine, per layer and as a heat map.
    """

    tunnel: str
    runs: int
    categories: tuple[str, ...]
    category_meanings: dict[str, str]
    uniform_mass: dict[str, float]
    uniform_entropy_bits: float
    layers: tuple[AttentionLayer, ...]
    authors_query_key_cosine: AuthorsQueryKeyCosine
