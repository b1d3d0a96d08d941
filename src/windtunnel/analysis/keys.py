"""Key orthogonality (the paper's Fig 14): is layer 0's key basis over the tokens near-orthogonal?

``key_orthogonality`` takes the keys each attention head produces for each input token
value (bijection: the inputs ``x``; HMM: the observation symbols), averaged over every
occurrence, and reports their cosine matrix and its mean |off-diagonal| per head and
layer, raw and centered. ``measures`` holds the same question under each definition in
use, each named for what it is (:data:`KEY_MEASURES`): ours, the authors' Paper-I
all-vocabulary signed mean of ``tok_emb @ W_K``, and their later mean |cos| of the
normalized output-token keys (without the norm's shift, as on their RMSNorm, and with it, as
their script computes on a LayerNorm); each with the runs' randomly initialized models beside it
and the chance level for the head width (:func:`expected_abs_cosine`, :func:`welch_rms_bound`).

Heads are not aligned across seeds (head 2 of one seed has no relation to head 2 of
another), so results over several runs average per-layer numbers (mean and spread over
runs) and keep per-head numbers per run. The registered analysis reads the first
:data:`~windtunnel.analysis.base.N_DIAGNOSTIC_SEQUENCES` sequences of the fixed eval set.

    from windtunnel.analysis.base import first_sequences
    from windtunnel.analysis.keys import key_orthogonality
    episodes = first_sequences(eval_set, 512)
    result = key_orthogonality([model], episodes, tunnel)
    result["frame_heads"][0]   # {"layer": 0, "head": 2, "mean_abs_offdiag_cos": 0.04}
    result["measures"]["normalized_output_keys_abs"]["layers"][0]["best_head"]   # the authors' later measure
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from windtunnel.analysis.base import (
    Run,
    check_same_architecture,
    diagnostic_episodes,
    head_grid,
    initial_models_of,
    register,
    summarize,
    traced,
)
from windtunnel.models import SequenceModel
from windtunnel.tunnels import Episode, Tunnel
from windtunnel.tunnels.capabilities import HypothesisTokens, SymbolTokens, declares, lacks

__all__ = [
    "HYPOTHESIS_MEASURES",
    "KEY_MEASURES",
    "cosine_matrix",
    "embedding_keys",
    "expected_abs_cosine",
    "key_orthogonality",
    "mean_abs_offdiagonal",
    "mean_signed_offdiagonal",
    "normalized_embedding_keys",
    "token_keys",
    "welch_rms_bound",
]


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
        _, trace = traced(model, episode.tokens, [f"blocks.{layer}.attn.k" for layer in layers], episode.value_inputs)
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


def mean_signed_offdiagonal(matrix: Tensor) -> Tensor:
    """``[..., X, X] -> [...]``: mean of ``matrix[i, j]`` over ``i != j`` (signs kept)."""
    X = matrix.shape[-1]
    off = ~torch.eye(X, dtype=torch.bool, device=matrix.device)  # [X, X]
    return matrix[..., off].mean(-1)


def expected_abs_cosine(d: int) -> float:
    """``E|cos|`` between two independent isotropic random vectors in ``d`` dimensions.

    ``cos^2 ~ Beta(1/2, (d-1)/2)``, whose square root has mean
    ``Gamma(d/2) / (sqrt(pi) Gamma((d+1)/2))`` (about ``sqrt(2 / (pi d))`` for large ``d``):
    the mean |cos| that keys with no structure at all would score.
    """
    return math.exp(math.lgamma(d / 2) - math.lgamma((d + 1) / 2)) / math.sqrt(math.pi)


def welch_rms_bound(n_vectors: int, d: int) -> float:
    """The smallest root-mean-square off-diagonal ``|cos|`` any ``n_vectors`` unit vectors in
    ``d`` dimensions can have (Welch): ``sqrt((X - d) / (d (X - 1)))``, 0 when ``X <= d``
    (orthonormal vectors fit). A regular simplex (``X = d + 1``) attains it."""
    X = n_vectors
    return math.sqrt(max(X - d, 0) / (d * (X - 1))) if X > 1 else 0.0


@torch.no_grad()
def embedding_keys(model: SequenceModel) -> dict[int, Tensor]:
    """``{layer: [H, vocab_size, d_head] float64}``: ``tok_emb @ W_K[l, h]`` for every token id
    (token embedding only: no position embedding, no LayerNorm)."""
    W_E, W_K = model.W_E.double(), model.W_K.double()  # [vocab, d_model], [n_layers, H, d_model, d_head]
    return {layer: torch.einsum("vd,hdf->hvf", W_E, W_K[layer]) for layer in sorted(model.attention_heads)}


@torch.no_grad()
def normalized_embedding_keys(model: SequenceModel, token_values: Sequence[int], *, shift: bool = False) -> dict[int, Tensor]:
    """``{layer: [H, X, d_head] float64}``: the layer's LayerNorm applied to the token
    embeddings of ``token_values`` (centering and scale kept; its shift only with ``shift``;
    no position embedding), then ``@ W_K[l, h]``.

    Without the shift this is the authors' later measure as defined on their RMSNorm (a scale,
    no shift); with it, what their script computes when handed a model whose norm has a shift."""
    W_E = model.W_E.double()[list(token_values)]  # [X, d_model]
    W_K = model.W_K.double()  # [n_layers, H, d_model, d_head]
    keys = {}
    for layer in sorted(model.attention_heads):
        ln = model.blocks[layer].attn.ln
        scale = ln.weight.detach().double()  # [d_model]
        bias = ln.bias.detach().double() if shift and ln.bias is not None else None
        normalized = F.layer_norm(W_E, (model.d_model,), weight=scale, bias=bias, eps=ln.eps)  # [X, d_model]
        keys[layer] = torch.einsum("xd,hdf->hxf", normalized, W_K[layer])  # [H, X, d_head]
    return keys


#: The key measures: statistic and one-sentence definition of each.
KEY_MEASURES: dict[str, dict[str, str]] = {
    "in_context_input_keys": {
        "statistic": "mean_abs_cos",
        "definition": "Ours: the key LN(resid) @ W_K of each input token (bijection: the inputs x; HMM: the "
        "observation symbols) read in context at every position holding it, so carrying the position embedding "
        "and the LayerNorm shift, averaged over occurrences; mean |cos| over the off-diagonal token pairs, per head.",
    },
    "in_context_input_keys_centered": {
        "statistic": "mean_abs_cos",
        "definition": "Ours: the same in-context input-token keys after subtracting their mean over tokens (a "
        "component every key shares cannot change where a query attends); mean |off-diagonal cos| per head "
        "(centered orthonormal keys give 1/(X-1), not 0).",
    },
    "embedding_keys_all_tokens_signed": {
        "statistic": "signed_mean_cos",
        "definition": "The authors' Paper-I code (qkv_analysis.py): the key tok_emb @ W_K of every vocabulary "
        "token (token embedding only: no position embedding, no LayerNorm, no bias); the signed mean of the "
        "off-diagonal cosines per head, then the mean over heads; random keys score about 0 on it, so it cannot "
        "tell a trained frame from random initialization.",
    },
    "normalized_output_keys_abs": {
        "statistic": "mean_abs_cos",
        "definition": "The authors' later jlens code ('following Paper I'): the key of each bijection output "
        "(hypothesis) token V..2V-1, norm(tok_emb) @ W_K with no position embedding, where norm is the layer's "
        "LayerNorm with its centering and scale but without its shift (the authors' RMSNorm has a scale only); "
        "mean |off-diagonal cos| per head, the authors reporting the min over layer-0 heads (best_head).",
    },
    "normalized_output_keys_abs_shifted": {
        "statistic": "mean_abs_cos",
        "definition": "The same output-token keys with the LayerNorm's shift kept, norm(tok_emb) + shift, as the "
        "authors' jlens script computes when it reads a model whose norm has a shift (LayerNorm rather than their "
        "RMSNorm); mean |off-diagonal cos| per head.",
    },
}

#: The measures read off the hypothesis (output) tokens: only where the tunnel declares them.
HYPOTHESIS_MEASURES = ("normalized_output_keys_abs", "normalized_output_keys_abs_shifted")


def _key_measures(
    model: SequenceModel, episodes: Sequence[Episode], tunnel: Tunnel
) -> tuple[dict[str, dict[int, Tensor]], dict[int, Tensor]]:
    """One model's ``{measure: {layer: [H]}}`` (see :data:`KEY_MEASURES`; the output-token
    measure only where the tunnel has hypothesis tokens), and its in-context input-token
    keys ``{layer: [H, X, d_head]}``."""
    keys = token_keys(model, episodes, tunnel.symbol_tokens()[0])  # {layer: [H, X, d_head]}
    measures = {
        "in_context_input_keys": {layer: mean_abs_offdiagonal(cosine_matrix(k)) for layer, k in keys.items()},
        "in_context_input_keys_centered": {
            layer: mean_abs_offdiagonal(cosine_matrix(k - k.mean(dim=1, keepdim=True))) for layer, k in keys.items()
        },
        "embedding_keys_all_tokens_signed": {
            layer: mean_signed_offdiagonal(cosine_matrix(k)) for layer, k in embedding_keys(model).items()
        },
    }
    if declares(tunnel, HypothesisTokens):
        hypotheses = tunnel.hypothesis_tokens()
        for name, shift in zip(HYPOTHESIS_MEASURES, (False, True)):
            measures[name] = {
                layer: mean_abs_offdiagonal(cosine_matrix(k))
                for layer, k in normalized_embedding_keys(model, hypotheses, shift=shift).items()
            }
    return measures, keys


def _key_summary(
    per_run: Sequence[tuple[dict[str, dict[int, Tensor]], dict[int, Tensor]]], layers: list[int], n_layers: int
) -> dict[str, Any]:
    """The per-layer, per-head and frame-head fields of :func:`key_orthogonality` for one set of runs."""
    raw_runs = [measures["in_context_input_keys"] for measures, _ in per_run]
    centered_runs = [measures["in_context_input_keys_centered"] for measures, _ in per_run]
    frame_heads = []
    for raw in raw_runs:
        head = int(raw[layers[0]].argmin())
        frame_heads.append({"layer": layers[0], "head": head, "mean_abs_offdiag_cos": raw[layers[0]][head].item()})
    frame_keys = per_run[0][1][layers[0]][frame_heads[0]["head"]]  # [X, d_head], run 0
    return {
        "layers": [
            {
                "layer": layer,
                "mean_abs_offdiag_cos": summarize([r[layer].mean().item() for r in raw_runs]),
                "mean_abs_offdiag_cos_centered": summarize([c[layer].mean().item() for c in centered_runs]),
            }
            for layer in layers
        ],
        "heads_mean_abs_offdiag_cos": [head_grid(n_layers, r) for r in raw_runs],
        "heads_mean_abs_offdiag_cos_centered": [head_grid(n_layers, c) for c in centered_runs],
        "frame_heads": frame_heads,
        "frame_head_mean_abs_offdiag_cos": summarize([f["mean_abs_offdiag_cos"] for f in frame_heads]),
        "frame_head_cos": cosine_matrix(frame_keys).tolist(),
        "frame_head_cos_centered": cosine_matrix(frame_keys - frame_keys.mean(0)).tolist(),
    }


def _measure_result(
    name: str,
    tokens: list[int],
    d_head: int,
    trained: Sequence[dict[int, Tensor]],
    initial: Sequence[dict[int, Tensor]] | None,
    layers: list[int],
    n_layers: int,
) -> dict[str, Any]:
    """One entry of ``key_orthogonality(...)["measures"]`` from per-run ``{layer: [H]}``."""
    statistic = KEY_MEASURES[name]["statistic"]
    if statistic == "mean_abs_cos":
        chance = {
            "expected_abs_cos": expected_abs_cosine(d_head),
            "welch_rms_bound": welch_rms_bound(len(tokens), d_head),
        }
    else:
        chance = {"expected_signed_cos": 0.0}

    def over_runs(runs: Sequence[dict[int, Tensor]] | None, layer: int, reduce: str) -> dict[str, float] | None:
        if runs is None:
            return None
        return summarize([getattr(r[layer], reduce)().item() for r in runs])

    return {
        "definition": KEY_MEASURES[name]["definition"],
        "statistic": statistic,
        "tokens": tokens,
        "n_tokens": len(tokens),
        "d_head": d_head,
        "layers": [
            {
                "layer": layer,
                "mean_over_heads": over_runs(trained, layer, "mean"),
                "best_head": over_runs(trained, layer, "min"),
                "random_init_mean_over_heads": over_runs(initial, layer, "mean"),
                "random_init_best_head": over_runs(initial, layer, "min"),
            }
            for layer in layers
        ],
        "heads": [head_grid(n_layers, r) for r in trained],
        "random_init_heads": None if initial is None else [head_grid(n_layers, r) for r in initial],
        "chance": chance,
    }


def key_orthogonality(
    models: Sequence[SequenceModel],
    episodes: Sequence[Episode],
    tunnel: Tunnel,
    *,
    initial_models: Sequence[SequenceModel] | None = None,
) -> dict[str, Any]:
    """Cosine geometry of the keys each head gives the input token values (Fig 14), and the
    authors' definitions beside it.

    Two versions of each cosine matrix: ``raw`` (the keys as they are: the paper's
    measure) and ``centered`` (the mean key over token values subtracted first). A key
    component shared by every token cannot change where a query attends (softmax is
    invariant to adding ``q . c`` to all scores), so the centered version looks at what
    distinguishes tokens; note that ``X`` orthonormal vectors, once centered, have cosine
    ``-1/(X-1)`` rather than 0. A trained model can have raw cosines near 1 when its keys
    share a large "this is an input token" component, while the centered ones are small.

    The frame head is, per run, the head of the first attention layer (layer 0 in a
    standard transformer) with the lowest raw mean |off-diagonal cos|.

    ``measures`` names every definition (:data:`KEY_MEASURES`): ours, the authors'
    Paper-I all-vocabulary signed mean, and their later output-token measure (bijection
    only), each with the same numbers for the randomly initialized models and the chance
    level of its statistic.

    Args:
        models: trained runs of one architecture.
        episodes: the sequences the in-context keys are read from.
        tunnel: their tunnel; it declares
            :class:`~windtunnel.tunnels.capabilities.SymbolTokens` (the tokens compared),
            and :class:`~windtunnel.tunnels.capabilities.HypothesisTokens` where the
            output-token measure applies.
        initial_models: the same runs' initial (step-0) models, read by exactly the same
            code; None leaves every random-init field None.

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
        ``random_init``: the ``layers``, ``heads_*``, ``frame_head*`` fields of the
        initial models (None without them);
        ``measures``: ``{name: {definition, statistic, tokens, n_tokens, d_head, layers:
        [{layer, mean_over_heads, best_head (min over heads), random_init_mean_over_heads,
        random_init_best_head}], heads, random_init_heads, chance}}``;
        ``measures_skipped``: ``{name: reason}`` for measures the tunnel has no tokens for.
    """
    check_same_architecture(models, "the geometric analyses")
    if initial_models is not None:
        check_same_architecture([*models, *initial_models], "the geometric analyses (trained and initial models)")
    missing = lacks(tunnel, SymbolTokens)
    if missing:
        raise ValueError(f"key orthogonality compares the keys of the tunnel's symbols: {missing}")
    token_values, labels = tunnel.symbol_tokens()
    n_layers = models[0].n_layers
    layers = sorted(models[0].attention_heads)
    if not layers:
        raise ValueError("key orthogonality needs a model with attention")
    trained = [_key_measures(model, episodes, tunnel) for model in models]
    initial = None if initial_models is None else [_key_measures(m, episodes, tunnel) for m in initial_models]
    summary = _key_summary(trained, layers, n_layers)
    no_hypotheses = lacks(tunnel, HypothesisTokens)
    hypotheses = None if no_hypotheses else tunnel.hypothesis_tokens()
    measure_tokens = {
        "in_context_input_keys": token_values,
        "in_context_input_keys_centered": token_values,
        "embedding_keys_all_tokens_signed": list(range(models[0].vocab_size)),
        **dict.fromkeys(HYPOTHESIS_MEASURES, hypotheses),
    }
    measures = {
        name: _measure_result(
            name,
            measure_tokens[name],
            models[0].d_head,
            [m[name] for m, _ in trained],
            None if initial is None else [m[name] for m, _ in initial],
            layers,
            n_layers,
        )
        for name in trained[0][0]
    }
    return {
        "runs": len(models),
        "token_values": token_values,
        "token_labels": labels,
        **summary,
        "centered_orthonormal_reference": 1.0 / (len(token_values) - 1),
        "random_init": None if initial is None else _key_summary(initial, layers, n_layers),
        "measures": measures,
        "measures_skipped": {} if no_hypotheses is None else dict.fromkeys(HYPOTHESIS_MEASURES, no_hypotheses),
    }


def _needs_symbols(runs: Sequence[Run]) -> str | None:
    return lacks(runs[0].config.tunnel, SymbolTokens)


@register("key_orthogonality", needs_attention=True, requires=_needs_symbols)
def key_orthogonality_of_runs(runs: Sequence[Run]) -> dict[str, Any]:
    """Fig 14: cosines between the keys of the input token values, per head; the layer-0 frame head."""
    return key_orthogonality(
        [r.model for r in runs],
        diagnostic_episodes(runs),
        runs[0].config.tunnel,
        initial_models=initial_models_of(runs),
    )
