"""Entropy and KL in bits against hand-computed values and scipy."""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy import stats

from windtunnel.metrics import entropy_bits, kl_bits


def test_entropy_closed_forms():
    for k in (1, 2, 3, 20):
        uniform = torch.full((k,), 1.0 / k, dtype=torch.float64)
        assert abs(entropy_bits(uniform).item() - math.log2(k)) < 1e-14  # a few ulps of summation
    assert entropy_bits(torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)).item() == 0.0  # 0 log 0 = 0
    assert entropy_bits(torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)).item() == 1.5


def test_kl_against_scipy_and_properties():
    g = torch.Generator().manual_seed(0)
    p = torch.rand(100, 6, generator=g, dtype=torch.float64)
    p[:, 0] = 0  # zero-probability entries of p contribute nothing
    p /= p.sum(-1, keepdim=True)
    q = torch.rand(100, 6, generator=g, dtype=torch.float64)
    q /= q.sum(-1, keepdim=True)
    expected = stats.entropy(p.numpy(), q.numpy(), base=2, axis=-1)
    np.testing.assert_allclose(kl_bits(p, q).numpy(), expected, rtol=1e-12, atol=1e-14)
    assert torch.all(kl_bits(p, q) >= 0)
    assert torch.all(kl_bits(p, p).abs() < 1e-14)
    # Units: bits are nats / ln 2.
    nats = (p * (torch.log(p.clamp_min(1e-300)) - torch.log(q))).sum(-1)
    np.testing.assert_allclose(kl_bits(p, q).numpy(), (nats / math.log(2)).numpy(), rtol=1e-12)
