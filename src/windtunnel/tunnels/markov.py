"""Laplace tunnels: in-context estimation of a Markov chain's transition rows (``markov``), and
its order-0 case, an i.i.d. Dirichlet–categorical sequence (``dirichlet``).

``markov``: each sequence draws a fresh order-``k`` Markov chain over ``V`` symbols, its
``V^k`` transition rows independently from the symmetric Dirichlet(``beta``); the first ``k``
symbols are uniform, each later one is drawn from the row of the ``k`` symbols before it
(its context). ``dirichlet``: each sequence draws symbol probabilities from the symmetric
Dirichlet(``alpha``) and ``L`` symbols i.i.d. from them (``k = 0``: one context). Token
layout (``T = L``)::

    BOS x_1 ... x_{L-1}

Symbol ``v`` is token ``v`` and ``BOS`` is token ``V``. At position ``t`` the model has read
``x_1..x_t`` and predicts ``x_{t+1}``. The exact posterior predictive (the rows integrated
out under their Dirichlet prior, Laplace's rule of succession for ``beta = 1``) is::

    p(x_{t+1} = v | x_1..x_t) = (n_{s,v} + beta) / (n_s + V beta)

with ``s`` the context of ``x_{t+1}`` and ``n_{s,v}`` the transitions from ``s`` to ``v``
among ``x_1..x_t`` (``n_s`` their sum); uniform where ``x_{t+1}`` is one of the first ``k``.
Bondaschi et al. ("From Markov to Laplace", arXiv 2502.10178) train on this task with
``beta = 1`` and score the loss gap to this predictor; here the full predictive is scored in
bits. The hypothesis space is continuous: nothing to memorize.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from windtunnel.config import ConfigError, check_field_types
from windtunnel.metrics import entropy_bits
from windtunnel.tunnels.base import Episode, label_with, one_hot
from windtunnel.tunnels.random import dirichlet

__all__ = ["DirichletTunnel", "MarkovEpisode", "MarkovTunnel", "laplace_posterior"]

#: The most contexts (``V^k``) a chain may have: each sequence draws a row per context.
MAX_CONTEXTS = 4096


@dataclass(frozen=True)
class MarkovEpisode(Episode):
    """An :class:`Episode` plus the hidden transition rows and the symbols drawn.

    Attributes:
        rows: ``[B, V^k, V]`` float64 transition rows (``dirichlet``: ``[B, 1, V]``), row
            ``s`` the next symbol's distribution after context ``s`` (base-``V`` digits, oldest first).
        symbols: ``[B, L]`` int64 ``x_1..x_L`` (the targets; the tokens are ``BOS`` and ``x_1..x_{L-1}``).
    """

    rows: Tensor
    symbols: Tensor

    def record(self, i: int) -> dict[str, Any]:
        record = super().record(i)
        record["rows"] = self.rows[i].tolist()
        record["symbols"] = self.symbols[i].tolist()
        return record


def context_ids(symbols: Tensor, V: int, k: int) -> Tensor:
    """``[B, L]`` int64: the context (base-``V`` number of the ``k`` symbols before it, oldest
    first) of each symbol; 0 for the first ``k`` (they have none) and everywhere when ``k = 0``."""
    contexts = torch.zeros_like(symbols)
    for lag in range(1, k + 1):  # x_{i-lag} is digit k - lag (weight V^(lag-1))
        contexts[:, k:] += symbols[:, k - lag:symbols.shape[1] - lag] * V ** (lag - 1)
    return contexts


def laplace_posterior(symbols: Tensor, contexts: Tensor, V: int, k: int, concentration: float) -> Tensor:
    """``[B, L, V]`` float64: the exact predictive of each symbol given those before it,
    ``(n_{s,v} + c) / (n_s + V c)`` over the transitions seen from its context ``s``; uniform
    for the first ``k``. One comparison of every pair of positions (``[B, L, L]``): the
    counts of each context over the positions before, for any number of contexts."""
    B, L = symbols.shape
    device = symbols.device
    index = torch.arange(L, device=device)
    earlier = (index[None, :] < index[:, None]) & (index[None, :] >= k)  # [L, L]: j < i, and j has a context
    same = (contexts[:, :, None] == contexts[:, None, :]) & earlier  # [B, L, L]
    counts = same.to(torch.float64) @ one_hot(symbols, V)  # [B, L, V]
    posterior = (counts + concentration) / (counts.sum(-1, keepdim=True) + V * concentration)
    posterior[:, :k] = 1.0 / V
    return posterior


def _chain(batch_size: int, V: int, k: int, L: int, concentration: float, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Fresh transition rows ``[B, V^k, V]`` and ``L`` symbols ``[B, L]`` drawn from them."""
    device = generator.device
    rows = dirichlet((batch_size, V**k), V, concentration, generator=generator)  # [B, V^k, V]
    uniform = torch.rand(batch_size, L, generator=generator, dtype=torch.float64, device=device)  # [B, L]
    symbols = torch.zeros(batch_size, L, dtype=torch.long, device=device)
    context = torch.zeros(batch_size, dtype=torch.long, device=device)
    cumulative = rows.cumsum(-1)
    batch = torch.arange(batch_size, device=device)
    for i in range(L):  # one step per position, every sequence at once
        if i < k:
            drawn = (uniform[:, i] * V).long().clamp_max(V - 1)
        else:
            drawn = (cumulative[batch, context] < uniform[:, i, None]).sum(-1).clamp_max(V - 1)  # inverse CDF
        symbols[:, i] = drawn
        context = (context * V + drawn) % V**k if k else context
    return rows, symbols


def _episode(symbols: Tensor, rows: Tensor, V: int, k: int, concentration: float) -> MarkovEpisode:
    B, L = symbols.shape
    posterior = laplace_posterior(symbols, context_ids(symbols, V, k), V, k, concentration)
    bos = torch.full((B, 1), V, dtype=torch.long, device=symbols.device)
    return MarkovEpisode(
        tokens=torch.cat([bos, symbols[:, :-1]], 1),
        positions=torch.arange(L, device=symbols.device),
        targets=symbols,
        posterior=posterior,
        entropy_bits=entropy_bits(posterior),
        rows=rows,
        symbols=symbols,
    )


class _Laplace:
    """What the two Laplace tunnels share: the layout, the prior, the draw (``_order`` and
    ``_concentration`` are the subclass's ``k`` and ``beta`` or ``alpha``)."""

    V: int
    L: int
    _order: int  # defined by each subclass: k, or 0
    _concentration: float  # defined by each subclass: beta, or alpha

    def _check(self, concentration_name: str) -> None:
        check_field_types(self)
        if self.V < 2:
            raise ConfigError(f"V={self.V} is out of range: need V >= 2")
        if not self._concentration > 0:  # also refuses NaN
            raise ConfigError(f"{concentration_name}={self._concentration} is out of range: need {concentration_name} > 0")
        self.check_horizon(self.L, name="L")

    def check_horizon(self, horizon: int, *, name: str = "horizon") -> None:
        """Raise :class:`ConfigError` unless ``horizon`` symbols can be predicted."""
        if horizon < 1:
            raise ConfigError(f"{name}={horizon} is out of range: need at least 1 symbol")

    @property
    def vocab_size(self) -> int:
        return self.V + 1

    @property
    def num_classes(self) -> int:
        return self.V

    @property
    def horizon(self) -> int:
        return self.L

    def seq_len(self, horizon: int | None = None) -> int:
        return self.L if horizon is None else horizon

    def prior_predictive(self, n_positions: int) -> Tensor:
        """``[n_positions, V]`` float64: uniform, since the prior of every row is symmetric."""
        return torch.full((n_positions, self.V), 1.0 / self.V, dtype=torch.float64)

    def sample_bytes(self, batch_size: int, horizon: int | None = None) -> int:
        """The int64 tokens, targets and symbols, the float64 posteriors ``[B, L, V]``, their
        entropies and the rows ``[B, V^k, V]``."""
        L = self.seq_len(horizon)
        return batch_size * 8 * (L * (self.V + 4) + self.V**self._order * self.V)

    def sample(self, batch_size: int, *, generator: torch.Generator, horizon: int | None = None) -> MarkovEpisode:
        """Draw ``batch_size`` fresh chains and ``horizon`` symbols from each."""
        L = self.seq_len(horizon)
        self.check_horizon(L)
        rows, symbols = _chain(batch_size, self.V, self._order, L, self._concentration, generator)
        return _episode(symbols, rows, self.V, self._order, self._concentration)

    # --- optional capabilities (windtunnel.tunnels.capabilities) ---------------------

    why_not: ClassVar[dict[str, str]] = {
        "HypothesisTokens": "no token names a hypothesis: the rows are never shown, only symbols drawn from them",
        "Relabeling": "its hidden variables are probabilities, not states with labels",
        "ValuePositions": "no position shows an answer apart from the next symbol itself",
    }

    def symbol_tokens(self) -> tuple[list[int], list[str]]:
        """The symbol tokens ``0..V-1``."""
        return list(range(self.V)), [f"x={v}" for v in range(self.V)]

    def parameter_predictive(self, episode: MarkovEpisode) -> Tensor:
        """``[B, L, V]`` the true row of each symbol's context (uniform for the first ``k``)."""
        k = self._order
        contexts = context_ids(episode.symbols, self.V, k)  # [B, L]
        rows = episode.rows.gather(1, contexts[..., None].expand(-1, -1, self.V))  # [B, L, V]
        rows[:, :k] = 1.0 / self.V
        return rows


@dataclass(frozen=True)
class MarkovTunnel(_Laplace):
    """An order-``k`` Markov chain with Dirichlet(``beta``) rows, drawn afresh per sequence.

    Args:
        V: symbols (``V >= 2``).
        k: the order: how many earlier symbols a transition depends on (``k >= 1``; ``V^k``
            rows, at most 4096).
        beta: the rows' symmetric Dirichlet concentration (``beta > 0``; 1: Laplace's rule).
        L: symbols predicted per sequence (the horizon).
    """

    name: ClassVar[str] = "markov"
    primitive: ClassVar[str] = "Laplace accumulation"

    V: int = 3
    k: int = 1
    beta: float = 1.0
    L: int = 64

    why_not: ClassVar[dict[str, str]] = {
        **_Laplace.why_not,
        "PositionWiseFloor": "the current symbol's own row may have been seen (x_{t-1} = x_t), so its predictive "
                             "from one token depends on the whole history: no closed form",
    }

    def __post_init__(self) -> None:
        self._check("beta")
        if self.k < 1:
            raise ConfigError(f"k={self.k} is out of range: need k >= 1 (the order-0 chain is the dirichlet tunnel)")
        if self.V**self.k > MAX_CONTEXTS:
            raise ConfigError(f"V^k = {self.V}^{self.k} contexts is out of range: need at most {MAX_CONTEXTS}")

    @property
    def _order(self) -> int:
        return self.k

    @property
    def _concentration(self) -> float:
        return self.beta

    def describe(self) -> str:
        return f"order {self.k}, beta {self.beta:g}"

    def label(self) -> str:
        return label_with(self, ("V", "k", "L"))


@dataclass(frozen=True)
class DirichletTunnel(_Laplace):
    """I.i.d. symbols from probabilities drawn afresh per sequence from Dirichlet(``alpha``).

    Args:
        V: symbols (``V >= 2``).
        alpha: the symmetric Dirichlet concentration (``alpha > 0``; 1: Laplace's rule).
        L: symbols predicted per sequence (the horizon).
    """

    name: ClassVar[str] = "dirichlet"
    primitive: ClassVar[str] = "Laplace accumulation"

    V: int = 5
    alpha: float = 1.0
    L: int = 32

    def __post_init__(self) -> None:
        self._check("alpha")

    @property
    def _order(self) -> int:
        return 0

    @property
    def _concentration(self) -> float:
        return self.alpha

    def describe(self) -> str:
        return f"alpha {self.alpha:g}"

    def position_wise_predictive(self, episode: MarkovEpisode) -> Tensor:
        """``[B, L, V]``: the predictive given only the symbol at each position, Laplace's rule
        after one draw, ``(1{v = x_t} + alpha) / (1 + V alpha)``; uniform at ``BOS``."""
        counts = one_hot(episode.tokens.clamp_max(self.V - 1), self.V)  # [B, L, V]; BOS's row is reset below
        floor = (counts + self.alpha) / (1.0 + self.V * self.alpha)
        floor[:, 0] = 1.0 / self.V
        return floor

    def label(self) -> str:
        return label_with(self, ("V", "L"))
