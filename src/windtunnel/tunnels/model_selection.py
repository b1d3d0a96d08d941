"""Model selection between hypothesis classes of functions on ``Z_n`` (Dalal, Misra, Parekh,
"Bayesian Wind Tunnels for Model Selection", arXiv 2607.19379).

Each sequence draws a class uniformly from the chosen ``classes``, a member ``f`` uniformly from
that class, and shows ``L`` pairs ``(x, f(x))`` as the bijection tunnel does (inputs drawn
independently of ``f``, with or without replacement). The classes (every one a permutation of
``{0..n-1}``):

- ``involution``: the fixed-point-free involutions (``n`` even; ``(n-1)!!`` members);
- ``three_cycles``: the permutations made of disjoint 3-cycles (``n`` divisible by 3);
- ``rotation``: ``x -> x + c mod n``, ``c`` in ``0..n-1``;
- ``multiplication``: ``x -> c x mod n``, ``c`` in ``1..n-1`` (``n`` prime);
- ``bijection``: every permutation (``n!``).

The exact posterior. The next answer's predictive under class ``c`` given the pairs ``D`` seen,
``q_c(y | x, D) = |C_c(D + (x, y))| / |C_c(D)|``, is in closed form for each class: a point mass
where ``D`` fixes ``f(x)`` (a seen input; an involution's seen partner; a 3-cycle's closing
arrow; a rotation's or multiplication's constant, fixed by one informative pair), else uniform
over what is left, except for a free element under ``three_cycles``, which either closes one of
the ``s`` open arrows (probability ``1/u`` each, ``u`` free elements) or starts a new cycle with
another free element (``3k / (u (u - 1))`` each, ``k = (u - s) / 3``), the counts of
completions ``u! / (k! 3^k)`` worked out in the tests against enumeration. The class posterior
is ``w_c`` proportional to ``pi_c |C_c(D)| / |C_c|``, updated after each pair by ``q_c`` of its
answer, and the next answer's posterior is ``sum_c w_c q_c``, in float64. Once the pairs rule
a class out (``q_c`` of an answer seen is 0) its weight stays 0 and its predictive is uniform: the
closed forms count completions of a state the class cannot be in. Brute-force
enumeration of every member of every class is the oracle (tests/tunnels/test_tunnel_model_selection.py).

Symbols (``symbols``): ``integer``, each value its own token; ``opaque``, each sequence draws a
relabelling ``sigma`` of the values, states it in a header and shows every value ``v`` as
``sigma(v)``, the posterior pushed through ``sigma``; ``fixed``, one relabelling (seeded by
``relabel_seed``) for every sequence and no header (the paper's control). Token layout::

    integer, fixed:  x_1 y_1 ... x_L y_L
    opaque:          ORD sigma(0) ... sigma(n-1) SEP x_1 y_1 ... x_L y_L

with input symbol ``v`` as token ``v`` and output symbol ``v`` as token ``n + v``; ``ORD`` is
token ``2n`` and ``SEP`` ``2n + 1``. The model is scored at each input on the ``n`` output
symbols.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from windtunnel.config import ConfigError, check_field_types
from windtunnel.metrics import entropy_bits
from windtunnel.tunnels.base import Episode, label_with, one_hot
from windtunnel.tunnels.random import random_permutations

__all__ = ["CLASSES", "ModelSelectionEpisode", "ModelSelectionTunnel", "class_sizes"]

#: The hypothesis classes, by name.
CLASSES = ("involution", "three_cycles", "rotation", "multiplication", "bijection")
#: The classes whose structure is arithmetic on the values (not kept by relabelling them).
ARITHMETIC = ("rotation", "multiplication")
#: Symbol modes.
SYMBOL_MODES = ("integer", "opaque", "fixed")


def _is_prime(n: int) -> bool:
    return n >= 2 and all(n % d for d in range(2, math.isqrt(n) + 1))


def class_sizes(name: str, n: int) -> int:
    """``|C|``: the members of class ``name`` on ``Z_n``."""
    if name == "involution":
        return math.prod(range(n - 1, 0, -2))
    if name == "three_cycles":
        return math.factorial(n) // (math.factorial(n // 3) * 3 ** (n // 3))
    if name == "rotation":
        return n
    if name == "multiplication":
        return n - 1
    return math.factorial(n)


@dataclass(frozen=True)
class ModelSelectionEpisode(Episode):
    """An :class:`Episode` plus the hidden class, function and relabelling.

    Attributes:
        hypothesis_class: ``[B]`` int64 index into the tunnel's ``classes``.
        mapping: ``[B, n]`` int64, ``mapping[b, x] = f_b(x)`` (integer values).
        inputs, outputs: ``[B, L]`` int64 integer values of the pairs shown.
        relabel: ``[B, n]`` int64 ``sigma`` (the identity in ``integer`` mode).
        class_posterior: ``[B, L, n_classes]`` float64 the exact class posterior before each
            pair's answer is shown (given the pairs before it).
    """

    hypothesis_class: Tensor
    mapping: Tensor
    inputs: Tensor
    outputs: Tensor
    relabel: Tensor
    class_posterior: Tensor

    def record(self, i: int) -> dict[str, Any]:
        record = super().record(i)
        for name in ("mapping", "inputs", "outputs", "relabel", "class_posterior"):
            record[name] = getattr(self, name)[i].tolist()
        record["hypothesis_class"] = int(self.hypothesis_class[i])
        return record


def _members(name: str, batch_size: int, n: int, generator: torch.Generator) -> Tensor:
    """``[B, n]`` uniformly drawn members of class ``name``."""
    device = generator.device
    x = torch.arange(n, device=device)
    if name == "rotation":
        c = torch.randint(0, n, (batch_size, 1), generator=generator, device=device)
        return (x + c) % n
    if name == "multiplication":
        c = torch.randint(1, n, (batch_size, 1), generator=generator, device=device)
        return (x * c) % n
    order = random_permutations(batch_size, n, generator=generator)  # [B, n]
    if name == "bijection":
        return order
    size = 2 if name == "involution" else 3
    groups = order.view(batch_size, n // size, size)
    # Each element maps to the next in its group, the last to the first: a matching's partner,
    # or the 3-cycle (a b c); every member arises from the same number of orders.
    images = groups.roll(-1, dims=2)
    mapping = torch.empty_like(order)
    return mapping.scatter_(1, groups.reshape(batch_size, n), images.reshape(batch_size, n))


def _class_predictive(name: str, x: Tensor, forward: Tensor, backward: Tensor, first: tuple[Tensor, Tensor] | None,
                      n: int) -> Tensor:
    """``[B, n]`` float64 ``q_c(. | x, D)`` for class ``name`` (see the module docstring).

    ``forward[b, v]`` is the answer seen for input ``v`` (-1: none), ``backward[b, v]`` the
    input seen with answer ``v`` (-1: none); ``first`` the first pair's input and answer, or
    None before any. Only meaningful while ``D`` is consistent with the class (the caller
    replaces a ruled-out class's row: see :meth:`ModelSelectionTunnel._posteriors`)."""
    B = x.shape[0]
    batch = torch.arange(B, device=x.device)
    values = torch.arange(n, device=x.device)
    known = forward[batch, x]  # [B]
    point = one_hot(known.clamp_min(0), n)  # [B, n]
    free = (forward < 0) & (backward < 0)  # [B, n]: in no pair seen

    def uniform(mask: Tensor) -> Tensor:
        mask = mask.to(torch.float64)
        return mask / mask.sum(-1, keepdim=True).clamp_min(1.0)

    if name == "bijection":
        spread = uniform(backward < 0)  # the answers not used yet
    elif name == "involution":
        partner = backward[batch, x]  # f(a) = x seen: f(x) = a
        spread = torch.where((partner >= 0)[:, None], one_hot(partner.clamp_min(0), n), uniform(free & (values != x[:, None])))
    elif name == "rotation":
        if first is None:
            spread = uniform(torch.ones(B, n, dtype=torch.bool, device=x.device))
        else:
            shift = (first[1] - first[0]) % n
            spread = one_hot((x + shift) % n, n)
    elif name == "multiplication":
        spread = _multiplication(x, forward, n)
    else:
        spread = _three_cycles(x, forward, backward, free, n)
    return torch.where((known >= 0)[:, None], point, spread)


def _multiplication(x: Tensor, forward: Tensor, n: int) -> Tensor:
    """``x -> c x mod n``: ``c`` fixed by any seen pair with a nonzero input, else uniform on ``1..n-1``."""
    values = torch.arange(n, device=x.device)
    informative = (forward >= 0) & (values != 0)  # [B, n]
    has = informative.any(-1)  # [B]
    x0 = torch.where(informative, values, n).amin(-1).clamp_max(n - 1)  # [B] a seen nonzero input
    y0 = forward.gather(1, x0[:, None])[:, 0].clamp_min(0)
    inverse = torch.tensor([pow(int(v), -1, n) if v else 0 for v in range(n)], device=x.device)
    c = (y0 * inverse[x0]) % n
    fixed = one_hot((c * x) % n, n)
    unknown = torch.where((x == 0)[:, None], one_hot(torch.zeros_like(x), n),
                          (values != 0).to(torch.float64).expand(x.shape[0], n) / (n - 1))
    return torch.where(has[:, None], fixed, unknown)


def _three_cycles(x: Tensor, forward: Tensor, backward: Tensor, free: Tensor, n: int) -> Tensor:
    """Permutations made of 3-cycles: ``f(x)`` for an ``x`` whose answer is not seen."""
    B = x.shape[0]
    batch = torch.arange(B, device=x.device)
    values = torch.arange(n, device=x.device)
    into = backward[batch, x]  # a -> x seen
    before = backward[batch, into.clamp_min(0)]  # a2 -> a -> x seen: f(x) = a2
    closes = (into >= 0) & (before >= 0)
    u = free.sum(-1).to(torch.float64)  # [B]
    # Open arrows a -> b: a has no arrow in, b has no arrow out.
    target = forward.clamp_min(0)
    open_head = (forward >= 0) & (backward < 0) & (forward.gather(1, target) < 0)  # [B, n]
    s = open_head.sum(-1).to(torch.float64)
    k = (u - s) / 3
    free_x = free & (values != x[:, None])
    # x free: close an open arrow (1/u each) or start a cycle with another free element.
    start = open_head.to(torch.float64) / u.clamp_min(1.0)[:, None] \
        + free_x.to(torch.float64) * (3 * k / (u * (u - 1)).clamp_min(1.0))[:, None]
    # x the end of one open arrow: its cycle's third element is a free one.
    third = free.to(torch.float64) / u.clamp_min(1.0)[:, None]
    return torch.where(closes[:, None], one_hot(before.clamp_min(0), n), torch.where((into >= 0)[:, None], third, start))


@dataclass(frozen=True)
class ModelSelectionTunnel:
    """Which class of functions on ``Z_n`` made the pairs, and what comes next.

    Args:
        n: the domain ``Z_n`` (``2 <= n <= 64``; each class may ask more of it).
        classes: the hypothesis classes compared (one or more of :data:`CLASSES`), uniform prior.
        L: pairs shown (the horizon; at most ``n`` without replacement).
        with_replacement: draw inputs i.i.d. uniform (they may repeat).
        symbols: ``integer``, ``opaque`` (a fresh relabelling per sequence, stated in a
            header) or ``fixed`` (one relabelling for every sequence, no header).
        relabel_seed: seeds the ``fixed`` relabelling.
    """

    name: ClassVar[str] = "model_selection"

    n: int = 6
    classes: tuple[str, ...] = ("involution", "three_cycles")
    L: int = 5
    with_replacement: bool = False
    symbols: str = "integer"
    relabel_seed: int = 0

    def __post_init__(self) -> None:
        check_field_types(self)
        if not 2 <= self.n <= 64:
            raise ConfigError(f"n={self.n} is out of range: need 2 <= n <= 64")
        if not self.classes or len(set(self.classes)) != len(self.classes):
            raise ConfigError(f"classes={list(self.classes)} must name one or more distinct classes of: {', '.join(CLASSES)}")
        for name in self.classes:
            if name not in CLASSES:
                raise ConfigError(f"classes: {name!r} is not a class; choose from: {', '.join(CLASSES)}")
        needs = {"involution": (self.n % 2 == 0, "n even"), "three_cycles": (self.n % 3 == 0, "n divisible by 3"),
                 "multiplication": (_is_prime(self.n), "n prime")}
        for name in self.classes:
            ok, what = needs.get(name, (True, ""))
            if not ok:
                raise ConfigError(f"n={self.n} does not fit class {name!r}: it needs {what}")
        if self.symbols not in SYMBOL_MODES:
            raise ConfigError(f"symbols={self.symbols!r} is not a symbol mode; choose from: {', '.join(SYMBOL_MODES)}")
        self.check_horizon(self.L, name="L")

    def check_horizon(self, horizon: int, *, name: str = "horizon") -> None:
        """Raise :class:`ConfigError` unless ``horizon`` pairs can be shown."""
        if horizon < 1:
            raise ConfigError(f"{name}={horizon} is out of range: need at least 1 pair")
        if not self.with_replacement and horizon > self.n:
            raise ConfigError(f"{name}={horizon} is out of range: without replacement at most n={self.n} distinct inputs exist")

    def describe(self) -> str:
        drawn = "with replacement" if self.with_replacement else "without replacement"
        return f"{' vs '.join(self.classes)}, {self.symbols} symbols, {drawn}"

    def label(self) -> str:
        return label_with(self, ("n", "L"))

    @property
    def _header(self) -> int:
        return self.n + 2 if self.symbols == "opaque" else 0

    @property
    def vocab_size(self) -> int:
        return 2 * self.n + 2

    @property
    def num_classes(self) -> int:
        return self.n

    @property
    def horizon(self) -> int:
        return self.L

    def seq_len(self, horizon: int | None = None) -> int:
        return self._header + 2 * (self.L if horizon is None else horizon)

    def prior_predictive(self, n_positions: int) -> Tensor:
        """``[n_positions, n]``: uniform. Every class is a set of permutations and each input is
        uniform over ``Z_n``, so each answer is too (and so is its relabelled symbol)."""
        return torch.full((n_positions, self.n), 1.0 / self.n, dtype=torch.float64)

    def sample_bytes(self, batch_size: int, horizon: int | None = None) -> int:
        """The int64 tokens, targets, inputs, outputs, mapping, relabelling and class, the float64
        posteriors, entropies and class posteriors."""
        L = self.L if horizon is None else horizon
        T = self.seq_len(L)
        return batch_size * 8 * (T + L * (4 + self.n + len(self.classes)) + 2 * self.n + 1)

    def exact_posteriors(self, inputs: Tensor, outputs: Tensor) -> tuple[Tensor, Tensor]:
        """``[B, L, n]`` the next answer's exact posterior (integer values) and ``[B, L, classes]``
        the class posterior, each before pair ``k``'s answer is shown."""
        posterior, class_posterior, _ = self._posteriors(inputs, outputs)
        return posterior, class_posterior

    def _posteriors(self, inputs: Tensor, outputs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """:meth:`exact_posteriors` and each class's own predictive ``[B, L, classes, n]``."""
        B, L = inputs.shape
        n, device = self.n, inputs.device
        batch = torch.arange(B, device=device)
        forward = torch.full((B, n), -1, dtype=torch.long, device=device)
        backward = torch.full_like(forward, -1)
        # log pi_c |C_c(D)| / |C_c|: the uniform prior times the product of the answers' q_c
        log_weight = torch.zeros(B, len(self.classes), dtype=torch.float64, device=device)
        posteriors, class_posteriors, predictives = [], [], []
        first = None
        uniform = torch.full((n,), 1.0 / n, dtype=torch.float64, device=device)
        for k in range(L):
            x, y = inputs[:, k], outputs[:, k]
            # A class the pairs have ruled out has no state its closed forms describe (a 3-cycle's
            # counts go negative once an involution's pair is seen): its weight stays 0 and its
            # predictive is the uniform stand-in, so nothing of it reaches the mixture.
            alive = log_weight > -math.inf  # [B, C]
            q = torch.stack([_class_predictive(c, x, forward, backward, first, n) for c in self.classes], 1)  # [B, C, n]
            q = torch.where(alive[..., None], q, uniform)
            weight = torch.softmax(log_weight, -1)  # [B, C]
            class_posteriors.append(weight)
            predictives.append(q)
            posteriors.append(torch.einsum("bc,bcn->bn", weight, q))
            # -inf where a class cannot give y, and from then on
            log_weight = torch.where(alive, log_weight + torch.log(q[batch, :, y]), -math.inf)
            forward[batch, x] = y
            backward[batch, y] = x
            if first is None:
                first = (x, y)
        return torch.stack(posteriors, 1), torch.stack(class_posteriors, 1), torch.stack(predictives, 1)

    def _relabelling(self, batch_size: int, generator: torch.Generator) -> Tensor:
        device = generator.device
        if self.symbols == "integer":
            return torch.arange(self.n, device=device).expand(batch_size, -1).clone()
        if self.symbols == "fixed":
            fixed = random_permutations(1, self.n, generator=torch.Generator().manual_seed(self.relabel_seed))
            return fixed.to(device).expand(batch_size, -1).clone()
        return random_permutations(batch_size, self.n, generator=generator)

    def sample(self, batch_size: int, *, generator: torch.Generator, horizon: int | None = None) -> ModelSelectionEpisode:
        """Draw ``batch_size`` classes, members and relabellings, and ``horizon`` pairs of each."""
        L = self.L if horizon is None else horizon
        self.check_horizon(L)
        B, n, device = batch_size, self.n, generator.device
        hypothesis_class = torch.randint(0, len(self.classes), (B,), generator=generator, device=device)
        members = torch.stack([_members(c, B, n, generator) for c in self.classes], 1)  # [B, C, n]
        mapping = members[torch.arange(B, device=device), hypothesis_class]  # [B, n]
        if self.with_replacement:
            inputs = torch.randint(0, n, (B, L), generator=generator, device=device)
        else:
            inputs = random_permutations(B, n, generator=generator)[:, :L]
        outputs = mapping.gather(1, inputs)
        return self._episode(hypothesis_class, mapping, inputs, outputs, self._relabelling(B, generator))

    def _episode(self, hypothesis_class: Tensor, mapping: Tensor, inputs: Tensor, outputs: Tensor,
                 relabel: Tensor) -> ModelSelectionEpisode:
        """The episode that shows the pairs ``(inputs, outputs)`` (integer values) in the symbols
        ``relabel`` (``[B, n]``, value ``v`` shown as ``relabel[b, v]``), with its exact posteriors."""
        (B, L), n, device = inputs.shape, self.n, inputs.device
        posterior, class_posterior = self.exact_posteriors(inputs, outputs)
        inverse = relabel.argsort(-1)  # sigma^-1
        posterior = posterior.gather(2, inverse[:, None, :].expand(-1, L, -1))  # P(answer symbol j) = P(y = sigma^-1(j))
        shown_in, shown_out = relabel.gather(1, inputs), relabel.gather(1, outputs)
        pairs = torch.stack([shown_in, shown_out + n], 2).reshape(B, 2 * L)
        if self.symbols == "opaque":
            header = torch.cat([torch.full((B, 1), 2 * n, device=device, dtype=torch.long), relabel,
                                torch.full((B, 1), 2 * n + 1, device=device, dtype=torch.long)], 1)
            tokens = torch.cat([header, pairs], 1)
        else:
            tokens = pairs
        return ModelSelectionEpisode(
            tokens=tokens,
            positions=torch.arange(self._header, self._header + 2 * L, 2, device=device),
            targets=shown_out,
            posterior=posterior,
            entropy_bits=entropy_bits(posterior),
            hypothesis_class=hypothesis_class,
            mapping=mapping,
            inputs=inputs,
            outputs=outputs,
            relabel=relabel,
            class_posterior=class_posterior,
        )

    @property
    def n_labels(self) -> int:
        """A relabelling permutes the ``n`` symbols."""
        return self.n

    def relabel(self, episode: ModelSelectionEpisode, permutation: Tensor) -> ModelSelectionEpisode:
        """The same pairs shown in other symbols: value ``v`` shown as ``permutation[sigma(v)]``
        (``permutation`` ``[n]`` or ``[B, n]``); in ``opaque`` mode the header states the new
        relabelling. The class posterior is unchanged and the answer's posterior is pushed
        through ``permutation``.

        That is the exact posterior of what the model reads where the header restates the
        symbols (``opaque``) or where every class is relational (``involution``,
        ``three_cycles``, ``bijection``): a relabelled member is a member of the same class
        (the classes are closed under conjugation), so the relabelled sequence is one the
        task draws as often. Elsewhere :meth:`rules_out` says why it is not."""
        if reason := self.rules_out("Relabeling"):
            raise ConfigError(f"relabeling does not apply: {reason}")
        B = episode.batch_size
        pi = permutation.to(episode.relabel.device).expand(B, self.n)
        return self._episode(episode.hypothesis_class, episode.mapping, episode.inputs, episode.outputs,
                             pi.gather(1, episode.relabel))

    def rules_out(self, capability: str) -> str | None:
        """Why this tunnel's parameters rule out a capability its class declares, or None.

        Relabeling is a symmetry of relational classes, not of arithmetic ones: relabelled, a
        rotation or a multiplication is not one, so without a header that restates the symbols
        (``integer``, ``fixed``) the relabelled pairs are not ones the task makes, and a model
        that solves the task must answer differently."""
        arithmetic = [c for c in self.classes if c in ARITHMETIC]
        if capability == "Relabeling" and arithmetic and self.symbols != "opaque":
            return (f"a relabelled {' or '.join(arithmetic)} is no longer one, and {self.symbols} symbols have no "
                    "header to restate them: the exact posterior changes, so invariance is not what a solver shows")
        return None

    def permutation_predictive(self, episode: ModelSelectionEpisode) -> Tensor:
        """``[B, P, n]`` the exact predictive of each answer symbol when the function is any
        permutation: the reference of what is known without the classes' structure."""
        every = ModelSelectionTunnel(n=self.n, classes=("bijection",), L=self.L, with_replacement=self.with_replacement)
        posterior, _ = every.exact_posteriors(episode.inputs, episode.outputs)
        inverse = episode.relabel.argsort(-1)
        return posterior.gather(2, inverse[:, None, :].expand(-1, posterior.shape[1], -1))

    why_not: ClassVar[dict[str, str]] = {
        "KnownParameters": "the function fixes every answer: the oracle that knows it has log-loss 0",
        "AttentionCategories": "which earlier pairs are evidence depends on the class: every pair bears on the class posterior",
        "ClosedFormEntropy": "the entropy depends on the pairs seen through the class posterior",
    }

    @property
    def class_names(self) -> tuple[str, ...]:
        """The hypothesis classes compared, in the order of ``class_posterior``."""
        return self.classes

    def class_posterior(self, episode: ModelSelectionEpisode) -> Tensor:
        """``[B, P, classes]`` the exact class posterior before each answer."""
        return episode.class_posterior

    def class_predictives(self, episode: ModelSelectionEpisode) -> Tensor:
        """``[B, P, classes, n]`` each class's own predictive of each answer symbol (what the
        next-answer posterior mixes with the class posterior's weights); uniform for a class the
        pairs before have ruled out."""
        _, _, predictive = self._posteriors(episode.inputs, episode.outputs)  # integer values
        inverse = episode.relabel.argsort(-1)[:, None, None, :].expand_as(predictive)
        return predictive.gather(3, inverse)  # symbol j is the value sigma^-1(j)

    def symbol_tokens(self) -> tuple[list[int], list[str]]:
        """The input symbol tokens ``0..n-1`` (answers are tokens ``n + v``)."""
        return list(range(self.n)), [f"x={v}" for v in range(self.n)]

    def hypothesis_tokens(self) -> list[int]:
        """The answer tokens ``n..2n-1``: a function fixes which answer each input gets."""
        return list(range(self.n, 2 * self.n))

    def value_positions(self, episode: Episode) -> tuple[Tensor, Tensor]:
        """The answer token right after each input."""
        return episode.positions + 1, torch.arange(len(episode.positions), device=episode.positions.device)
