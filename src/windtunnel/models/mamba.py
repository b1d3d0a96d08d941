"""The Mamba control (the paper's later versions: belief transport without attention).

The transformer's embeddings and head around pre-norm residual blocks ``x += Mamba(LN(x))``,
where ``Mamba`` is the published selective-SSM block (Gu and Dao 2023, Fig 3): an input
projection into a gated branch ``z`` and a branch ``x``; on ``x`` a causal depthwise
convolution and SiLU, then the selective scan ``h_t = exp(Δ_t A) h_{t-1} + Δ_t B_t x_t``,
``y_t = C_t h_t + D x_t`` with input-dependent ``Δ`` (softplus of a low-rank projection),
``B`` and ``C``, and diagonal ``A = -exp(A_log)``; then ``y * SiLU(z)`` and an output
projection. The block is the ``mambapy`` package's ``MambaBlock`` (pure PyTorch, a parallel
scan: runs on CPU), not a hand-written one; ``tests/models/test_models.py`` holds it to a plain
sequential recurrence written in the test. Its inner width ``d_inner`` (the paper's
``E * d_model``) is what the sizing chooses.

    >>> from windtunnel.models import TransformerConfig
    >>> model = MambaControl(MambaConfig(d_model=48, matched_to=TransformerConfig(6, 4, 48, 192)),
    ...                      vocab_size=27, num_classes=5, max_len=100)
    >>> model.config.n_layers, abs(model.sizing.mismatch) < 0.01
    (6, True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from mambapy.mamba import MambaBlock
from mambapy.mamba import MambaConfig as MambapyConfig
from torch import nn

from windtunnel.models.config import TransformerConfig, check_control_config
from windtunnel.models.mixer_control import MixerControl

__all__ = ["MambaConfig", "MambaControl"]

#: The published initialization's range of the step size Δ (log-uniform) and its floor.
DT_MIN, DT_MAX, DT_FLOOR = 1e-3, 1e-1, 1e-4


@dataclass(frozen=True)
class MambaConfig:
    """The Mamba control's shape.

    Args:
        d_model: embedding and residual width (the matched transformer's).
        n_layers: Mamba blocks (None: chosen by matching, the transformer's depth if it fits).
        d_inner: each block's inner width, ``E * d_model`` in the paper (None: chosen by matching).
        d_state: the state size ``N`` per inner channel (the paper's 16).
        d_conv: the causal convolution's width (the paper's 4).
        max_len: size of the position table (None: filled in by the run).
        matched_to: the transformer whose parameter count the control matches within 1%.
    """

    d_model: int = 192
    n_layers: int | None = None
    d_inner: int | None = None
    d_state: int = 16
    d_conv: int = 4
    max_len: int | None = None
    matched_to: TransformerConfig | None = None

    def __post_init__(self) -> None:
        check_control_config(self, ("n_layers", "d_inner"), ("d_state", "d_conv"))

    @property
    def dt_rank(self) -> int:
        """The rank of Δ's projection: ``ceil(d_model / 16)``, the published default."""
        return math.ceil(self.d_model / 16)


class MambaControl(MixerControl):
    """Pre-norm residual Mamba blocks between the transformer's embeddings and head."""

    kind: ClassVar[str] = "mamba"
    config_class: ClassVar[type] = MambaConfig
    width_field: ClassVar[str] = "d_inner"
    not_stackable: ClassVar[str | None] = "mambapy's parallel scan is an autograd.Function that torch.func.vmap cannot map (no setup_context)"

    @classmethod
    def make_mixer(cls, config: MambaConfig) -> nn.Module:
        inner = MambapyConfig(d_model=config.d_model, n_layers=1, d_state=config.d_state, d_conv=config.d_conv)
        inner.d_inner = config.d_inner  # mambapy derives it from expand_factor; the sizing sets it exactly
        return MambaBlock(inner)

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """The shared initialization for the projections, norms, embeddings and head (the output
        projection scaled by ``1/sqrt(n_layers)``, as the transformer's), then the published
        one for the rest, every draw from ``generator``: the convolution uniform in
        ``±1/sqrt(d_conv)``; Δ's projection uniform in ``±dt_rank^-1/2`` and its bias the inverse
        softplus of a step size log-uniform in [1e-3, 0.1]; ``A = -(1, 2, ..., N)`` per channel
        (S4D-real); ``D = 1``."""
        super().reset_parameters(generator)
        if self.on_meta_device:
            return
        residual_std = self.init_std / math.sqrt(self.n_residual_writes)
        for block in self.blocks:
            mixer = block.mixer
            d_inner, d_state = mixer.A_log.shape
            nn.init.normal_(mixer.out_proj.weight, 0.0, residual_std, generator=generator)
            bound = 1.0 / math.sqrt(mixer.conv1d.kernel_size[0])
            nn.init.uniform_(mixer.conv1d.weight, -bound, bound, generator=generator)
            nn.init.uniform_(mixer.conv1d.bias, -bound, bound, generator=generator)
            rank = mixer.dt_proj.in_features
            nn.init.uniform_(mixer.dt_proj.weight, -(rank**-0.5), rank**-0.5, generator=generator)
            with torch.no_grad():
                u = torch.rand(d_inner, generator=generator, device=mixer.A_log.device)
                dt = torch.exp(u * (math.log(DT_MAX) - math.log(DT_MIN)) + math.log(DT_MIN)).clamp(min=DT_FLOOR)
                mixer.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus(bias) = dt
                a = torch.arange(1, d_state + 1, dtype=mixer.A_log.dtype, device=mixer.A_log.device)
                mixer.A_log.copy_(torch.log(a).repeat(d_inner, 1))
                mixer.D.fill_(1.0)
