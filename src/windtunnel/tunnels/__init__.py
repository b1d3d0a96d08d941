"""Wind tunnels: tasks whose exact Bayesian posterior is known at every position.

    >>> import torch
    >>> from windtunnel.tunnels import make_tunnel
    >>> tunnel = make_tunnel("hmm", {"K": 30})
    >>> episode = tunnel.sample(4, generator=torch.Generator().manual_seed(0))
    >>> episode.tokens.shape, episode.posterior.shape
    (torch.Size([4, 80]), torch.Size([4, 30, 5]))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from windtunnel.config import ConfigError, apply_overrides, from_mapping
from windtunnel.tunnels.assoc_recall import AssocRecallEpisode, AssocRecallTunnel
from windtunnel.tunnels.base import Episode, Tunnel
from windtunnel.tunnels.bijection import BijectionEpisode, BijectionTunnel
from windtunnel.tunnels.capabilities import lacks
from windtunnel.tunnels.hmm import HMMEpisode, HMMTunnel, decode_header, forward_filter
from windtunnel.tunnels.kalman import KalmanEpisode, KalmanTunnel
from windtunnel.tunnels.markov import DirichletTunnel, MarkovEpisode, MarkovTunnel
from windtunnel.tunnels.model_selection import ModelSelectionEpisode, ModelSelectionTunnel

__all__ = [
    "TUNNELS",
    "AssocRecallEpisode",
    "AssocRecallTunnel",
    "BijectionEpisode",
    "BijectionTunnel",
    "DirichletTunnel",
    "Episode",
    "HMMEpisode",
    "HMMTunnel",
    "KalmanEpisode",
    "KalmanTunnel",
    "MarkovEpisode",
    "MarkovTunnel",
    "ModelSelectionEpisode",
    "ModelSelectionTunnel",
    "Tunnel",
    "decode_header",
    "forward_filter",
    "lacks",
    "make_tunnel",
    "register_tunnel",
    "tunnel_class",
    "unregister_tunnel",
]

#: Every tunnel by name: the built-in ones, and any added with :func:`register_tunnel`.
TUNNELS: dict[str, type] = {}


def register_tunnel(cls: type) -> type:
    """Make the tunnel class ``cls`` available by its ``name`` (to configs, ``windtunnel sample``,
    training, evaluation and the analyses); returns ``cls``, so it also serves as a class decorator.

    A tunnel is a frozen dataclass of its parameters that keeps the
    :class:`~windtunnel.tunnels.base.Tunnel` contract; what else it knows about its task it
    declares through the optional capabilities of :mod:`windtunnel.tunnels.capabilities`.

    Raises:
        ValueError: ``cls`` is not a dataclass keeping the contract, or its name is taken.
    """
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise ValueError(f"{cls.__name__} has no name: give it a class attribute name: ClassVar[str]")
    if not dataclasses.is_dataclass(cls):
        raise ValueError(f"{cls.__name__} is not a dataclass: a tunnel's parameters are its dataclass fields")
    missing = [m for m in ("vocab_size", "num_classes", "horizon", "check_horizon", "seq_len", "prior_predictive",
                           "sample_bytes", "sample", "describe", "label") if not hasattr(cls, m)]
    if missing:
        raise ValueError(f"{cls.__name__} does not keep the Tunnel contract: it lacks {', '.join(missing)}")
    if name in TUNNELS:
        raise ValueError(f"a tunnel named {name!r} is registered already ({TUNNELS[name].__name__})")
    TUNNELS[name] = cls
    return cls


def unregister_tunnel(name: str) -> None:
    """Remove the tunnel registered as ``name`` (a test's clean-up; the built-in ones stay put)."""
    if TUNNELS.get(name) in BUILT_IN:
        raise ValueError(f"the built-in {name!r} tunnel cannot be unregistered")
    TUNNELS.pop(name, None)


#: The tunnels this package ships.
BUILT_IN = (BijectionTunnel, HMMTunnel, AssocRecallTunnel, DirichletTunnel, MarkovTunnel, KalmanTunnel, ModelSelectionTunnel)
for _cls in BUILT_IN:
    register_tunnel(_cls)


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
