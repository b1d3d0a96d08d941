"""Wind tunnels: tasks whose exact Bayesian posterior is known at every position.

    >>> import torch
    >>> from windtunnel.tunnels import make_tunnel
    >>> tunnel = make_tunnel("hmm", {"K": 30})
    >>> episode = tunnel.sample(4, generator=torch.Generator().manual_seed(0))
    >>> episode.tokens.shape, episode.posterior.shape
    (torch.Size([4, 80]), torch.Size([4, 30, 5]))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from windtunnel.config import ConfigError, apply_overrides, from_mapping
from windtunnel.tunnels.base import Episode, Tunnel
from windtunnel.tunnels.bijection import BijectionEpisode, BijectionTunnel
from windtunnel.tunnels.hmm import HMMEpisode, HMMTunnel, decode_header, forward_filter

__all__ = [
    "TUNNELS",
    "BijectionEpisode",
    "BijectionTunnel",
    "Episode",
    "HMMEpisode",
    "HMMTunnel",
    "Tunnel",
    "decode_header",
    "forward_filter",
    "make_tunnel",
    "tunnel_class",
]

#: Registry of the built-in tunnels by name.
TUNNELS: dict[str, type] = {cls.name: cls for cls in (BijectionTunnel, HMMTunnel)}


def tunnel_class(name: str) -> type:
    """The tunnel class registered as ``name``; an unknown name lists the valid ones."""
    try:
        return TUNNELS[name]
    except KeyError:
        raise ConfigError(f"unknown tunnel {name!r}; choose one of: {', '.join(sorted(TUNNELS))}") from None


def make_tunnel(name: str, params: Mapping[str, Any] | None = None, overrides: Sequence[str] = ()) -> Tunnel:
    """Build a tunnel from its name, a parameter mapping, and ``key=value`` overrides (strings).

    Raises:
        ConfigError: unknown name or key, wrong type, or a value out of range.
    """
    cls = tunnel_class(name)
    return from_mapping(cls, apply_overrides(cls, params or {}, overrides))
