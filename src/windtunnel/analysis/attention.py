"""Where the queries attend, layer by layer (the paper's Fig 15: query-key sharpening).

``qk_sharpening`` splits the keys each supervised query can see into the kinds its tunnel
declares (:class:`~windtunnel.tunnels.capabilities.AttentionCategories`; for the
bijection: the evidence that fixes the exact posterior, the query's own input, other
inputs and outputs; for the HMM: the header's T and E, and the observations), and
reports per layer (mean over heads, and per head) the attention mass on each kind and
the attention entropy in bits, against what uniform attention would give. Run as a
registered analysis on the first
:data:`~windtunnel.analysis.base.N_DIAGNOSTIC_SEQUENCES` sequences of the fixed eval set.

    from windtunnel.analysis.attention import qk_sharpening
    result = qk_sharpening([model], episodes, tunnel)
    [row["mass"]["evidence"]["mean"] for row in result["layers"]]

Beside it, the authors' own quantity (``authors_query_key_cosine``: the cosine of each
supervised query with the keys of the earlier supervised positions, a heat map), and the
same numbers for the runs' randomly initialized models (``initial_models``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from windtunnel.analysis.base import Run, check_same_architecture, diagnostic_episodes, initial_models_of, register, summarize, traced
from windtunnel.metrics import entropy_bits
from windtunnel.models import SequenceModel
from windtunnel.tunnels import Episode, Tunnel
from windtunnel.tunnels.capabilities import AttentionCategories, lacks

__all__ = ["AUTHORS_QUERY_KEY_COSINE", "qk_sharpening"]


# --- query-key sharpening (Fig 15) -----------------------------------------------------

def _unit(vectors: Tensor) -> Tensor:
    """``[..., d]`` vectors scaled to unit length (a zero vector stays zero, so its cosines are 0)."""
    return vectors / vectors.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(vectors.dtype).tiny)


@torch.no_grad()
def _attention_stats(model: SequenceModel, episodes: Sequence[Episode], tunnel: Tunnel) -> dict[str, Any]:
    """Per attention layer ``[H]`` masses by category and entropy, averaged over sequences and
    the supervised positions with more than one key; the uniform-attention references; and
    per layer the ``[P, P]`` query-key cosine between supervised positions (the authors'
    measure), averaged over sequences and heads."""
    layers = sorted(model.attention_heads)
    mass: dict[int, dict[str, Tensor]] = {layer: {} for layer in layers}
    entropy: dict[int, Tensor] = {layer: torch.zeros(()) for layer in layers}
    query_key_cos: dict[int, Tensor] = {layer: torch.zeros(()) for layer in layers}
    uniform_mass: dict[str, Tensor] = {}
    uniform_entropy = torch.zeros(())
    n_total = 0
    names = [f"blocks.{layer}.attn.{what}" for layer in layers for what in ("pattern", "q", "k")]
    for episode in episodes:
        categories = tunnel.attention_categories(episode)  # {name: [B, P, T]}
        queries = episode.positions  # [P]
        valid = queries >= 1  # [P]: a query that sees only itself has nothing to choose
        n_keys = (queries + 1).double()[valid]  # [P']
        _, trace = traced(model, episode.tokens, names, episode.value_inputs)
        B = episode.batch_size
        n_total += B
        for name, keys in categories.items():
            share = keys[:, valid].sum(-1).double() / n_keys  # [B, P']: the mass uniform attention would give
            uniform_mass[name] = uniform_mass.get(name, 0) + share.mean(1).sum(0)
        uniform_entropy = uniform_entropy + B * torch.log2(n_keys).mean()
        for layer in layers:
            pattern = trace[f"blocks.{layer}.attn.pattern"][:, :, queries[valid]].double()  # [B, H, P', T]
            for name, keys in categories.items():
                on_keys = (pattern * keys[:, None, valid]).sum(-1)  # [B, H, P']
                mass[layer][name] = mass[layer].get(name, 0) + on_keys.mean(2).sum(0)  # [H]
            entropy[layer] = entropy[layer] + entropy_bits(pattern).mean(2).sum(0)  # [H]
            q = _unit(trace[f"blocks.{layer}.attn.q"][:, :, queries].double())  # [B, H, P, d_head]
            k = _unit(trace[f"blocks.{layer}.attn.k"][:, :, queries].double())  # [B, H, P, d_head]
            query_key_cos[layer] = query_key_cos[layer] + (q @ k.transpose(-1, -2)).mean(1).sum(0)  # [P, P]
    return {
        "mass": {layer: {name: m / n_total for name, m in per.items()} for layer, per in mass.items()},
        "entropy_bits": {layer: e / n_total for layer, e in entropy.items()},
        "uniform_mass": {name: (m / n_total).item() for name, m in uniform_mass.items()},
        "uniform_entropy_bits": (uniform_entropy / n_total).item(),
        "query_key_cos": {layer: c / n_total for layer, c in query_key_cos.items()},
    }


#: What the authors' query-key cosine is, in one sentence.
AUTHORS_QUERY_KEY_COSINE = (
    "The authors' qkv_analysis.py measure: at each supervised query position p (bijection: the input x_k; HMM: "
    "the observation o_t), the cosine between the query q_p and the key k_j of each earlier supervised position "
    "j < p (bijection: the earlier inputs, the authors' keys at earlier input positions), both read from the "
    "layer's LayerNorm output, per head and then averaged over heads; the authors take the prefixes of one fixed "
    "sequence, we average over the diagnostic sequences."
)


def _earlier_pairs(n_positions: int) -> Tensor:
    """``[P, P]`` bool: ``(query index i, key index j)`` with ``j < i``."""
    return torch.ones(n_positions, n_positions, dtype=torch.bool).tril(diagonal=-1)


def _mean_query_key_cos(cos: Tensor) -> float:
    """``[P, P]`` mean cosines -> their mean over the pairs with an earlier key (each pair
    holds the same number of sequences and heads, so this is the mean over all of them)."""
    return cos[_earlier_pairs(cos.shape[0])].mean().item()


def _layer_rows(
    stats: Sequence[dict[str, Any]], layers: list[int], categories: list[str], uniform: dict[str, float]
) -> dict[int, dict[str, Any]]:
    """Per layer the over-runs ``mass``, ``lift`` and ``entropy_bits`` of one set of runs."""
    rows = {}
    for layer in layers:
        mass = {name: summarize([s["mass"][layer][name].mean().item() for s in stats]) for name in categories}
        rows[layer] = {
            "mass": mass,
            "lift": {name: mass[name]["mean"] / uniform[name] if uniform[name] > 0 else None for name in categories},
            "entropy_bits": summarize([s["entropy_bits"][layer].mean().item() for s in stats]),
        }
    return rows


def qk_sharpening(
    models: Sequence[SequenceModel],
    episodes: Sequence[Episode],
    tunnel: Tunnel,
    *,
    initial_models: Sequence[SequenceModel] | None = None,
) -> dict[str, Any]:
    """Where each layer's queries at the supervised positions attend, and how sharply (Fig 15).

    For each attention layer and head: the attention mass a supervised query puts on each
    category of key (the tunnel's ``attention_categories``; for the bijection, ``evidence`` is the
    set of positions whose content fixes the exact posterior of ``pi(x_q)``), and the
    entropy of its attention distribution in bits. Both are averaged over sequences and
    over the supervised positions that see more than one key (the bijection's first
    input sees only itself). ``uniform_*`` is what attention spread evenly over the causal
    keys would give; ``lift`` is mass over that. Sharpening with depth shows as rising
    evidence mass (lift > 1) and falling entropy.

    Beside ours, the authors' own quantity (:data:`AUTHORS_QUERY_KEY_COSINE`): the cosine
    between each supervised query and the keys of the earlier supervised positions, a heat
    map without a scalar or threshold.

    Args:
        models: trained runs of one architecture.
        episodes: the sequences to read.
        tunnel: their tunnel; it declares
            :class:`~windtunnel.tunnels.capabilities.AttentionCategories`.
        initial_models: the same runs' initial (step-0) models, read by exactly the same
            code; None leaves every random-init field None.

    Returns:
        ``runs``; ``tunnel``; ``categories`` and ``category_meanings``;
        ``uniform_mass`` ``{category: float}`` and ``uniform_entropy_bits``;
        ``layers``: per attention layer ``mass`` ``{category: {mean, std}}`` (mean over
        heads; mean and std over runs), ``lift`` ``{category: float}``, ``entropy_bits``
        ``{mean, std}``, ``heads`` (run 0): ``mass`` ``{category: [H]}`` and
        ``entropy_bits`` ``[H]``, and ``random_init``: ``{lift, entropy_bits}`` of the
        initial models (None without them);
        ``authors_query_key_cosine``: ``definition``, ``layers`` (per attention layer
        ``mean_cos`` and ``random_init_mean_cos``, mean and std over runs of the mean over
        all query-key pairs, sequences and heads), ``heatmap`` (run 0, ``[layer][query
        index][key index]`` over the supervised positions, None for layers without
        attention and where the key index is not earlier), ``note``.
    """
    check_same_architecture(models, "the geometric analyses")
    if initial_models is not None:
        check_same_architecture([*models, *initial_models], "the geometric analyses (trained and initial models)")
    layers = sorted(models[0].attention_heads)
    if not layers:
        raise ValueError("qk sharpening needs a model with attention")
    missing = lacks(tunnel, AttentionCategories)
    if missing:
        raise ValueError(f"qk sharpening needs the evidence of each query: {missing}")
    stats = [_attention_stats(model, episodes, tunnel) for model in models]
    initial = None if initial_models is None else [_attention_stats(m, episodes, tunnel) for m in initial_models]
    categories = list(stats[0]["uniform_mass"])
    uniform = stats[0]["uniform_mass"]
    trained_rows = _layer_rows(stats, layers, categories, uniform)
    initial_rows = None if initial is None else _layer_rows(initial, layers, categories, uniform)
    rows = []
    for layer in layers:
        rows.append(
            {
                "layer": layer,
                **trained_rows[layer],
                "heads": {
                    "mass": {name: stats[0]["mass"][layer][name].tolist() for name in categories},
                    "entropy_bits": stats[0]["entropy_bits"][layer].tolist(),
                },
                "random_init": None
                if initial_rows is None
                else {key: initial_rows[layer][key] for key in ("lift", "entropy_bits")},
            }
        )

    def heatmap(cos: Tensor) -> list[list[float | None]]:
        earlier = _earlier_pairs(cos.shape[0])  # [P, P]
        return [[v if e else None for v, e in zip(row, mask)] for row, mask in zip(cos.tolist(), earlier.tolist())]

    return {
        "runs": len(models),
        "tunnel": tunnel.name,
        "categories": categories,
        "category_meanings": dict(tunnel.category_meanings),
        "uniform_mass": uniform,
        "uniform_entropy_bits": stats[0]["uniform_entropy_bits"],
        "layers": rows,
        "authors_query_key_cosine": {
            "definition": AUTHORS_QUERY_KEY_COSINE,
            "layers": [
                {
                    "layer": layer,
                    "mean_cos": summarize([_mean_query_key_cos(s["query_key_cos"][layer]) for s in stats]),
                    "random_init_mean_cos": None
                    if initial is None
                    else summarize([_mean_query_key_cos(s["query_key_cos"][layer]) for s in initial]),
                }
                for layer in layers
            ],
            "heatmap": [
                heatmap(stats[0]["query_key_cos"][layer]) if layer in stats[0]["query_key_cos"] else None
                for layer in range(models[0].n_layers)
            ],
            "note": "the authors define no scalar and no threshold: a heat map only",
        },
    }


def _needs_categories(runs: Sequence[Run]) -> str | None:
    return lacks(runs[0].config.tunnel, AttentionCategories)


@register("qk_sharpening", needs_attention=True, requires=_needs_categories)
def qk_sharpening_of_runs(runs: Sequence[Run]) -> dict[str, Any]:
    """Fig 15: attention mass on the evidence and attention entropy at the supervised positions, by layer."""
    return qk_sharpening(
        [r.model for r in runs],
        diagnostic_episodes(runs),
        runs[0].config.tunnel,
        initial_models=initial_models_of(runs),
    )
