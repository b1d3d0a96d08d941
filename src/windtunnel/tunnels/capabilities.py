"""What a tunnel may know about itself beyond the :class:`~windtunnel.tunnels.base.Tunnel`
contract: optional capabilities, each a method the tunnel class defines or not.

Every analysis runs on any tunnel that keeps the contract (token ids in, exact posteriors
out). Some need task knowledge on top: which tokens are the symbols whose keys are compared,
how the keys a query sees divide into evidence and the rest, whether hidden states can be
relabeled, whether the exact entropy has a closed form. A tunnel declares such knowledge by
defining the capability's members; an analysis that needs it asks :func:`lacks`, which says
in one line why the analysis does not apply (with the tunnel's own reason where it gives
one in ``why_not``), instead of crashing or testing the tunnel's class.

    >>> from windtunnel.tunnels import make_tunnel
    >>> from windtunnel.tunnels.capabilities import Relabeling, lacks
    >>> lacks(make_tunnel("hmm"), Relabeling) is None
    True
    >>> print(lacks(make_tunnel("bijection"), Relabeling))
    the bijection tunnel does not declare Relabeling (hidden-state labels that can be permuted): it would define n_labels and relabel
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol, runtime_checkable

from torch import Tensor

from windtunnel.tunnels.base import Episode

__all__ = [
    "AttentionCategories",
    "CAPABILITIES",
    "ClosedFormEntropy",
    "HypothesisClasses",
    "HypothesisTokens",
    "KnownParameters",
    "NextSymbolPredictive",
    "PermutationReference",
    "PositionWiseFloor",
    "Relabeling",
    "SymbolTokens",
    "ValueInputs",
    "ValuePositions",
    "capabilities_of",
    "declares",
    "lacks",
    "value_dim_of",
]


@runtime_checkable
class SymbolTokens(Protocol):
    """The token ids that stand for the task's symbols, whose keys are compared for
    orthogonality (the bijection's inputs, the HMM's observation symbols)."""

    def symbol_tokens(self) -> tuple[list[int], list[str]]:
        """The token ids, and a label for each (``"x=3"``)."""


@runtime_checkable
class HypothesisTokens(Protocol):
    """The token ids that name the hypotheses (the bijection's outputs: a hypothesis fixes
    which output each input maps to), for the authors' later key measure."""

    def hypothesis_tokens(self) -> list[int]:
        """The token ids."""


@runtime_checkable
class AttentionCategories(Protocol):
    """How the keys a supervised query sees divide into kinds, one of them the evidence that
    fixes the exact posterior (query-key sharpening, Fig 15)."""

    #: Each category's meaning, in words (the report prints them).
    category_meanings: ClassVar[dict[str, str]]

    def attention_categories(self, episode: Episode) -> dict[str, Tensor]:
        """``{category: [B, P, T] bool}``: for query ``positions[p]`` of sequence ``b``, which
        keys ``t`` are of that kind; the categories partition the causal keys ``t <= positions[p]``
        (every such key is in exactly one). One category is named ``"evidence"`` where the task
        has evidence a query should find."""


@runtime_checkable
class Relabeling(Protocol):
    """A permutation of hidden-state labels that keeps the posterior's meaning (Fig 8): the
    relabeled sequences have the same observations and the permuted exact posterior."""

    @property
    def n_labels(self) -> int:
        """How many labels a permutation acts on."""

    def relabel(self, episode: Any, permutation: Tensor) -> Episode:
        """The same sequences under ``permutation`` (``[n_labels]`` or ``[B, n_labels]``)."""


@runtime_checkable
class ClosedFormEntropy(Protocol):
    """The exact entropy at each supervised position is the same for every sequence and
    known in closed form (the bijection without replacement: ``log2(V - k + 1)``)."""

    def closed_form_entropy_bits(self, n_positions: int) -> list[float] | None:
        """``[n_positions]`` the curve, or None where this tunnel's parameters give none."""


@runtime_checkable
class ValuePositions(Protocol):
    """Each supervised position's answer is shown later in the sequence, at a position the
    tunnel can name (the bijection's output token right after its input): the value tokens
    whose representation the authors' value-manifold measure reads."""

    def value_positions(self, episode: Episode) -> tuple[Tensor, Tensor]:
        """``[P']`` the positions holding an answer, and ``[P']`` the index into
        ``episode.positions`` of the supervised position each answers."""


@runtime_checkable
class KnownParameters(Protocol):
    """The predictive of an oracle that knows each sequence's hidden parameters (a Markov
    chain's true rows), not only the prior over them: the reference of the loss gap the
    in-context learning literature reports (the model's log-loss over that oracle's)."""

    def parameter_predictive(self, episode: Episode) -> Tensor:
        """``[B, P, C]`` float64: the next class's distribution given the episode's own
        parameters and the tokens before each supervised position."""


@runtime_checkable
class NextSymbolPredictive(Protocol):
    """The exact predictive of the symbol shown next after each supervised position, from any
    predictive of the tunnel's own classes: what a model that only predicts the next token (a
    pretrained language model reading the tunnel as text) is scored against. The bijection's
    classes are already the next symbol (the output after ``x_k``); the HMM's are hidden
    states, whose filtering posterior the header's ``T`` and ``E`` carry one step ahead."""

    def next_symbol_predictive(self, episode: Episode, posterior: Tensor | None = None) -> Tensor:
        """``[B, P, M]`` float64: the distribution of the next symbol at each supervised
        position, given ``posterior`` ``[B, P, C]`` over the tunnel's classes (default: the
        episode's exact posterior, which gives the exact next-symbol predictive)."""


@runtime_checkable
class PositionWiseFloor(Protocol):
    """The exact predictive given only what a model that mixes no positions reads at each
    supervised position (its token, its values, its position), in closed form: the floor of
    the attention-free MLP control, which the context-free prior is not where the current
    token is itself evidence (a Dirichlet symbol, a Kalman observation)."""

    def position_wise_predictive(self, episode: Episode) -> Tensor:
        """``[B, P, C]`` float64: the next class's distribution given the token (and values) at
        each supervised position alone."""


@runtime_checkable
class PermutationReference(Protocol):
    """Its hypotheses are permutations of the answers (model selection): the exact predictive
    when the class is every permutation is the reference of what a reader knows from the
    answers being distinct alone, without the classes' structure. A model whose error sits
    there has learned nothing of the class (opaque arithmetic); one at the exact posterior has
    used all of it."""

    def permutation_predictive(self, episode: Episode) -> Tensor:
        """``[B, P, C]`` float64: the exact predictive of each answer when the function is any
        permutation (point masses on seen inputs, else uniform over the unused answers)."""


@runtime_checkable
class HypothesisClasses(Protocol):
    """Its hypotheses come in classes (model selection): the exact class posterior before each
    answer, and each class's own predictive, which the answer's posterior mixes."""

    @property
    def class_names(self) -> tuple[str, ...]:
        """The classes, in the order of the class axis."""

    def class_posterior(self, episode: Episode) -> Tensor:
        """``[B, P, K]`` float64: the exact class posterior before each supervised answer."""

    def class_predictives(self, episode: Episode) -> Tensor:
        """``[B, P, K, C]`` float64: each class's predictive of the answer."""


@runtime_checkable
class ValueInputs(Protocol):
    """Its observations are real numbers the model reads as values through a linear read-in
    beside the tokens (the Kalman tunnel's ``y_t``): every episode carries ``values``
    ``[B, T, value_dim]``, and every model built for the tunnel gets the read-in."""

    @property
    def value_dim(self) -> int:
        """Values per position (``>= 1``)."""


#: Every capability: what it says of a task, and the members a tunnel defines to declare it.
CAPABILITIES: dict[type, tuple[str, tuple[str, ...]]] = {
    SymbolTokens: ("which tokens are its symbols", ("symbol_tokens",)),
    HypothesisTokens: ("which tokens name its hypotheses", ("hypothesis_tokens",)),
    AttentionCategories: ("which keys are evidence for a query", ("category_meanings", "attention_categories")),
    Relabeling: ("hidden-state labels that can be permuted", ("n_labels", "relabel")),
    ClosedFormEntropy: ("a closed-form exact entropy curve", ("closed_form_entropy_bits",)),
    ValuePositions: ("where each answer is shown", ("value_positions",)),
    KnownParameters: ("the predictive given its hidden parameters", ("parameter_predictive",)),
    NextSymbolPredictive: ("the predictive of the next symbol shown", ("next_symbol_predictive",)),
    HypothesisClasses: ("hypothesis classes with an exact class posterior", ("class_names", "class_posterior", "class_predictives")),
    PositionWiseFloor: ("the predictive given one position's token alone", ("position_wise_predictive",)),
    PermutationReference: ("the predictive when the hypothesis is any permutation", ("permutation_predictive",)),
    ValueInputs: ("observations read as values", ("value_dim",)),
}


def declares(tunnel: object, capability: type) -> bool:
    """Whether ``tunnel`` (a tunnel or a tunnel class) defines every member of ``capability``."""
    return all(hasattr(tunnel, member) for member in CAPABILITIES[capability][1])


def capabilities_of(tunnel: object) -> list[str]:
    """The names of the capabilities ``tunnel`` (a tunnel or a tunnel class) declares."""
    return [capability.__name__ for capability in CAPABILITIES if declares(tunnel, capability)]


def lacks(tunnel: object, capability: type) -> str | None:
    """None if ``tunnel`` declares ``capability``, else one line saying why not.

    A tunnel may explain an absence in its class attribute ``why_not`` (``{capability name:
    reason}``), e.g. why the HMM has no hypothesis tokens; otherwise the line names what the
    tunnel would have to define. A tunnel whose own parameters rule out a capability its class
    declares (model selection: relabeling where the symbols carry arithmetic and no header
    restates them) says why in its method ``rules_out(capability name) -> str | None``.
    """
    name = getattr(tunnel, "name", type(tunnel).__name__)
    if declares(tunnel, capability):
        rules_out = getattr(tunnel, "rules_out", None)
        reason = rules_out(capability.__name__) if rules_out is not None and not isinstance(tunnel, type) else None
        return f"the {name} tunnel has no {capability.__name__} here: {reason}" if reason else None
    reason = getattr(tunnel, "why_not", {}).get(capability.__name__)
    if reason:
        return f"the {name} tunnel has no {capability.__name__}: {reason}"
    says, members = CAPABILITIES[capability]
    return f"the {name} tunnel does not declare {capability.__name__} ({says}): it would define {' and '.join(members)}"


def value_dim_of(tunnel: object) -> int:
    """The values per position ``tunnel``'s episodes carry beside their tokens (0: tokens only)."""
    return tunnel.value_dim if declares(tunnel, ValueInputs) else 0
