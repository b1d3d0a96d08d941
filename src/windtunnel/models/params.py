"""Parameter counting, in total and by part of the model (for ``windtunnel info``).

    >>> from windtunnel.models import build_model
    >>> model = build_model("transformer", None, vocab_size=40, num_classes=20, max_len=39)
    >>> count_params(model)
    2683988
"""

from __future__ import annotations

from torch import nn

__all__ = ["PARTS", "count_params", "params_by_part", "unwrap_model"]

#: The parts :func:`params_by_part` reports, in order.
PARTS: tuple[str, ...] = ("embed", "pos_embed", "blocks/attention", "blocks/mlp", "blocks/mixer", "norms", "head")


def unwrap_model(model: nn.Module) -> nn.Module:
    """The model inside DDP (``.module``) and ``torch.compile`` (``._orig_mod``) wrappers."""
    while True:
        for attribute in ("module", "_orig_mod"):
            inner = getattr(model, attribute, None)
            if isinstance(inner, nn.Module):
                model = inner
                break
        else:
            return model


def count_params(model: nn.Module) -> int:
    """Number of scalar parameters (each shared tensor counted once)."""
    return sum(p.numel() for p in unwrap_model(model).parameters())


def _part(name: str) -> str:
    """The part a parameter belongs to, from its dotted name."""
    if name.startswith(("token_embed.", "value_read_in.")):
        return "embed"  # a value's read-in is its embedding
    if name.startswith("pos_embed."):
        return "pos_embed"
    if name.startswith("head."):
        return "head"
    if name.startswith("ln_final.") or ".ln." in name:
        return "norms"  # every LayerNorm: the final one and each sublayer's pre-norm
    if name.startswith("blocks.") and ".attn." in name:
        return "blocks/attention"
    if name.startswith("blocks.") and ".mlp." in name:
        return "blocks/mlp"
    if name.startswith("blocks.") and ".mixer." in name:
        return "blocks/mixer"  # a recurrent control's sequence mixer (LSTM, Mamba block)
    raise ValueError(f"parameter {name!r} belongs to no known part of a windtunnel model")


def params_by_part(model: nn.Module) -> dict[str, int]:
    """Parameter counts by part, in the order of :data:`PARTS` (parts a model lacks count 0).

    ``blocks/attention``, ``blocks/mlp`` and ``blocks/mixer`` exclude their LayerNorms, which are counted
    under ``norms``; the values sum to :func:`count_params`.
    """
    counts = dict.fromkeys(PARTS, 0)
    for name, parameter in unwrap_model(model).named_parameters():
        counts[_part(name)] += parameter.numel()
    return counts
