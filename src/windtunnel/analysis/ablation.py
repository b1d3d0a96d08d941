"""Layer and head ablations (the paper's Fig 3 and Fig 4).

Removing a whole layer (attention and feed-forward; the residual stream passes through)
or zeroing one attention head, and measuring how far the predictions move from the exact
posterior, relative to the intact model. Results are averaged over the runs given (the
paper uses 3 seeds) with their spread.

    from windtunnel.analysis.ablation import layer_ablation, head_ablation
    layers = layer_ablation([model_seed0, model_seed1, model_seed2], eval_set)
    layers["layers"][0]["mae_ratio"]      # mean over seeds of ablated / intact mae_bits
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

from windtunnel.analysis.base import Run, check_same_architecture, eval_set_for, register, summarize
from windtunnel.evaluation import METRICS as _METRICS
from windtunnel.evaluation import EvalSet, evaluate, model_predictor

__all__ = ["head_ablation", "layer_ablation"]


def _scores(model: nn.Module, eval_set: EvalSet, interventions: Mapping[str, Any] | None = None) -> dict[str, float]:
    result = evaluate(model_predictor(model, interventions=interventions), eval_set, references=False)
    return {name: result[name] for name in _METRICS}


def _ablate(models: Sequence[nn.Module], eval_set: EvalSet, interventions: Mapping[str, Any], intact: list[dict]) -> dict[str, Any]:
    ablated = [_scores(model, eval_set, interventions) for model in models]
    row: dict[str, Any] = {name: summarize([a[name] for a in ablated]) for name in _METRICS}
    # Ratios are taken per run, then averaged: each seed is compared with itself.
    row["ratios"] = {name: summarize([a[name] / i[name] for a, i in zip(ablated, intact)]) for name in _METRICS}
    row["mae_ratio"], row["mae_ratio_std"] = row["ratios"]["mae_bits"]["mean"], row["ratios"]["mae_bits"]["std"]
    row["kl_ratio"] = row["ratios"]["kl_bits"]["mean"]
    row["per_run"] = ablated
    return row


def layer_ablation(models: Sequence[nn.Module], eval_set: EvalSet) -> dict[str, Any]:
    """Remove each layer whole, one at a time.

    Returns:
        ``intact`` (metrics averaged over runs), and ``layers``: for each layer its metrics
        (mean and spread over runs), ``ratios`` to the intact model per metric (each run
        against itself, then mean and spread), ``mae_ratio``/``kl_ratio`` (their means) and
        ``per_run`` (each run's ablated metrics); ``intact_per_run``: each run's intact
        metrics (with a layer's ``per_run``, each seed's own ratios).
    """
    check_same_architecture(models, "ablation")
    intact = [_scores(model, eval_set) for model in models]
    layers = []
    for layer in range(models[0].n_layers):
        layers.append({"layer": layer, **_ablate(models, eval_set, {"skip_layers": [layer]}, intact)})
    return {
        "runs": len(models),
        "intact": {name: summarize([i[name] for i in intact]) for name in _METRICS},
        "intact_per_run": intact,
        "layers": layers,
    }


def head_ablation(models: Sequence[nn.Module], eval_set: EvalSet) -> dict[str, Any]:
    """Zero each attention head, one at a time.

    Returns:
        ``intact``, ``heads`` (one row per head with its metrics and ratios), ``mae_ratio``
        as a ``[layer][head]`` grid of ratios averaged over runs by head index (None where a
        layer has no attention; for the figure), ``most_destructive``: the head of that grid
        whose removal raises ``mae_bits`` most, and ``per_run``: each run's own ranking
        (``worst`` and ``second`` head with ``delta_mae_bits`` and ``mae_ratio``, and
        ``top_over_second``: the worst head's ΔMAE over the second's, None when the second's
        is not positive).
    """
    check_same_architecture(models, "ablation")
    heads_by_layer = models[0].attention_heads
    if not heads_by_layer:
        raise ValueError("head ablation needs a model with attention")
    intact = [_scores(model, eval_set) for model in models]
    rows = []
    for layer, n_heads in sorted(heads_by_layer.items()):
        for head in range(n_heads):
            rows.append({"layer": layer, "head": head, **_ablate(models, eval_set, {"mask_heads": {layer: [head]}}, intact)})
    n_heads = max(heads_by_layer.values())
    grid: list[list[float | None]] = [[None] * n_heads for _ in range(models[0].n_layers)]
    for row in rows:
        grid[row["layer"]][row["head"]] = row["mae_ratio"]
    worst = max(rows, key=lambda r: r["mae_ratio"])
    return {
        "runs": len(models),
        "intact": {name: summarize([i[name] for i in intact]) for name in _METRICS},
        "heads": rows,
        "mae_ratio": grid,
        "most_destructive": {"layer": worst["layer"], "head": worst["head"], "mae_ratio": worst["mae_ratio"]},
        "per_run": [_ranking(rows, run, intact[run]) for run in range(len(models))],
    }


def _ranking(rows: Sequence[dict[str, Any]], run: int, intact: Mapping[str, float]) -> dict[str, Any]:
    """One run's heads ranked by how much their removal raises its ``mae_bits`` (the authors'
    later protocol: ΔMAE per head, the top against the second). Heads do not line up across
    seeds, so the ranking is per run, never by head index over runs."""

    def entry(row: Mapping[str, Any]) -> dict[str, Any]:
        ablated = row["per_run"][run]["mae_bits"]
        return {
            "layer": row["layer"],
            "head": row["head"],
            "delta_mae_bits": ablated - intact["mae_bits"],
            "mae_ratio": ablated / intact["mae_bits"],
        }

    ranked = sorted((entry(row) for row in rows), key=lambda e: -e["delta_mae_bits"])
    top, second = ranked[0], ranked[1] if len(ranked) > 1 else None
    top_over_second = None
    if second is not None and second["delta_mae_bits"] > 0:
        top_over_second = top["delta_mae_bits"] / second["delta_mae_bits"]
    return {"intact_mae_bits": intact["mae_bits"], "worst": top, "second": second, "top_over_second": top_over_second}


@register("layer_ablation")
def layer_ablation_of_runs(runs: Sequence[Run]) -> dict[str, Any]:
    """Fig 3: each layer removed whole, error ratio to the intact model, averaged over seeds."""
    return layer_ablation([r.model for r in runs], eval_set_for(runs[0].config))


@register("head_ablation", needs_attention=True)
def head_ablation_of_runs(runs: Sequence[Run]) -> dict[str, Any]:
    """Fig 4: each head zeroed, heat map of error ratios, the most destructive head."""
    return head_ablation([r.model for r in runs], eval_set_for(runs[0].config))
