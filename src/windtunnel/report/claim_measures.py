"""Each claim's numbers, read out of the analysis results, and the criterion that decides it.

For every claim of :data:`windtunnel.report.claims.CLAIMS` there is a ``measure``
(results -> :class:`~windtunnel.report.claim_types.Measured`) and a ``judge`` (the named
values -> bool), in the claims' order. A measure raises
:class:`~windtunnel.report.claim_types.MissingResult` only when an analysis result is
absent; anything else wrong inside a present result is raised as it is.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence

from windtunnel.report.claim_results import (
    HMM_TRANSFORMER_GROUPS,
    first_result,
    fmt_bits,
    fmt_factor,
    fmt_times,
    has_result,
    models_on,
    result_of,
    safe_ratio,
    seed_range_text,
    variant_of,
)
from windtunnel.report.claim_types import (
    PAPER_METRIC,
    VARIANT_GROUPS,
    Measured,
    MissingResult,
    Results,
    Values,
)
from windtunnel.results.ablation import LayerAblation
from windtunnel.results.generalization import SeedSpreadAgainstMlp

__all__ = [
    "accuracy",
    "at_least",
    "below",
    "below_half_chance",
    "dissociation",
    "every_factor_at_least",
    "head_ablation",
    "key_orthogonality",
    "late_attention",
    "layer_ablation",
    "no_break",
    "one_dimensional",
    "qk_sharpening",
    "relabeling",
    "relabeling_invariant",
    "seeds",
    "seeds_agree",
    "separation",
    "settles_early_then_improves",
    "sharpens_with_depth",
    "smooth_at_the_horizon",
    "unique_layer0_head",
    "value_manifold",
]


# --- accuracy ---------------------------------------------------------------------------


def accuracy(
    tunnel: str, horizon: int | None, stricter: Sequence[str], groups: Sequence[str] | None = None
) -> Callable[[Results], Measured]:
    """The transformer's error on the paper's metric at ``horizon`` (default: the training
    horizon), on the first of ``groups`` that has it (default: the paper's variant first)."""
    # A partial of a module-level function, not a closure: the claim table is built at import,
    # and the measure itself then runs (and is mutation-tested) where it is called. The factories'
    # own lines run at import, before mutmut can switch a mutant on: "no mutate" (make mutate).
    return functools.partial(_accuracy, tunnel, horizon, tuple(stricter), groups)  # pragma: no mutate


def _accuracy(tunnel: str, horizon: int | None, stricter: Sequence[str], groups: Sequence[str] | None, results: Results) -> Measured:
    metric = PAPER_METRIC[tunnel]
    (model,), found = models_on(results, tunnel, ["transformer"], groups)
    h = horizon or model.training_horizon
    value = model.metric(h, metric)
    others = [m[0] for m in found if m[0] is not None and m[0] is not model]
    ours = f"{fmt_bits(value)} bits {metric} ({model.variant}{seed_range_text(model, h, metric)})"
    ours += "".join(f"; {fmt_bits(m.metric(h, metric))} ({m.variant})" for m in others)
    strict = "; ".join(f"{name} {fmt_bits(model.metric(h, name))}" for name in stricter)
    return Measured({metric: value}, ours, strict, tuple({metric: v} for v in model.per_seed(h, metric)))


def below(metric: str, limit: float) -> Callable[[Values], bool]:
    return functools.partial(_below, metric, limit)  # pragma: no mutate


def _below(metric: str, limit: float, values: Values) -> bool:
    return values[metric] < limit


# --- the MLP control --------------------------------------------------------------------


def separation(tunnel: str, factor: float) -> Callable[[Results], Measured]:
    """The MLP's error over the transformer's on the paper's metric, at the training horizon,
    on the first task variant that has both."""
    return functools.partial(_separation, tunnel)  # pragma: no mutate


def _separation(tunnel: str, results: Results) -> Measured:
    metric = PAPER_METRIC[tunnel]
    (transformer, mlp), found = models_on(results, tunnel, ["transformer", "mlp"])
    h = transformer.training_horizon
    ratio = mlp.metric(h, metric) / transformer.metric(h, metric)
    horizons = list(mlp.horizons)
    mlps = "/".join(fmt_bits(mlp.metric(k, metric)) for k in horizons)
    at = f" at K={'/'.join(map(str, horizons))}" if len(horizons) > 1 else ""
    ours = f"MLP {mlps} bits {metric}{at} (prior {fmt_bits(mlp.prior(h, metric))}); {fmt_factor(ratio)} the transformer ({mlp.variant})"
    for _, m in found:  # the other variants: the MLP (and the prior it converges to)
        if m is not None and m is not mlp:
            ours += f"; MLP {fmt_bits(m.metric(h, metric))}, prior {fmt_bits(m.prior(h, metric))} ({m.variant})"
    others = [name for name in ("mae_bits", "kl_bits") if name != metric]
    strict = "; ".join(f"{name} {fmt_times(mlp.metric(h, name), transformer.metric(h, name))}" for name in others)
    # Each transformer seed against the MLP's median (the control is trained once at the CPU scale).
    per_seed = tuple({"ratio": safe_ratio(mlp.metric(h, metric), v)} for v in transformer.per_seed(h, metric))
    return Measured({"ratio": ratio}, ours, strict, per_seed)


def at_least(name: str, limit: float) -> Callable[[Values], bool]:
    return functools.partial(_at_least, name, limit)  # pragma: no mutate


def _at_least(name: str, limit: float, values: Values) -> bool:
    return values[name] >= limit


# --- late attention ---------------------------------------------------------------------


def late_attention(results: Results) -> Measured:
    groups = [g for g in VARIANT_GROUPS["hmm"] if has_result(results, g, "late_attention")]
    if not groups:
        raise MissingResult("late_attention")
    result = results[groups[0]]["late_attention"]
    horizons = result.horizons
    factors = {h: row.factors.kl_bits for h, row in horizons.items()}
    at = f" at K={'/'.join(map(str, horizons))}"
    ours = "kl_bits " + "/".join(fmt_factor(f) for f in factors.values()) + at
    strict = "mae_bits " + "/".join(fmt_factor(row.factors.mae_bits) for row in horizons.values()) + at
    return Measured({"kl_factors": list(factors.values())}, ours, strict)


def every_factor_at_least(limit: float) -> Callable[[Values], bool]:
    return functools.partial(_every_factor_at_least, limit)  # pragma: no mutate


def _every_factor_at_least(limit: float, values: Values) -> bool:
    return len(values["kl_factors"]) > 0 and min(values["kl_factors"]) >= limit


# --- ablations --------------------------------------------------------------------------


def layer_ablation(results: Results) -> Measured:
    found = {}
    for tunnel, groups in (("bijection", ("bijection_transformer",)), ("hmm", HMM_TRANSFORMER_GROUPS)):
        try:
            found[tunnel] = first_result(results, groups, "layer_ablation")
        except MissingResult:
            continue
    if not found:
        raise MissingResult("layer_ablation")
    parts, strict, minima = [], [], []
    for tunnel, result in found.items():
        metric = PAPER_METRIC[tunnel]
        ratios = [getattr(row.ratios, metric).median for row in result.layers]
        minima.append(min(ratios))
        parts.append(f"{tunnel}{variant_of(result)} {metric} " + ", ".join(fmt_factor(r) for r in ratios))
        strict.append(f"{tunnel} mae_bits " + ", ".join(fmt_factor(row.ratios.mae_bits.median) for row in result.layers))
    return Measured({"min_ratio": min(minima)}, "; ".join(parts) + " per layer", "; ".join(strict), _layer_ablation_per_seed(found))


def _layer_ablation_per_seed(found: Mapping[str, LayerAblation]) -> tuple[Values, ...]:
    """Seed ``s``'s smallest ratio over layers and tunnels (seed ``s`` of each tunnel), each
    run against itself, where every tunnel trained the same number of seeds (more than one)."""
    counts = {len(result.intact_per_run) for result in found.values()}
    if len(counts) != 1 or counts.pop() < 2:
        return ()
    per_seed = []
    for s in range(len(next(iter(found.values())).intact_per_run)):
        ratios = [
            getattr(row.per_run[s], PAPER_METRIC[tunnel]) / getattr(result.intact_per_run[s], PAPER_METRIC[tunnel])
            for tunnel, result in found.items()
            for row in result.layers
        ]
        per_seed.append({"min_ratio": min(ratios)})
    return tuple(per_seed)


def head_ablation(results: Results) -> Measured:
    result = result_of(results, "bijection_transformer", "head_ablation")
    seeds = result.per_run
    parts = []
    for run in seeds:
        worst, over = run.worst, run.top_over_second
        parts.append(
            f"L{worst.layer}H{worst.head} {fmt_factor(worst.mae_ratio)}, "
            + (f"{over:.2f}x the next" if over is not None else "next not destructive")
        )
    values = {
        "worst_layers": [run.worst.layer for run in seeds],
        "worst_ratios": [run.worst.mae_ratio for run in seeds],
        "top_over_second": [run.top_over_second for run in seeds],
    }
    return Measured(values, f"worst head per seed ({len(seeds)}): " + "; ".join(parts))


def unique_layer0_head(values: Values) -> bool:
    """Every seed's most destructive head is in layer 0, at least doubles the error, and
    raises it at least twice as much as that seed's next head."""
    rows = list(zip(values["worst_layers"], values["worst_ratios"], values["top_over_second"]))
    return bool(rows) and all(
        layer == 0 and ratio >= 2 and (over is None or over >= 2) for layer, ratio, over in rows
    )


# --- length generalization ----------------------------------------------------------------


def no_break(results: Results) -> Measured:
    result = first_result(results, HMM_TRANSFORMER_GROUPS, "length_generalization")
    horizons = result.horizons
    trained = result.training_horizon
    beyond = [h for h in horizons if h > trained]
    if not beyond:
        raise MissingResult("length_generalization beyond the training horizon")
    longest = max(beyond)
    row = horizons[longest]
    kl = row.beyond.kl_bits
    prior_within = horizons[trained].prior.kl_bits if trained in horizons else None
    boundary = kl.boundary
    ratio = boundary.ratio
    ours = (
        f"K={longest}{variant_of(result)}: kl_bits step t={trained}→{trained + 1} {fmt_bits(boundary.step)} vs largest nearby "
        f"{fmt_bits(boundary.largest_neighbor_step)} ({'n/a' if ratio is None else f'{ratio:.2g}x'}); "
        f"mean over t≤{trained} {fmt_bits(kl.within_training)}, after {fmt_bits(kl.beyond_training)}"
    )
    mae = row.beyond.mae_bits.boundary
    strict = f"mae_bits step {fmt_bits(mae.step)} vs {fmt_bits(mae.largest_neighbor_step)}"
    values = {
        "boundary_ratio": ratio,
        "within_training_kl_bits": kl.within_training,
        "prior_kl_bits": prior_within,
    }
    runs = [run for run in row.per_run if run.beyond is not None]
    per_seed = tuple(
        {
            "boundary_ratio": run.beyond.kl_bits.boundary.ratio,
            "within_training_kl_bits": run.beyond.kl_bits.within_training,
            "prior_kl_bits": prior_within,
        }
        for run in runs
    ) if len(runs) > 1 else ()
    return Measured(values, ours, strict, per_seed)


def _filters(values: Values) -> bool:
    """The model filters within the training range: mean KL there under a tenth of the prior's."""
    return values["prior_kl_bits"] is not None and values["within_training_kl_bits"] < 0.1 * values["prior_kl_bits"]


def smooth_at_the_horizon(values: Values) -> bool:
    ratio = values["boundary_ratio"]
    return _filters(values) and ratio is not None and ratio <= 2


def relabeling(results: Results) -> Measured:
    result = first_result(results, HMM_TRANSFORMER_GROUPS, "relabeling")
    run = result.per_run[0]
    low, high = run.delta_mae_bits_ci
    ours = (
        f"ΔMAE {run.delta_mae_bits:+.2g} bits, 95% CI [{low:+.2g}, {high:+.2g}]; MAE {fmt_bits(run.mae_bits_before)} "
        f"(prior {fmt_bits(run.mae_bits_prior)}){variant_of(result)}"
    )
    values = {
        "delta_ci": [low, high],
        "relative_change": result.relative_change,
        "mae_bits": run.mae_bits_before,
        "prior_mae_bits": run.mae_bits_prior,
    }
    per_seed = tuple(
        {
            "delta_ci": list(r.delta_mae_bits_ci),
            "relative_change": abs(r.delta_mae_bits) / r.mae_bits_before if r.mae_bits_before else None,
            "mae_bits": r.mae_bits_before,
            "prior_mae_bits": r.mae_bits_prior,
        }
        for r in result.per_run
    ) if len(result.per_run) > 1 else ()
    kl_low, kl_high = run.delta_kl_bits_ci
    strict = (
        f"ΔKL {run.delta_kl_bits:+.2g} bits, 95% CI [{kl_low:+.2g}, {kl_high:+.2g}] on kl_bits "
        f"{fmt_bits(run.kl_bits_before)} (KL sees which state is which; entropy does not)"
    )
    return Measured(values, ours, strict, per_seed)


def relabeling_invariant(values: Values) -> bool:
    """The model filters (MAE under a tenth of the prior's), and ΔMAE is indistinguishable
    from 0 or under 5% of its MAE."""
    low, high = values["delta_ci"]
    filters = values["mae_bits"] < 0.1 * values["prior_mae_bits"]
    small = low <= 0 <= high or (values["relative_change"] is not None and values["relative_change"] < 0.05)
    return filters and small


def seeds(results: Results) -> Measured:
    for tunnel in ("hmm", "bijection"):  # the paper's seed figure is the HMM's
        if has_result(results, tunnel, "seeds"):
            result = results[tunnel]["seeds"]
            break
    else:
        raise MissingResult("seeds")
    metric = PAPER_METRIC[tunnel]
    rows = [getattr(row.metrics, metric) for row in result.horizons.values()]
    spread = max(row.spread for row in rows)
    if not all(isinstance(row, SeedSpreadAgainstMlp) for row in rows):
        ours = f"{tunnel}: seed spread {fmt_bits(spread)} bits {metric} (no MLP to compare)"
        return Measured({"gap_over_spread": None, "gap_fraction": None}, ours)
    # Seeds with no spread at all (identical errors) fit infinitely many times into any gap.
    gap = min(math.inf if row.gap_over_spread is None else row.gap_over_spread for row in rows)
    fraction = min(row.gap_to_mlp / row.mlp for row in rows)
    ours = (
        f"{tunnel}, {len(result.seeds)} seeds: spread {fmt_bits(spread)} bits {metric}; the MLP's gap {fmt_factor(gap)} the spread, "
        f"{fraction:.0%} of the MLP's error"
    )
    mae = [row.metrics.mae_bits.spread for row in result.horizons.values()]
    return Measured({"gap_over_spread": gap, "gap_fraction": fraction}, ours, f"mae_bits spread {fmt_bits(max(mae))}")


def seeds_agree(values: Values) -> bool:
    """The seeds differ by under a tenth of their gap to the MLP, and that gap is real: the
    transformer removes at least half of the MLP's error (models that all sit at the prior,
    as at random init, have no gap for their agreement to be measured against)."""
    gap, fraction = values["gap_over_spread"], values["gap_fraction"]
    return gap is not None and fraction is not None and gap >= 10 and fraction >= 0.5


# --- geometry -----------------------------------------------------------------------------


def key_orthogonality(results: Results) -> Measured:
    result = result_of(results, "bijection_transformer", "key_orthogonality")
    measures = result.measures
    later = measures["normalized_output_keys_abs"]
    best, chance = later.layers[0].best_head.median, later.chance.expected_abs_cos
    signed = measures["embedding_keys_all_tokens_signed"].layers[0]
    ours = (
        f"best layer-0 head, output-token keys: mean |cos| {best:.2f} (chance {chance:.2f}); "
        f"Paper-I signed mean over all tokens {signed.mean_over_heads.median:+.2f}"
    )
    centered = measures["in_context_input_keys_centered"].layers[0].best_head.median
    strict = f"in-context input keys, centered: best layer-0 head mean |cos| {centered:.2f}"
    return Measured({"best_head_abs_cos": best, "chance_abs_cos": chance}, ours, strict)


def below_half_chance(values: Values) -> bool:
    return values["best_head_abs_cos"] < 0.5 * values["chance_abs_cos"]


def qk_sharpening(results: Results) -> Measured:
    result = result_of(results, "bijection_transformer", "qk_sharpening")
    lifts = [row.lift["evidence"] for row in result.layers]
    entropies = [row.entropy_bits.median for row in result.layers]
    ours = "evidence mass / uniform share by layer " + ", ".join(f"{x:.2f}" for x in lifts)
    ours += "; attention entropy " + " → ".join(f"{h:.2f}" for h in entropies) + " bits"
    cosines = [row.mean_cos.median for row in result.authors_query_key_cosine.layers]
    strict = "the authors' measure (mean cos of the query with earlier input keys) by layer " + ", ".join(
        f"{c:+.2f}" for c in cosines
    )
    return Measured({"lifts": lifts, "entropies": entropies}, ours, strict)


def sharpens_with_depth(values: Values) -> bool:
    """The last layer puts ≥ 1.2x layer 0's lift on the evidence, with ≥ 0.1 bits less entropy."""
    lifts, entropies = values["lifts"], values["entropies"]
    return lifts[-1] >= 1.2 * lifts[0] and entropies[-1] <= entropies[0] - 0.1


def value_manifold(results: Results) -> Measured:
    result = result_of(results, "bijection_transformer", "value_manifold")
    authors = result.measures["ln_final_value_positions_max_pearson"]
    pc1, r = authors.pc1_variance.median, authors.correlation.value.median
    ours = f"bijection, final-normed value positions: PC1 {pc1:.0%}, max |Pearson| {r:.2f} (PC{authors.correlation.pc})"
    parts = []
    for group in ("bijection_transformer", "hmm_transformer"):
        if has_result(results, group, "value_manifold"):
            mine = results[group]["value_manifold"].measures["resid_supervised_spearman_pc1"]
            parts.append(
                f"{group.split('_')[0]} residual at supervised positions: PC1 {mine.pc1_variance.median:.0%}, "
                f"|Spearman| {mine.correlation.value.median:.2f}"
            )
    if has_result(results, "hmm_transformer", "value_manifold"):
        hmm = results["hmm_transformer"]["value_manifold"].measures["ln_final_supervised_abs_pearson_pc1"]
        parts.append(
            f"hmm, the authors' HMM measure (no threshold): PC1 {hmm.pc1_variance.median:.0%}, "
            f"|Pearson| {hmm.correlation.value.median:.2f}"
        )
    return Measured({"pc1_variance": pc1, "correlation": r}, ours, "; ".join(parts))


def one_dimensional(values: Values) -> bool:
    return values["pc1_variance"] > 0.8 and values["correlation"] > 0.8


def dissociation(results: Results) -> Measured:
    result = result_of(results, "bijection_transformer", "training_dynamics")
    metric = PAPER_METRIC["bijection"]
    step, fraction = result.stabilization_step, result.stabilization_fraction
    if step is None:
        return Measured({"fraction": None, "ratio": None}, "attention never settles within the threshold")
    ratio = getattr(result.ratio_stabilization_to_final, metric)
    ours = (
        f"attention settles at step {step} ({fraction:.0%} of training); {metric} there "
        f"{fmt_bits(getattr(result.at_stabilization, metric))}, at the end {fmt_bits(getattr(result.final, metric))} "
        f"({fmt_factor(ratio)} lower)"
    )
    strict = f"mae_bits {fmt_factor(result.ratio_stabilization_to_final.mae_bits)} lower"
    return Measured({"fraction": fraction, "ratio": ratio}, ours, strict)


def settles_early_then_improves(values: Values) -> bool:
    fraction, ratio = values["fraction"], values["ratio"]
    return fraction is not None and ratio is not None and fraction <= 0.5 and ratio >= 2
