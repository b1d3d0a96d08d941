"""Learning-rate schedules as pure functions of the step (so resuming needs no scheduler state)."""

from __future__ import annotations

import math

__all__ = ["learning_rate"]


def learning_rate(step: int, *, lr: float, schedule: str, warmup_steps: int, total_steps: int, min_lr: float = 0.0) -> float:
    """The learning rate for optimizer step ``step`` (0-based).

    ``constant``: ``lr`` after a linear warm-up over ``warmup_steps``.
    ``cosine``: linear warm-up to ``lr``, then half a cosine from ``lr`` down to ``min_lr``
    at the last step.
    """
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if schedule == "constant":
        return lr
    if schedule == "cosine":
        decay_steps = max(1, total_steps - warmup_steps - 1)
        progress = min(1.0, (step - warmup_steps) / decay_steps)
        return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown schedule {schedule!r}")
