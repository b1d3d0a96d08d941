"""Canonical activation names: what a :class:`~windtunnel.models.trace.Trace` can record.

Names are dotted paths in the order the forward pass produces them. Shapes use
``B`` batch, ``T`` positions, ``H`` heads, ``d_head``, ``d_model``, ``d_mlp`` (``d_hidden``
for the MLP control) and ``C`` classes.

==============================  ==============================  =================================
name                            shape                           what
==============================  ==============================  =================================
``embed``                       ``[B, T, d_model]``             token embeddings
``pos_embed``                   ``[B, T, d_model]``             position embeddings
``blocks.{l}.resid_pre``        ``[B, T, d_model]``             residual stream entering block l
``blocks.{l}.attn_in``          ``[B, T, d_model]``             LayerNorm output read by attention
``blocks.{l}.attn.q|k|v``       ``[B, H, T, d_head]``           queries, keys, values
``blocks.{l}.attn.scores``      ``[B, H, T_q, T_k]``            scaled scores, ``-inf`` above the diagonal
``blocks.{l}.attn.pattern``     ``[B, H, T_q, T_k]``            attention probabilities
``blocks.{l}.attn.z``           ``[B, H, T, d_head]``           per-head mix of values (after head masks)
``blocks.{l}.attn.head_out``    ``[B, H, T, d_model]``          per-head output after ``W_O``
``blocks.{l}.attn_out``         ``[B, T, d_model]``             attention output (sum of ``head_out``)
``blocks.{l}.resid_mid``        ``[B, T, d_model]``             residual after attention
``blocks.{l}.mlp_in``           ``[B, T, d_model]``             LayerNorm output read by the MLP
``blocks.{l}.mlp.pre``          ``[B, T, d_mlp]``               MLP hidden layer before GELU
``blocks.{l}.mlp.post``         ``[B, T, d_mlp]``               MLP hidden layer after GELU
``blocks.{l}.mlp_out``          ``[B, T, d_model]``             MLP output
``blocks.{l}.mixer_in``         ``[B, T, d_model]``             LayerNorm output read by a recurrent mixer
``blocks.{l}.mixer_out``        ``[B, T, d_model]``             the mixer's output (LSTM, Mamba block)
``blocks.{l}.resid_post``       ``[B, T, d_model]``             residual stream leaving block l
``ln_final``                    ``[B, T, d_model]``             final LayerNorm output
``logits``                      ``[B, T, C]``                   output logits
==============================  ==============================  =================================

Transformer layers without attention keep ``resid_mid`` (equal to ``resid_pre``) so
that every layer has the same residual names; they have no ``attn*`` names. The MLP
control's blocks have ``resid_pre``, ``mlp_in``, ``mlp.*``, ``mlp_out`` and ``resid_post``; the
recurrent controls' (LSTM, Mamba) ``resid_pre``, ``mixer_in``, ``mixer_out`` and ``resid_post``.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["ATTENTION_NAMES", "MLP_NAMES", "mixer_control_names", "mlp_control_names", "transformer_names"]

#: Per-layer names of an attention sublayer, in forward order.
ATTENTION_NAMES: tuple[str, ...] = (
    "attn_in",
    "attn.q",
    "attn.k",
    "attn.v",
    "attn.scores",
    "attn.pattern",
    "attn.z",
    "attn.head_out",
    "attn_out",
)

#: Per-layer names of a feed-forward sublayer, in forward order.
MLP_NAMES: tuple[str, ...] = ("mlp_in", "mlp.pre", "mlp.post", "mlp_out")


def transformer_names(n_layers: int, *, no_attention_layers: Iterable[int] = ()) -> list[str]:
    """Every name a transformer with ``n_layers`` blocks records, in forward order."""
    no_attention = set(no_attention_layers)
    names = ["embed", "pos_embed"]
    for layer in range(n_layers):
        per_layer = ["resid_pre"]
        if layer not in no_attention:
            per_layer += ATTENTION_NAMES
        per_layer += ["resid_mid", *MLP_NAMES, "resid_post"]
        names += [f"blocks.{layer}.{name}" for name in per_layer]
    return [*names, "ln_final", "logits"]


def mlp_control_names(n_blocks: int) -> list[str]:
    """Every name the attention-free MLP control with ``n_blocks`` blocks records."""
    names = ["embed", "pos_embed"]
    for layer in range(n_blocks):
        names += [f"blocks.{layer}.{name}" for name in ("resid_pre", *MLP_NAMES, "resid_post")]
    return [*names, "ln_final", "logits"]


def mixer_control_names(n_layers: int) -> list[str]:
    """Every name a recurrent control (LSTM, Mamba) with ``n_layers`` mixer blocks records."""
    names = ["embed", "pos_embed"]
    for layer in range(n_layers):
        names += [f"blocks.{layer}.{name}" for name in ("resid_pre", "mixer_in", "mixer_out", "resid_post")]
    return [*names, "ln_final", "logits"]
