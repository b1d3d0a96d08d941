"""The capacity-matched, attention-free control (docs/protocol.md §4).

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
from typing import Any, ClassVar

import torch

from windtunnel.models.base import Role, SequenceModel
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
    role: ClassVar[Role] = "control"  # the attention-free baseline the transformer is compared against

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
        sizing = match_transformer(config, **shape)
        n_blocks, d_hidden = _sizes(config, sizing)
        blocks = [MLPBlock(config.d_model, d_hidden) for _ in range(n_blocks)]
        super().__init__(blocks, d_model=config.d_model, **shape)
        self.config = dataclasses.replace(config, n_blocks=n_blocks, d_hidden=d_hidden, max_len=max_len)
        self.sizing = sizing
        self.reset_parameters(generator)

    @classmethod
    def activation_names_for(cls, config: MLPConfig) -> list[str]:
        if config.n_blocks is None:
            raise ValueError("the MLP control's names need its resolved config (n_blocks=None): pass a built model's config")
        return mlp_control_names(config.n_blocks)

    @classmethod
    def sizing_info(
        cls, config: MLPConfig, *, vocab_size: int, num_classes: int, max_len: int | None
    ) -> dict[str, Any]:
        """``n_blocks`` and ``d_hidden`` as built, and with ``matched_to`` the transformer's
        parameter count (``target_params``) and the signed relative ``mismatch``."""
        shape = dict(vocab_size=vocab_size, num_classes=num_classes, max_len=resolve_max_len(config.max_len, max_len))
        sizing = match_transformer(config, **shape)  # sized exactly as the constructor sizes it
        n_blocks, d_hidden = _sizes(config, sizing)
        info: dict[str, Any] = {"n_blocks": n_blocks, "d_hidden": d_hidden}
        if sizing is not None:
            info["target_params"] = sizing.target_params
            info["mismatch"] = round(sizing.mismatch, 6)
        return info


def _sizes(config: MLPConfig, sizing: MLPSizing | None) -> tuple[int, int]:
    """``(n_blocks, d_hidden)``: the config's own, or the sizing's where it matched them."""
    if sizing is None:
        assert config.n_blocks is not None and config.d_hidden is not None  # MLPConfig refuses otherwise
        return config.n_blocks, config.d_hidden
    return sizing.n_blocks, sizing.d_hidden
