"""A tunnel's sequences as the token ids of a pretrained language model: the stated text formats.

Every symbol of a tunnel (the bijection's inputs and outputs, the HMM's observations) is one
token of the language model's tokenizer, and no two symbols share a token; the ids are put
together directly (never by tokenizing the whole text), so the model reads exactly one token
per symbol. Text between symbols (separators, the HMM's header, an optional instruction) is
tokenized piece by piece. The formats, with ``<x>`` the symbol of ``x``:

- ``bijection``: ``<x_1> -> <y_1>, <x_2> -> <y_2>, ...``; inputs are the capital letters
  `` A``, `` B``, ..., outputs the small letters `` a``, `` b``, ...; the prediction of
  ``y_k`` is read at the `` ->`` after ``<x_k>``.
- ``hmm``: a header stating the number of states, the symbols, the initial distribution, and
  ``T`` and ``E`` row by row as the decimals (or fractions) the tunnel's quantized header
  holds, then ``Observations: <o_1> <o_2> ...``; symbols are the capital letters; the
  prediction of ``o_{t+1}`` is read at ``<o_t>``.

With ``fresh_symbols`` each sequence draws its own one-to-one map from symbols to letters
(the opaque mode of the model-selection paper): a model cannot lean on what a letter meant
in its pretraining. With ``instruction`` a one-line description of the task comes first.
"""

from __future__ import annotations

import string
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, ClassVar, Protocol

import torch
from torch import Tensor

from windtunnel.config import ConfigError
from windtunnel.tunnels import Episode

__all__ = ["FORMATS", "Rendered", "TextFormat", "check_tunnel", "format_for", "single_tokens"]

CAPITALS = [f" {c}" for c in string.ascii_uppercase]
SMALL = [f" {c}" for c in string.ascii_lowercase]


class Tokenizer(Protocol):
    """What the formats need of a tokenizer (a ``transformers`` tokenizer has it)."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


@dataclass(frozen=True)
class Rendered:
    """A batch of sequences as language-model token ids.

    Attributes:
        ids: ``[B, T_lm]`` int64, right-padded with ``pad_id``.
        attention_mask: ``[B, T_lm]`` int64, 1 on the real tokens.
        read_at: ``[B, P]`` int64: the position whose next-token distribution predicts the
            symbol after the tunnel's supervised position ``p``.
        class_tokens: ``[B, C]`` int64: the token of each next-symbol class, per sequence
            (one map for all, or each its own with fresh symbols).
        token_at: ``[B, T]`` int64: the language-model position of each tunnel token that is a
            symbol, -1 where the tunnel token is written as text (the HMM's header).
        key_tokens: ``[K]`` int64: the tokens whose keys are compared (the symbols the tunnel
            declares as ``symbol_tokens``, in every map used).
        text: the first sequence as text.
    """

    ids: Tensor
    attention_mask: Tensor
    read_at: Tensor
    class_tokens: Tensor
    token_at: Tensor
    key_tokens: Tensor
    text: str


def single_tokens(tokenizer: Tokenizer, symbols: Sequence[str], what: str) -> list[int]:
    """Each string of ``symbols`` as its one token id; :class:`ConfigError` naming the first
    string that is not one token, or two strings that share a token."""
    ids = []
    for symbol in symbols:
        encoded = tokenizer.encode(symbol, add_special_tokens=False)
        if len(encoded) != 1:
            raise ConfigError(f"the tokenizer writes the {what} {symbol!r} as {len(encoded)} tokens: lm-score needs "
                              "one token per symbol (a tokenizer with a token for each capital and small letter after a space)")
        ids.append(encoded[0])
    if len(set(ids)) != len(ids):
        raise ConfigError(f"the tokenizer gives two {what}s of {list(symbols)} the same token: lm-score needs distinct tokens")
    return ids


class _Builder:
    """One sequence's ids, appended piece by piece."""

    def __init__(self, tokenizer: Tokenizer, prefix: Sequence[int]) -> None:
        self.tokenizer, self.ids = tokenizer, list(prefix)
        self._cache: dict[str, list[int]] = {}

    def text(self, text: str) -> None:
        if text not in self._cache:
            self._cache[text] = self.tokenizer.encode(text, add_special_tokens=False)
        self.ids += self._cache[text]

    def symbol(self, token: int) -> int:
        self.ids.append(token)
        return len(self.ids) - 1


class TextFormat(ABC):
    """Renders one tunnel's episodes; each tunnel's format defines :meth:`alphabets` and :meth:`_sequence`."""

    tunnel_name: ClassVar[str]
    #: The one-line instruction (with ``instruction=True``), formatted with the tunnel's fields.
    instruction: ClassVar[str]

    def __init__(self, tunnel: Any, tokenizer: Tokenizer) -> None:
        self.tunnel, self.tokenizer = tunnel, tokenizer
        bos = getattr(tokenizer, "bos_token_id", None)
        # the tokenizer's own convention: a BOS first only where it adds one itself
        self.prefix = [bos] if bos is not None and getattr(tokenizer, "add_bos_token", False) else []

    @abstractmethod
    def alphabets(self) -> dict[str, list[int]]:
        """Role -> the token of each symbol of that role, in the tunnel's order."""

    def render(self, episode: Episode, *, generator: torch.Generator | None = None, instruction: bool = False,
               pad_id: int = 0) -> Rendered:
        """The episode's sequences as token ids; ``generator`` draws a fresh symbol map per
        sequence (None: the same map, the alphabets' order, for every sequence)."""
        base = self.alphabets()
        rows, read_at, class_tokens, token_at = [], [], [], []
        used: set[int] = set()
        for i in range(episode.batch_size):
            maps = {role: ([tokens[j] for j in torch.randperm(len(tokens), generator=generator).tolist()]
                           if generator is not None else list(tokens)) for role, tokens in base.items()}
            builder = _Builder(self.tokenizer, self.prefix)
            if instruction:
                builder.text(self.instruction.format(t=self.tunnel) + "\n")
            positions, reads = self._sequence(builder, episode, i, maps)
            rows.append(builder.ids)
            read_at.append(reads)
            token_at.append(positions)
            class_tokens.append(maps[self.class_role])
            used.update(maps[self.key_role])
        length = max(len(r) for r in rows)
        ids = torch.full((len(rows), length), pad_id, dtype=torch.int64)
        mask = torch.zeros((len(rows), length), dtype=torch.int64)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row)
            mask[i, : len(row)] = 1
        return Rendered(ids, mask, torch.tensor(read_at), torch.tensor(class_tokens), torch.tensor(token_at),
                        torch.tensor(sorted(used)), self.tokenizer.decode(rows[0]))

    #: The role whose symbols are the next-symbol classes, and the role whose keys are compared.
    class_role: ClassVar[str]
    key_role: ClassVar[str]

    @abstractmethod
    def _sequence(self, builder: _Builder, episode: Episode, i: int, maps: dict[str, list[int]]) -> tuple[list[int], list[int]]:
        """Append sequence ``i``; return the language-model position of each tunnel token (-1
        where it is text) and the read position of each supervised position."""


class BijectionText(TextFormat):
    tunnel_name = "bijection"
    instruction = ("Each capital letter stands for a different small letter, the same one every time; "
                   "complete each arrow.")
    class_role, key_role = "output", "input"

    def alphabets(self) -> dict[str, list[int]]:
        V = self.tunnel.V
        if V > len(CAPITALS):
            raise ConfigError(f"V={V}: the bijection's text format has {len(CAPITALS)} letters per side: need V <= {len(CAPITALS)}")
        return {"input": single_tokens(self.tokenizer, CAPITALS[:V], "input symbol"),
                "output": single_tokens(self.tokenizer, SMALL[:V], "output symbol")}

    def _sequence(self, builder: _Builder, episode: Episode, i: int, maps: dict[str, list[int]]) -> tuple[list[int], list[int]]:
        V = self.tunnel.V
        tokens = episode.tokens[i].tolist()
        supervised = set(episode.positions.tolist())
        positions, reads = [], []
        for t, token in enumerate(tokens):
            if token < V:  # an input x: "<x> ->", the answer read at the arrow
                if t > 0:
                    builder.text(",")
                positions.append(builder.symbol(maps["input"][token]))
                builder.text(" ->")
                if t in supervised:
                    reads.append(len(builder.ids) - 1)
            else:
                positions.append(builder.symbol(maps["output"][token - V]))
        return positions, reads


class HMMText(TextFormat):
    tunnel_name = "hmm"
    instruction = ("A hidden Markov model emits one letter per step from its hidden state; predict the next letter.")
    class_role, key_role = "symbol", "symbol"

    def alphabets(self) -> dict[str, list[int]]:
        M = self.tunnel.M
        if M > len(CAPITALS):
            raise ConfigError(f"M={M}: the HMM's text format has {len(CAPITALS)} letters: need M <= {len(CAPITALS)}")
        return {"symbol": single_tokens(self.tokenizer, CAPITALS[:M], "observation symbol")}

    def _number(self, count: int) -> str:
        """``count / N`` exactly: a decimal where it has one with at most 4 digits, else a fraction."""
        value = Fraction(count, self.tunnel.levels)
        for digits in range(5):
            if (value * 10**digits).denominator == 1:
                return f"{float(value):.{digits}f}" if digits else str(int(value))
        return f"{value.numerator}/{value.denominator}"

    def _sequence(self, builder: _Builder, episode: Episode, i: int, maps: dict[str, list[int]]) -> tuple[list[int], list[int]]:
        S, M, header = self.tunnel.S, self.tunnel.M, self.tunnel.header_len
        tokens = episode.tokens[i].tolist()
        letters = [self.tokenizer.decode([token]).strip() for token in maps["symbol"]]
        initial = "uniform" if self.tunnel.initial is None else " ".join(str(p) for p in self.tunnel.initial)
        transition = "; ".join(" ".join(self._number(c) for c in tokens[r * S:(r + 1) * S]) for r in range(S))
        emission = "; ".join(" ".join(self._number(c) for c in tokens[S * S + r * M:S * S + (r + 1) * M]) for r in range(S))
        builder.text(f"States: {S}. Symbols: {' '.join(letters)}. Initial state distribution: {initial}.\n"
                     f"Transition probabilities (row: from state 1..{S}; column: to state 1..{S}): {transition}.\n"
                     f"Emission probabilities (row: state 1..{S}; column: symbol {' '.join(letters)}): {emission}.\n"
                     "Observations:")
        positions = [-1] * header
        levels = self.tunnel.levels
        for t in range(header, len(tokens)):
            positions.append(builder.symbol(maps["symbol"][tokens[t] - levels - 1]))
        reads = [positions[t] for t in episode.positions.tolist()]
        return positions, reads


#: Tunnel name -> its text format.
FORMATS: dict[str, type[TextFormat]] = {f.tunnel_name: f for f in (BijectionText, HMMText)}


def check_tunnel(tunnel: Any) -> None:
    """:class:`ConfigError` for a tunnel without a text format."""
    if tunnel.name not in FORMATS:
        raise ConfigError(f"no text format for the {tunnel.name} tunnel: lm-score reads {', '.join(sorted(FORMATS))}")


def format_for(tunnel: Any, tokenizer: Tokenizer) -> TextFormat:
    """The text format of ``tunnel``; :class:`ConfigError` for a tunnel without one."""
    check_tunnel(tunnel)
    return FORMATS[tunnel.name](tunnel, tokenizer)
