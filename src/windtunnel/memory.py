"""Refuse, before allocating, what cannot fit in this machine's memory.

A size or count too large for memory (``sample --n``, V, K, a batch, eval n) used to be
found only when the allocation failed, minutes in and with a traceback. Each large draw is
estimated first from its shapes (a lower bound: the tensors it must return) and
compared with the memory the system says is available now; what cannot fit is refused with
the estimate and what to lower.
"""

from __future__ import annotations

import psutil

from windtunnel.config import ConfigError

__all__ = ["available_bytes", "check_fits", "format_bytes"]


def available_bytes() -> int | None:
    """Memory available to a new allocation now (psutil's ``available``: Linux ``MemAvailable``), or None if unknown."""
    try:
        return int(psutil.virtual_memory().available)
    except (OSError, RuntimeError, AttributeError):  # an unsupported platform: refuse nothing
        return None


def format_bytes(n: float) -> str:
    if n < 1024:
        return f"{n:.0f} B"
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        n /= 1024
        if n < 1024:
            break
    return f"{n:.1f} {unit}"


def check_fits(what: str, needed: int, advice: str, *, available: int | None = None) -> None:
    """Raise ConfigError if ``needed`` bytes (a lower bound for ``what``) exceed the memory available.

    ``available`` defaults to :func:`available_bytes`; when that is unknown nothing is refused.
    """
    available = available_bytes() if available is None else available
    if available is not None and needed > available:
        raise ConfigError(
            f"{what} needs at least {format_bytes(needed)} of memory but {format_bytes(available)} is available: {advice}"
        )
