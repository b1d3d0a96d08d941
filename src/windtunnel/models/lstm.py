"""The LSTM control (the paper's later versions: belief accumulation without attention).

The transformer's embeddings and head around a stack of pre-norm residual LSTM blocks:
``x += W_proj LSTM(LN(x))`` with ``torch.nn.LSTM`` (one layer per block, hidden size
``d_hidden``). Position ``t`` reads positions ``<= t`` through the recurrence only, so its
memory of the context is the fixed-size state ``(h, c)``: what it can keep is the question.

    >>> from windtunnel.models import TransformerConfig
    >>> model = LSTMControl(LSTMConfig(d_model=48, matched_to=TransformerConfig(6, 4, 48, 192)),
    ...                     vocab_size=27, num_classes=5, max_len=100)
    >>> model.config.n_layers, abs(model.sizing.mismatch) < 0.01
    (6, True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from windtunnel.models.config import TransformerConfig, check_control_config
from windtunnel.models.mixer_control import MixerControl

__all__ = ["LSTMConfig", "LSTMControl"]


@dataclass(frozen=True)
class LSTMConfig:
    """The LSTM control's shape.

    Args:
        d_model: embedding and residual width (the matched transformer's).
        n_layers: LSTM blocks (None: chosen by matching, the transformer's depth if it fits).
        d_hidden: each LSTM's hidden size (None: chosen by matching).
        max_len: size of the position table (None: filled in by the run).
        matched_to: the transformer whose parameter count the control matches within 1%.
    """

    d_model: int = 192
    n_layers: int | None = None
    d_hidden: int | None = None
    max_len: int | None = None
    matched_to: TransformerConfig | None = None

    def __post_init__(self) -> None:
        check_control_config(self, ("n_layers", "d_hidden"))


class LSTMMixer(nn.Module):
    """``[B, T, d_model] -> [B, T, d_model]``: one LSTM layer, then a projection back to the
    residual width (named ``proj``: it writes into the residual stream)."""

    def __init__(self, d_model: int, d_hidden: int) -> None:
        super().__init__()
        self.lstm = nn.LSTM(d_model, d_hidden, batch_first=True)
        self.proj = nn.Linear(d_hidden, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(self.lstm(x)[0])


class LSTMControl(MixerControl):
    """Pre-norm residual LSTM blocks between the transformer's embeddings and head."""

    kind: ClassVar[str] = "lstm"
    config_class: ClassVar[type] = LSTMConfig
    width_field: ClassVar[str] = "d_hidden"
    not_stackable: ClassVar[str | None] = "torch.func.vmap has no batching rule for aten::lstm"

    @classmethod
    def make_mixer(cls, config: LSTMConfig) -> nn.Module:
        return LSTMMixer(config.d_model, config.d_hidden)

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """The shared initialization (embeddings, norms, head, ``proj``), and every LSTM weight
        and bias uniform in ``±1/sqrt(d_hidden)`` (PyTorch's own LSTM init), drawn from ``generator``."""
        super().reset_parameters(generator)
        if self.on_meta_device:
            return
        for block in self.blocks:
            lstm = block.mixer.lstm
            bound = 1.0 / math.sqrt(lstm.hidden_size)
            for weight in lstm.parameters():
                nn.init.uniform_(weight, -bound, bound, generator=generator)
