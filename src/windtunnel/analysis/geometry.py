"""The geometry of the representations (the paper's Fig 14 and 16-17): keys and value manifolds.

Two diagnostics, each a library function of models and episodes plus a registered
analysis that runs it on the first :data:`~windtunnel.analysis.base.N_DIAGNOSTIC_SEQUENCES`
sequences of the fixed eval set (where the queries attend, Fig 15, is in
:mod:`windtunnel.analysis.attention`):

- ``key_orthogonality`` (Fig 14): the keys each attention head produces for each input
  token value (bijection: the inputs ``x``; HMM: the observation symbols), averaged over
  every occurrence; their cosine matrix and its mean |off-diagonal| per head and layer.
  The paper's layer-0 "hypothesis frame" is near-orthogonal (mean |cos| < 0.1).
- ``value_manifold`` (Fig 16-17): PCA of the final residual stream and of the last
  attention layer's values at the supervised positions; variance explained by PC1/PC2 and
  the Spearman correlation of PC1 with the exact posterior entropy (paper: PC1 > 80%,
  strongly correlated).

Heads are not aligned across seeds (head 2 of one seed has no relation to head 2 of
another), so results over several runs average per-layer numbers (mean and spread over
runs) and keep per-head numbers per run.

    from windtunnel.analysis.base import first_sequences
    from windtunnel.analysis.geometry import key_orthogonality
    episodes = first_sequences(eval_set, 512)
    result = key_orthogonality([model], episodes, tunnel)
    result["frame_heads"][0]   # {"layer": 0, "head": 2, "mean_abs_offdiag_cos": 0.04}
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from windtunnel.analysis.base import (
    Run,
    check_same_architecture,
    diagnostic_episodes,
    head_grid,
    register,
    summarize,
)
from windtunnel.analysis.stats import pca, spearman
from windtunnel.models import SequenceModel, run_with_trace
from windtunnel.tunnels import BijectionTunnel, Episode, HMMTunnel, Tunnel

__all__ = [
    "cosine_matrix",
    "key_orthogonality",
    "key_token_values",
    "mean_abs_offdiagonal",
    "token_keys",
    "value_manifold",
]

#: Points kept (run 0) for the value-manifold scatter plot.
N_SCATTER = 2000


# --- key orthogonality (Fig 14) ---------------------------------------------------------


def key_token_values(tunnel: Tunnel) -> tuple[list[int], list[str]]:
    """The token ids whose keys are compared, and a label for each.

    Bijection: the input tokens ``x = 0..V-1`` (outputs are tokens ``V + y`` and are not
    compared). HMM: the observation symbols ``o = 0..M-1`` (tokens ``N + 1 + o``; header
    tokens are grid counts and are not compared).
    """
    if isinstance(tunnel, BijectionTunnel):
        return list(range(tunnel.V)), [f"x={x}" for x in range(tunnel.V)]
    if isinstance(tunnel, HMMTunnel):
        first = tunnel.levels + 1
        return list(range(first, first + tunnel.M)), [f"o={o}" for o in range(tunnel.M)]
    raise ValueError(f"key orthogonality knows the bijection and hmm tunnels, not {tunnel.name!r}")


@torch.no_grad()
def token_keys(model: SequenceModel, episodes: Sequence[Episode], token_values: Sequence[int]) -> dict[int, Tensor]:
    """Each attention head's mean key for each token value.

    Args:
        model: a transformer (layers without attention are skipped).
        episodes: the sequences to read.
        token_values: ``X`` token ids.

    Returns:
        ``{layer: [H, X, d_head] float64}``: the key at every position holding token
        ``token_values[i]`` (every sequence, every position), averaged. Keys also carry
        the position's embedding; averaged over occurrences, it becomes a component
        (nearly) shared by all tokens, which the centered cosines remove.

    Raises:
        ValueError: a token value never occurs in ``episodes``.
    """
    layers = sorted(model.attention_heads)
    values = torch.tensor(list(token_values))  # [X]
    sums = {layer: torch.zeros(()) for layer in layers}
    counts = torch.zeros(len(values), dtype=torch.float64)  # [X]
    for episode in episodes:
        _, trace = run_with_trace(model, episode.tokens, [f"blocks.{layer}.attn.k" for layer in layers])
        onehot = (episode.tokens[..., None] == values).double()  # [B, T, X]
        counts += onehot.sum((0, 1))
        for layer in layers:
            keys = trace[f"blocks.{layer}.attn.k"].double()  # [B, H, T, d_head]
            sums[layer] = sums[layer] + torch.einsum("btx,bhtf->hxf", onehot, keys)  # [H, X, d_head]
    if (counts == 0).any():
        missing = values[counts == 0].tolist()
        raise ValueError(f"token values {missing} never occur in the episodes: their keys are undefined")
    return {layer: sums[layer] / counts[:, None] for layer in layers}


def cosine_matrix(vectors: Tensor) -> Tensor:
    """``[..., X, d] -> [..., X, X]`` cosine similarity between the ``X`` vectors (0 for a zero vector)."""
    unit = vectors / vectors.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(vectors.dtype).tiny)
    return unit @ unit.transpose(-1, -2)


def mean_abs_offdiagonal(matrix: Tensor) -> Tensor:
    """``[..., X, X] -> [...]``: mean of ``|matrix[i, j]|`` over ``i != j``."""
    X = matrix.shape[-1]
    off = ~torch.eye(X, dtype=torch.bool, device=matrix.device)  # [X, X]
    return matrix.abs()[..., off].mean(-1)


def key_orthogonality(models: Sequence[SequenceModel], episodes: Sequence[Episode], tunnel: Tunnel) -> dict[str, Any]:
    """Cosine geometry of the keys each head gives the input token values (Fig 14).

    Two versions of each cosine matrix: ``raw`` (the keys as they are: the paper's
    measure) and ``centered`` (the mean key over token values subtracted first). A key
    component shared by every token cannot change where a query attends (softmax is
    invariant to adding ``q . c`` to all scores), so the centered version looks at what
    distinguishes tokens; note that ``X`` orthonormal vectors, once centered, have cosine
    ``-1/(X-1)`` rather than 0. A trained model can have raw cosines near 1 when its keys
    share a large "this is an input token" component, while the centered ones are small.

    The frame head is, per run, the head of the first attention layer (layer 0 in a
    standard transformer) with the lowest raw mean |off-diagonal cos|.

    Returns:
        ``runs``; ``token_values`` and ``token_labels`` (the ``X`` tokens compared);
        ``layers``: per attention layer ``mean_abs_offdiag_cos`` and
        ``mean_abs_offdiag_cos_centered`` (mean over heads; mean and std over runs);
        ``heads_mean_abs_offdiag_cos`` and ``heads_mean_abs_offdiag_cos_centered``:
        per run a ``[layer][head]`` grid (None for layers without attention);
        ``frame_heads``: per run ``{layer, head, mean_abs_offdiag_cos}``;
        ``frame_head_mean_abs_offdiag_cos`` (mean and std over runs);
        ``frame_head_cos`` and ``frame_head_cos_centered``: the ``[X][X]`` cosine
        matrices of run 0's frame head;
        ``centered_orthonormal_reference``: ``1/(X-1)``, the centered value of
        orthonormal keys;
        ``anchor``: the paper's claim and whether the frame layer and head meet it.
    """
    check_same_architecture(models, "the geometric analyses")
    token_values, labels = key_token_values(tunnel)
    n_layers = models[0].n_layers
    layers = sorted(models[0].attention_heads)
    if not layers:
        raise ValueError("key orthogonality needs a model with attention")
    raw_runs, centered_runs, frame_heads = [], [], []
    frame_cos = frame_cos_centered = None
    for model in models:
        keys = token_keys(model, episodes, token_values)  # {layer: [H, X, d_head]}
        cos = {layer: cosine_matrix(k) for layer, k in keys.items()}  # {layer: [H, X, X]}
        raw = {layer: mean_abs_offdiagonal(c) for layer, c in cos.items()}  # {layer: [H]}
        centered = {
            layer: mean_abs_offdiagonal(cosine_matrix(k - k.mean(dim=1, keepdim=True))) for layer, k in keys.items()
        }
        head = int(raw[layers[0]].argmin())
        frame_heads.append({"layer": layers[0], "head": head, "mean_abs_offdiag_cos": raw[layers[0]][head].item()})
        if frame_cos is None:
            frame_keys = keys[layers[0]][head]  # [X, d_head]
            frame_cos = cosine_matrix(frame_keys)
            frame_cos_centered = cosine_matrix(frame_keys - frame_keys.mean(0))
        raw_runs.append(raw)
        centered_runs.append(centered)
    per_layer = [
        {
            "layer": layer,
            "mean_abs_offdiag_cos": summarize([r[layer].mean().item() for r in raw_runs]),
            "mean_abs_offdiag_cos_centered": summarize([c[layer].mean().item() for c in centered_runs]),
        }
        for layer in layers
    ]
    frame_summary = summarize([f["mean_abs_offdiag_cos"] for f in frame_heads])
    frame_layer = per_layer[0]["mean_abs_offdiag_cos"]["mean"]
    return {
        "runs": len(models),
        "token_values": token_values,
        "token_labels": labels,
        "layers": per_layer,
        "heads_mean_abs_offdiag_cos": [head_grid(n_layers, r) for r in raw_runs],
        "heads_mean_abs_offdiag_cos_centered": [head_grid(n_layers, c) for c in centered_runs],
        "frame_heads": frame_heads,
        "frame_head_mean_abs_offdiag_cos": frame_summary,
        "frame_head_cos": frame_cos.tolist(),
        "frame_head_cos_centered": frame_cos_centered.tolist(),
        "centered_orthonormal_reference": 1.0 / (len(token_values) - 1),
        "anchor": {
            "claim": "layer-0 mean |off-diagonal cos| of the keys over input tokens < 0.1",
            "frame_layer_mean_abs_offdiag_cos": frame_layer,
            "frame_head_mean_abs_offdiag_cos": frame_summary["mean"],
            "met_by_layer": frame_layer < 0.1,
            "met_by_frame_head": frame_summary["mean"] < 0.1,
        },
    }




# --- value manifold (Fig 16-17) --------------------------------------------------------








def _manifold_spaces(model: SequenceModel) -> dict[str, str]:
    """Space name -> activation read at the supervised positions."""
    spaces = {"resid_post": f"blocks.{model.n_layers - 1}.resid_post"}  # [B, T, d_model]
    if model.attention_heads:
        last = max(model.attention_heads)
        spaces["attn_v"] = f"blocks.{last}.attn.v"  # [B, H, T, d_head]
        spaces["attn_z"] = f"blocks.{last}.attn.z"  # [B, H, T, d_head]
    return spaces


@torch.no_grad()
def _supervised_points(model: SequenceModel, episodes: Sequence[Episode], names: Sequence[str]) -> dict[str, Tensor]:
    """``{name: [N, width]}`` activations at the supervised positions (heads concatenated),
    ``N = sequences * P`` in episode, sequence, position order."""
    points: dict[str, list[Tensor]] = {name: [] for name in names}
    for episode in episodes:
        _, trace = run_with_trace(model, episode.tokens, list(names))
        for name in names:
            x = trace[name][..., episode.positions, :]  # [B, T, d] -> [B, P, d]  or  [B, H, P, d_head]
            if x.dim() == 4:
                x = x.permute(0, 2, 1, 3).flatten(2)  # [B, P, H * d_head]
            points[name].append(x.flatten(0, 1).double())  # [B * P, width]
    return {name: torch.cat(chunks) for name, chunks in points.items()}


def value_manifold(
    models: Sequence[SequenceModel], episodes: Sequence[Episode], *, n_scatter: int = N_SCATTER, seed: int = 0
) -> dict[str, Any]:
    """PCA of the representations at the supervised positions against the exact entropy (Fig 16-17).

    Spaces: ``resid_post`` (the residual stream after the last block, what the head
    reads), and for models with attention ``attn_v`` (the value vectors of the last
    attention layer, heads concatenated: what each position offers later queries) and
    ``attn_z`` (the same layer's per-head mix of values read at the position, heads
    concatenated). Each component is oriented so that its Spearman correlation with the
    exact posterior entropy is >= 0 (the sign of a principal component is arbitrary), so
    ``spearman_*`` is the strength of a monotone relation in either direction.

    Args:
        models: runs of one architecture (transformer or MLP control).
        episodes: the sequences to read.
        n_scatter: points kept (run 0, random subset) for the scatter plot.
        seed: seed of that subset.

    Returns:
        ``runs``, ``n_points``, and ``spaces``: per space its ``activation``, ``dim``,
        ``variance_ratio`` (first 5 components, mean over runs), ``pc1_variance``,
        ``pc2_variance``, ``spearman_pc1_entropy``, ``spearman_pc2_entropy`` (each mean
        and std over runs), and ``scatter``: ``pc1``, ``pc2``, ``entropy_bits`` lists for
        the subset of run 0's points. ``anchor``: the paper's claim against
        ``resid_post``.
    """
    check_same_architecture(models, "the geometric analyses")
    entropy = torch.cat([e.entropy_bits.flatten() for e in episodes])  # [N]
    N = len(entropy)
    keep = torch.randperm(N, generator=torch.Generator().manual_seed(seed))[:n_scatter]
    spaces = _manifold_spaces(models[0])
    per_run: list[dict[str, dict[str, Any]]] = []
    for model in models:
        points = _supervised_points(model, episodes, list(spaces.values()))
        results = {}
        for space, name in spaces.items():
            ratio, scores = pca(points[name])  # [K], [N, K]
            rho = [spearman(scores[:, i], entropy) for i in range(2)]
            sign = torch.tensor([-1.0 if r < 0 else 1.0 for r in rho], dtype=torch.float64)
            results[space] = {
                "dim": points[name].shape[1],
                "ratio": ratio,
                "rho": [abs(r) for r in rho],
                "scores": scores[:, :2] * sign,  # [N, 2], oriented
            }
        per_run.append(results)
    first = per_run[0]
    out_spaces = {}
    for space, name in spaces.items():
        ratios = torch.stack([r[space]["ratio"][:5] for r in per_run])  # [R, 5]
        scatter = first[space]["scores"][keep]  # [n, 2]
        out_spaces[space] = {
            "activation": name,
            "dim": first[space]["dim"],
            "variance_ratio": ratios.mean(0).tolist(),
            "pc1_variance": summarize([r[space]["ratio"][0].item() for r in per_run]),
            "pc2_variance": summarize([r[space]["ratio"][1].item() for r in per_run]),
            "spearman_pc1_entropy": summarize([r[space]["rho"][0] for r in per_run]),
            "spearman_pc2_entropy": summarize([r[space]["rho"][1] for r in per_run]),
            "scatter": {
                "pc1": [float(f"{v:.5g}") for v in scatter[:, 0].tolist()],
                "pc2": [float(f"{v:.5g}") for v in scatter[:, 1].tolist()],
                "entropy_bits": [float(f"{v:.5g}") for v in entropy[keep].tolist()],
            },
        }
    resid = out_spaces["resid_post"]
    return {
        "runs": len(models),
        "n_points": N,
        "spaces": out_spaces,
        "anchor": {
            "claim": "PC1 of the final residual stream explains > 80% of the variance and is strongly correlated "
            "with the posterior entropy (taken here as |Spearman| > 0.8)",
            "pc1_variance": resid["pc1_variance"]["mean"],
            "spearman_pc1_entropy": resid["spearman_pc1_entropy"]["mean"],
            "met": resid["pc1_variance"]["mean"] > 0.8 and resid["spearman_pc1_entropy"]["mean"] > 0.8,
        },
    }


# --- registered analyses ----------------------------------------------------------------


@register("key_orthogonality", needs_attention=True)
def key_orthogonality_of_runs(runs: Sequence[Run]) -> dict[str, Any]:
    """Fig 14: cosines between the keys of the input token values, per head; the layer-0 frame head."""
    return key_orthogonality([r.model for r in runs], diagnostic_episodes(runs), runs[0].config.tunnel)


@register("value_manifold")
def value_manifold_of_runs(runs: Sequence[Run]) -> dict[str, Any]:
    """Fig 16-17: PCA of final residuals and last-layer values; PC1 against the exact entropy."""
    return value_manifold([r.model for r in runs], diagnostic_episodes(runs))
