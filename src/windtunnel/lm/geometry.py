"""The paper's geometric diagnostics on a pretrained language model's layers, while it reads tunnel text.

The same questions the toolkit asks of its own transformers (:mod:`windtunnel.analysis`),
asked of every decoder layer of a ``transformers`` model of the Llama family of attention
modules (``self_attn.k_proj``, ``input_layernorm``: Llama, SmolLM, Mistral, Qwen2 and the
like), read through forward hooks (TransformerLens has no conversion for every such model,
SmolLM2 among them; hooks read the same tensors without one):

- key orthogonality, under both definitions the toolkit reports: the in-context key of each
  symbol token (the output of ``k_proj``, before the rotary position embedding, which would
  rotate each occurrence by its position) averaged over its occurrences, raw and centered;
  and the authors' later definition, the layer's input norm (its scale, no shift) of the
  token embedding times ``W_K``. Mean |off-diagonal cosine| per key-value head, beside the
  chance level for the head width (:func:`~windtunnel.analysis.keys.expected_abs_cosine`);
- QK sharpening: the entropy of each layer's attention at the read positions (mean over
  heads) against uniform attention, and the attention mass on the symbols against the share
  of symbols among the visible tokens;
- the value manifold: PCA of each layer's residual stream at the read positions, PC1's share
  of the variance and its Spearman correlation with the exact entropy (of the next symbol;
  for the HMM also of the hidden state). PC signs are arbitrary, so |rho| is reported;
- linear probes of the exact next-symbol predictive (and the HMM's state posterior) from
  each layer's residual (:func:`~windtunnel.analysis.probes.probe_layer`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from windtunnel.analysis.keys import cosine_matrix, expected_abs_cosine, mean_abs_offdiagonal
from windtunnel.analysis.probes import probe_layer
from windtunnel.analysis.stats import pca, spearman
from windtunnel.config import ConfigError
from windtunnel.lm.score import next_symbol_episode
from windtunnel.lm.text import Rendered
from windtunnel.metrics import entropy_bits
from windtunnel.tunnels import Episode, Tunnel

__all__ = ["AUTHORS_PYTHIA_PC1_SPEARMAN", "decoder_layers", "language_model_geometry"]

#: The authors' number to set beside ours: Pythia-410M's last-layer PC1 against the Bayes
#: entropy on their text task (arXiv 2512.23752, its result files), Spearman rho.
AUTHORS_PYTHIA_PC1_SPEARMAN = -0.765


def decoder_layers(model: Any) -> list[Any]:
    """The model's decoder layers; :class:`ConfigError` where their attention is not the Llama family's."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None or not all(hasattr(layer, "self_attn") and hasattr(layer.self_attn, "k_proj")
                                 and hasattr(layer, "input_layernorm") for layer in layers):
        raise ConfigError(f"the geometry reads decoder layers with self_attn.k_proj and input_layernorm (the Llama family); "
                          f"{type(model).__name__} has none: run lm-score without --geometry")
    return list(layers)


def _rms_scale_only(x: Tensor, norm: Any) -> Tensor:
    """The layer's RMSNorm in float64 (its scale; RMSNorm has no shift)."""
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6))
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * norm.weight.detach().double()


def _key_heads(keys: Tensor, n_kv: int) -> Tensor:
    """``[X, n_kv * d_head] -> [n_kv, X, d_head]``."""
    return keys.reshape(keys.shape[0], n_kv, -1).transpose(0, 1)


def _head_stats(per_head: Tensor) -> dict[str, Any]:
    values = per_head.tolist()
    return {"mean": sum(values) / len(values), "best_head": min(values), "per_head": values}


@torch.no_grad()
def language_model_geometry(
    model: Any, tunnel: Tunnel, episodes: Sequence[Episode], rendered: Sequence[Rendered], *, n_sequences: int
) -> dict[str, Any]:
    """Every diagnostic above, per layer, on the first ``n_sequences`` sequences (the model
    must compute attention weights explicitly: loaded with ``attention="eager"``)."""
    layers = decoder_layers(model)
    config = model.config
    n_kv = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    d_head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    key_tokens = rendered[0].key_tokens
    for r in rendered[1:]:
        key_tokens = torch.unique(torch.cat([key_tokens, r.key_tokens]))
    captured: dict[str, Tensor] = {}

    def keep(name: str):
        def hook(_module: Any, _inputs: Any, output: Any) -> None:
            captured[name] = (output[0] if isinstance(output, tuple) else output).detach()
        return hook

    handles = [layer.register_forward_hook(keep(f"resid.{i}")) for i, layer in enumerate(layers)]
    handles += [layer.self_attn.k_proj.register_forward_hook(keep(f"k.{i}")) for i, layer in enumerate(layers)]
    n_layers = len(layers)
    residuals: list[list[Tensor]] = [[] for _ in range(n_layers)]
    key_sums = [torch.zeros(len(key_tokens), n_kv * d_head, dtype=torch.float64) for _ in range(n_layers)]
    key_counts = torch.zeros(len(key_tokens), dtype=torch.float64)
    entropy = torch.zeros(n_layers, dtype=torch.float64)
    symbol_mass = torch.zeros(n_layers, dtype=torch.float64)
    uniform_entropy = uniform_symbol_share = 0.0
    targets, posteriors, seen = [], [], 0
    try:
        for episode, r in zip(episodes, rendered):
            if seen >= n_sequences:
                break
            take = min(episode.batch_size, n_sequences - seen)
            seen += take
            ids, mask, read_at = r.ids[:take], r.attention_mask[:take], r.read_at[:take]
            out = model(input_ids=ids, attention_mask=mask, output_attentions=True)
            if out.attentions is None or any(a is None for a in out.attentions):
                raise ConfigError("the model returned no attention weights: load it with eager attention")
            rows = torch.arange(take)[:, None]
            onehot = (ids[..., None] == key_tokens).double() * mask[..., None]  # [B, T, X]
            key_counts += onehot.sum((0, 1))
            is_symbol = torch.zeros_like(ids, dtype=torch.float64)
            for b in range(take):
                placed = r.token_at[b][r.token_at[b] >= 0]
                is_symbol[b, placed] = 1.0
            visible = (torch.arange(ids.shape[1])[None, None, :] <= read_at[..., None]).double()  # [B, P, T]
            n_visible = visible.sum(-1)  # [B, P]
            uniform_entropy += torch.log2(n_visible).mean().item() * take
            uniform_symbol_share += ((visible * is_symbol[:, None, :]).sum(-1) / n_visible).mean().item() * take
            for i in range(n_layers):
                residuals[i].append(captured[f"resid.{i}"][rows, read_at].double())  # [B, P, d]
                key_sums[i] += torch.einsum("btx,btf->xf", onehot, captured[f"k.{i}"].double())
                pattern = out.attentions[i].double().gather(
                    2, read_at[:, None, :, None].expand(-1, out.attentions[i].shape[1], -1, ids.shape[1]))  # [B, H, P, T]
                entropy[i] += entropy_bits(pattern).mean().item() * take
                symbol_mass[i] += (pattern * is_symbol[:, None, None, :]).sum(-1).mean().item() * take
            head = episode.head(take) if take < episode.batch_size else episode
            targets.append(next_symbol_episode(tunnel, episode).posterior[:take])
            posteriors.append(head.posterior)
    finally:
        for handle in handles:
            handle.remove()
    next_symbol = torch.cat(targets)  # [N, P, M]
    posterior = torch.cat(posteriors)  # [N, P, C]
    next_entropy, state_entropy = entropy_bits(next_symbol), entropy_bits(posterior)
    same = tunnel.name == "bijection"  # its classes are the next symbol: one target, not two
    if (key_counts == 0).any():
        raise ConfigError("a symbol never occurs in the sequences read: raise --geometry-n")
    weights = model.get_input_embeddings().weight.detach().double()[key_tokens]  # [X, d_model]
    per_layer = []
    for i, layer in enumerate(layers):
        in_context = _key_heads(key_sums[i] / key_counts[:, None], n_kv)  # [n_kv, X, d_head]
        centered = in_context - in_context.mean(1, keepdim=True)
        w_k = layer.self_attn.k_proj.weight.detach().double()  # [n_kv * d_head, d_model]
        embedding = _key_heads(_rms_scale_only(weights, layer.input_layernorm) @ w_k.T, n_kv)
        points = torch.cat(residuals[i]).flatten(0, 1)  # [N * P, d]
        share, scores = pca(points)
        row: dict[str, Any] = {
            "layer": i,
            "in_context_keys": _head_stats(mean_abs_offdiagonal(cosine_matrix(in_context))),
            "in_context_keys_centered": _head_stats(mean_abs_offdiagonal(cosine_matrix(centered))),
            "normalized_embedding_keys": _head_stats(mean_abs_offdiagonal(cosine_matrix(embedding))),
            "attention_entropy_bits": entropy[i].item() / seen,
            "symbol_mass": symbol_mass[i].item() / seen,
            "pc1_variance": share[0].item(),
            "pc1_next_entropy_spearman_abs": abs(spearman(scores[:, 0], next_entropy.flatten())),
            "probe_next_symbol": probe_layer(torch.cat(residuals[i]), next_symbol, next_entropy),
        }
        if not same:
            row["pc1_state_entropy_spearman_abs"] = abs(spearman(scores[:, 0], state_entropy.flatten()))
            row["probe_state_posterior"] = probe_layer(torch.cat(residuals[i]), posterior, state_entropy)
        per_layer.append(row)
    return {
        "n_sequences": seen,
        "n_layers": n_layers,
        "n_kv_heads": n_kv,
        "d_head": d_head,
        "key_tokens": key_tokens.tolist(),
        "chance_abs_cos": expected_abs_cosine(d_head),
        "uniform_attention_entropy_bits": uniform_entropy / seen,
        "uniform_symbol_share": uniform_symbol_share / seen,
        "authors_pythia_410m_pc1_spearman": AUTHORS_PYTHIA_PC1_SPEARMAN,
        "layers": per_layer,
    }
