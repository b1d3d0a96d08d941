"""Wind tunnel 3: associative recall, random-access binding (the paper's later versions).

Each sequence draws a fresh uniformly random injection ``f`` from the ``key_vocab`` keys
into the ``value_vocab`` values (``value_vocab >= key_vocab``) and stores ``n_pairs`` of its
bindings, at distinct keys chosen uniformly, as key-value pairs; filler follows, then
``n_queries`` queries. A query names a stored key with probability ``p_stored`` (uniform over
the stored ones) and otherwise a key not stored (uniform over those). Token layout
(``T = 2 n_pairs + n_filler + n_queries``)::

    k_1 v_1 ... k_N v_N  FILL ... FILL  q_1 ... q_Q

Key ``k`` is token ``k``; value ``v`` is token ``key_vocab + v``; ``FILL`` is token
``key_vocab + value_vocab``. The model is scored at each query on predicting ``f(q)`` over
the ``value_vocab`` values; queries show no answers, so each is a fresh recall.

Exact posterior (uniform prior over injections): a point mass on the bound value when the
query's key was stored; otherwise uniform over the ``value_vocab - n_pairs`` values not
bound in this sequence (an injection gives the key a value no stored key has, and every
such value is equally likely). A model with a fixed-size state has to keep all ``n_pairs``
bindings to answer the first case, which is what separates random access from a running
summary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from windtunnel.config import ConfigError, check_field_types
from windtunnel.metrics import entropy_bits
from windtunnel.tunnels.base import Episode, label_with, one_hot
from windtunnel.tunnels.random import random_permutations

__all__ = ["AssocRecallEpisode", "AssocRecallTunnel"]


@dataclass(frozen=True)
class AssocRecallEpisode(Episode):
    """An :class:`Episode` plus the hidden injection and what was stored and asked.

    Attributes:
        mapping: ``[B, key_vocab]`` int64, ``mapping[b, k] = f_b(k)`` (distinct values).
        keys: ``[B, n_pairs]`` int64 stored keys, in order; ``values``: their values.
        queries: ``[B, Q]`` int64 queried keys; ``stored``: ``[B, Q]`` bool, whether each was stored.
    """

    mapping: Tensor
    keys: Tensor
    values: Tensor
    queries: Tensor
    stored: Tensor

    def record(self, i: int) -> dict[str, Any]:
        record = super().record(i)
        for name in ("mapping", "keys", "values", "queries", "stored"):
            record[name] = getattr(self, name)[i].tolist()
        return record


@dataclass(frozen=True)
class AssocRecallTunnel:
    """Associative recall.

    Args:
        n_pairs: bindings stored per sequence (``1 <= n_pairs <= key_vocab``; below
            ``key_vocab`` when queries may name unstored keys).
        n_queries: queries per sequence (the horizon: the supervised steps).
        n_filler: filler tokens between the pairs and the queries (``>= 0``).
        key_vocab: the keys ``0..key_vocab-1``.
        value_vocab: the values ``0..value_vocab-1``; at least ``key_vocab`` (an injection
            of the keys) and above ``n_pairs`` (an unstored key has a value left to take).
        p_stored: probability that a query names a stored key, in ``[0, 1]``.
    """

    name: ClassVar[str] = "assoc_recall"
    primitive: ClassVar[str] = "random-access binding"

    n_pairs: int = 8
    n_queries: int = 8
    n_filler: int = 4
    key_vocab: int = 16
    value_vocab: int = 16
    p_stored: float = 0.75

    def __post_init__(self) -> None:
        check_field_types(self)
        if self.key_vocab < 1:
            raise ConfigError(f"key_vocab={self.key_vocab} is out of range: need key_vocab >= 1")
        if not 1 <= self.n_pairs <= self.key_vocab:
            raise ConfigError(f"n_pairs={self.n_pairs} is out of range: need 1 <= n_pairs <= key_vocab={self.key_vocab}")
        if self.value_vocab < self.key_vocab:
            raise ConfigError(
                f"value_vocab={self.value_vocab} is out of range: need value_vocab >= key_vocab={self.key_vocab} "
                "(every key is bound to a distinct value)"
            )
        if not 0.0 <= self.p_stored <= 1.0:  # also refuses NaN
            raise ConfigError(f"p_stored={self.p_stored} is out of range: need 0 <= p_stored <= 1")
        if self.p_stored < 1.0 and self.n_pairs == self.key_vocab:
            raise ConfigError(
                f"p_stored={self.p_stored} asks for unstored keys, but n_pairs={self.n_pairs} stores every key: "
                "lower n_pairs below key_vocab or set p_stored = 1"
            )
        if self.n_filler < 0:
            raise ConfigError(f"n_filler={self.n_filler} is out of range: need n_filler >= 0")
        self.check_horizon(self.n_queries, name="n_queries")

    def describe(self) -> str:
        return self.name

    def label(self) -> str:
        return label_with(self, ("n_pairs",))

    def check_horizon(self, horizon: int, *, name: str = "horizon") -> None:
        """Raise :class:`ConfigError` unless ``horizon`` queries can be asked."""
        if horizon < 1:
            raise ConfigError(f"{name}={horizon} is out of range: need at least 1 query")

    @property
    def fill_token(self) -> int:
        return self.key_vocab + self.value_vocab

    @property
    def vocab_size(self) -> int:
        return self.key_vocab + self.value_vocab + 1

    @property
    def num_classes(self) -> int:
        return self.value_vocab

    @property
    def horizon(self) -> int:
        return self.n_queries

    @property
    def first_query(self) -> int:
        """The position of the first query."""
        return 2 * self.n_pairs + self.n_filler

    def seq_len(self, horizon: int | None = None) -> int:
        return self.first_query + (self.n_queries if horizon is None else horizon)

    def prior_predictive(self, n_positions: int) -> Tensor:
        """``[n_positions, value_vocab]`` float64: without the context every value is equally likely."""
        return torch.full((n_positions, self.value_vocab), 1.0 / self.value_vocab, dtype=torch.float64)

    def sample_bytes(self, batch_size: int, horizon: int | None = None) -> int:
        """What the episode returned keeps: the float64 posteriors ``[B, Q, value_vocab]`` and
        entropies, the int64 tokens, targets, mapping, keys, values and queries, and the bool
        ``stored`` (one byte each)."""
        Q = self.n_queries if horizon is None else horizon
        return batch_size * (8 * (Q * (self.value_vocab + 3) + self.seq_len(horizon) + self.key_vocab + 2 * self.n_pairs) + Q)

    def sample(self, batch_size: int, *, generator: torch.Generator, horizon: int | None = None) -> AssocRecallEpisode:
        """Draw ``batch_size`` injections and one sequence of ``horizon`` queries from each."""
        Q = self.n_queries if horizon is None else horizon
        self.check_horizon(Q)
        B, N, n_keys, n_values = batch_size, self.n_pairs, self.key_vocab, self.value_vocab
        mapping = random_permutations(B, n_values, generator=generator)[:, :n_keys]  # [B, key_vocab] an injection
        key_order = random_permutations(B, n_keys, generator=generator)  # [B, key_vocab]: stored first, then the rest
        keys = key_order[:, :N]  # [B, N]
        values = mapping.gather(1, keys)  # [B, N]
        stored = torch.rand(B, Q, generator=generator, dtype=torch.float64, device=generator.device) < self.p_stored  # [B, Q]
        pick = torch.rand(B, Q, generator=generator, dtype=torch.float64, device=generator.device)  # [B, Q] uniform in [0, 1)
        n_unstored = n_keys - N
        index = torch.where(stored, (pick * N).long(), N + (pick * max(n_unstored, 1)).long())  # [B, Q] into key_order
        queries = key_order.gather(1, index.clamp_max(n_keys - 1))  # [B, Q]
        targets = mapping.gather(1, queries)  # [B, Q]

        bound = torch.zeros(B, n_values, dtype=torch.float64, device=generator.device).scatter_(1, values, 1.0)  # [B, value_vocab]
        unbound = (1.0 - bound) / (n_values - N)  # uniform over the values no stored key has
        posterior = torch.where(
            stored[..., None], one_hot(targets, n_values), unbound[:, None, :].expand(B, Q, n_values)
        )  # [B, Q, value_vocab]
        pairs = torch.stack([keys, values + n_keys], dim=2).reshape(B, 2 * N)  # k v k v ...
        filler = torch.full((B, self.n_filler), self.fill_token, dtype=torch.long, device=generator.device)
        tokens = torch.cat([pairs, filler, queries], dim=1)  # [B, T]
        return AssocRecallEpisode(
            tokens=tokens,
            positions=torch.arange(self.first_query, self.first_query + Q, device=generator.device),
            targets=targets,
            posterior=posterior,
            entropy_bits=entropy_bits(posterior) + 0.0,  # + 0.0 turns a point mass's -0.0 into 0.0
            mapping=mapping,
            keys=keys,
            values=values,
            queries=queries,
            stored=stored,
        )

    # --- optional capabilities (windtunnel.tunnels.capabilities) ---------------------

    #: Query-key sharpening's kinds of key (the categories partition the keys a query sees).
    category_meanings: ClassVar[dict[str, str]] = {
        "evidence": "the earlier positions that fix the exact posterior: when the query's key was stored, the value "
        "token bound to it (the answer); otherwise every stored value token (the values it cannot have)",
        "matching_key": "the stored pair's key token equal to the query's key (only when it was stored)",
        "other_value": "stored value tokens that are not evidence (only when the query's key was stored)",
        "other_key": "stored key tokens other than the query's",
        "filler": "the filler tokens",
        "earlier_query": "the queries before this one (they carry no answer)",
        "self": "the query position itself",
    }

    why_not: ClassVar[dict[str, str]] = {
        "ValuePositions": "it shows no value tokens after a query: queries are answered by the model, never in the sequence",
    }

    def symbol_tokens(self) -> tuple[list[int], list[str]]:
        """The key tokens ``0..key_vocab-1``."""
        return list(range(self.key_vocab)), [f"k={k}" for k in range(self.key_vocab)]

    def hypothesis_tokens(self) -> list[int]:
        """The value tokens: a hypothesis fixes which value each key is bound to."""
        return list(range(self.key_vocab, self.key_vocab + self.value_vocab))

    def attention_categories(self, episode: Episode) -> dict[str, Tensor]:
        """See :class:`~windtunnel.tunnels.capabilities.AttentionCategories` and :attr:`category_meanings`."""
        tokens = episode.tokens  # [B, T]
        B, T = tokens.shape
        queries = episode.positions  # [P]
        t = torch.arange(T)
        earlier = (t[None, :] < queries[:, None])[None]  # [1, P, T]
        in_pairs = t < 2 * self.n_pairs  # [T]
        is_key = (in_pairs & (t % 2 == 0))[None, None, :] & earlier  # [1, P, T]
        is_value = (in_pairs & (t % 2 == 1))[None, None, :] & earlier  # [1, P, T]
        matching_key = is_key & (tokens[:, None, :] == tokens[:, queries][..., None])  # [B, P, T]
        hit = matching_key.any(-1, keepdim=True)  # [B, P, 1]
        answer = torch.zeros_like(matching_key)
        answer[..., 1:] = matching_key[..., :-1]  # the value sits right after its key
        evidence = torch.where(hit, answer, is_value.expand(B, -1, -1))  # [B, P, T]
        filler = ((t >= 2 * self.n_pairs) & (t < self.first_query))[None, None, :] & earlier
        return {
            "evidence": evidence,
            "matching_key": matching_key,
            "other_value": is_value & ~evidence,
            "other_key": is_key & ~matching_key,
            "filler": filler.expand(B, -1, -1),
            "earlier_query": ((t >= self.first_query)[None, None, :] & earlier).expand(B, -1, -1),
            "self": (t[None, :] == queries[:, None])[None].expand(B, -1, -1),
        }
