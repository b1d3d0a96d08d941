"""Batched random draws that take an explicit ``torch.Generator``.

``torch.distributions`` cannot be seeded per call (it reads the global RNG), so the
Dirichlet draw is built here from a Gamma sampler (Marsaglia & Tsang, 2000) that
takes a generator. Every function is deterministic given the generator's state.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["dirichlet", "log_gamma", "random_permutations"]


def random_permutations(batch_size: int, n: int, *, generator: torch.Generator) -> Tensor:
    """``[batch_size, n]`` int64: independent uniformly random permutations of ``0..n-1``."""
    # argsort of i.i.d. continuous keys is a uniform permutation (ties have probability ~0
    # for float64 keys, and any tie would be broken by index, not by bias toward a value).
    keys = torch.rand(batch_size, n, generator=generator, dtype=torch.float64, device=generator.device)
    return keys.argsort(dim=-1)


def log_gamma(shape: tuple[int, ...], alpha: float, *, generator: torch.Generator) -> Tensor:
    """``log X`` for ``X ~ Gamma(alpha, 1)`` i.i.d., float64 of the given shape.

    Marsaglia-Tsang rejection for shape ``a >= 1``; for ``alpha < 1`` draws at ``alpha + 1``
    and multiplies by ``U ** (1 / alpha)``. Working in log space keeps tiny concentrations
    (where ``X`` underflows to 0) exact enough to normalize.
    """
    count = math.prod(shape)
    if alpha == 1.0:  # Gamma(1) is Exponential(1) = -log(1 - U): no rejection loop (the default prior)
        u = torch.rand(shape, generator=generator, dtype=torch.float64, device=generator.device)
        return torch.log(-torch.log1p(-u))
    a = alpha if alpha >= 1.0 else alpha + 1.0
    d = a - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * d)
    out = torch.empty(count, dtype=torch.float64, device=generator.device)
    pending = torch.arange(count, device=generator.device)
    while pending.numel() > 0:  # acceptance is >95% per round, so a few rounds at most
        m = pending.numel()
        x = torch.randn(m, generator=generator, dtype=torch.float64, device=generator.device)
        u = torch.rand(m, generator=generator, dtype=torch.float64, device=generator.device)
        v = (1.0 + c * x) ** 3
        safe_v = v.clamp_min(torch.finfo(torch.float64).tiny)
        accept = (v > 0) & (torch.log(u) < 0.5 * x * x + d - d * v + d * torch.log(safe_v))
        out[pending[accept]] = math.log(d) + torch.log(safe_v[accept])
        pending = pending[~accept]
    if alpha < 1.0:
        u = torch.rand(count, generator=generator, dtype=torch.float64, device=generator.device)
        out += torch.log(u) / alpha
    return out.view(shape)


def dirichlet(shape: tuple[int, ...], k: int, concentration: float, *, generator: torch.Generator) -> Tensor:
    """``[*shape, k]`` float64 rows drawn from the symmetric Dirichlet(concentration)."""
    if concentration == 1.0:  # the default prior: Exponential(1) draws directly, the fast path
        g = -torch.log1p(-torch.rand((*shape, k), generator=generator, dtype=torch.float64, device=generator.device))
    else:  # via logs: draws for small concentrations underflow to 0 before normalizing
        log_g = log_gamma((*shape, k), concentration, generator=generator)
        g = torch.exp(log_g - log_g.amax(dim=-1, keepdim=True))
    return g / g.sum(dim=-1, keepdim=True)
