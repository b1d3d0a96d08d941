"""What the recurrent controls share: blocks ``x += mixer(LN(x))``, sized to a transformer.

A recurrent control (the LSTM, Mamba) keeps the transformer's token and position
embeddings, final norm and class head, and replaces its blocks by pre-norm residual
sequence mixers (:class:`~windtunnel.models.components.MixerBlock`). Its depth and width
are the config's, or chosen so that the parameter count is within 1% of the transformer in
``matched_to`` (the depth closest to the transformer's that lands there), as the MLP
control is. A family says how to build one mixer and how to initialize it; the rest is here.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, ClassVar

import torch
from torch import nn

from windtunnel.config import ConfigError
from windtunnel.models.base import Role, SequenceModel
from windtunnel.models.components import MixerBlock
from windtunnel.models.config import resolve_max_len
from windtunnel.models.names import mixer_control_names
from windtunnel.models.params import count_params
from windtunnel.models.sizing import ShapeSizing, size_by_count, transformer_param_count

__all__ = ["MixerControl"]


class MixerControl(SequenceModel):
    """Embeddings -> ``n_layers`` mixer blocks -> LayerNorm -> class head, sized to a transformer.

    A family's config is a frozen dataclass with ``d_model``, ``n_layers``, its width field
    (named by :attr:`width_field`), ``max_len`` and ``matched_to`` (a ``TransformerConfig`` or
    None); sizes left None are chosen by matching.

    Attributes:
        config: the config with ``n_layers``, the width and ``max_len`` filled in.
        sizing: how the shape compares with ``matched_to`` (None without one).
    """

    role: ClassVar[Role] = "control"  # a baseline the transformer is compared against
    #: The config field the sizing chooses besides ``n_layers`` (an LSTM's hidden size ...).
    width_field: ClassVar[str]

    def __init__(
        self,
        config: Any,
        *,
        vocab_size: int,
        num_classes: int,
        max_len: int | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        max_len = resolve_max_len(config.max_len, max_len)
        shape = dict(vocab_size=vocab_size, num_classes=num_classes, max_len=max_len)
        sizing = self.match(config, **shape)
        depth = sizing.depth if sizing is not None else config.n_layers
        width = sizing.width if sizing is not None else getattr(config, self.width_field)
        resolved = dataclasses.replace(config, n_layers=depth, max_len=max_len, **{self.width_field: width})
        blocks = [MixerBlock(config.d_model, self.make_mixer(resolved)) for _ in range(depth)]
        super().__init__(blocks, d_model=config.d_model, **shape)
        self.config = resolved
        self.sizing = sizing
        self.reset_parameters(generator)

    @classmethod
    @abc.abstractmethod
    def make_mixer(cls, config: Any) -> nn.Module:
        """One block's mixer for the resolved ``config``: ``[B, T, d_model] -> [B, T, d_model]``, causal."""

    @classmethod
    def activation_names_for(cls, config: Any) -> list[str]:
        if config.n_layers is None:
            raise ValueError(f"the {cls.kind} control's names need its resolved config (n_layers=None): pass a built model's config")
        return mixer_control_names(config.n_layers)

    @classmethod
    def match(cls, config: Any, *, vocab_size: int, num_classes: int, max_len: int) -> ShapeSizing | None:
        """The shape matched to ``config.matched_to`` (None without one). Counted on the meta
        device by building the family itself, so the count is exact for any mixer."""
        if config.matched_to is None:
            return None
        target = transformer_param_count(
            config.matched_to, vocab_size=vocab_size, num_classes=num_classes, max_len=config.matched_to.max_len or max_len
        )

        def count(depth: int, width: int) -> int:
            sized = dataclasses.replace(config, n_layers=depth, matched_to=None, **{cls.width_field: width})
            with torch.device("meta"):
                return count_params(cls(sized, vocab_size=vocab_size, num_classes=num_classes, max_len=max_len))

        n = config.matched_to.n_layers
        depths = [config.n_layers] if config.n_layers is not None else sorted(range(1, 2 * n + 1), key=lambda d: (abs(d - n), d))
        width = getattr(config, cls.width_field)
        given = config.n_layers is not None and width is not None  # sizes given in full: reported, not held to 1%
        try:
            return size_by_count(count, target, depths=depths, width=width, tolerance=float("inf") if given else 0.01)
        except ConfigError as error:
            raise ConfigError(f"{cls.kind} control: {error}") from None

    @classmethod
    def sizing_info(cls, config: Any, *, vocab_size: int, num_classes: int, max_len: int | None) -> dict[str, Any]:
        """``n_layers`` and the width as built, and with ``matched_to`` the transformer's
        parameter count (``target_params``) and the signed relative ``mismatch``."""
        sizing = cls.match(config, vocab_size=vocab_size, num_classes=num_classes, max_len=resolve_max_len(config.max_len, max_len))
        if sizing is None:
            return {"n_layers": config.n_layers, cls.width_field: getattr(config, cls.width_field)}
        return {
            "n_layers": sizing.depth,
            cls.width_field: sizing.width,
            "target_params": sizing.target_params,
            "mismatch": round(sizing.mismatch, 6),
        }
