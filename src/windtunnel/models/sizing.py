"""Capacity matching: choose the MLP control's depth and width to match a transformer's size.

The paper's control has 18-20 residual blocks of width 384-400 and about as many
parameters as the transformer (within 1%). Those widths fit the bijection transformer
(~2.68M with our embeddings and head). The HMM transformer's true size is ~7.1M, not
the 2.68M the paper states (docs/protocol.md §4), so for it we keep 18-20 blocks and widen them
(width ~690-770 at ``d_model = 256``) rather than match a number the model does not have.

    >>> sizing = size_mlp(2_683_988, d_model=192, vocab_size=40, num_classes=20, max_len=39)
    >>> (sizing.n_blocks, sizing.d_hidden, abs(sizing.mismatch) < 0.01)
    (18, 384, True)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from windtunnel.config import ConfigError
from windtunnel.models.config import MLPConfig, TransformerConfig
from windtunnel.models.params import count_params
from windtunnel.models.transformer import Transformer

__all__ = [
    "MLPSizing", "ShapeSizing", "match_transformer", "mlp_param_count", "size_by_count", "size_mlp", "transformer_param_count",
]

#: Block counts tried when the depth is free (the paper's range).
PAPER_DEPTHS: tuple[int, ...] = (18, 19, 20)


@dataclass(frozen=True)
class MLPSizing:
    """A chosen MLP-control shape and how close it comes to its target.

    Attributes:
        n_blocks: residual MLP blocks.
        d_hidden: hidden width of each block.
        params: parameter count of the control with this shape.
        target_params: parameter count it was matched to.
        mismatch: ``(params - target_params) / target_params`` (signed; +0.003 is 0.3% larger).
    """

    n_blocks: int
    d_hidden: int
    params: int
    target_params: int
    mismatch: float


def mlp_param_count(
    *, d_model: int, n_blocks: int, d_hidden: int, vocab_size: int, num_classes: int, max_len: int
) -> int:
    """Exact parameter count of the MLP control (closed form, so sizing can search quickly)."""
    embeddings = (vocab_size + max_len) * d_model
    per_block = 2 * d_model + (d_model * d_hidden + d_hidden) + (d_hidden * d_model + d_model)  # LN, fc_in, fc_out
    final = 2 * d_model + d_model * num_classes + num_classes  # ln_final, head
    return embeddings + n_blocks * per_block + final


def transformer_param_count(
    config: TransformerConfig, *, vocab_size: int, num_classes: int, max_len: int | None = None
) -> int:
    """Parameter count of the transformer ``config`` describes, counted on the meta device (no memory)."""
    with torch.device("meta"):
        model = Transformer(config, vocab_size=vocab_size, num_classes=num_classes, max_len=max_len)
    return count_params(model)


def size_mlp(
    target_params: int,
    *,
    d_model: int,
    vocab_size: int,
    num_classes: int,
    max_len: int,
    n_blocks: int | None = None,
    d_hidden: int | None = None,
    depths: Sequence[int] = PAPER_DEPTHS,
    multiple_of: int = 16,
    tolerance: float = 0.01,
) -> MLPSizing:
    """The MLP-control shape whose parameter count is closest to ``target_params``.

    Free sizes are searched: each depth in ``depths`` (or the given ``n_blocks``) with
    the widths that are multiples of ``multiple_of`` on either side of the exact solution
    (round widths run faster, and 1% leaves room for them); with ``d_hidden`` given, the
    depths on either side of the exact solution. The smallest ``|mismatch|`` wins, then
    the fewer blocks. Sizes given in full are not searched and not held to ``tolerance``.

    Args:
        target_params: the parameter count to match.
        d_model, vocab_size, num_classes, max_len: the fixed parts of the control.
        n_blocks, d_hidden: fix one (or both) sizes instead of searching it.
        depths: block counts tried when ``n_blocks`` is free.
        multiple_of: granularity of searched widths.
        tolerance: largest ``|mismatch|`` accepted for a searched shape.

    Raises:
        ConfigError: no searched shape lands within ``tolerance``.
    """

    def count(n: int, h: int) -> int:
        return mlp_param_count(
            d_model=d_model, n_blocks=n, d_hidden=h, vocab_size=vocab_size, num_classes=num_classes, max_len=max_len
        )

    fixed = count(0, 1)  # embeddings, final norm, head
    if n_blocks is not None and d_hidden is not None:
        candidates = [(n_blocks, d_hidden)]
    elif d_hidden is not None:
        n_exact = (target_params - fixed) / (count(1, d_hidden) - fixed)
        candidates = [(n, d_hidden) for n in sorted({max(1, int(n_exact)), max(1, int(n_exact) + 1)})]
    else:
        candidates = []
        for n in [n_blocks] if n_blocks is not None else depths:
            # count(n, h) = fixed + n * (3 d_model + h (2 d_model + 1)); solve for h.
            h_exact = ((target_params - fixed) / n - 3 * d_model) / (2 * d_model + 1)
            low = max(multiple_of, int(h_exact // multiple_of) * multiple_of)
            candidates += [(n, low), (n, low + multiple_of)]
    best = min(candidates, key=lambda nh: (abs(count(*nh) - target_params), nh[0]))
    params = count(*best)
    sizing = MLPSizing(best[0], best[1], params, target_params, (params - target_params) / target_params)
    searched = n_blocks is None or d_hidden is None
    if searched and abs(sizing.mismatch) > tolerance:
        raise ConfigError(
            f"n_blocks={n_blocks}, d_hidden={d_hidden} cannot match {target_params} parameters within "
            f"{tolerance:.0%}: the closest shape ({best[0]} blocks x {best[1]}) is off by {sizing.mismatch:+.2%}"
        )
    return sizing


def match_transformer(config: MLPConfig, *, vocab_size: int, num_classes: int, max_len: int) -> MLPSizing | None:
    """Size the control described by ``config`` against ``config.matched_to`` (None when there is none).

    The transformer is counted with the same vocabulary and classes, and with its own
    ``max_len`` if set, else the control's.
    """
    if config.matched_to is None:
        return None
    target = transformer_param_count(
        config.matched_to, vocab_size=vocab_size, num_classes=num_classes, max_len=config.matched_to.max_len or max_len
    )
    return size_mlp(
        target,
        d_model=config.d_model,
        vocab_size=vocab_size,
        num_classes=num_classes,
        max_len=max_len,
        n_blocks=config.n_blocks,
        d_hidden=config.d_hidden,
    )


@dataclass(frozen=True)
class ShapeSizing:
    """A chosen ``(depth, width)`` of a control family and how close it comes to its target.

    Attributes:
        depth: layers.
        width: the family's free width (an LSTM's hidden size, a Mamba block's inner width).
        params: parameter count with this shape.
        target_params: parameter count it was matched to.
        mismatch: ``(params - target_params) / target_params`` (signed).
    """

    depth: int
    width: int
    params: int
    target_params: int
    mismatch: float


def size_by_count(
    count: Callable[[int, int], int],
    target_params: int,
    *,
    depths: Sequence[int],
    width: int | None = None,
    max_width: int = 1 << 16,
    tolerance: float = 0.01,
) -> ShapeSizing:
    """The ``(depth, width)`` whose parameter count is closest to ``target_params``, for a family
    whose count has no convenient closed form (a recurrent control counted on the meta device).

    For each depth (in order of preference) the width is found by bisection (``count`` grows
    with the width), and the widths on either side of the target are tried; with ``width``
    given only the depths are searched. The first depth with a shape within ``tolerance``
    wins, its closer width; without one, the closest shape of all is refused.

    Args:
        count: ``count(depth, width) -> parameters``.
        target_params: the parameter count to match.
        depths: depths to try, the preferred first (e.g. the transformer's own first).
        width: a fixed width (then only the depths are searched).
        max_width: the largest width tried.
        tolerance: largest ``|mismatch|`` accepted.

    Raises:
        ConfigError: no shape lands within ``tolerance``.
    """

    def closest_width(depth: int) -> int:
        if width is not None:
            return width
        low, high = 1, max_width
        while low < high:  # the smallest width whose count reaches the target
            mid = (low + high) // 2
            low, high = (mid + 1, high) if count(depth, mid) < target_params else (low, mid)
        return min((w for w in (low - 1, low) if w >= 1), key=lambda w: abs(count(depth, w) - target_params))

    best: ShapeSizing | None = None
    for depth in depths:
        w = closest_width(depth)
        params = count(depth, w)
        sizing = ShapeSizing(depth, w, params, target_params, (params - target_params) / target_params)
        if abs(sizing.mismatch) <= tolerance:
            return sizing
        if best is None or abs(sizing.mismatch) < abs(best.mismatch):
            best = sizing
    assert best is not None, "size_by_count needs at least one depth"
    raise ConfigError(
        f"no shape matches {target_params} parameters within {tolerance:.0%}: the closest "
        f"({best.depth} layers x {best.width}) is off by {best.mismatch:+.2%}; give the sizes yourself"
    )
