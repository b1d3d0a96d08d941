"""The forward algorithm: exact filtering posteriors of an HMM, batched, in float64."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["forward_filter"]

_RESCALE_EVERY = 8  # (1/levels)^16 stays far above float64's smallest normal for levels <= 1e9


def forward_filter(transition: Tensor, emission: Tensor, initial: Tensor, observations: Tensor) -> tuple[Tensor, Tensor]:
    """The forward algorithm, normalized at every step.

    Args:
        transition: ``[B, S, S]`` float64.
        emission: ``[B, S, M]`` float64.
        initial: ``[B, S]`` or ``[S]`` float64 distribution of ``s_1``.
        observations: ``[B, K]`` int64.

    Returns:
        posterior ``[B, K, S]`` float64, ``p(s_t | o_1..o_t)``; and ``[B]`` float64
        ``log p(o_1..o_K)`` in nats, the sum of the logs of the per-step normalizers.
    """
    B, K = observations.shape
    S = transition.shape[-1]
    # likelihood[t, b, s] = E[b, s, o_t]; time-major so each step reads a contiguous slice
    likelihood = emission.gather(2, observations[:, None, :].expand(B, S, K)).permute(2, 0, 1).contiguous()
    # The recursion runs on the unnormalized joint p(s_t, o_1..o_t) (scale does not change
    # relative float64 error) and is rescaled every few steps so it cannot underflow: each
    # step shrinks it by p(o_t | o_<t) >= (1 / levels)^2 for data the HMM generated.
    joint = torch.empty(K, B, S, dtype=torch.float64, device=observations.device)
    log_scale = torch.zeros(B, dtype=torch.float64, device=observations.device)  # log of the factors divided out so far
    predicted = initial.expand(B, S)
    for t in range(K):
        torch.mul(predicted, likelihood[t], out=joint[t])
        if t % _RESCALE_EVERY == _RESCALE_EVERY - 1:
            scale = joint[t].sum(-1, keepdim=True)  # [B, 1]
            joint[t] /= scale
            log_scale += scale.squeeze(1).log()
        predicted = torch.bmm(joint[t, :, None, :], transition).squeeze(1)
    evidence = joint.sum(-1, keepdim=True)  # [K, B, 1]
    log_likelihood = log_scale + evidence[-1, :, 0].log()  # nats
    return (joint / evidence).transpose(0, 1), log_likelihood
