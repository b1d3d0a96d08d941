"""Small statistics the geometric analyses share: ranks, Pearson and Spearman correlation, PCA.

All in float64 torch (scipy is only the tests' oracle).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["average_ranks", "pca", "pearson", "spearman"]


def average_ranks(x: Tensor) -> Tensor:
    """``[N] -> [N]`` float64 ranks 1..N; tied values share the mean of their ranks.

    Ties matter here: without replacement, every bijection sequence has the same exact
    entropy at a given position, so the entropy takes only L distinct values.
    """
    sorted_x, order = torch.sort(x, stable=True)
    _, group, counts = torch.unique_consecutive(sorted_x, return_inverse=True, return_counts=True)
    last_rank = counts.cumsum(0).double()  # [G]: 1-based rank of each group's last member
    group_rank = last_rank - (counts.double() - 1) / 2  # [G]: mean of first..last rank
    ranks = torch.empty(x.shape[0], dtype=torch.float64)
    ranks[order] = group_rank[group]
    return ranks


def pearson(x: Tensor, y: Tensor) -> float:
    """Pearson correlation of ``[N]`` and ``[N]`` (float64); NaN if either is constant."""
    x, y = x.double(), y.double()
    x, y = x - x.mean(), y - y.mean()
    denominator = (x.square().sum() * y.square().sum()).sqrt()
    return (x @ y / denominator).item() if denominator > 0 else math.nan


def spearman(x: Tensor, y: Tensor) -> float:
    """Spearman rank correlation of ``[N]`` and ``[N]`` (Pearson of average ranks); NaN if either is constant."""
    return pearson(average_ranks(x), average_ranks(y))


def pca(points: Tensor) -> tuple[Tensor, Tensor]:
    """Principal components of ``[N, d]`` points, in float64.

    Returns:
        ``[d]`` fraction of the variance along each component (descending; all zero if
        the points coincide) and ``[N, d]`` the centered points' coordinates on the
        components (signs arbitrary).
    """
    x = points.double()
    x = x - x.mean(0)  # [N, d]
    # Eigen-decomposing the d x d scatter matrix is much cheaper than an SVD of N >> d rows.
    eigenvalues, eigenvectors = torch.linalg.eigh(x.T @ x)  # ascending: [d], [d, d]
    variance, axes = eigenvalues.flip(0).clamp_min(0), eigenvectors.flip(1)
    total = variance.sum()
    ratio = variance / total if total > 0 else torch.zeros_like(variance)
    return ratio, x @ axes
