"""Wind tunnel 2: HMM state tracking by filtering (docs/protocol.md §3).

Each sequence draws a fresh HMM with ``S`` hidden states and ``M`` symbols: every row
of the transition matrix ``T`` (``[S, S]``) and of the emission matrix ``E`` (``[S, M]``)
is drawn from a symmetric Dirichlet(``concentration``; ``T``'s rows from
``transition_concentration`` where that is set) and then quantized to the grid
(``grid = 1/N``; integer counts per row summing to exactly ``N``, largest remainder).
With ``floor > 0`` every entry is first raised to at least ``floor`` (``max(p, floor)``,
row renormalized) and rounded as the authors' generator rounds, to at least
``m = ceil(floor * N)`` grid steps (:func:`round_rows_with_floor`), so every header
probability is ``>= floor``; the authors' generator is ``floor=0.05, grid=0.01``.
The quantized HMM *is* the hypothesis: states and observations are generated from it
and the posterior is computed from it, so the model is scored against the HMM it reads.

Token layout (``T_seq = S*S + S*M + K``)::

    [ T row-major: S*S tokens | E row-major: S*M tokens | o_1 ... o_K ]

A header entry with count ``n`` (probability ``n / N``) is token ``n`` in ``0..N``; symbol
``o`` is token ``N + 1 + o``; the vocabulary has ``N + 1 + M`` ids. The model is scored at
each observation token ``o_t`` on the filtering posterior ``p(s_t | o_1..o_t)`` over the
``S`` states, computed by the forward algorithm in float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from windtunnel.config import ConfigError, check_field_types
from windtunnel.metrics import entropy_bits
from windtunnel.tunnels.base import Episode, label_with
from windtunnel.tunnels.filtering import forward_filter
from windtunnel.tunnels.quantize import quantize_rows, round_rows_with_floor
from windtunnel.tunnels.random import dirichlet

__all__ = [
    "MAX_OBSERVATIONS", "HMMEpisode", "HMMTunnel", "decode_header", "forward_filter", "quantize_rows", "round_rows_with_floor",
]

#: The longest sequence sampled: far beyond any horizon of the paper (K <= 50) or a model's context here.
MAX_OBSERVATIONS = 100_000


@dataclass(frozen=True)
class HMMEpisode(Episode):
    """An :class:`Episode` plus the hidden HMM and its sampled path.

    Attributes:
        transition: ``[B, S, S]`` float64 quantized ``T`` (``T[i, j] = p(s' = j | s = i)``).
        emission: ``[B, S, M]`` float64 quantized ``E`` (``E[i, o] = p(o | s = i)``).
        initial: ``[B, S]`` float64 distribution of ``s_1``.
        states: ``[B, K]`` int64 hidden states ``s_1..s_K`` (also the hard ``targets``).
        observations: ``[B, K]`` int64 symbols ``o_1..o_K``.
        log_likelihood: ``[B]`` float64 ``log p(o_1..o_K)`` in nats, from the filter's normalizers.
    """

    transition: Tensor
    emission: Tensor
    initial: Tensor
    states: Tensor
    observations: Tensor
    log_likelihood: Tensor

    def record(self, i: int) -> dict[str, Any]:
        record = super().record(i)
        S, M = self.emission.shape[1:]
        transition, emission = decode_header(self.tokens[i : i + 1], S, M)  # what the model reads
        record["T"] = transition[0].tolist()
        record["E"] = emission[0].tolist()
        record["initial"] = self.initial[i].tolist()
        record["states"] = self.states[i].tolist()
        record["observations"] = self.observations[i].tolist()
        return record


@dataclass(frozen=True)
class HMMTunnel:
    """HMM filtering.

    Args:
        S: number of hidden states (the output classes).
        M: number of observation symbols.
        K: number of observations per sequence (the training horizon).
        concentration: symmetric Dirichlet concentration of every row of ``T`` and ``E``.
        transition_concentration: the concentration of ``T``'s rows alone; None (default)
            is ``concentration``. A low value makes each state's successor nearly certain,
            so the previous observations say much about the current state (a curriculum
            can anneal it into ``concentration``).
        stickiness: ``rho`` in ``[0, 1)``: each row of ``T`` is ``(1 - rho) * Dirichlet + rho *
            e_i`` before quantization, so a state stays put with probability at least ``rho``
            and the evidence of earlier observations adds up; 0.0 (default) leaves the rows as
            drawn, bit for bit.
        grid: quantization step of header probabilities; ``1 / grid`` must be an integer.
        floor: minimum probability of every entry of ``T`` and ``E``, in
            ``[0, 1 / max(S, M))``; 0.0 (default) leaves the Dirichlet rows as drawn. Each
            row becomes ``max(p, floor)`` renormalized, rounded like the authors' generator
            to at least :attr:`floor_steps` grid steps per entry (:func:`round_rows_with_floor`). It keeps near-zero transitions and
            emissions out of the task, so no single observation rules a state out; the
            authors' generator is ``floor=0.05, grid=0.01``.
        initial: distribution of the first state, ``S`` non-negative numbers summing
            to 1; None (default) is uniform. It is a fixed, known part of the task and
            is not written into the header.
    """

    name: ClassVar[str] = "hmm"
    primitive: ClassVar[str] = "belief transport"

    S: int = 5
    M: int = 5
    K: int = 20
    concentration: float = 1.0
    transition_concentration: float | None = None
    stickiness: float = 0.0
    grid: float = 0.01
    floor: float = 0.0
    initial: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        check_field_types(self)
        if self.S < 1:
            raise ConfigError(f"S={self.S} is out of range: need at least 1 hidden state")
        if self.M < 1:
            raise ConfigError(f"M={self.M} is out of range: need at least 1 observation symbol")
        self.check_horizon(self.K, name="K")
        if not (math.isfinite(self.concentration) and self.concentration > 0):
            raise ConfigError(f"concentration={self.concentration} is out of range: need a finite value > 0")
        if not (math.isfinite(self.stickiness) and 0 <= self.stickiness < 1):
            raise ConfigError(f"stickiness={self.stickiness} is out of range: need a finite value in [0, 1)")
        alpha = self.transition_concentration
        if alpha is not None and not (math.isfinite(alpha) and alpha > 0):
            raise ConfigError(f"transition_concentration={alpha} is out of range: need a finite value > 0 (or unset)")
        levels = 1.0 / self.grid if 0 < self.grid <= 1 else 0.0
        width = max(self.S, self.M)
        if not (levels >= width and abs(levels - round(levels)) < 1e-9 * levels):
            raise ConfigError(
                f"grid={self.grid} is too coarse or not a divisor of 1: need 1/grid an integer >= max(S, M) = {width} "
                "so every row can sum to exactly 1 on the grid (e.g. grid=0.01)"
            )
        # Written so that NaN fails it: every comparison with NaN is False.
        if not (math.isfinite(self.floor) and 0 <= self.floor < 1 / width):
            raise ConfigError(
                f"floor={self.floor} is out of range: need a finite value in [0, 1/max(S, M)) = [0, {1 / width:.6g}) "
                "(e.g. floor=0.05)"
            )
        if width * self.floor_steps > self.levels:
            raise ConfigError(
                f"floor={self.floor} is infeasible on grid={self.grid}: rows of {width} entries of at least "
                f"{self.floor_steps} steps need {width} x {self.floor_steps} = {width * self.floor_steps} grid steps "
                f"per row but the grid has {self.levels}"
            )
        if self.initial is not None:
            p = self.initial
            if len(p) != self.S or min(p) < 0 or abs(sum(p) - 1.0) > 1e-9:
                raise ConfigError(
                    f"initial={list(p)} is not a distribution over S={self.S} states: need {self.S} non-negative "
                    "numbers summing to 1 (or leave it unset for uniform)"
                )

    def describe(self) -> str:
        words = [f"floor {self.floor:g}" if self.floor else "no floor", f"grid {self.grid:g}"]
        # the rarer departures are named only where present, so the usual variants read short
        if self.concentration != 1.0:
            words.append(f"concentration {self.concentration:g}")
        if self.transition_concentration is not None:
            words.append(f"T concentration {self.transition_concentration:g}")
        if self.stickiness:
            words.append(f"stickiness {self.stickiness:g}")
        return ", ".join(words)

    def label(self) -> str:
        return label_with(self, ("S", "M", "K"))

    def check_horizon(self, horizon: int, *, name: str = "horizon") -> None:
        """Raise :class:`ConfigError` unless ``horizon`` is a valid number of observations."""
        if horizon < 1:
            raise ConfigError(f"{name}={horizon} is out of range: need at least 1 observation")
        if horizon > MAX_OBSERVATIONS:
            raise ConfigError(
                f"{name}={horizon} is out of range: at most {MAX_OBSERVATIONS:,} observations (the chain and the "
                "forward filter step through positions one at a time, so longer sequences take minutes each)"
            )

    def sample_bytes(self, batch_size: int, horizon: int | None = None) -> int:
        """What the episode returned keeps: T and E as header tokens and as float64, and per
        observation the token, target, state, observation, entropy and the float64 posterior
        over S states (the forward filter's working tensors come on top)."""
        n_obs = self.K if horizon is None else horizon
        S, M = self.S, self.M
        return batch_size * 8 * (2 * (S * S + S * M) + n_obs * (S + 5) + S + 1)

    # --- layout -----------------------------------------------------------------

    @property
    def transition_alpha(self) -> float:
        """The Dirichlet concentration ``T``'s rows are drawn with."""
        return self.concentration if self.transition_concentration is None else self.transition_concentration

    @property
    def levels(self) -> int:
        """``N = 1 / grid``: header probabilities are ``n / N`` for integer ``n`` in ``0..N``."""
        return round(1.0 / self.grid)

    @property
    def floor_steps(self) -> int:
        """``m``: the fewest grid steps any header entry has, the smallest ``m`` with ``m / N >= floor``.

        ``floor * N`` is read to 1e-9 relative precision, so that ``0.07 * 100 =
        7.000000000000001`` in float64 counts as 7 steps, not 8.
        """
        return math.ceil(self.floor * self.levels * (1 - 1e-9))

    @property
    def header_len(self) -> int:
        return self.S * self.S + self.S * self.M

    @property
    def vocab_size(self) -> int:
        return self.levels + 1 + self.M

    @property
    def num_classes(self) -> int:
        return self.S

    @property
    def horizon(self) -> int:
        return self.K

    def seq_len(self, horizon: int | None = None) -> int:
        return self.header_len + (self.K if horizon is None else horizon)

    def initial_distribution(self, device: torch.device | str = "cpu") -> Tensor:
        """``[S]`` float64 distribution of the first hidden state, on ``device``."""
        if self.initial is None:
            return torch.full((self.S,), 1.0 / self.S, dtype=torch.float64, device=device)
        return torch.tensor(self.initial, dtype=torch.float64, device=device)

    def prior_predictive(self, n_positions: int) -> Tensor:
        """``[n_positions, S]`` float64: p(s_t) for a predictor that reads nothing.

        ``s_1`` follows ``initial``. Every later state is uniform: the Dirichlet prior on each
        row of ``T`` is symmetric, and the floor and the quantization treat every entry of a
        row alike, so the entries stay exchangeable: ``E[T[i, j]] = 1/S`` and
        ``p(s_2 = j) = 1/S`` exactly (quantization breaks ties by index, but only between
        entries that tie with probability 0, or floored entries that get no extra step);
        for ``t > 2`` this is exact when ``initial`` is uniform (the default) and a close
        approximation otherwise.
        """
        prior = torch.full((n_positions, self.S), 1.0 / self.S, dtype=torch.float64)
        prior[0] = self.initial_distribution()
        return prior

    def encode_header(self, transition_counts: Tensor, emission_counts: Tensor) -> Tensor:
        """``[B, S, S]`` and ``[B, S, M]`` integer counts -> ``[B, header_len]`` tokens."""
        return torch.cat([transition_counts.flatten(1), emission_counts.flatten(1)], dim=1)

    def decode_header(self, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """:func:`decode_header` for this tunnel's ``S``, ``M`` and grid."""
        transition, emission = decode_header(tokens, self.S, self.M)
        if tokens[:, : self.S].sum(-1).ne(self.levels).any():
            raise ValueError(f"not a header of this tunnel: rows must sum to 1/grid = {self.levels} steps")
        return transition, emission

    # --- sampling ---------------------------------------------------------------

    def sample(self, batch_size: int, *, generator: torch.Generator, horizon: int | None = None) -> HMMEpisode:
        """Draw ``batch_size`` HMMs and one sequence of ``horizon`` (default ``K``) observations from each."""
        n_obs = self.K if horizon is None else horizon
        self.check_horizon(n_obs)
        B, S, M, N = batch_size, self.S, self.M, self.levels
        transition_rows = dirichlet((B, S), S, self.transition_alpha, generator=generator)
        if self.stickiness:
            transition_rows = (1 - self.stickiness) * transition_rows + self.stickiness * torch.eye(S, dtype=transition_rows.dtype, device=generator.device)
        transition_counts = self._quantized_rows(transition_rows)
        emission_counts = self._quantized_rows(dirichlet((B, S), M, self.concentration, generator=generator))
        initial = self.initial_distribution(generator.device).expand(B, S)
        states, observations = _sample_path(transition_counts, emission_counts, initial, n_obs, N, generator)
        return self._episode(transition_counts, emission_counts, initial, states, observations)

    def _quantized_rows(self, probs: Tensor) -> Tensor:
        """Drawn Dirichlet rows -> grid counts, raised to the floor first when there is one."""
        if self.floor == 0:  # exactly the arithmetic of the floorless tunnel: earlier runs' batches depend on it
            return quantize_rows(probs, self.levels)
        floored = probs.clamp_min(self.floor)
        return round_rows_with_floor(floored / floored.sum(-1, keepdim=True), self.levels, self.floor_steps)

    # --- optional capabilities (windtunnel.tunnels.capabilities) ---------------------

    #: Query-key sharpening's kinds of key (the categories partition the keys a query sees).
    category_meanings: ClassVar[dict[str, str]] = {
        "header_transition": "the S*S header tokens of T",
        "header_emission": "the S*M header tokens of E",
        "observations": "the earlier observation tokens o_1..o_{t-1}",
        "self": "the query position itself (o_t)",
    }

    #: Why capabilities it lacks do not fit the task (windtunnel.tunnels.capabilities.lacks).
    why_not: ClassVar[dict[str, str]] = {
        "HypothesisTokens": "it shows no hypothesis tokens: its hidden states are never shown (the header holds counts "
        "of T and E, the sequence the observation symbols)",
        "ValuePositions": "it shows no value tokens: the position after an observation holds the next observation",
    }

    def symbol_tokens(self) -> tuple[list[int], list[str]]:
        """The observation symbols ``o = 0..M-1`` (tokens ``N + 1 + o``; header tokens are grid counts)."""
        first = self.levels + 1
        return list(range(first, first + self.M)), [f"o={o}" for o in range(self.M)]

    def next_symbol_predictive(self, episode: HMMEpisode, posterior: Tensor | None = None) -> Tensor:
        """``p(o_{t+1} | ...) = sum_s sum_s' q_t(s) T[s, s'] E[s', o]``: the filtering
        posterior ``q_t`` (default: the exact one) carried one step by the episode's own ``T``
        and ``E`` (those the header encodes), at every observation including the last."""
        q = episode.posterior if posterior is None else posterior.to(torch.float64)
        return torch.einsum("bps,bsr,brm->bpm", q, episode.transition, episode.emission)

    def attention_categories(self, episode: Episode) -> dict[str, Tensor]:
        """See :class:`~windtunnel.tunnels.capabilities.AttentionCategories` and :attr:`category_meanings`."""
        B, T = episode.tokens.shape
        queries = episode.positions  # [P]
        t = torch.arange(T)
        earlier = (t[None, :] < queries[:, None])[None]  # [1, P, T]
        n_transition = self.S * self.S
        by_position = {
            "header_transition": t < n_transition,
            "header_emission": (t >= n_transition) & (t < self.header_len),
            "observations": t >= self.header_len,
        }
        categories = {name: (mask[None, None, :] & earlier).expand(B, -1, -1) for name, mask in by_position.items()}
        return {**categories, "self": (t[None, :] == queries[:, None])[None].expand(B, -1, -1)}

    @property
    def n_labels(self) -> int:
        """A relabeling permutes the ``S`` hidden states."""
        return self.S

    def relabel(self, episode: HMMEpisode, permutation: Tensor) -> HMMEpisode:
        """The same sequences under the state relabeling ``permutation`` (``[S]`` or ``[B, S]``).

        New state ``i`` is old state ``sigma[i]``: ``T'[i, j] = T[sigma[i], sigma[j]]``,
        ``E'[i] = E[sigma[i]]``, ``pi'[i] = pi[sigma[i]]``. The observations are unchanged
        (the permuted HMM assigns them the same probability); the header is re-encoded and
        the posterior recomputed from the permuted HMM by the forward filter.
        """
        B, S = episode.batch_size, self.S
        sigma = permutation.expand(B, S)
        transition_counts = episode.tokens[:, : S * S].reshape(B, S, S)
        emission_counts = episode.tokens[:, S * S : self.header_len].reshape(B, S, self.M)
        rows = sigma[:, :, None]
        transition_counts = transition_counts.gather(1, rows.expand(B, S, S)).gather(2, sigma[:, None, :].expand(B, S, S))
        emission_counts = emission_counts.gather(1, rows.expand(B, S, self.M))
        initial = episode.initial.gather(1, sigma)
        inverse = sigma.argsort(dim=1)  # inverse[b, old] = new
        states = inverse.gather(1, episode.states)
        return self._episode(transition_counts, emission_counts, initial, states, episode.observations)

    def _episode(
        self, transition_counts: Tensor, emission_counts: Tensor, initial: Tensor, states: Tensor, observations: Tensor
    ) -> HMMEpisode:
        N = self.levels
        header = self.encode_header(transition_counts, emission_counts)  # [B, header_len]
        tokens = torch.cat([header, observations + N + 1], dim=1)  # [B, header_len + K]
        transition, emission = transition_counts.double() / N, emission_counts.double() / N
        posterior, log_likelihood = forward_filter(transition, emission, initial, observations)
        return HMMEpisode(
            tokens=tokens,
            positions=torch.arange(self.header_len, tokens.shape[1], device=tokens.device),
            targets=states,
            posterior=posterior,
            entropy_bits=entropy_bits(posterior),
            transition=transition,
            emission=emission,
            initial=initial.contiguous(),
            states=states,
            observations=observations,
            log_likelihood=log_likelihood,
        )


def decode_header(tokens: Tensor, S: int, M: int) -> tuple[Tensor, Tensor]:
    """Read ``T`` and ``E`` back from the header at the start of ``[B, >= S*S + S*M]`` tokens.

    Header tokens are grid counts; every row sums to the same ``N = 1 / grid``, so the
    matrices are ``counts / N`` in float64: exactly those the posterior was computed from.

    Returns:
        ``[B, S, S]`` transition and ``[B, S, M]`` emission matrices, float64.
    """
    header_len = S * S + S * M
    header = tokens[:, :header_len]
    if header.shape[1] != header_len or header.min() < 0:
        raise ValueError(f"not an HMM header: need {header_len} non-negative count tokens")
    transition = header[:, : S * S].reshape(-1, S, S)
    emission = header[:, S * S :].reshape(-1, S, M)
    levels = transition[:, :1, :].sum(-1, keepdim=True)  # [B, 1, 1]
    if (transition.sum(-1, keepdim=True) != levels).any() or (emission.sum(-1, keepdim=True) != levels).any():
        raise ValueError("not an HMM header: every row must sum to the same number of grid steps")
    return transition.double() / levels, emission.double() / levels


def _sample_path(
    transition_counts: Tensor, emission_counts: Tensor, initial: Tensor, n_obs: int, levels: int, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """Hidden states and observations ``[B, K]`` from integer-count HMMs, with exact probabilities.

    An integer draw ``r`` uniform in ``[0, levels)`` selects outcome ``i`` iff
    ``cum[i-1] <= r < cum[i]``, i.e. with probability ``counts[i] / levels``: no rounding.
    """
    B, S, M = emission_counts.shape
    transition_cum = transition_counts.cumsum(-1).view(B * S, S)  # row b*S + s holds T[b, s]
    transition_draws = torch.randint(0, levels, (n_obs - 1, B, 1), generator=generator, device=generator.device)
    emission_draws = torch.randint(0, levels, (B, n_obs, 1), generator=generator, device=generator.device)
    row_base = torch.arange(B, device=generator.device) * S
    state = torch.multinomial(initial, 1, generator=generator).squeeze(1)  # [B]
    path = [state]
    for t in range(n_obs - 1):  # the Markov chain is sequential; emissions are drawn after it
        state = (transition_cum[row_base + state] <= transition_draws[t]).sum(-1)
        path.append(state)
    states = torch.stack(path, dim=1)  # [B, K]
    emission_cum = emission_counts.cumsum(-1).gather(1, states[:, :, None].expand(B, n_obs, M))  # [B, K, M]
    observations = (emission_cum <= emission_draws).sum(-1)  # [B, K]
    return states, observations
