"""Wind tunnel 1: bijection elimination (docs/protocol.md §2).

Each sequence draws a fresh uniformly random bijection ``pi`` of ``{0..V-1}`` and shows
``L`` input-output pairs. Token layout (``T = 2L``, plus one with ``query``)::

    x_1  y_1  x_2  y_2  ...  x_L  y_L  [x_q]

Input ``x`` is token ``x``; output ``y`` is token ``V + y``, so the vocabulary has ``2V``
ids. The model is scored at each input token ``x_k`` on predicting ``pi(x_k)`` over the
``V`` output classes. With ``query`` a final input is copied from a uniformly chosen
shown pair, and its answer is already known.

Exact posterior (uniform prior over all ``V!`` bijections): a point mass on the known
output when ``x_k`` was shown before, else uniform over the outputs not yet used, so
without replacement ``H_Bayes(k) = log2(V - k + 1)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from windtunnel.config import ConfigError, check_field_types
from windtunnel.tunnels.base import Episode, label_with, one_hot
from windtunnel.tunnels.random import random_permutations

__all__ = ["BijectionEpisode", "BijectionTunnel"]


@dataclass(frozen=True)
class BijectionEpisode(Episode):
    """An :class:`Episode` plus the hidden bijection and the pairs shown.

    Attributes:
        mapping: ``[B, V]`` int64, ``mapping[b, x] = pi_b(x)``.
        inputs: ``[B, L]`` int64 inputs ``x_k`` of the shown pairs, in order.
        outputs: ``[B, L]`` int64 outputs ``pi(x_k)``.
        query_index: ``[B]`` int64 index of the pair the final query repeats, or None.
    """

    mapping: Tensor
    inputs: Tensor
    outputs: Tensor
    query_index: Tensor | None

    def record(self, i: int) -> dict[str, Any]:
        record = super().record(i)
        record["mapping"] = self.mapping[i].tolist()
        record["inputs"] = self.inputs[i].tolist()
        record["outputs"] = self.outputs[i].tolist()
        if self.query_index is not None:
            j = int(self.query_index[i])
            record["query"] = {"input": int(self.inputs[i, j]), "output": int(self.outputs[i, j]), "pair": j}
        return record


@dataclass(frozen=True)
class BijectionTunnel:
    """Bijection elimination.

    Args:
        V: domain size (``V >= 2``); ``V!`` hypotheses.
        L: number of pairs shown (default ``V - 1``); at most ``V`` without replacement.
        with_replacement: draw inputs i.i.d. uniform, so they may repeat (entropy
            staircases); default draws distinct inputs.
        query: append a final input copied from the context (its answer is known).
        repeat_rate: with replacement, the probability that an input (after the first) is a
            copy of a uniformly chosen earlier input instead of a uniform draw over all ``V``;
            0 (default) is the plain i.i.d. sampling. A training curriculum: repeats are
            what the match of ``x_k`` against earlier inputs learns from. The exact
            posterior is unchanged, since it conditions on the inputs shown and their
            distribution does not depend on the bijection.
        repeat_window: with ``repeat_rate``, half of the copies come from the
            ``repeat_window`` most recent pairs instead of any earlier pair (0, the default:
            always any earlier pair). With a uniform earlier source the first pair is
            copied about ``ln L`` times as often as an average pair and the last almost
            never, while binding each output to its input has to be learned at every
            position of the learned position table: recent sources spread that signal.
    """

    name: ClassVar[str] = "bijection"
    primitive: ClassVar[str] = "belief accumulation"

    V: int = 20
    L: int | None = None
    with_replacement: bool = False
    query: bool = False
    repeat_rate: float = 0.0
    repeat_window: int = 0

    def __post_init__(self) -> None:
        check_field_types(self)
        if self.V < 2:
            raise ConfigError(f"V={self.V} is out of range: need V >= 2")
        if not 0.0 <= self.repeat_rate < 1.0:  # also refuses NaN
            raise ConfigError(f"repeat_rate={self.repeat_rate} is out of range: need 0 <= repeat_rate < 1")
        if self.repeat_rate > 0.0 and not self.with_replacement:
            raise ConfigError(f"repeat_rate={self.repeat_rate} needs with_replacement=true (without it inputs never repeat)")
        if self.repeat_window < 0:
            raise ConfigError(f"repeat_window={self.repeat_window} is out of range: need repeat_window >= 0 (0: any earlier pair)")
        if self.L is None:
            object.__setattr__(self, "L", self.V - 1)
        self.check_horizon(self.L, name="L")

    def describe(self) -> str:
        return "with replacement" if self.with_replacement else "without replacement"

    def label(self) -> str:
        return label_with(self, ("V",))

    def check_horizon(self, horizon: int, *, name: str = "horizon") -> None:
        """Raise :class:`ConfigError` unless ``horizon`` pairs can be shown."""
        if horizon < 1:
            raise ConfigError(f"{name}={horizon} is out of range: need at least 1 pair")
        if not self.with_replacement and horizon > self.V:
            raise ConfigError(
                f"{name}={horizon} is out of range: without replacement at most V={self.V} distinct inputs "
                "exist (set with_replacement=true for longer sequences)"
            )

    @property
    def vocab_size(self) -> int:
        return 2 * self.V

    @property
    def num_classes(self) -> int:
        return self.V

    @property
    def horizon(self) -> int:
        return self.L

    def seq_len(self, horizon: int | None = None) -> int:
        return 2 * (self.L if horizon is None else horizon) + int(self.query)

    def prior_predictive(self, n_positions: int) -> Tensor:
        """``[n_positions, V]`` float64: before any pair is seen, every output is equally likely."""
        return torch.full((n_positions, self.V), 1.0 / self.V, dtype=torch.float64)

    # --- optional capabilities (windtunnel.tunnels.capabilities) ---------------------

    #: Query-key sharpening's kinds of key (the categories partition the keys a query sees).
    category_meanings: ClassVar[dict[str, str]] = {
        "evidence": "the earlier positions that fix the exact posterior: when the query's input x_q is new, every "
        "earlier output token (the eliminated outputs: the posterior is uniform over the rest); when x_q was "
        "shown before, the output token of that earlier pair (the answer)",
        "matching_input": "earlier positions holding the query's own input x_q (only when inputs repeat)",
        "other_output": "earlier output tokens that are not evidence (only when x_q repeats)",
        "other_input": "earlier input tokens other than x_q (they say nothing about pi(x_q))",
        "self": "the query position itself (x_q)",
    }

    def symbol_tokens(self) -> tuple[list[int], list[str]]:
        """The input tokens ``x = 0..V-1`` (outputs are tokens ``V + y``)."""
        return list(range(self.V)), [f"x={x}" for x in range(self.V)]

    def next_symbol_predictive(self, episode: Episode, posterior: Tensor | None = None) -> Tensor:
        """The classes are the outputs, and the output ``y_k`` is the symbol shown right after
        ``x_k``: the next-symbol predictive is the posterior itself."""
        return episode.posterior if posterior is None else posterior

    def hypothesis_tokens(self) -> list[int]:
        """The output tokens ``V..2V-1``: a hypothesis fixes which output each input maps to."""
        return list(range(self.V, 2 * self.V))

    def attention_categories(self, episode: Episode) -> dict[str, Tensor]:
        """See :class:`~windtunnel.tunnels.capabilities.AttentionCategories` and :attr:`category_meanings`."""
        tokens = episode.tokens  # [B, T]
        B, T = tokens.shape
        queries = episode.positions  # [P]
        t = torch.arange(T)
        earlier = (t[None, :] < queries[:, None])[None]  # [1, P, T]
        is_input = (tokens < self.V)[:, None, :]  # [B, 1, T]; outputs are tokens V..2V-1
        query_tokens = tokens[:, queries]  # [B, P]
        matching_input = is_input & earlier & (tokens[:, None, :] == query_tokens[..., None])  # [B, P, T]
        repeat = matching_input.any(-1, keepdim=True)  # [B, P, 1]
        # The output of a pair sits right after its input (x y x y ...).
        answer = torch.zeros_like(matching_input)
        answer[..., 1:] = matching_input[..., :-1]
        earlier_outputs = ~is_input & earlier  # [B, P, T]
        evidence = torch.where(repeat, answer & earlier_outputs, earlier_outputs)
        return {
            "evidence": evidence,
            "matching_input": matching_input,
            "other_output": earlier_outputs & ~evidence,
            "other_input": is_input & earlier & ~matching_input,
            "self": (t[None, :] == queries[:, None])[None].expand(B, -1, -1),
        }

    def closed_form_entropy_bits(self, n_positions: int) -> list[float] | None:
        """Without replacement ``log2(V - k + 1)`` at the k-th input (k = 1..L), and 0 at the
        final query (its answer was shown); with replacement None (it depends on the repeats)."""
        if self.with_replacement:
            return None
        n_pairs = n_positions - int(self.query)
        return [math.log2(self.V - k + 1) for k in range(1, n_pairs + 1)] + [0.0] * int(self.query)

    def value_positions(self, episode: Episode) -> tuple[Tensor, Tensor]:
        """The output token ``y_k`` right after each input ``x_k`` (the final query has none)."""
        kept = (episode.positions + 1 < episode.tokens.shape[1]).nonzero().flatten()  # [P']
        return episode.positions[kept] + 1, kept

    def sample_bytes(self, batch_size: int, horizon: int | None = None) -> int:
        """What the episode returned keeps: the float64 posteriors ``[B, L, V]`` and entropies,
        the int64 tokens, targets, inputs, outputs and permutations (the working copies come on top)."""
        n_pairs, query = (self.L if horizon is None else horizon), int(self.query)
        supervised = n_pairs + query
        return batch_size * 8 * (supervised * (self.V + 2) + 4 * n_pairs + 2 * query + self.V)

    def sample(self, batch_size: int, *, generator: torch.Generator, horizon: int | None = None) -> BijectionEpisode:
        """Draw ``batch_size`` bijections and one sequence of ``horizon`` pairs (+ query) from each."""
        n_pairs = self.L if horizon is None else horizon
        self.check_horizon(n_pairs)
        B, V = batch_size, self.V
        mapping = random_permutations(B, V, generator=generator)  # [B, V]
        if self.with_replacement:
            inputs = torch.randint(0, V, (B, n_pairs), generator=generator, device=generator.device)  # [B, L]
            if self.repeat_rate > 0.0:
                inputs = _repeat_earlier(inputs, self.repeat_rate, self.repeat_window, generator)
        else:
            inputs = random_permutations(B, V, generator=generator)[:, :n_pairs]  # [B, L]
        outputs = mapping.gather(1, inputs)  # [B, L]

        posterior, entropy = _pair_posteriors(inputs, outputs, V)  # [B, L, V], [B, L]
        tokens = torch.stack([inputs, outputs + V], dim=2).reshape(B, 2 * n_pairs)  # x1 y1 x2 y2 ...
        positions = torch.arange(0, 2 * n_pairs, 2, device=generator.device)
        targets = outputs
        query_index = None
        if self.query:
            query_index = torch.randint(0, n_pairs, (B,), generator=generator, device=generator.device)  # [B]
            query_input = inputs.gather(1, query_index[:, None])  # [B, 1]
            query_output = outputs.gather(1, query_index[:, None])  # [B, 1]
            tokens = torch.cat([tokens, query_input], dim=1)
            positions = torch.cat([positions, torch.tensor([2 * n_pairs], device=generator.device)])
            targets = torch.cat([targets, query_output], dim=1)
            posterior = torch.cat([posterior, one_hot(query_output, V)], dim=1)
            entropy = torch.cat([entropy, torch.zeros(B, 1, dtype=torch.float64, device=generator.device)], dim=1)
        return BijectionEpisode(
            tokens=tokens,
            positions=positions,
            targets=targets,
            posterior=posterior,
            entropy_bits=entropy,
            mapping=mapping,
            inputs=inputs,
            outputs=outputs,
            query_index=query_index,
        )


def _repeat_earlier(inputs: Tensor, rate: float, window: int, generator: torch.Generator) -> Tensor:
    """``inputs`` with each entry after the first replaced, with probability ``rate``, by a
    copy of an earlier entry of the result (so copies of copies count): uniform over every
    earlier entry, or, with ``window`` > 0, half the time uniform over the ``window`` latest."""
    B, L = inputs.shape
    repeat = torch.rand(B, L, generator=generator, dtype=torch.float64, device=generator.device) < rate  # [B, L]
    source = torch.rand(B, L, generator=generator, dtype=torch.float64, device=generator.device)  # [B, L] uniform in [0, 1)
    recent = torch.rand(B, L, generator=generator, dtype=torch.float64, device=generator.device) < 0.5 if window else None  # [B, L]
    out = inputs.clone()
    for k in range(1, L):
        if recent is None:
            j = (source[:, k] * k).long()  # [B] uniform over 0..k-1
        else:
            span = torch.where(recent[:, k], min(window, k), k)  # [B]
            j = k - 1 - (source[:, k] * span).long()  # [B] uniform over the span's latest pairs
        out[:, k] = torch.where(repeat[:, k], out.gather(1, j[:, None])[:, 0], inputs[:, k])
    return out


def _pair_posteriors(inputs: Tensor, outputs: Tensor, V: int) -> tuple[Tensor, Tensor]:
    """Exact posterior over ``pi(x_k)`` given pairs ``1..k-1``, and its entropy in bits.

    Args:
        inputs, outputs: ``[B, L]`` the shown pairs.

    Returns:
        ``[B, L, V]`` float64 posterior and ``[B, L]`` float64 entropy (closed form).
    """
    L = inputs.shape[1]
    outputs_onehot = one_hot(outputs, V)  # [B, L, V]
    # Outputs used by pairs strictly before k (exclusive cumulative sum).
    used_before = (outputs_onehot.cumsum(dim=1) - outputs_onehot) > 0  # [B, L, V]
    free = ~used_before
    n_free = free.sum(dim=-1)  # [B, L], >= 1 whenever x_k is new (a bijection leaves one free)
    earlier = torch.ones(L, L, dtype=torch.bool, device=inputs.device).tril(diagonal=-1)  # earlier[k, j] = j < k
    seen_before = ((inputs[:, :, None] == inputs[:, None, :]) & earlier).any(dim=-1)  # [B, L]
    uniform_free = free.to(torch.float64) / n_free.clamp_min(1)[..., None]
    posterior = torch.where(seen_before[..., None], outputs_onehot, uniform_free)
    entropy = torch.where(seen_before, 0.0, torch.log2(n_free.to(torch.float64)))
    return posterior, entropy

