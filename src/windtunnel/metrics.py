"""Information measures in bits, defined once.

Probabilities are the last dimension of a tensor. ``0 log 0`` is taken as 0, so point
masses and distributions with empty support entries are handled exactly.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["entropy_bits", "kl_bits"]

_LN2 = math.log(2.0)


def entropy_bits(probs: Tensor) -> Tensor:
    """Shannon entropy in bits over the last dimension: ``[..., C] -> [...]``."""
    # p * log(max(p, tiny)) is exactly 0 at p = 0 and cheaper than xlogy.
    return -(probs * probs.clamp_min(torch.finfo(probs.dtype).tiny).log()).sum(-1) / _LN2


def kl_bits(p: Tensor, q: Tensor) -> Tensor:
    """KL(p || q) in bits over the last dimension; terms with p = 0 contribute 0."""
    return (torch.special.xlogy(p, p) - torch.special.xlogy(p, q)).sum(-1) / _LN2
