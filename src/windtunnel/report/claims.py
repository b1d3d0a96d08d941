"""The paper's claims, each judged the way the paper measures it.

Every :class:`Claim` names the paper's number with its metric and its task variant, reads
our number under the same metric (on the paper's variant where this reproduction trained
it, else on ours, and says which), and decides by a stated criterion. The criterion is a
function of a few named values (:attr:`Measured.values`), so the same function judges
our results, the same analyses of the runs' *initial* weights (random init must not pass)
and the paper's own published numbers (:attr:`Paper.values`; they must pass, unless the
authors' own results fail the claim as the paper states it: :attr:`Paper.authors_fail`
says so, with the number).

The metric of each tunnel is the paper's: aggregate entropy error (``mae_aggregate_bits``)
for the bijection, and per-position KL(exact ‖ model) (``kl_bits``) for the HMM, where the
authors' 7.5e-5 / 0.012 / 0.029 bits are KL (their ``eval_length_gen.py``). Our stricter
or other measures stand beside it.

Results are looked up as ``results[group][analysis]`` (the JSON of
``DIR/analysis/<group>/<analysis>.json``). A claim whose analysis result is absent reads
"n/a"; any other error inside a present result (a missing key, a wrong type) is a bug and
is raised.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CLAIMS",
    "PAPER_METRIC",
    "Claim",
    "Measured",
    "MissingResult",
    "Paper",
    "Verdict",
    "evaluate_claims",
    "variant_name",
]

Results = Mapping[str, Mapping[str, Mapping[str, Any]]]
Values = Mapping[str, Any]

#: The metric the paper's numbers are in, by tunnel.
PAPER_METRIC = {"bijection": "mae_aggregate_bits", "hmm": "kl_bits"}

#: Comparison groups of each tunnel, the paper's task variant first (see ``reproduce.GROUPS``):
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
        values: what the criterion reads.
        ours: our number under the paper's metric, naming the task variant it is on.
        stricter: our stricter (or otherwise different) measure where it differs; "" if none.
    """

    values: Values
    ours: str
    stricter: str = ""


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

    @property
    def ours(self) -> str:
        return self.measured.ours if self.measured else "n/a (analysis missing)"

    @property
    def stricter(self) -> str:
        return self.measured.stricter if self.measured else ""


def evaluate_claims(results: Results, claims: Sequence[Claim] | None = None) -> list[Verdict]:
    """Each claim with our number and its verdict; "n/a" only where an analysis is absent."""
    verdicts = []
    for claim in CLAIMS if claims is None else claims:
        try:
            measured = claim.measure(results)
        except MissingResult:
            verdicts.append(Verdict(claim, None, None))
            continue
        verdicts.append(Verdict(claim, measured, bool(claim.judge(measured.values))))
    return verdicts


# --- reading results -------------------------------------------------------------------


def _result(results: Results, group: str, analysis: str) -> Mapping[str, Any]:
    try:
        return results[group][analysis]
    except KeyError:
        raise MissingResult(f"{group}/{analysis}") from None


def _has(results: Results, group: str, analysis: str) -> bool:
    return analysis in results.get(group, {})


#: Per-configuration groups of the HMM transformer, the paper's variant (floored) first.
HMM_TRANSFORMER_GROUPS = ("hmm_transformer_floor", "hmm_transformer")


def _first(results: Results, groups: Sequence[str], analysis: str) -> Mapping[str, Any]:
    """``analysis`` of the first of ``groups`` that has it."""
    for group in groups:
        if _has(results, group, analysis):
            return results[group][analysis]
    raise MissingResult(f"{'/'.join(groups)}: {analysis}")


def _variant_of(result: Mapping[str, Any]) -> str:
    """`` (variant)`` of a saved result (the runner records the runs' tunnel), for the text."""
    return f" ({variant_name(result['tunnel'])})" if "tunnel" in result else ""


def variant_name(tunnel: Mapping[str, Any]) -> str:
    """The task variant of a tunnel's parameters, in words (what a number belongs to)."""
    if tunnel["name"] == "bijection":
        return "with replacement" if tunnel.get("with_replacement") else "without replacement"
    if tunnel["name"] == "hmm":
        floor = tunnel.get("floor", 0.0)
        return (f"floor {floor:g}" if floor else "no floor") + f", grid {tunnel['grid']:g}"
    return tunnel["name"]


@dataclass(frozen=True)
class _Model:
    """One model's scores on one task variant: ``horizons[str(h)][metric]["mean"]``, prior rows."""

    horizons: Mapping[str, Any]
    variant: str
    training_horizon: int

    def metric(self, horizon: int, metric: str) -> float:
        return self.horizons[str(horizon)][metric]["mean"]

    def prior(self, horizon: int, metric: str) -> float:
        return self.horizons[str(horizon)]["prior"][metric]


def _model(results: Results, group: str, model: str) -> _Model:
    """``model``'s scores in comparison group ``group``: from its Table 1, or, where the group
    trained only that model, from its per-position analysis."""
    group_results = results.get(group, {})
    if "model_comparison" in group_results and model in group_results["model_comparison"]["models"]:
        table = group_results["model_comparison"]
        return _Model(table["models"][model]["horizons"], variant_name(table["tunnel"]), table["training_horizon"])
    if "length_generalization" in group_results and group_results["length_generalization"]["model"] == model:
        single = group_results["length_generalization"]
        return _Model(single["horizons"], variant_name(single["tunnel"]), single["training_horizon"])
    raise MissingResult(f"{group}: {model}")


def _models(
    results: Results, tunnel: str, names: Sequence[str], groups: Sequence[str] | None = None
) -> tuple[list[_Model], list[list[_Model]]]:
    """The named models on the first of ``groups`` (default: the variant groups of ``tunnel``,
    the paper's variant first) that has all of them, and, for the text, every group's
    models found.

    Raises MissingResult when no group has them all.
    """
    complete: list[_Model] | None = None
    found: list[list[_Model]] = []
    for group in groups or VARIANT_GROUPS[tunnel]:
        models = []
        for name in names:
            try:
                models.append(_model(results, group, name))
            except MissingResult:
                models.append(None)
        if all(m is not None for m in models):
            complete = complete or models
        if any(m is not None for m in models):
            found.append(models)
    if complete is None:
        raise MissingResult(f"{tunnel}: {', '.join(names)}")
    return complete, found


def _g(value: float) -> str:
    return f"{value:.2g}" if abs(value) < 0.01 else f"{value:.3g}"


def _x(value: float) -> str:
    return f"{value:.0f}x" if value >= 10 else f"{value:.2g}x"


def _times(numerator: float, denominator: float) -> str:
    """``numerator / denominator`` as a factor, for the text (a zero denominator is infinite)."""
    return _x(numerator / denominator) if denominator else "∞x"


# --- accuracy ---------------------------------------------------------------------------


def _accuracy(
    tunnel: str, horizon: int | None, stricter: Sequence[str], groups: Sequence[str] | None = None
) -> Callable[[Results], Measured]:
    """The transformer's error on the paper's metric at ``horizon`` (default: the training
    horizon), on the first of ``groups`` that has it (default: the paper's variant first)."""
    metric = PAPER_METRIC[tunnel]

    def measure(results: Results) -> Measured:
        (model,), found = _models(results, tunnel, ["transformer"], groups)
        h = horizon or model.training_horizon
        value = model.metric(h, metric)
        others = [m[0] for m in found if m[0] is not None and m[0] is not model]
        ours = f"{_g(value)} bits {metric} ({model.variant})"
        ours += "".join(f"; {_g(m.metric(h, metric))} ({m.variant})" for m in others)
        strict = "; ".join(f"{name} {_g(model.metric(h, name))}" for name in stricter)
        return Measured({metric: value}, ours, strict)

    return measure


def _below(metric: str, limit: float) -> Callable[[Values], bool]:
    return lambda values: values[metric] < limit


# --- the MLP control --------------------------------------------------------------------


def _separation(tunnel: str, factor: float) -> Callable[[Results], Measured]:
    """The MLP's error over the transformer's on the paper's metric, at the training horizon,
    on the first task variant that has both."""
    metric = PAPER_METRIC[tunnel]

    def measure(results: Results) -> Measured:
        (transformer, mlp), found = _models(results, tunnel, ["transformer", "mlp"])
        h = transformer.training_horizon
        ratio = mlp.metric(h, metric) / transformer.metric(h, metric)
        horizons = [int(k) for k in mlp.horizons]
        mlps = "/".join(_g(mlp.metric(k, metric)) for k in horizons)
        at = f" at K={'/'.join(map(str, horizons))}" if len(horizons) > 1 else ""
        ours = f"MLP {mlps} bits {metric}{at} (prior {_g(mlp.prior(h, metric))}); {_x(ratio)} the transformer ({mlp.variant})"
        for _, m in found:  # the other variants: the MLP (and the prior it converges to)
            if m is not None and m is not mlp:
                ours += f"; MLP {_g(m.metric(h, metric))}, prior {_g(m.prior(h, metric))} ({m.variant})"
        others = [name for name in ("mae_bits", "kl_bits") if name != metric]
        strict = "; ".join(f"{name} {_times(mlp.metric(h, name), transformer.metric(h, name))}" for name in others)
        return Measured({"ratio": ratio}, ours, strict)

    return measure


def _at_least(name: str, limit: float) -> Callable[[Values], bool]:
    return lambda values: values[name] >= limit


# --- late attention ---------------------------------------------------------------------


def _late_attention(results: Results) -> Measured:
    groups = [g for g in VARIANT_GROUPS["hmm"] if _has(results, g, "late_attention")]
    if not groups:
        raise MissingResult("late_attention")
    result = results[groups[0]]["late_attention"]
    horizons = result["horizons"]
    factors = {h: row["factors"]["kl_bits"] for h, row in horizons.items()}
    at = f" at K={'/'.join(horizons)}"
    ours = "kl_bits " + "/".join(_x(f) for f in factors.values()) + at
    strict = "mae_bits " + "/".join(_x(row["factors"]["mae_bits"]) for row in horizons.values()) + at
    return Measured({"kl_factors": list(factors.values())}, ours, strict)


def _every_factor_at_least(limit: float) -> Callable[[Values], bool]:
    return lambda values: len(values["kl_factors"]) > 0 and min(values["kl_factors"]) >= limit


# --- ablations --------------------------------------------------------------------------


def _layer_ablation(results: Results) -> Measured:
    found = {}
    for tunnel, groups in (("bijection", ("bijection_transformer",)), ("hmm", HMM_TRANSFORMER_GROUPS)):
        try:
            found[tunnel] = _first(results, groups, "layer_ablation")
        except MissingResult:
            continue
    if not found:
        raise MissingResult("layer_ablation")
    parts, strict, minima = [], [], []
    for tunnel, result in found.items():
        layers = result["layers"]
        metric = PAPER_METRIC[tunnel]
        ratios = [row["ratios"][metric]["mean"] for row in layers]
        minima.append(min(ratios))
        parts.append(f"{tunnel}{_variant_of(result)} {metric} " + ", ".join(_x(r) for r in ratios))
        strict.append(f"{tunnel} mae_bits " + ", ".join(_x(row["ratios"]["mae_bits"]["mean"]) for row in layers))
    return Measured({"min_ratio": min(minima)}, "; ".join(parts) + " per layer", "; ".join(strict))


def _head_ablation(results: Results) -> Measured:
    result = _result(results, "bijection_transformer", "head_ablation")
    seeds = result["per_run"]
    parts = []
    for run in seeds:
        worst = run["worst"]
        over = run["top_over_second"]
        parts.append(
            f"L{worst['layer']}H{worst['head']} {_x(worst['mae_ratio'])}, "
            + (f"{over:.2f}x the next" if over is not None else "next not destructive")
        )
    values = {
        "worst_layers": [run["worst"]["layer"] for run in seeds],
        "worst_ratios": [run["worst"]["mae_ratio"] for run in seeds],
        "top_over_second": [run["top_over_second"] for run in seeds],
    }
    return Measured(values, f"worst head per seed ({len(seeds)}): " + "; ".join(parts))


def _unique_layer0_head(values: Values) -> bool:
    """Every seed's most destructive head is in layer 0, at least doubles the error, and
    raises it at least twice as much as that seed's next head."""
    rows = list(zip(values["worst_layers"], values["worst_ratios"], values["top_over_second"]))
    return bool(rows) and all(
        layer == 0 and ratio >= 2 and (over is None or over >= 2) for layer, ratio, over in rows
    )


# --- length generalization ----------------------------------------------------------------


def _no_break(results: Results) -> Measured:
    result = _first(results, HMM_TRANSFORMER_GROUPS, "length_generalization")
    horizons = result["horizons"]
    trained = result["training_horizon"]
    beyond = [h for h in horizons if int(h) > trained]
    if not beyond:
        raise MissingResult("length_generalization beyond the training horizon")
    longest = max(beyond, key=int)
    row = horizons[longest]
    kl = row["beyond"]["kl_bits"]
    prior_within = horizons[str(trained)]["prior"]["kl_bits"] if str(trained) in horizons else None
    boundary = kl["boundary"]
    ratio = boundary["ratio"]
    ours = (
        f"K={longest}{_variant_of(result)}: kl_bits step t={trained}→{trained + 1} {_g(boundary['step'])} vs largest nearby "
        f"{_g(boundary['largest_neighbor_step'])} ({'n/a' if ratio is None else f'{ratio:.2g}x'}); "
        f"mean over t≤{trained} {_g(kl['within_training'])}, after {_g(kl['beyond_training'])}"
    )
    mae = row["beyond"]["mae_bits"]["boundary"]
    strict = f"mae_bits step {_g(mae['step'])} vs {_g(mae['largest_neighbor_step'])}"
    values = {
        "boundary_ratio": ratio,
        "within_training_kl_bits": kl["within_training"],
        "prior_kl_bits": prior_within,
    }
    return Measured(values, ours, strict)


def _filters(values: Values) -> bool:
    """The model filters within the training range: mean KL there under a tenth of the prior's."""
    return values["prior_kl_bits"] is not None and values["within_training_kl_bits"] < 0.1 * values["prior_kl_bits"]


def _smooth_at_the_horizon(values: Values) -> bool:
    ratio = values["boundary_ratio"]
    return _filters(values) and ratio is not None and ratio <= 2


def _relabeling(results: Results) -> Measured:
    result = _first(results, HMM_TRANSFORMER_GROUPS, "relabeling")
    run = result["per_run"][0]
    low, high = run["delta_mae_bits_ci"]
    ours = (
        f"ΔMAE {run['delta_mae_bits']:+.2g} bits, 95% CI [{low:+.2g}, {high:+.2g}]; MAE {_g(run['mae_bits_before'])} "
        f"(prior {_g(run['mae_bits_prior'])}){_variant_of(result)}"
    )
    values = {
        "delta_ci": [low, high],
        "relative_change": result["relative_change"],
        "mae_bits": run["mae_bits_before"],
        "prior_mae_bits": run["mae_bits_prior"],
    }
    kl_low, kl_high = run["delta_kl_bits_ci"]
    strict = (
        f"ΔKL {run['delta_kl_bits']:+.2g} bits, 95% CI [{kl_low:+.2g}, {kl_high:+.2g}] on kl_bits "
        f"{_g(run['kl_bits_before'])} (KL sees which state is which; entropy does not)"
    )
    return Measured(values, ours, strict)


def _relabeling_invariant(values: Values) -> bool:
    """The model filters (MAE under a tenth of the prior's), and ΔMAE is indistinguishable
    from 0 or under 5% of its MAE."""
    low, high = values["delta_ci"]
    filters = values["mae_bits"] < 0.1 * values["prior_mae_bits"]
    small = low <= 0 <= high or (values["relative_change"] is not None and values["relative_change"] < 0.05)
    return filters and small


def _seeds(results: Results) -> Measured:
    for tunnel in ("hmm", "bijection"):  # the paper's seed figure is the HMM's
        if _has(results, tunnel, "seeds"):
            result = results[tunnel]["seeds"]
            break
    else:
        raise MissingResult("seeds")
    metric = PAPER_METRIC[tunnel]
    rows = [row["metrics"][metric] for row in result["horizons"].values()]
    spread = max(row["spread"] for row in rows)
    if any("gap_over_spread" not in row for row in rows):
        ours = f"{tunnel}: seed spread {_g(spread)} bits {metric} (no MLP to compare)"
        return Measured({"gap_over_spread": None, "gap_fraction": None}, ours)
    # Seeds with no spread at all (identical errors) fit infinitely many times into any gap.
    gap = min(math.inf if row["gap_over_spread"] is None else row["gap_over_spread"] for row in rows)
    fraction = min(row["gap_to_mlp"] / row["mlp"] for row in rows)
    ours = (
        f"{tunnel}, {len(result['seeds'])} seeds: spread {_g(spread)} bits {metric}; the MLP's gap {_x(gap)} the spread, "
        f"{fraction:.0%} of the MLP's error"
    )
    mae = [row["metrics"]["mae_bits"]["spread"] for row in result["horizons"].values()]
    return Measured({"gap_over_spread": gap, "gap_fraction": fraction}, ours, f"mae_bits spread {_g(max(mae))}")


def _seeds_agree(values: Values) -> bool:
    """The seeds differ by under a tenth of their gap to the MLP, and that gap is real: the
    transformer removes at least half of the MLP's error (models that all sit at the prior,
    as at random init, have no gap for their agreement to be measured against)."""
    gap, fraction = values["gap_over_spread"], values["gap_fraction"]
    return gap is not None and fraction is not None and gap >= 10 and fraction >= 0.5


# --- geometry -----------------------------------------------------------------------------


def _key_orthogonality(results: Results) -> Measured:
    result = _result(results, "bijection_transformer", "key_orthogonality")
    measures = result["measures"]
    later = measures["normalized_output_keys_abs"]
    layer0 = later["layers"][0]
    best, chance = layer0["best_head"]["mean"], later["chance"]["expected_abs_cos"]
    signed = measures["embedding_keys_all_tokens_signed"]["layers"][0]
    ours = (
        f"best layer-0 head, output-token keys: mean |cos| {best:.2f} (chance {chance:.2f}); "
        f"Paper-I signed mean over all tokens {signed['mean_over_heads']['mean']:+.2f}"
    )
    centered = measures["in_context_input_keys_centered"]["layers"][0]["best_head"]["mean"]
    strict = f"in-context input keys, centered: best layer-0 head mean |cos| {centered:.2f}"
    return Measured({"best_head_abs_cos": best, "chance_abs_cos": chance}, ours, strict)


def _below_half_chance(values: Values) -> bool:
    return values["best_head_abs_cos"] < 0.5 * values["chance_abs_cos"]


def _qk_sharpening(results: Results) -> Measured:
    result = _result(results, "bijection_transformer", "qk_sharpening")
    layers = result["layers"]
    lifts = [row["lift"]["evidence"] for row in layers]
    entropies = [row["entropy_bits"]["mean"] for row in layers]
    ours = "evidence mass / uniform share by layer " + ", ".join(f"{x:.2f}" for x in lifts)
    ours += "; attention entropy " + " → ".join(f"{h:.2f}" for h in entropies) + " bits"
    cosines = [row["mean_cos"]["mean"] for row in result["authors_query_key_cosine"]["layers"]]
    strict = "the authors' measure (mean cos of the query with earlier input keys) by layer " + ", ".join(
        f"{c:+.2f}" for c in cosines
    )
    return Measured({"lifts": lifts, "entropies": entropies}, ours, strict)


def _sharpens_with_depth(values: Values) -> bool:
    """The last layer puts ≥ 1.2x layer 0's lift on the evidence, with ≥ 0.1 bits less entropy."""
    lifts, entropies = values["lifts"], values["entropies"]
    return lifts[-1] >= 1.2 * lifts[0] and entropies[-1] <= entropies[0] - 0.1


def _value_manifold(results: Results) -> Measured:
    result = _result(results, "bijection_transformer", "value_manifold")
    authors = result["measures"]["ln_final_value_positions_max_pearson"]
    pc1, r = authors["pc1_variance"]["mean"], authors["correlation"]["value"]["mean"]
    ours = f"bijection, final-normed value positions: PC1 {pc1:.0%}, max |Pearson| {r:.2f} (PC{authors['correlation']['pc']})"
    parts = []
    for group in ("bijection_transformer", "hmm_transformer"):
        if _has(results, group, "value_manifold"):
            mine = results[group]["value_manifold"]["measures"]["resid_supervised_spearman_pc1"]
            parts.append(
                f"{group.split('_')[0]} residual at supervised positions: PC1 {mine['pc1_variance']['mean']:.0%}, "
                f"|Spearman| {mine['correlation']['value']['mean']:.2f}"
            )
    if _has(results, "hmm_transformer", "value_manifold"):
        hmm = results["hmm_transformer"]["value_manifold"]["measures"]["ln_final_supervised_abs_pearson_pc1"]
        parts.append(
            f"hmm, the authors' HMM measure (no threshold): PC1 {hmm['pc1_variance']['mean']:.0%}, "
            f"|Pearson| {hmm['correlation']['value']['mean']:.2f}"
        )
    return Measured({"pc1_variance": pc1, "correlation": r}, ours, "; ".join(parts))


def _one_dimensional(values: Values) -> bool:
    return values["pc1_variance"] > 0.8 and values["correlation"] > 0.8


def _dissociation(results: Results) -> Measured:
    result = _result(results, "bijection_transformer", "training_dynamics")
    metric = PAPER_METRIC["bijection"]
    step, fraction = result["stabilization_step"], result["stabilization_fraction"]
    if step is None:
        return Measured({"fraction": None, "ratio": None}, "attention never settles within the threshold")
    ratio = result["ratio_stabilization_to_final"][metric]
    ours = (
        f"attention settles at step {step} ({fraction:.0%} of training); {metric} there "
        f"{_g(result['at_stabilization'][metric])}, at the end {_g(result['final'][metric])} ({_x(ratio)} lower)"
    )
    strict = f"mae_bits {_x(result['ratio_stabilization_to_final']['mae_bits'])} lower"
    return Measured({"fraction": fraction, "ratio": ratio}, ours, strict)


def _settles_early_then_improves(values: Values) -> bool:
    fraction, ratio = values["fraction"], values["ratio"]
    return fraction is not None and ratio is not None and fraction <= 0.5 and ratio >= 2


#: Every claim of SPEC §7 (and the figures' qualitative claims), in report order.
CLAIMS: tuple[Claim, ...] = (
    Claim(
        "bijection_accuracy", "Bijection: the transformer's entropy matches Bayes",
        Paper("≈0.003 bits mae_aggregate_bits (Fig 1: evaluated without replacement, trained with replacement); "
              "the authors' code: 0.0067 bits mae_bits on the same checkpoint", {"mae_aggregate_bits": 0.003}),
        # Fig 1's curve, log2(V - k + 1), is the posterior without replacement: judged there.
        "mae_aggregate_bits < 0.02, evaluated without replacement",
        _accuracy("bijection", None, ("mae_bits", "kl_bits"), ("bijection", "bijection_with_replacement")),
        _below("mae_aggregate_bits", 0.02),
    ),
    Claim(
        "bijection_separation", "Bijection: the MLP control fails",
        Paper("MLP ≈1.85 bits mae_aggregate_bits, 618x the transformer; with replacement, where the context-free "
              "prior scores 1.848", {"ratio": 618.0}),
        "MLP mae_aggregate_bits ≥ 20x the transformer's, on one task variant", _separation("bijection", 20),
        _at_least("ratio", 20),
    ),
    Claim(
        "hmm_k20", "HMM K=20: the transformer tracks the forward filter",
        Paper("7.5e-5 bits kl_bits (authors' code; floor 0.05, grid 0.01)", {"kl_bits": 7.5e-5}),
        "kl_bits < 0.01 (2% of the context-free prior's ≈0.5)", _accuracy("hmm", 20, ("mae_bits",)),
        _below("kl_bits", 0.01),
    ),
    Claim(
        "hmm_k30", "HMM K=30 (1.5x the training length)",
        Paper("≈0.012 bits kl_bits (floor 0.05, grid 0.01)", {"kl_bits": 0.012}),
        "kl_bits < 0.05", _accuracy("hmm", 30, ("mae_bits",)), _below("kl_bits", 0.05),
    ),
    Claim(
        "hmm_k50", "HMM K=50 (2.5x the training length)",
        Paper("≈0.029 bits kl_bits (floor 0.05, grid 0.01)", {"kl_bits": 0.029}),
        "kl_bits < 0.1", _accuracy("hmm", 50, ("mae_bits",)), _below("kl_bits", 0.1),
    ),
    Claim(
        "hmm_separation", "HMM: the MLP control fails",
        Paper("MLP ≈0.40 bits at K=20/30/50 (the context-free prior of floor 0.05, grid 0.01 scores 0.414); "
              "the transformer 7.5e-5 kl_bits", {"ratio": 0.40 / 7.5e-5}),
        "MLP kl_bits ≥ 10x the transformer's at the training length, on one task variant", _separation("hmm", 10),
        _at_least("ratio", 10),
    ),
    Claim(
        "late_attention", "Late attention is needed for filtering (Fig 9)",
        Paper("21x worse kl_bits at K=20 (1.57e-3 bits) to 62x at K=50 (floor 0.05, grid 0.01)",
              {"kl_factors": [21.0, 62.0]}),
        "kl_bits of the variant ≥ 2x the full model's at every K", _late_attention, _every_factor_at_least(2),
    ),
    Claim(
        "layer_ablation", "Every layer is necessary (Fig 3)",
        Paper("removing any layer raises the error more than 10x, on both tunnels (no per-layer numbers)"),
        "every layer's error ratio > 10, on the paper's metric of each tunnel trained", _layer_ablation,
        lambda values: values["min_ratio"] > 10,
    ),
    Claim(
        "head_ablation", "One layer-0 head is uniquely destructive (Fig 4)",
        Paper("a single layer-0 'hypothesis-frame' head; no other head comparably sensitive",
              {"worst_layers": [0], "worst_ratios": [0.1624 / 0.00665], "top_over_second": [1.128]},
              authors_fail="the authors' later measurement on the paper's checkpoint, in this task format: top head "
              "L0H3 ΔMAE 0.157 bits, only 1.13x the next (L0H4); 9 heads above half the top"),
        "in every seed: the worst head is in layer 0, doubles mae_bits, and its ΔMAE is ≥ 2x the next head's",
        _head_ablation, _unique_layer0_head,
    ),
    Claim(
        "no_break", "No break at the training horizon (Fig 6)",
        Paper("error rises smoothly with t, no discontinuity at t = 20 (no per-position numbers; the published "
              "7.5e-5 and 0.012 bits imply a mean kl_bits over t = 21-30 of ≈0.036, 480x that before: a rise that "
              "starts at t = 20)"),
        "filters before K (mean kl_bits under 10% of the prior's), and the kl_bits step t = K→K+1 ≤ 2x the largest "
        "step among the 5 positions on either side, at the longest horizon",
        _no_break, _smooth_at_the_horizon,
    ),
    Claim(
        "relabeling", "Relabeling invariance (Fig 8)",
        Paper("ΔMAE ≈ 0, on the diagonal (mae_bits per sequence; no number)"),
        "filters (mae_bits under 10% of the prior's), and the 95% CI of ΔMAE contains 0 or |ΔMAE| < 5% of the MAE",
        _relabeling, _relabeling_invariant,
    ),
    Claim(
        "seeds", "Seeds agree (Fig 11)",
        Paper("5 HMM seeds' per-position curves overlap; the spread is negligible against the MLP gap (no number)"),
        "the MLP's gap ≥ 10x the spread between seeds and ≥ half the MLP's error, on the paper's metric (HMM seeds "
        "where trained)", _seeds, _seeds_agree,
    ),
    Claim(
        "key_orthogonality", "Layer-0 keys form a near-orthogonal basis (Fig 14)",
        Paper("layer-0 cosine < 0.1 (the authors' checklist: a signed mean over all vocabulary tokens, which random "
              "keys meet too)",
              {"best_head_abs_cos": 0.4327, "chance_abs_cos": 0.142},
              authors_fail="their later measure, mean |cos| of normalized output-token keys, gives their own paper "
              "checkpoint 0.43 at its best layer-0 head (0.43-0.49 per head), above its random init (0.13-0.16) and "
              "chance for d_head 32 (0.142)"),
        "the best layer-0 head's mean |cos| over normalized output-token keys < half the chance level for its "
        "width (random directions)", _key_orthogonality, _below_half_chance,
    ),
    Claim(
        "qk_sharpening", "Queries sharpen onto the evidence with depth (Fig 15)",
        Paper("focus on feasible hypotheses grows with depth (a heat map of query-key cosines; the authors define no "
              "scalar and no threshold: this criterion is ours)"),
        "the last layer's evidence lift ≥ 1.2x layer 0's, and its attention entropy ≥ 0.1 bits below layer 0's",
        _qk_sharpening, _sharpens_with_depth,
    ),
    Claim(
        "value_manifold", "Value manifold parameterized by entropy (Fig 16-17)",
        Paper("PC1 > 80% of the variance, strongly tied to entropy (authors' checklist; final-normed residual at the "
              "bijection's value tokens, the best |Pearson| of PC1-5; no threshold for the HMM)"),
        "bijection, the authors' point set: PC1 > 80% and max |Pearson(PC1-5, H_Bayes)| > 0.8",
        _value_manifold, _one_dimensional,
    ),
    Claim(
        "dissociation", "Frame-precision dissociation (bijection)",
        Paper("attention maps stabilize early; calibration keeps improving (no number)"),
        "attention JSD to the final model < 0.05 bits by half of training, and mae_aggregate_bits falls ≥ 2x after",
        _dissociation, _settles_early_then_improves,
    ),
)
