"""The pre-norm causal transformer of the paper (docs/protocol.md §4).

Learned token and absolute position embeddings, ``n_layers`` pre-norm blocks
(``LN -> causal multi-head attention -> +``, ``LN -> GELU MLP -> +``), a final LayerNorm
and a linear head over the task's classes.

    >>> model = Transformer(TransformerConfig(2, 2, 16, 32), vocab_size=10, num_classes=4, max_len=8)
    >>> model(torch.zeros(3, 8, dtype=torch.long)).shape
    torch.Size([3, 8, 4])
    >>> model.W_Q.shape  # [n_layers, n_heads, d_model, d_head]
    torch.Size([2, 2, 16, 8])
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import ClassVar

import torch
from torch import Tensor

from windtunnel.models.base import Role, SequenceModel
from windtunnel.models.components import Attention, TransformerBlock
from windtunnel.models.config import TransformerConfig, resolve_max_len
from windtunnel.models.names import transformer_names

__all__ = ["Transformer"]


class Transformer(SequenceModel):
    """Causal transformer over token ids, predicting a class distribution at each position.

    Args:
        config: the shape; ``config.max_len`` (if set) fixes the position table.
        vocab_size: number of token ids.
        num_classes: output classes ``C``.
        max_len: the longest sequence the run feeds; used when ``config.max_len`` is None.
        generator: seeds the initial weights (see :meth:`SequenceModel.reset_parameters`).

    Attributes:
        config: ``config`` with ``max_len`` filled in: rebuilding from it (plus
            ``vocab_size`` and ``num_classes``) gives the same architecture.
    """

    kind: ClassVar[str] = "transformer"
    config_class: ClassVar[type] = TransformerConfig
    role: ClassVar[Role] = "subject"  # the model whose Bayesian geometry the paper studies

    def __init__(
        self,
        config: TransformerConfig | None = None,
        *,
        vocab_size: int,
        num_classes: int,
        max_len: int | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        config = TransformerConfig() if config is None else config
        max_len = resolve_max_len(config.max_len, max_len)
        no_attention = set(config.no_attention_layers)
        blocks = [
            TransformerBlock(config.d_model, config.n_heads, config.d_mlp, attention=layer not in no_attention)
            for layer in range(config.n_layers)
        ]
        shape = dict(vocab_size=vocab_size, num_classes=num_classes, max_len=max_len)
        super().__init__(blocks, d_model=config.d_model, **shape)
        self.config = dataclasses.replace(config, max_len=max_len)
        self.n_heads = config.n_heads
        self.d_head = config.d_head
        self.init_std = config.init_std
        self.reset_parameters(generator)

    @classmethod
    def activation_names_for(cls, config: TransformerConfig) -> list[str]:
        return transformer_names(config.n_layers, no_attention_layers=config.no_attention_layers)

    @classmethod
    def variant(cls, config: TransformerConfig) -> str:
        """``"no attention in 7,8"`` for the late-attention variant, ``""`` for the full model."""
        layers = config.no_attention_layers
        return "no attention in " + ",".join(map(str, layers)) if layers else ""

    @property
    def attention_heads(self) -> dict[int, int]:
        return {layer: self.n_heads for layer, block in enumerate(self.blocks) if block.attn is not None}

    @property
    def n_residual_writes(self) -> int:
        return 2 * self.n_layers

    # --- stacked attention weights ----------------------------------------------------
    # Copies, detached. LayerNorm scales are not folded in (weights are never rewritten):
    # q = attn_in @ W_Q[l, h], where attn_in is the recorded LayerNorm output.
    # Layers built without attention contribute zeros.

    def _stack(self, per_layer: Callable[[Attention], Tensor], shape: tuple[int, ...]) -> Tensor:
        zeros = self.token_embed.weight.new_zeros(shape)
        return torch.stack([per_layer(b.attn).detach() if b.attn is not None else zeros for b in self.blocks])

    def _qkv_heads(self, which: int) -> Tensor:
        d_model, H, d_head = self.d_model, self.n_heads, self.d_head

        def per_layer(attn: Attention) -> Tensor:
            weight = attn.qkv.weight[which * d_model : (which + 1) * d_model]  # [H * d_head, d_model]
            return weight.view(H, d_head, d_model).transpose(1, 2)  # [H, d_model, d_head]

        return self._stack(per_layer, (H, d_model, d_head))

    @property
    def W_Q(self) -> Tensor:
        """``[n_layers, n_heads, d_model, d_head]``: ``attn.q[:, h] = attn_in @ W_Q[l, h]``."""
        return self._qkv_heads(0)

    @property
    def W_K(self) -> Tensor:
        """``[n_layers, n_heads, d_model, d_head]``: ``attn.k[:, h] = attn_in @ W_K[l, h]``."""
        return self._qkv_heads(1)

    @property
    def W_V(self) -> Tensor:
        """``[n_layers, n_heads, d_model, d_head]``: ``attn.v[:, h] = attn_in @ W_V[l, h]``."""
        return self._qkv_heads(2)

    @property
    def W_O(self) -> Tensor:
        """``[n_layers, n_heads, d_head, d_model]``: ``attn.head_out[:, h] = attn.z[:, h] @ W_O[l, h]``."""
        d_model, H, d_head = self.d_model, self.n_heads, self.d_head

        def per_layer(attn: Attention) -> Tensor:
            return attn.proj.weight.view(d_model, H, d_head).permute(1, 2, 0)  # [H, d_head, d_model]

        return self._stack(per_layer, (H, d_head, d_model))
