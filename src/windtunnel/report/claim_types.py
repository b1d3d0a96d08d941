"""What a claim is made of: the paper's side, ours, the criterion, and the verdict.

:mod:`windtunnel.report.claims` lists the claims; :mod:`windtunnel.report.claim_measures`
reads each claim's numbers out of the analysis results.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from windtunnel.results import AnalysisResult

__all__ = [
    "PAPER_METRIC", "VARIANT_GROUPS", "Claim", "Measured", "MissingResult", "Paper", "Results", "Values", "Verdict",
]

#: ``{group: {analysis: typed result}}``, as :func:`windtunnel.report.folder.load_results` reads a folder.
Results = Mapping[str, Mapping[str, AnalysisResult]]
Values = Mapping[str, Any]

#: The metric the paper's numbers are in, by tunnel.
PAPER_METRIC = {"bijection": "mae_aggregate_bits", "hmm": "kl_bits"}

#: Comparison groups of each tunnel, the paper's task variant first (see ``studies.GROUPS``):
#: the authors sample bijection inputs with replacement, and floor every HMM entry at 0.05.
VARIANT_GROUPS = {"bijection": ("bijection_with_replacement", "bijection"), "hmm": ("hmm_floor", "hmm")}


class MissingResult(LookupError):
    """An analysis result a claim reads is not among the results: the claim is "n/a"."""


@dataclass(frozen=True)
class Paper:
    """What the paper reports for a claim.

    Attributes:
        number: the paper's number, naming its metric and task variant.
        values: the same number(s) in the form the claim's criterion reads, where the paper
            or the authors' code publish one; None where the paper states the claim in words.
        authors_fail: where the authors' own results fail the claim as the paper states it,
            that result with its number (then the criterion must fail ``values``).
    """

    number: str
    values: Values | None = None
    authors_fail: str | None = None


@dataclass(frozen=True)
class Measured:
    """Our side of a claim.

    Attributes:
        values: what the criterion reads (over seeds: their median).
        ours: our number under the paper's metric, naming the task variant it is on.
        stricter: our stricter (or otherwise different) measure where it differs; "" if none.
        per_seed: the same values from each seed's run alone, in seed order, where several
            seeds were trained and the claim's number is one per run; () otherwise. A
            verdict on the median can hide a seed that fails: these show it.
    """

    values: Values
    ours: str
    stricter: str = ""
    per_seed: tuple[Values, ...] = ()


@dataclass(frozen=True)
class Claim:
    """One row of the claim table: what the paper says, its number, and how we decide."""

    key: str
    claim: str
    paper: Paper
    criterion: str
    measure: Callable[[Results], Measured]
    judge: Callable[[Values], bool]

    def paper_holds(self) -> bool | None:
        """The criterion applied to the paper's own numbers (None: the paper gives none)."""
        return None if self.paper.values is None else bool(self.judge(self.paper.values))


@dataclass(frozen=True)
class Verdict:
    """A claim evaluated on one set of results; ``measured`` is None when its analysis is absent."""

    claim: Claim
    measured: Measured | None
    holds: bool | None = field(default=None)
    seeds: tuple[bool, ...] = ()  # the criterion on each of Measured.per_seed

    @property
    def seed_split(self) -> str:
        """``"2 of 3 seeds hold"`` where each seed was judged on its own, else ""."""
        if len(self.seeds) < 2:
            return ""
        held = sum(self.seeds)
        return f"{held} of {len(self.seeds)} seeds hold" if held != 1 else f"1 of {len(self.seeds)} seeds holds"

    @property
    def ours(self) -> str:
        return self.measured.ours if self.measured else "n/a (analysis missing)"

    @property
    def stricter(self) -> str:
        return self.measured.stricter if self.measured else ""
