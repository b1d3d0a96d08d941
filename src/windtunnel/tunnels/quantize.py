"""Probabilities on a grid: rows of a stochastic matrix as integer counts of ``1/levels``.

The HMM tunnel's header writes every entry of T and E as one token on this grid, and the
quantized matrix *is* the hypothesis (the posterior is computed from it), so the rounding
must keep each row a distribution exactly: counts summing to ``levels``.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["quantize_rows", "round_rows_with_floor"]


def quantize_rows(probs: Tensor, levels: int) -> Tensor:
    """Round each row of ``probs`` to integer counts summing to exactly ``levels``.

    Largest-remainder rounding: floor every ``p * levels``, then give the missing units to
    the entries with the largest remainders, so each entry moves by less than one grid step.

    Args:
        probs: ``[..., k]`` rows summing to 1.

    Returns:
        ``[..., k]`` int64 counts.
    """
    scaled = probs * levels
    counts = scaled.floor()
    missing = levels - counts.sum(-1, keepdim=True)  # [..., 1], in 0..k-1
    order = (scaled - counts).argsort(dim=-1, descending=True, stable=True)  # largest remainder first
    bonus = torch.arange(probs.shape[-1], device=probs.device) < missing  # [..., k]: one unit to each of the first `missing`
    return counts.long().scatter_add_(-1, order, bonus.long())


def round_rows_with_floor(probs: Tensor, levels: int, minimum: int) -> Tensor:
    """Round each row to integer counts summing to ``levels``, each at least ``minimum``, as
    the authors' generator does.

    Round every ``p * levels`` to the nearest integer (half to even), raise it to
    ``minimum``, then fix the row's sum one unit at a time: a row short of ``levels`` adds
    one unit to each entry in ascending order of its count (ties by position), cycling; a
    row over it takes one unit from each entry above ``minimum`` in descending order,
    cycling, skipping entries at the minimum. The orders are fixed once, before any fix.

    Args:
        probs: ``[..., k]`` rows summing to 1.
        levels: units per row.
        minimum: units every entry gets at least; ``k * minimum <= levels``.

    Returns:
        ``[..., k]`` int64 counts.
    """
    k = probs.shape[-1]
    if k * minimum > levels:
        raise ValueError(f"minimum={minimum} is infeasible: {k} x {minimum} units exceed levels={levels}")
    counts = torch.round(probs * levels).long().clamp_min(minimum)  # [..., k]
    short = (levels - counts.sum(-1, keepdim=True)).clamp_min(0)  # [..., 1]
    # Short rows: the entry of rank r in ascending order is reached ceil((short - r) / k) times.
    rank_up = counts.argsort(dim=-1, stable=True).argsort(dim=-1)  # [..., k]
    counts = counts + torch.div(short - rank_up + k - 1, k, rounding_mode="floor").clamp_min(0)
    # Rows over: each pass visits the entries in descending order once and takes a unit from
    # each one still above the minimum, until the row sums to ``levels``.
    down = (-counts).argsort(dim=-1, stable=True)  # [..., k]: entry indices, largest first
    over = counts.sum(-1, keepdim=True) - levels  # [..., 1], >= 0
    while bool((over > 0).any()):
        in_order = counts.gather(-1, down)  # [..., k]
        eligible = in_order > minimum
        take = eligible & (eligible.cumsum(-1) <= over)  # the first `over` eligible entries of this pass
        counts = counts.scatter_add(-1, down, -take.long())
        over = over - take.sum(-1, keepdim=True)
    return counts
