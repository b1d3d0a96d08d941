"""What every windtunnel model shares: embeddings, a block stack, final norm, class head.

``SequenceModel`` is the common interface: ``forward(tokens, *, trace=None) -> logits``,
the trace protocol (``activation_names``, ``n_layers``, ``attention_heads``), stacked
weight accessors, and seeded initialization. A family builds its blocks and declares
what it is on its class: its registry name (``kind``), parameter class
(``config_class``), ``role`` in a study, trace names (``activation_names_for``), the
``variant`` a config describes, and its own lines of ``windtunnel info``
(``sizing_info``). It is then registered by name with
:func:`windtunnel.models.build.register_model`; nothing outside ``models/`` tests a
family by name.

Parameters are named so that a checkpoint's keys say where they live::

    token_embed.weight  pos_embed.weight  blocks.{l}.attn.{ln,qkv,proj}.*
    blocks.{l}.mlp.{ln,fc_in,fc_out}.*  ln_final.*  head.{weight,bias}
    value_read_in.weight   (only for a tunnel whose observations are values)

There are no buffers and no tied weights: ``state_dict()`` holds one contiguous tensor
per parameter and nothing else, so it saves as safetensors as is.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Iterable
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from windtunnel.config import ConfigError
from windtunnel.models.config import INIT_STD
from windtunnel.models.trace import NULL_TRACE, Trace

__all__ = ["ROLES", "Role", "SequenceModel"]

#: What a family is in a study: a ``"subject"`` is a model whose Bayesian geometry is
#: studied (the transformer); a ``"control"`` is a baseline the subjects are compared
#: against (the attention-free MLP).
Role = Literal["subject", "control"]

#: Every :data:`Role`, in that order.
ROLES: tuple[str, ...] = ("subject", "control")


class SequenceModel(nn.Module, abc.ABC):
    """Token + learned absolute position embeddings -> blocks -> LayerNorm -> linear class head.

    Args:
        blocks: the residual blocks, each ``block(x, trace, layer) -> x``.
        d_model: residual width.
        vocab_size: number of token ids.
        num_classes: number of output classes ``C`` (the head's width).
        max_len: size of the position table: the longest sequence the model accepts.
    """

    #: Registry name of the family ("transformer", "mlp").
    kind: ClassVar[str]

    #: The family's parameter class: a frozen dataclass of typed fields with a ``max_len``
    #: field (see :class:`~windtunnel.models.config.ModelConfig`).
    config_class: ClassVar[type]

    #: The family's part in a study (see :data:`Role`).
    role: ClassVar[Role]

    #: Why runs of the family cannot train as one run group (``windtunnel.training.group``
    #: stacks their parameters and maps the forward over them with ``torch.func.vmap``), or
    #: None where they can. A family whose forward calls an op that vmap has no batching rule
    #: for says so here, and its runs train alone.
    not_stackable: ClassVar[str | None] = None

    #: The family's config with every size resolved: rebuilding from it (plus
    #: ``vocab_size`` and ``num_classes``) gives the same architecture. Set by the family.
    config: Any

    #: Standard deviation of the initial weights; a family may set its own before
    #: :meth:`reset_parameters` (the transformer's config does).
    init_std: float = INIT_STD

    def __init__(
        self, blocks: list[nn.Module], *, d_model: int, vocab_size: int, num_classes: int, max_len: int
    ) -> None:
        for name, value in (("vocab_size", vocab_size), ("num_classes", num_classes), ("max_len", max_len)):
            if value < 1:
                raise ConfigError(f"{name}={value} is out of range: need {name} >= 1")
        super().__init__()
        self.vocab_size = vocab_size
        self.num_classes = num_classes
        self.max_len = max_len
        self.d_model = d_model
        self.token_embed = nn.Embedding(vocab_size, d_model)
        self.pos_embed = nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList(blocks)
        self.ln_final = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, num_classes)
        self.value_read_in: nn.Linear | None = None  # add_value_read_in gives one

    # --- trace protocol ------------------------------------------------------------

    @property
    def n_layers(self) -> int:
        """Number of residual blocks."""
        return len(self.blocks)

    @property
    def activation_names(self) -> list[str]:
        """Every name a trace can record, in forward order: :meth:`activation_names_for` of ``config``."""
        return self.activation_names_for(self.config)

    @property
    def attention_heads(self) -> dict[int, int]:
        """``{layer: n_heads}`` for the layers that have attention (none by default)."""
        return {}

    # --- what a family declares about itself -----------------------------------------

    @classmethod
    @abc.abstractmethod
    def activation_names_for(cls, config: Any) -> list[str]:
        """Every name a trace can record in the model ``config`` describes, in forward order.

        ``config`` has its sizes resolved (a built model's ``config``); the names are
        those of :mod:`windtunnel.models.names`.
        """

    @classmethod
    def variant(cls, config: Any) -> str:
        """How ``config`` departs from the family's plain model, in a few words ("" for none).

        Part of a run's identity: runs of one family and tunnel that differ only in their
        seed share a variant, and a variant is compared with the plain model as a model of
        its own (``windtunnel.analysis.base.RunKey``). By default no config is a variant.
        """
        return ""

    @classmethod
    def sizing_info(
        cls, config: Any, *, vocab_size: int, num_classes: int, max_len: int | None
    ) -> dict[str, Any]:
        """The family's own lines of ``windtunnel info`` (JSON-able), after the parameter counts.

        Args:
            config: the family's config as the run gives it (sizes may be unresolved).
            vocab_size, num_classes, max_len: what the model is built with.

        Returns:
            Nothing by default; the MLP control reports the sizes it chose and how close
            they come to the transformer it matches.
        """
        return {}

    # --- forward -------------------------------------------------------------------

    def forward(
        self, tokens: Tensor, *, values: Tensor | None = None, trace: Trace | None = None, at: Tensor | None = None
    ) -> Tensor:
        """Logits over the classes at every position, or at the positions ``at``.

        Args:
            tokens: ``[B, T]`` int64 token ids, ``T <= max_len``.
            values: ``[B, T, value_dim]`` values read beside the tokens, for a model built
                with a value read-in (:meth:`add_value_read_in`); None otherwise.
            trace: records activations and applies interventions for this call only.
            at: ``[P]`` positions (increasing): return their logits only. Untraced, the
                model then computes only what those positions need (from the last block
                that mixes positions on, the other positions are dropped: the MLP control
                drops them at the embedding, the transformer in its last attention layer).
                The numbers equal ``forward(tokens)[:, at]`` up to float rounding
                (tests/models/test_models.py). A traced call computes every position.

        Returns:
            ``[B, T, C]`` (``[B, P, C]`` with ``at``) float32 logits; position ``t``
            depends on ``tokens[:, :t+1]`` only.
        """
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be [B, T]; got shape {tuple(tokens.shape)}")
        B, T = tokens.shape
        if T > self.max_len:
            raise ValueError(f"sequence length {T} exceeds the position table (max_len={self.max_len})")
        if at is not None and trace is None:
            return self._forward_at(tokens, values, at)
        tr = NULL_TRACE if trace is None else trace.start(self)
        positions = torch.arange(T, device=tokens.device)  # [T]
        embed = tr.record("embed", self._embed(tokens, values))  # [B, T, d_model]
        pos_embed = tr.record("pos_embed", self.pos_embed(positions).expand(B, T, self.d_model))  # [B, T, d_model]
        x = embed + pos_embed  # [B, T, d_model]
        for layer, block in enumerate(self.blocks):
            x = block(x, tr, layer)  # [B, T, d_model]
        x = tr.record("ln_final", self.ln_final(x))  # [B, T, d_model]
        logits = tr.record("logits", self.head(x))  # [B, T, C]
        if at is not None:
            logits = logits[:, at]  # [B, P, C]
        return logits.float()  # float32 even under autocast: metrics compare with float64 posteriors

    def _embed(self, tokens: Tensor, values: Tensor | None) -> Tensor:
        """``[B, T, d_model]``: each token's embedding, plus its values' read-in where the model has one."""
        if (values is None) != (self.value_read_in is None):
            raise ValueError("values must be given exactly when the model has a value read-in "
                             f"(this one reads {self.value_dim} values per position)")
        embed = self.token_embed(tokens)
        if values is None:
            return embed
        if values.shape != (*tokens.shape, self.value_dim):
            raise ValueError(f"values must be [B, T, {self.value_dim}] beside tokens {tuple(tokens.shape)}; "
                             f"got shape {tuple(values.shape)}")
        # In float32 even under autocast: the exact posterior conditions on the float32 values,
        # and a bfloat16 read-in would round them to 3 significant digits first.
        with torch.autocast(device_type=values.device.type, enabled=False):
            read_in = self.value_read_in(values.float())
        return embed + read_in.to(embed.dtype)

    def add_value_read_in(self, value_dim: int, generator: torch.Generator | None = None) -> None:
        """Give the model a linear read-in (``value_read_in``, no bias) of ``value_dim`` values per
        position, added to the token embedding; initialized N(0, ``init_std``) like the embeddings.

        A tunnel whose observations are values (``ValueInputs``) gets it from
        :func:`~windtunnel.models.build.build_model`, for every family alike: the read-in is
        the embedding of a value, not part of a family's design."""
        if value_dim < 1:
            raise ConfigError(f"value_dim={value_dim} is out of range: need value_dim >= 1")
        if self.value_read_in is not None:
            raise ValueError("the model has a value read-in already")
        self.value_read_in = nn.Linear(value_dim, self.d_model, bias=False)
        nn.init.normal_(self.value_read_in.weight, 0.0, self.init_std, generator=generator)

    @property
    def value_dim(self) -> int:
        """Values read per position (0: tokens only)."""
        return 0 if self.value_read_in is None else self.value_read_in.in_features

    def _forward_at(self, tokens: Tensor, values: Tensor | None, at: Tensor) -> Tensor:
        """The untraced forward at the positions ``at`` only: ``[B, P, C]``.

        Blocks before the last one that mixes positions run on every position (their
        outputs feed its keys and values); that block computes its queries at ``at`` only,
        and every block after it (position-wise) sees only those positions.
        """
        B, T = tokens.shape
        x = self._embed(tokens, values) + self.pos_embed(torch.arange(T, device=tokens.device))  # [B, T, d_model]
        mixing = [layer for layer, block in enumerate(self.blocks) if block.mixes_positions]
        if not mixing:
            x = x[:, at]  # position-wise throughout (the MLP control): drop the rest at once
        cut = mixing[-1] if mixing else -1  # the block where the other positions are dropped
        for layer, block in enumerate(self.blocks):
            # [B, T, d_model] before the cut, [B, P, d_model] from it on
            x = block.forward_at(x, at) if layer == cut else block(x, NULL_TRACE, layer)
        return self.head(self.ln_final(x)).float()  # [B, P, C]

    def run_with_trace(
        self, tokens: Tensor, names: Iterable[str] | str | None = None, *, values: Tensor | None = None, **options: Any
    ) -> tuple[Tensor, Trace]:
        """``(logits, trace)`` of one traced forward; see :func:`windtunnel.models.trace.run_with_trace`."""
        trace = Trace(names, **options)
        return self(tokens, values=values, trace=trace), trace

    # --- initialization ------------------------------------------------------------

    @property
    def n_residual_writes(self) -> int:
        """How many sublayers add to the residual stream (sets the output-projection init scale)."""
        return self.n_layers

    @property
    def on_meta_device(self) -> bool:
        """Built on the meta device (to count its parameters, as the sizing does): its tensors
        hold no values, so there is nothing to initialize, and drawing the values anyway (on
        the CPU, from the generator) would be most of a sizing search's time."""
        return any(parameter.is_meta for parameter in self.parameters())

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """GPT-2 initialization: N(0, ``init_std``) weights (0.02), zero biases, unit LayerNorms.

        Projections that write into the residual stream (``attn.proj``, ``mlp.fc_out``)
        are scaled by ``1/sqrt(n_residual_writes)`` so the stream's variance at the top
        does not grow with depth.

        Args:
            generator: draws every weight (CPU), so a seed fixes the model independently
                of the global RNG; ``None`` uses the global RNG.
        """
        if self.on_meta_device:
            return
        residual_std = self.init_std / math.sqrt(self.n_residual_writes)
        for name, module in self.named_modules():
            if isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
            elif isinstance(module, (nn.Linear, nn.Embedding)):
                std = residual_std if name.endswith((".proj", ".fc_out")) else self.init_std
                nn.init.normal_(module.weight, 0.0, std, generator=generator)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)

    # --- stacked weights (copies, detached: editing them never changes the model) ------

    @property
    def W_E(self) -> Tensor:
        """``[vocab_size, d_model]`` token embeddings."""
        return self.token_embed.weight.detach().clone()

    @property
    def W_pos(self) -> Tensor:
        """``[max_len, d_model]`` position embeddings."""
        return self.pos_embed.weight.detach().clone()

    @property
    def W_U(self) -> Tensor:
        """``[d_model, C]`` head weights: ``logits = ln_final(x) @ W_U + b_U``."""
        return self.head.weight.detach().t().clone()

    @property
    def b_U(self) -> Tensor:
        """``[C]`` head bias."""
        return self.head.bias.detach().clone()

    @property
    def W_in(self) -> Tensor:
        """``[n_layers, d_model, d_mlp]``: ``mlp.pre = mlp_in @ W_in[l] + b_in[l]``."""
        return torch.stack([block.mlp.fc_in.weight.detach().t() for block in self.blocks])

    @property
    def W_out(self) -> Tensor:
        """``[n_layers, d_mlp, d_model]``: ``mlp_out = mlp.post @ W_out[l] + b_out[l]``."""
        return torch.stack([block.mlp.fc_out.weight.detach().t() for block in self.blocks])
