"""The capacity-matched, attention-free control (SPEC §4).

The same token + position embeddings and class head as the transformer, but the blocks
are residual MLPs applied to each position separately (``LN -> Linear -> GELU -> Linear
-> +``). Position ``t``'s logits depend only on token ``t`` and on ``t`` itself, so the
best it can learn is a position-dependent marginal: the paper's flat-entropy failure.

    >>> from windtunnel.models import TransformerConfig
    >>> model = MLPControl(MLPConfig(matched_to=TransformerConfig()), vocab_size=40, num_classes=20, max_len=39)
    >>> (model.config.n_blocks, model.config.d_hidden, f"{model.sizing.mismatch:+.2%}")
    (18, 384, '+0.26%')
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch

from windtunnel.models.base import SequenceModel
from windtunnel.models.components import MLPBlock
from windtunnel.models.config import MLPConfig, resolve_max_len
from windtunnel.models.names import mlp_control_names
from windtunnel.models.sizing import MLPSizing, match_transformer

__all__ = ["MLPControl"]


class MLPControl(SequenceModel):
    """Per-position stack of residual MLP blocks between the shared embeddings and head.

    Args:
        config: the shape; free ``n_blocks`` / ``d_hidden`` are sized against
            ``config.matched_to`` (built with the same ``vocab_size``, ``num_classes``).
        vocab_size: number of token ids.
        num_classes: output classes ``C``.
        max_len: the longest sequence the run feeds; used when ``config.max_len`` is None.
        generator: seeds the initial weights.

    Attributes:
        config: ``config`` with ``n_blocks``, ``d_hidden`` and ``max_len`` filled in
            (rebuilding from it gives the same shape without sizing again).
        sizing: how the shape compares with ``matched_to`` (None without one).
    """

    kind: ClassVar[str] = "mlp"
    config_class: ClassVar[type] = MLPConfig

    def __init__(
        self,
        config: MLPConfig,
        *,
        vocab_size: int,
        num_classes: int,
        max_len: int | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        max_len = resolve_max_len(config.max_len, max_len)
        shape = dict(vocab_size=vocab_size, num_classes=num_classes, max_len=max_len)
        sizing: MLPSizing | None = match_transformer(config, **shape)
        n_blocks = config.n_blocks if sizing is None else sizing.n_blocks
        d_hidden = config.d_hidden if sizing is None else sizing.d_hidden
        blocks = [MLPBlock(config.d_model, d_hidden) for _ in range(n_blocks)]
        super().__init__(blocks, d_model=config.d_model, **shape)
        self.config = dataclasses.replace(config, n_blocks=n_blocks, d_hidden=d_hidden, max_len=max_len)
        self.sizing = sizing
        self.reset_parameters(generator)

    @property
    def activation_names(self) -> list[str]:
        return mlp_control_names(self.n_layers)
