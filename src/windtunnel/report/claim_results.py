"""Reading the analysis results a claim rests on, and writing its numbers as text.

:mod:`windtunnel.report.claim_measures` builds each claim's measure on these: where a
result is (``results[group][analysis]``, the paper's task variant first), one model's
scores at a horizon (median over seeds, each seed's own value, their range), and the
number formats of the claim table.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from windtunnel.report.claim_types import VARIANT_GROUPS, MissingResult, Results, median_of

__all__ = ["HMM_TRANSFORMER_GROUPS", "ModelScores", "first_result", "fmt_bits", "fmt_factor", "fmt_times", "has_result", "model_scores", "models_on", "result_of", "safe_ratio", "seed_range_text", "variant_name", "variant_of"]



def result_of(results: Results, group: str, analysis: str) -> Mapping[str, Any]:
    try:
        return results[group][analysis]
    except KeyError:
        raise MissingResult(f"{group}/{analysis}") from None


def has_result(results: Results, group: str, analysis: str) -> bool:
    return analysis in results.get(group, {})


#: Per-configuration groups of the HMM transformer, the paper's variant (floored) first.
HMM_TRANSFORMER_GROUPS = ("hmm_transformer_floor", "hmm_transformer")


def first_result(results: Results, groups: Sequence[str], analysis: str) -> Mapping[str, Any]:
    """``analysis`` of the first of ``groups`` that has it."""
    for group in groups:
        if has_result(results, group, analysis):
            return results[group][analysis]
    raise MissingResult(f"{'/'.join(groups)}: {analysis}")


def variant_of(result: Mapping[str, Any]) -> str:
    """`` (variant)`` of a saved result (the runner records the runs' tunnel), for the text."""
    return f" ({variant_name(result['tunnel'])})" if "tunnel" in result else ""


def variant_name(tunnel: Mapping[str, Any]) -> str:
    """The task variant of a tunnel's parameters, in words (what a number belongs to)."""
    if tunnel["name"] == "bijection":
        return "with replacement" if tunnel.get("with_replacement") else "without replacement"
    if tunnel["name"] == "hmm":
        floor = tunnel.get("floor", 0.0)
        words = [f"floor {floor:g}" if floor else "no floor", f"grid {tunnel['grid']:g}"]
        # the rarer departures are named only where present, so the usual variants read as before
        if tunnel.get("concentration", 1.0) != 1.0:
            words.append(f"concentration {tunnel['concentration']:g}")
        if tunnel.get("transition_concentration") is not None:
            words.append(f"T concentration {tunnel['transition_concentration']:g}")
        if tunnel.get("stickiness", 0.0):
            words.append(f"stickiness {tunnel['stickiness']:g}")
        return ", ".join(words)
    return tunnel["name"]


@dataclass(frozen=True)
class ModelScores:
    """One model's scores on one task variant: ``horizons[str(h)][metric]``, prior rows."""

    horizons: Mapping[str, Any]
    variant: str
    training_horizon: int

    def metric(self, horizon: int, metric: str) -> float:
        """The median over seeds (:func:`~windtunnel.report.claim_types.median_of`)."""
        return median_of(self.horizons[str(horizon)][metric])

    def per_seed(self, horizon: int, metric: str) -> list[float]:
        """Each seed's own value, in seed order, where several seeds were trained; else []."""
        runs = self.horizons[str(horizon)].get("per_run") or []
        return [run[metric] for run in runs] if len(runs) > 1 else []

    def seed_range(self, horizon: int, metric: str) -> tuple[float, float] | None:
        """``(min, max)`` over seeds where there are several, else None."""
        stats = self.horizons[str(horizon)][metric]
        return (stats["min"], stats["max"]) if "min" in stats and stats["min"] != stats["max"] else None

    def prior(self, horizon: int, metric: str) -> float:
        return self.horizons[str(horizon)]["prior"][metric]


def model_scores(results: Results, group: str, model: str) -> ModelScores:
    """``model``'s scores in comparison group ``group``: from its Table 1, or, where the group
    trained only that model, from its per-position analysis."""
    group_results = results.get(group, {})
    if "model_comparison" in group_results and model in group_results["model_comparison"]["models"]:
        table = group_results["model_comparison"]
        return ModelScores(table["models"][model]["horizons"], variant_name(table["tunnel"]), table["training_horizon"])
    if "length_generalization" in group_results and group_results["length_generalization"]["model"] == model:
        single = group_results["length_generalization"]
        return ModelScores(single["horizons"], variant_name(single["tunnel"]), single["training_horizon"])
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


