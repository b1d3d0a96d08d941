"""Scoped tracing and interventions: one object handed to one forward call.

A :class:`Trace` is passed to a model's forward (``model(tokens, trace=trace)``) and
acts only inside that call. The model keeps no reference to it, registers no hooks and
touches no global state, so after the call nothing remains but the tensors the trace
recorded, and the next plain forward is the training-time fast path again. Every model
in :mod:`windtunnel.models` takes the same trace; the names it can record are listed in
:mod:`windtunnel.models.names`.

What a trace does, all in one pass:

- **record** the activations named in ``names`` (exact names and/or glob patterns such
  as ``"blocks.*.resid_post"``; ``None`` records everything, ``()`` nothing);
- **mask heads**: ``mask_heads={layer: [head, ...]}`` zeroes those heads' ``z`` and so
  their whole contribution (attention has no output bias, so masking every head of a
  layer zeroes its attention output exactly);
- **skip layers**: ``skip_layers=[layer, ...]`` passes the residual stream through those
  blocks unchanged (attention and MLP both removed);
- **replace** any activation: ``replace={name_or_pattern: tensor or fn(x, name)}``; the
  replacement (broadcast to the original shape) is what the rest of the forward uses,
  and what is recorded.

Attention probabilities exist only on the explicit attention path; a layer takes it
when the trace asks for (or replaces) its ``attn.scores`` or ``attn.pattern``, or when
``explicit_attention=True``. Every other layer keeps the fused kernel, so a trace that
records only residuals returns logits bit-identical to the untraced forward.

Example (the shapes of the analyses built on this)::

    from windtunnel.models import Trace, build_model, run_with_trace

    model = build_model("transformer", None, vocab_size=40, num_classes=20, max_len=39)
    logits, trace = run_with_trace(model, tokens, names=["blocks.0.attn.k", "blocks.*.attn.pattern",
                                                         "blocks.*.resid_post"])
    keys = trace["blocks.0.attn.k"]                  # [B, H, T, d_head]: key orthogonality
    patterns = trace.stack("blocks.*.attn.pattern")  # [n_layers, B, H, T, T]: QK sharpening
    resid = trace.stack("blocks.*.resid_post")       # [n_layers, B, T, d_model]: linear probes
    head_ablated = model(tokens, trace=Trace((), mask_heads={0: [3]}))   # head ablation
    layer_ablated = model(tokens, trace=Trace((), skip_layers=[2]))      # layer ablation
    mean_ablated = model(tokens, trace=Trace((), replace={
        "blocks.1.attn.z": lambda z, name: z.mean(dim=0, keepdim=True)}))  # mean ablation
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

import torch
from torch import Tensor

__all__ = ["NULL_TRACE", "Replacement", "Trace", "Traceable", "run_with_trace"]

#: A replacement value: a tensor broadcastable to the activation, or ``fn(x, name) -> tensor``.
Replacement = Tensor | Callable[[Tensor, str], Tensor]

_GLOB_CHARS = frozenset("*?[")


class Traceable(Protocol):
    """What a trace needs of a model (every :class:`~windtunnel.models.base.SequenceModel` is one).

    Declared here rather than importing the model base class, which itself builds on this
    module: the trace depends on this protocol only, never on a model family.
    """

    @property
    def activation_names(self) -> list[str]:
        """Every name a trace can record, in forward order."""

    @property
    def n_layers(self) -> int:
        """Number of residual blocks."""

    @property
    def attention_heads(self) -> dict[int, int]:
        """``{layer: n_heads}`` for the layers that have attention."""

    def __call__(self, tokens: Tensor, *, trace: Trace | None = None) -> Tensor:
        """``[B, T, C]`` logits of one forward call that ``trace`` records."""


def _resolve(what: str, patterns: Iterable[str], available: list[str]) -> list[str]:
    """The available names that ``patterns`` select; a name or pattern that selects nothing is an error."""
    selected: list[str] = []
    for pattern in patterns:
        if _GLOB_CHARS & set(pattern):
            matches = fnmatch.filter(available, pattern)
            if not matches:
                raise ValueError(
                    f"{what} pattern {pattern!r} matches no activation of this model "
                    "(names look like 'blocks.0.resid_post'; see windtunnel.models.names)"
                )
            selected += matches
        elif pattern in available:
            selected.append(pattern)
        else:
            close = difflib.get_close_matches(pattern, available, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else "; see windtunnel.models.names"
            raise ValueError(f"{what} name {pattern!r} is not an activation of this model{hint}")
    return selected


class Trace:
    """Records activations and applies interventions during one forward call.

    Args:
        names: activation names and/or glob patterns to record; ``None`` records every
            activation, ``()`` none (for pure interventions). A single string is one name.
        mask_heads: ``{layer: heads}``: heads whose contribution is zeroed.
        skip_layers: layers whose block is replaced by the identity.
        replace: ``{name or pattern: replacement}``; a tensor is broadcast to the
            activation's shape, a function is called as ``fn(x, name)``.
        explicit_attention: compute attention explicitly in every layer, even where
            nothing needs the probabilities (for checking it against the fused path).
        detach: store recorded tensors detached from the autograd graph; pass ``False``
            to take gradients through them.

    Attributes:
        activations: name -> tensor, in forward order, filled by the last forward call.
    """

    def __init__(
        self,
        names: Iterable[str] | str | None = None,
        *,
        mask_heads: Mapping[int, Iterable[int]] | None = None,
        skip_layers: Iterable[int] = (),
        replace: Mapping[str, Replacement] | None = None,
        explicit_attention: bool = False,
        detach: bool = True,
    ) -> None:
        self.names = (names,) if isinstance(names, str) else None if names is None else tuple(names)
        self.mask_heads = {int(layer): frozenset(int(h) for h in heads) for layer, heads in (mask_heads or {}).items()}
        self.skip_layers = frozenset(int(layer) for layer in skip_layers)
        self.replace = dict(replace or {})
        self.explicit_attention = explicit_attention
        self.detach = detach
        self.activations: dict[str, Tensor] = {}
        self._keep: frozenset[str] = frozenset()
        self._replacements: dict[str, Replacement] = {}
        self._n_heads: dict[int, int] = {}

    # --- the protocol models use -------------------------------------------------------

    def start(self, model: Traceable) -> Trace:
        """Check the request against ``model`` and clear previous recordings (called by forward).

        Raises:
            ValueError: an unknown name or pattern, a layer out of range, or a head mask
                on a layer without attention or a head out of range.
        """
        available = model.activation_names
        self._keep = frozenset(available if self.names is None else _resolve("trace", self.names, available))
        self._replacements = {}
        for key, value in self.replace.items():
            for name in _resolve("replace", [key], available):
                self._replacements[name] = value
        n_layers = model.n_layers
        for layer in sorted(self.skip_layers):
            if not 0 <= layer < n_layers:
                raise ValueError(f"skip_layers: layer {layer} is out of range: the model has layers 0..{n_layers - 1}")
        self._n_heads = dict(model.attention_heads)
        for layer, heads in sorted(self.mask_heads.items()):
            if layer not in self._n_heads:
                with_attention = sorted(self._n_heads)
                raise ValueError(f"mask_heads: layer {layer} has no attention; layers with attention: {with_attention}")
            bad = sorted(h for h in heads if not 0 <= h < self._n_heads[layer])
            if bad:
                last = self._n_heads[layer] - 1
                raise ValueError(f"mask_heads: heads {bad} of layer {layer} are out of range 0..{last}")
        self.activations = {}
        return self

    def record(self, name: str, x: Tensor) -> Tensor:
        """Apply any replacement of ``name``, store the result if asked for, and return it."""
        replacement = self._replacements.get(name)
        if replacement is not None:
            x = _apply(name, x, replacement)
        if name in self._keep:
            self.activations[name] = x.detach() if self.detach else x
        return x

    def needs(self, name: str) -> bool:
        """Whether ``name`` is recorded or replaced (the model must then compute it)."""
        return name in self._keep or name in self._replacements

    def replaces(self, name: str) -> bool:
        """Whether an intervention replaces ``name``."""
        return name in self._replacements

    def skips(self, layer: int) -> bool:
        """Whether block ``layer`` is skipped."""
        return layer in self.skip_layers

    def head_keep(self, layer: int, like: Tensor) -> Tensor | None:
        """``[H]`` multipliers (0 for masked heads, 1 otherwise) for ``layer``, or None when unmasked."""
        heads = self.mask_heads.get(layer)
        if not heads:
            return None
        keep = torch.ones(self._n_heads[layer], dtype=like.dtype, device=like.device)  # [H]
        keep[sorted(heads)] = 0.0
        return keep

    # --- reading the results -----------------------------------------------------------

    def __getitem__(self, name: str) -> Tensor:
        try:
            return self.activations[name]
        except KeyError:
            recorded = ", ".join(list(self.activations)[:8]) or "nothing"
            more = ", ..." if len(self.activations) > 8 else ""
            raise KeyError(
                f"activation {name!r} was not recorded (recorded: {recorded}{more}); ask for it in Trace(names=...)"
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self.activations

    def __iter__(self) -> Iterator[str]:
        return iter(self.activations)

    def __len__(self) -> int:
        return len(self.activations)

    def stack(self, pattern: str) -> Tensor:
        """Stack the recorded activations matching ``pattern`` along a new first axis, in layer order.

        ``trace.stack("blocks.*.resid_post")`` is ``[n_layers, B, T, d_model]``.
        """
        matches = [name for name in self.activations if fnmatch.fnmatchcase(name, pattern)]
        if not matches:
            raise KeyError(f"no recorded activation matches {pattern!r}")
        return torch.stack([self.activations[name] for name in matches])

    def __repr__(self) -> str:
        return (
            f"Trace(recorded={len(self.activations)}, names={self.names!r}, mask_heads={self.mask_heads!r}, "
            f"skip_layers={sorted(self.skip_layers)!r}, replace={sorted(self.replace)!r})"
        )


def _apply(name: str, x: Tensor, replacement: Replacement) -> Tensor:
    value = replacement(x, name) if callable(replacement) else replacement
    if not isinstance(value, Tensor):
        raise TypeError(f"replacement for {name!r} returned {type(value).__name__}, not a Tensor")
    try:
        if torch.broadcast_shapes(value.shape, x.shape) != x.shape:
            raise RuntimeError
    except RuntimeError:
        raise ValueError(
            f"replacement for {name!r} has shape {tuple(value.shape)}; it must broadcast to {tuple(x.shape)}"
        ) from None
    return value.to(dtype=x.dtype, device=x.device).expand_as(x)


class _NullTrace:
    """The trace of an untraced call: records nothing, changes nothing, needs nothing.

    It is stateless, so sharing one instance is not shared state.
    """

    explicit_attention = False

    def record(self, name: str, x: Tensor) -> Tensor:
        return x

    def needs(self, name: str) -> bool:
        return False

    def replaces(self, name: str) -> bool:
        return False

    def skips(self, layer: int) -> bool:
        return False

    def head_keep(self, layer: int, like: Tensor) -> None:
        return None


#: Used by models when no trace is given, so their code has a single path.
NULL_TRACE = _NullTrace()


def run_with_trace(
    model: Traceable,
    tokens: Tensor,
    names: Iterable[str] | str | None = None,
    *,
    values: Tensor | None = None,
    **options: Any,
) -> tuple[Tensor, Trace]:
    """Run ``model`` once with a fresh :class:`Trace`; return ``(logits, trace)``.

    Args:
        model: any windtunnel model.
        tokens: ``[B, T]`` int64 token ids.
        names: what to record (see :class:`Trace`).
        values: ``[B, T, D]`` values beside the tokens, for a model with a value read-in.
        **options: the keyword arguments of :class:`Trace` (``mask_heads``, ``skip_layers``, ...).

    Returns:
        ``[B, T, C]`` float32 logits and the filled trace.
    """
    trace = Trace(names, **options)
    logits = model(tokens, values=values, trace=trace) if values is not None else model(tokens, trace=trace)
    return logits, trace
