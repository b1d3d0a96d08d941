"""Reading the analysis results a claim rests on, and writing its numbers as text.

:mod:`windtunnel.report.claim_measures` builds each claim's measure on these: where a
typed result is (``results[group][analysis]``, the paper's task variant first), one model's
scores at a horizon (median over seeds, each seed's own value, their range), and the
number formats of the claim table.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from windtunnel.report.claim_types import VARIANT_GROUPS, MissingResult, Results
from windtunnel.results import AnalysisResult
from windtunnel.results.generalization import HorizonScores

__all__ = ["HMM_TRANSFORMER_GROUPS", "ModelScores", "first_result", "fmt_bits", "fmt_factor", "fmt_times", "has_result", "model_scores", "models_on", "result_of", "safe_ratio", "seed_range_text", "variant_of"]



def result_of(results: Results, group: str, analysis: str) -> Any:
    """The typed result of ``analysis`` in ``group`` (a :class:`MissingResult` if absent)."""
    try:
        return results[group][analysis]
    except KeyError:
        raise MissingResult(f"{group}/{analysis}") from None


def has_result(results: Results, group: str, analysis: str) -> bool:
    return analysis in results.get(group, {})


#: Per-configuration groups of the HMM transformer, the paper's variant (floored) first.
HMM_TRANSFORMER_GROUPS = ("hmm_transformer_floor", "hmm_transformer")


def first_result(results: Results, groups: Sequence[str], analysis: str) -> Any:
    """``analysis`` of the first of ``groups`` that has it."""
    for group in groups:
        if has_result(results, group, analysis):
            return results[group][analysis]
    raise MissingResult(f"{'/'.join(groups)}: {analysis}")


def variant_of(result: AnalysisResult) -> str:
    """`` (variant)``: the task variant a saved result belongs to, in its tunnel's words ("" if it has none)."""
    return f" ({result.task_variant})" if result.task_variant else ""


@dataclass(frozen=True)
class ModelScores:
    """One model's scores on one task variant: its rows by horizon, and the variant's words."""

    horizons: Mapping[int, HorizonScores]
    variant: str
    training_horizon: int

    def metric(self, horizon: int, metric: str) -> float:
        """The median over seeds of ``metric`` (what a claim over seeds is decided on)."""
        return getattr(self.horizons[horizon], metric).median

    def per_seed(self, horizon: int, metric: str) -> list[float]:
        """Each seed's own value, in seed order, where several seeds were trained; else []."""
        runs = self.horizons[horizon].per_run
        return [getattr(run, metric) for run in runs] if len(runs) > 1 else []

    def seed_range(self, horizon: int, metric: str) -> tuple[float, float] | None:
        """``(min, max)`` over seeds where they differ, else None."""
        stats = getattr(self.horizons[horizon], metric)
        return (stats.min, stats.max) if stats.min != stats.max else None

    def prior(self, horizon: int, metric: str) -> float:
        return getattr(self.horizons[horizon].prior, metric)


def model_scores(results: Results, group: str, model: str) -> ModelScores:
    """``model``'s scores in comparison group ``group``: from its Table 1, or, where the group
    trained only that model, from its per-position analysis."""
    group_results = results.get(group, {})
    table = group_results.get("model_comparison")
    if table is not None and model in table.models:
        return ModelScores(table.models[model].horizons, table.task_variant, table.training_horizon)
    single = group_results.get("length_generalization")
    if single is not None and single.model == model:
        return ModelScores(single.horizons, single.task_variant, single.training_horizon)
    raise MissingResult(f"{group}: {model}")


def models_on(
    results: Results, tunnel: str, names: Sequence[str], groups: Sequence[str] | None = None
) -> tuple[list[ModelScores], list[list[ModelScores]]]:
    """The named models on the first of ``groups`` (default: the variant groups of ``tunnel``,
    the paper's variant first) that has all of them, and, for the text, every group's
    models found.

    Raises MissingResult when no group has them all.
    """
    complete: list[ModelScores] | None = None
    found: list[list[ModelScores]] = []
    for group in groups or VARIANT_GROUPS[tunnel]:
        models = []
        for name in names:
            try:
                models.append(model_scores(results, group, name))
            except MissingResult:
                models.append(None)
        if all(m is not None for m in models):
            complete = complete or models
        if any(m is not None for m in models):
            found.append(models)
    if complete is None:
        raise MissingResult(f"{tunnel}: {', '.join(names)}")
    return complete, found


def seed_range_text(model: ModelScores, horizon: int, metric: str) -> str:
    """``; median of the seeds, range a–b`` where several seeds were trained, for the text."""
    spread = model.seed_range(horizon, metric)
    return f"; median of the seeds, range {fmt_bits(spread[0])}–{fmt_bits(spread[1])}" if spread else ""


def fmt_bits(value: float) -> str:
    return f"{value:.2g}" if abs(value) < 0.01 else f"{value:.3g}"


def fmt_factor(value: float) -> str:
    return f"{value:.0f}x" if value >= 10 else f"{value:.2g}x"


def safe_ratio(numerator: float, denominator: float) -> float:
    """``numerator / denominator``; a perfect denominator (0) makes any error infinitely larger."""
    return numerator / denominator if denominator else math.inf


def fmt_times(numerator: float, denominator: float) -> str:
    """``numerator / denominator`` as a factor, for the text (a zero denominator is infinite)."""
    return fmt_factor(numerator / denominator) if denominator else "∞x"


