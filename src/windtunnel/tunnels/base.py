"""The contract every wind tunnel keeps: draw fresh hypotheses, return an :class:`Episode`.

An episode is a batch of token sequences together with the exact Bayesian posterior
the model should reproduce at each supervised position. Layouts are fixed by a
tunnel's parameters, so the supervised positions are the same for every sequence of a
batch; they are stored once as ``positions`` (``[P]``) and every per-position tensor is
``[B, P, ...]``. ``mask`` gives the equivalent ``[B, T]`` boolean view.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch
from torch import Tensor

__all__ = ["Episode", "Tunnel", "label_with", "one_hot", "primitive_of"]


@dataclass(frozen=True)
class Episode:
    """A batch of sequences and their exact posteriors.

    Attributes:
        tokens: ``[B, T]`` int64 token ids, exactly what the model reads.
        positions: ``[P]`` int64 indices into ``T`` of the supervised positions
            (the model's prediction at ``tokens[:, positions[p]]`` is scored).
        targets: ``[B, P]`` int64 class sampled from the generative process at each
            supervised position (the hard training label).
        posterior: ``[B, P, C]`` float64 exact posterior over the ``C`` output classes.
        entropy_bits: ``[B, P]`` float64 entropy of ``posterior`` in bits.
        value_inputs: ``[B, T, D]`` float64 values read beside the tokens through a linear read-in
            (a tunnel that declares ``ValueInputs``, e.g. the Kalman tunnel's observations;
            float32-representable, so the posterior conditions on what the model reads), or
            None where the tokens are all the model reads.
    """

    tokens: Tensor
    positions: Tensor
    targets: Tensor
    posterior: Tensor
    entropy_bits: Tensor
    value_inputs: Tensor | None = field(default=None, kw_only=True)

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    @property
    def mask(self) -> Tensor:
        """``[B, T]`` bool, True at supervised positions."""
        mask = torch.zeros_like(self.tokens, dtype=torch.bool)
        mask[:, self.positions] = True
        return mask

    def to(self, device: torch.device | str) -> Episode:
        """A copy with every tensor moved to ``device`` (dtypes kept: posteriors stay float64)."""
        moved = {
            f.name: getattr(self, f.name).to(device) if isinstance(getattr(self, f.name), Tensor) else getattr(self, f.name)
            for f in dataclasses.fields(self)
        }
        return dataclasses.replace(self, **moved)

    def head(self, n: int) -> Episode:
        """The first ``n`` sequences as a plain :class:`Episode` (tunnel-specific fields dropped)."""
        value_inputs = None if self.value_inputs is None else self.value_inputs[:n]
        return Episode(self.tokens[:n], self.positions, self.targets[:n], self.posterior[:n], self.entropy_bits[:n],
                       value_inputs=value_inputs)

    def record(self, i: int) -> dict[str, Any]:
        """Sequence ``i`` as plain JSON-able values (what ``windtunnel sample`` prints)."""
        record = {
            "tokens": self.tokens[i].tolist(),
            "positions": self.positions.tolist(),
            "targets": self.targets[i].tolist(),
            "posterior": self.posterior[i].tolist(),
            "entropy_bits": self.entropy_bits[i].tolist(),
        }
        if self.value_inputs is not None:
            record["value_inputs"] = self.value_inputs[i].tolist()
        return record


@runtime_checkable
class Tunnel(Protocol):
    """What a wind tunnel provides. Tunnels are frozen dataclasses of their parameters.

    ``horizon`` is the number of supervised steps a sequence has: pairs for the
    bijection tunnel, observations for the HMM tunnel. Training uses the tunnel's own
    horizon; evaluation may pass another to :meth:`sample` (length generalization).
    """

    name: ClassVar[str]
    #: The inference primitive the tunnel isolates (the paper's later versions: "belief
    #: accumulation", "belief transport", "random-access binding"); optional, read with
    #: :func:`primitive_of`, which gives None for a tunnel that names none.
    primitive: ClassVar[str]

    @property
    def vocab_size(self) -> int:
        """Number of distinct token ids the tunnel emits."""

    @property
    def num_classes(self) -> int:
        """Number of output classes ``C`` of the posterior."""

    @property
    def horizon(self) -> int:
        """The default horizon."""

    def check_horizon(self, horizon: int, *, name: str = "horizon") -> None:
        """Raise ``ConfigError`` (naming the value as ``name``) unless ``horizon`` can be sampled."""

    def seq_len(self, horizon: int | None = None) -> int:
        """Length ``T`` of a sequence with the given horizon (default: the tunnel's)."""

    def prior_predictive(self, n_positions: int) -> Tensor:
        """``[n_positions, C]`` float64: the best predictor that ignores every token (a baseline)."""

    def sample_bytes(self, batch_size: int, horizon: int | None = None) -> int:
        """The bytes of the episode :meth:`sample` returns for ``batch_size`` sequences: a lower
        bound on what a draw holds at once (checked by :mod:`windtunnel.memory` before a large draw)."""

    def sample(self, batch_size: int, *, generator: torch.Generator, horizon: int | None = None) -> Episode:
        """Draw ``batch_size`` fresh hypotheses and one sequence from each."""

    def describe(self) -> str:
        """The task variant in words (``"with replacement"``, ``"floor 0.05, grid 0.01"``):
        what a number measured on it belongs to. Saved with every analysis, so the report
        names the variant without knowing the tunnel."""

    def label(self) -> str:
        """The tunnel's name with the parameters that size it (``"hmm (S = 5, M = 5, K = 20)"``;
        :func:`label_with`), for a column header."""


def label_with(tunnel: object, sizing: tuple[str, ...]) -> str:
    """``"<name> (<p> = <value>, ...)"`` for the parameters ``sizing`` of ``tunnel``."""
    params = ", ".join(f"{key} = {getattr(tunnel, key)}" for key in sizing)
    return f"{tunnel.name} ({params})" if params else tunnel.name


def primitive_of(tunnel: object) -> str | None:
    """The inference primitive ``tunnel`` declares (:attr:`Tunnel.primitive`), None if it names none."""
    primitive = getattr(tunnel, "primitive", None)
    return primitive if isinstance(primitive, str) else None


def one_hot(index: Tensor, n: int) -> Tensor:
    """``[..., n]`` float64 indicator rows of ``index`` (values in ``0..n-1``).

    ``torch.nn.functional.one_hot`` checks the range of ``index`` by reading its minimum and
    maximum back to the host: on CUDA a wait for every kernel queued before it, twice per
    training batch. A sampler's indices are in range by construction, so this scatters
    without the check (the same rows, tests/tunnels/test_tunnel_bijection.py)."""
    rows = torch.zeros((*index.shape, n), dtype=torch.float64, device=index.device)
    return rows.scatter_(-1, index.unsqueeze(-1), 1.0)
