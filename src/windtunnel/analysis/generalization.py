"""Beyond the training distribution and against the controls (Fig 6, 8, 9, 10, 11; Table 1).

- ``length_generalization``: per-position error at every evaluation horizon, with the
  training horizon marked (Fig 6);
- ``relabeling``: per-sequence error before and after a random permutation of the hidden
  states (Fig 8; HMM);
- ``model_comparison``: Table 1, every model at every horizon, and the per-position
  curves of each (Fig 10: the MLP control's flat error);
- ``late_attention``: the transformer without attention in its last layers against the
  full one, as a degradation factor per horizon (Fig 9);
- ``seeds``: per-position curves of every seed overlaid, and the spread between seeds
  against the gap to the MLP control (Fig 11).

Every model is evaluated once per horizon on the tunnel's fixed held-out set
(:func:`~windtunnel.analysis.base.scores_at`), so the analyses agree with each other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from windtunnel.analysis.base import Run, by_configuration, eval_set_for, register, scores_at, summarize
from windtunnel.evaluation import METRICS, model_predictor, score_relabeling
from windtunnel.tunnels.base import primitive_of
from windtunnel.tunnels.capabilities import Relabeling, lacks

__all__ = ["length_generalization", "late_attention", "model_comparison", "relabeling", "seeds"]

#: Table 1's columns: the per-sequence error first (the headline number), then the paper's.
TABLE1_METRICS = ("mae_bits", "mae_aggregate_bits", "kl_bits")

#: Per-position curves carried into results (see ``evaluation.score``).
CURVES = ("abs_error_bits", "kl_bits", "model_entropy_bits", "bayes_entropy_bits")


def _mean_curves(scores: Sequence[dict[str, Any]]) -> dict[str, list[float]]:
    """Per-position curves averaged over runs."""
    return {
        name: torch.tensor([s["curves"][name] for s in scores], dtype=torch.float64).mean(0).tolist() for name in CURVES
    }


def _horizon_summary(runs: Sequence[Run], horizon: int) -> dict[str, Any]:
    """Metrics at one horizon, mean and spread over the runs, with curves and the prior row."""
    scores = [scores_at(run, horizon) for run in runs]
    summary: dict[str, Any] = {metric: summarize([s[metric] for s in scores]) for metric in METRICS}
    # Each run's 95% bootstrap interval over sequences rides along: with one seed it is the interval.
    summary["per_run"] = [
        {**{metric: s[metric] for metric in METRICS}, **{f"{m}_ci": s[f"{m}_ci"] for m in METRICS if f"{m}_ci" in s}}
        for s in scores
    ]
    summary["prior"] = {metric: scores[0]["prior"][metric] for metric in METRICS}
    summary["curves"] = _mean_curves(scores)
    if "position_wise" in scores[0]:  # the tunnel's closed-form floor of a model that mixes no positions
        summary["position_wise"] = {metric: scores[0]["position_wise"][metric] for metric in METRICS}
    if "permutation" in scores[0]:  # what the answers being distinct alone tell (model selection)
        summary["permutation"] = {metric: scores[0]["permutation"][metric] for metric in METRICS}
    return summary


def _attention_less_layers(run: Run) -> list[int]:
    """The layers of the run's model built without attention, in order."""
    return [layer for layer in range(run.model.n_layers) if layer not in run.model.attention_heads]


def _is_full_transformer(run: Run) -> bool:
    """The plain model of the studied family (the full transformer), the reference of the comparisons."""
    return run.role == "subject" and not run.key.variant


def _is_late_attention_off(run: Run) -> bool:
    """A variant of the studied family without attention in some layers (Fig 9's model)."""
    return run.role == "subject" and bool(run.key.variant) and bool(_attention_less_layers(run))


def _mean_over(curve: Sequence[float], start: int, stop: int) -> float | None:
    """Mean of ``curve`` over positions ``start < t <= stop`` (positions count from 1)."""
    window = curve[max(start, 0) : stop]
    return sum(window) / len(window) if window else None


#: Positions on each side of the training horizon whose steps the boundary step is compared with.
BOUNDARY_WINDOW = 5

#: The per-position curve of each metric (``evaluation.score``'s ``curves``).
METRIC_CURVES = {"mae_bits": "abs_error_bits", "kl_bits": "kl_bits"}


def boundary_step(curve: Sequence[float], trained: int, window: int = BOUNDARY_WINDOW) -> dict[str, float | None]:
    """How the error changes across the training horizon, against how it changes nearby.

    ``curve[i]`` is the error at position ``t = i + 1``. The boundary step is
    ``curve(K + 1) - curve(K)``; its neighbors are the steps between consecutive positions
    among the ``window`` positions before ``K`` and the ``window`` after ``K + 1``. A break
    at the horizon is a boundary step far larger than any neighbor; a smooth drift (even
    one that starts at ``K``) has a boundary step like the steps after it.

    Returns:
        ``step``, ``largest_neighbor_step`` (the largest |step| among the neighbors) and
        ``ratio`` (step over it; None when there is no neighbor or it is 0).
    """
    steps = [b - a for a, b in zip(curve[:-1], curve[1:])]  # steps[i]: t = i + 1 -> i + 2
    if trained < 1 or trained >= len(curve):
        raise ValueError(f"the curve of {len(curve)} positions does not extend past the training horizon {trained}")
    neighbors = steps[max(trained - 1 - window, 0) : trained - 1] + steps[trained : trained + window]
    largest = max((abs(x) for x in neighbors), default=0.0)
    step = steps[trained - 1]
    return {"step": step, "largest_neighbor_step": largest, "ratio": step / largest if largest > 0 else None}


def _beyond(curves: Mapping[str, Sequence[float]], trained: int, horizon: int) -> dict[str, Any]:
    """Per metric with a curve: mean error within and beyond training, and the boundary step."""
    return {
        metric: {
            "within_training": _mean_over(curves[name], 0, trained),
            "beyond_training": _mean_over(curves[name], trained, horizon),
            "boundary": boundary_step(curves[name], trained),
        }
        for metric, name in METRIC_CURVES.items()
    }


@register("length_generalization")
def length_generalization(runs: Sequence[Run]) -> dict[str, Any]:
    """Fig 6: per-position error at each evaluation horizon, the training horizon marked.

    Returns:
        ``model``, ``training_horizon``; ``horizons``: for each
        horizon (a string key), the metrics (``mean``/``std`` over runs), ``per_run``
        metrics, the ``prior`` row, the run-averaged ``curves`` (position t = index + 1),
        and, for horizons beyond training: per metric with a curve (``mae_bits``,
        ``kl_bits``) in ``beyond``: ``within_training`` and ``beyond_training`` (mean
        per-position error for t <= and t > the training horizon) and ``boundary``
        (:func:`boundary_step`), also in each run's ``per_run`` row from its own curves; and, as before, ``within_training_mae_bits``,
        ``beyond_training_mae_bits`` and ``jump_at_training_horizon`` (mean |ΔH| over the
        5 positions after the training horizon over that of the 5 before).
    """
    config = runs[0].config
    trained = config.tunnel.horizon
    horizons: dict[str, Any] = {}
    for horizon in config.horizons:
        summary = _horizon_summary(runs, horizon)
        curve = summary["curves"]["abs_error_bits"]
        if horizon > trained:
            before, after = _mean_over(curve, trained - 5, trained), _mean_over(curve, trained, trained + 5)
            summary["within_training_mae_bits"] = _mean_over(curve, 0, trained)
            summary["beyond_training_mae_bits"] = _mean_over(curve, trained, horizon)
            summary["jump_at_training_horizon"] = after / before if before else None
            summary["beyond"] = _beyond(summary["curves"], trained, horizon)
            for run, row in zip(runs, summary["per_run"]):  # each seed's own curve, for its own verdict
                row["beyond"] = _beyond(scores_at(run, horizon)["curves"], trained, horizon)
        horizons[str(horizon)] = summary
    return {
        "model": runs[0].configuration.name,
        "n_runs": len(runs),
        "training_horizon": trained,
        "horizons": horizons,
    }


def _has_relabel(runs: Sequence[Run]) -> str | None:
    return lacks(runs[0].config.tunnel, Relabeling)


@register("relabeling", requires=_has_relabel)
def relabeling(runs: Sequence[Run]) -> dict[str, Any]:
    """Fig 8: per-sequence error before vs after a random relabeling of the hidden states.

    The relabeled sequence has the same observations and the same exact posterior over
    the next observation; only the header (T, E) is written in another state order. A
    model that filters, rather than memorizing state identities, keeps ΔMAE ≈ 0.

    Returns:
        ``per_run``: for each run ``mae_bits_before``/``after``, ``delta_mae_bits`` and its
        95% interval ``delta_mae_bits_ci``; ``delta_mae_bits``: mean/std over runs;
        ``relative_change``: |mean ΔMAE| / mean MAE before; and ``scatter``: the first
        run's per-sequence ``before``/``after`` values.
    """
    per_run, scatter = [], {}
    for run in runs:
        config = run.config
        result = score_relabeling(
            model_predictor(run.model), eval_set_for(config), config.tunnel, seed=config.eval.seed, bootstrap=config.eval.bootstrap
        )
        if not scatter:
            scatter = {"before": result["per_sequence_before"], "after": result["per_sequence_after"]}
        per_run.append({k: v for k, v in result.items() if not k.startswith("per_sequence")})
    delta = summarize([r["delta_mae_bits"] for r in per_run])
    before = summarize([r["mae_bits_before"] for r in per_run])
    return {
        "model": runs[0].configuration.name,
        "n_runs": len(runs),
        "per_run": per_run,
        "mae_bits_before": before,
        "mae_bits_after": summarize([r["mae_bits_after"] for r in per_run]),
        "delta_mae_bits": delta,
        "relative_change": abs(delta["mean"]) / before["mean"] if before["mean"] else None,
        "scatter": scatter,
    }


def _several_models(runs: Sequence[Run]) -> str | None:
    if len(by_configuration(runs)) < 2:
        return "it compares models, and these runs are all one configuration"
    return None


@register("model_comparison", scope="comparison", requires=_several_models)
def model_comparison(runs: Sequence[Run]) -> dict[str, Any]:
    """Table 1 and Fig 10: every model at every horizon, and its per-position error.

    Returns:
        ``horizons``; ``primitive``: the inference primitive the tunnel declares (or None);
        ``models``: for each configuration, ``n_runs``, ``n_parameters`` and per horizon its
        metrics (each run's with its 95% bootstrap interval over sequences), prior row and
        curves (as in ``length_generalization``); ``ratios``: for
        each configuration other than the full transformer, its ``mae_bits`` and
        ``kl_bits`` divided by the transformer's, per horizon; ``markdown``: Table 1.
    """
    groups = {configuration.name: group for configuration, group in by_configuration(runs).items()}
    horizons = runs[0].config.horizons
    models = {
        name: {
            "n_runs": len(group),
            "n_parameters": sum(p.numel() for p in group[0].model.parameters()),
            "horizons": {str(h): _horizon_summary(group, h) for h in horizons},
        }
        for name, group in groups.items()
    }
    ratios: dict[str, Any] = {}
    reference = next((name for name, group in groups.items() if _is_full_transformer(group[0])), None)
    if reference is not None:
        for name in models:
            if name == reference:
                continue
            ratios[name] = {
                str(h): {
                    metric: models[name]["horizons"][str(h)][metric]["median"] / models[reference]["horizons"][str(h)][metric]["median"]
                    for metric in ("mae_bits", "kl_bits")
                }
                for h in horizons
            }
    return {
        "horizons": list(horizons),
        "training_horizon": runs[0].config.tunnel.horizon,
        "primitive": primitive_of(runs[0].config.tunnel),
        "reference": reference,
        "models": models,
        "ratios": ratios,
        "markdown": table1_markdown(models, horizons),
    }


def table1_markdown(models: dict[str, Any], horizons: Sequence[int]) -> str:
    """Table 1 as a Markdown table: model × horizon, the median over seeds with the smallest and
    largest seed's value in brackets, the prior last."""
    lines = ["| model | seeds | horizon | mae_bits | mae_aggregate_bits | kl_bits |", "|---|---|---|---|---|---|"]

    def cell(stats: dict[str, float], n: int) -> str:
        return f"{stats['median']:.4g} [{stats['min']:.3g}, {stats['max']:.3g}]" if n > 1 else f"{stats['median']:.4g}"

    for name, model in models.items():
        for h in horizons:
            row = model["horizons"][str(h)]
            lines.append(f"| {name} | {model['n_runs']} | {h} | " + " | ".join(cell(row[m], model["n_runs"]) for m in TABLE1_METRICS) + " |")
    first = next(iter(models.values()))
    for h in horizons:
        prior = first["horizons"][str(h)]["prior"]
        lines.append(f"| context-free prior | — | {h} | " + " | ".join(f"{prior[m]:.4g}" for m in TABLE1_METRICS) + " |")
    return "\n".join(lines) + "\n"


def _full_and_late(runs: Sequence[Run]) -> str | None:
    if not any(map(_is_full_transformer, runs)) or not any(map(_is_late_attention_off, runs)):
        return "it needs a full transformer and a variant without attention in some layers"
    return None


@register("late_attention", scope="comparison", requires=_full_and_late)
def late_attention(runs: Sequence[Run]) -> dict[str, Any]:
    """Fig 9: the transformer without late-layer attention against the full model, per horizon.

    Returns:
        ``no_attention_layers``; ``horizons``: for each, the ``full`` and ``variant``
        summaries (metrics mean/std over seeds, curves) and the degradation factors
        ``factors`` per metric (variant / full, ratio of the medians over seeds), also as
        ``mae_factor`` and ``kl_factor``.
    """
    full = [r for r in runs if _is_full_transformer(r)]
    variant = [r for r in runs if _is_late_attention_off(r)]
    variant = [r for r in variant if r.configuration == variant[0].configuration]
    horizons = {}
    for h in runs[0].config.horizons:
        a, b = _horizon_summary(full, h), _horizon_summary(variant, h)
        factors = {metric: b[metric]["median"] / a[metric]["median"] for metric in METRICS}  # medians over seeds, as the claims
        horizons[str(h)] = {
            "full": a,
            "variant": b,
            "factors": factors,
            "mae_factor": factors["mae_bits"],
            "kl_factor": factors["kl_bits"],
        }
    return {
        "full": full[0].configuration.name,
        "variant": variant[0].configuration.name,
        "no_attention_layers": _attention_less_layers(variant[0]),
        "training_horizon": runs[0].config.tunnel.horizon,
        "horizons": horizons,
    }


def _seeded_group(runs: Sequence[Run]) -> list[Run]:
    """The configuration with the most seeds (a full transformer when tied)."""
    groups = list(by_configuration(runs).values())
    return max(groups, key=lambda g: (len(g), _is_full_transformer(g[0])))


def _has_seeds(runs: Sequence[Run]) -> str | None:
    if len(_seeded_group(runs)) < 2:
        return "it overlays seeds, and no configuration here has more than one"
    return None


@register("seeds", scope="comparison", requires=_has_seeds)
def seeds(runs: Sequence[Run]) -> dict[str, Any]:
    """Fig 11: per-position error of every seed overlaid; spread between seeds vs the MLP gap.

    Returns:
        ``model`` and ``seeds``; ``horizons``: for each, ``per_seed`` (``seed``, every
        metric, curve ``abs_error_bits``), ``metrics``: per metric its ``mean``, ``std``,
        ``spread`` (max − min over seeds) and, with an MLP control, ``mlp``,
        ``gap_to_mlp`` and ``gap_over_spread``; the same for ``mae_bits`` as
        ``mae_bits`` mean/std,
        ``spread_bits`` (max − min ``mae_bits`` over seeds), ``curve_std_bits`` (the
        between-seed std of the per-position error, averaged over positions), and when an
        MLP control is among the runs: ``mlp`` (its mean ``mae_bits`` and curve),
        ``gap_to_mlp_bits`` (MLP − transformer mean ``mae_bits``) and
        ``gap_over_spread`` (how many seed spreads fit in that gap).
    """
    group = _seeded_group(runs)
    mlp = [r for r in runs if r.role == "control"]  # the baseline the seeds' spread is set against
    horizons = {}
    for h in group[0].config.horizons:
        scores = [scores_at(run, h) for run in group]
        curves = torch.tensor([s["curves"]["abs_error_bits"] for s in scores], dtype=torch.float64)  # [seeds, P]
        maes = [s["mae_bits"] for s in scores]
        entry: dict[str, Any] = {
            "per_seed": [
                {"seed": run.config.train.seed, **{m: s[m] for m in METRICS}, "abs_error_bits": s["curves"]["abs_error_bits"]}
                for run, s in zip(group, scores)
            ],
            "mae_bits": summarize(maes),
            "spread_bits": max(maes) - min(maes),
            "curve_std_bits": curves.std(0, unbiased=False).mean().item(),
        }
        mlp_summary = _horizon_summary(mlp, h) if mlp else None
        entry["metrics"] = {}
        for metric in METRICS:
            values = [s[metric] for s in scores]
            stats: dict[str, Any] = {**summarize(values), "spread": max(values) - min(values)}
            if mlp_summary is not None:
                stats["mlp"] = mlp_summary[metric]["mean"]
                stats["gap_to_mlp"] = stats["mlp"] - stats["mean"]
                stats["gap_over_spread"] = stats["gap_to_mlp"] / stats["spread"] if stats["spread"] > 0 else None
            entry["metrics"][metric] = stats
        if mlp_summary is not None:
            gap = mlp_summary["mae_bits"]["mean"] - entry["mae_bits"]["mean"]
            entry["mlp"] = {"mae_bits": mlp_summary["mae_bits"]["mean"], "abs_error_bits": mlp_summary["curves"]["abs_error_bits"]}
            entry["gap_to_mlp_bits"] = gap
            entry["gap_over_spread"] = gap / entry["spread_bits"] if entry["spread_bits"] > 0 else None
        horizons[str(h)] = entry
    return {
        "model": group[0].configuration.name,
        "seeds": [run.config.train.seed for run in group],
        "training_horizon": group[0].config.tunnel.horizon,
        "horizons": horizons,
    }
