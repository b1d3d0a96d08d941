"""The claim table's verdicts on hand-written results, on both sides of each criterion."""

from __future__ import annotations

import pytest

from windtunnel.report.claims import CLAIMS, evaluate_claims


def verdicts(results) -> dict[str, tuple[str, bool | None]]:
    return {claim.claim: (ours, holds) for claim, ours, holds in evaluate_claims(results)}


def comparison(transformer: dict[int, float], mlp: dict[int, float], training_horizon: int) -> dict:
    def model(values):
        return {"n_runs": 1, "horizons": {str(h): {"mae_bits": {"mean": v, "std": 0.0}} for h, v in values.items()}}

    return {"horizons": list(transformer), "training_horizon": training_horizon,
            "models": {"transformer": model(transformer), "mlp": model(mlp)}}


def test_nothing_measured_is_not_applicable_not_a_failure():
    rows = evaluate_claims({})
    assert len(rows) == len(CLAIMS)
    assert all(ours.startswith("n/a") and holds is None for _, ours, holds in rows)


@pytest.mark.parametrize("transformer, holds", [(0.01, True), (0.03, False)])
def test_bijection_accuracy_and_separation(transformer, holds):
    results = {"bijection": {"model_comparison": comparison({19: transformer}, {19: 1.1}, 19)}}
    got = verdicts(results)
    assert got["Bijection: the transformer's entropy matches Bayes"][1] is holds  # criterion: < 0.02 bits
    # 1.1 / 0.01 = 110x >= 20x holds; 1.1 / 0.03 = 37x holds too
    assert got["Bijection: the MLP control fails"][1] is True


def test_hmm_separation_is_judged_at_the_training_horizon():
    # 12x at K=20 (the training length) but 2x at K=50: holds, and the text shows every ratio.
    results = {"hmm": {"model_comparison": comparison({20: 0.05, 30: 0.1, 50: 0.3}, {20: 0.6, 30: 0.6, 50: 0.6}, 20)}}
    ours, holds = verdicts(results)["HMM: the MLP control fails"]
    assert holds is True and "12x/6x/2x at K=20/30/50" in ours
    results["hmm"]["model_comparison"]["models"]["mlp"]["horizons"]["20"]["mae_bits"]["mean"] = 0.45  # 9x
    assert verdicts(results)["HMM: the MLP control fails"][1] is False


@pytest.mark.parametrize("ratios, holds", [([11.0, 50.0], True), ([9.9, 50.0], False)])
def test_every_layer_must_exceed_ten(ratios, holds):
    results = {"bijection_transformer": {"layer_ablation": {"layers": [{"mae_ratio": r} for r in ratios]}}}
    assert verdicts(results)["Every layer is necessary (Fig 3)"][1] is holds


@pytest.mark.parametrize(
    "heads, holds",
    [
        ([(0, 0, 8.0), (1, 0, 3.0)], True),  # layer 0, 8 >= 2 x 3
        ([(0, 0, 5.0), (1, 0, 3.0)], False),  # not uniquely destructive
        ([(1, 0, 8.0), (0, 0, 3.0)], False),  # not in layer 0
    ],
)
def test_one_layer0_head_uniquely_destructive(heads, holds):
    rows = [{"layer": layer, "head": head, "mae_ratio": ratio} for layer, head, ratio in heads]
    results = {"bijection_transformer": {"head_ablation": {"heads": rows}}}
    assert verdicts(results)["One layer-0 head is uniquely destructive (Fig 4)"][1] is holds


def test_relabeling_holds_when_the_interval_contains_zero_or_the_change_is_small():
    def result(delta, ci, relative):
        return {"hmm_transformer": {"relabeling": {"per_run": [{"delta_mae_bits": delta, "delta_mae_bits_ci": ci}],
                                                   "relative_change": relative}}}

    claim = "Relabeling invariance (Fig 8)"
    assert verdicts(result(0.001, [-0.001, 0.003], 0.2))[claim][1] is True
    assert verdicts(result(0.001, [0.0005, 0.0015], 0.01))[claim][1] is True
    assert verdicts(result(0.02, [0.01, 0.03], 0.5))[claim][1] is False


def test_dissociation_needs_early_settling_and_a_later_fall():
    def result(fraction, ratio):
        return {"bijection_transformer": {"training_dynamics": {
            "stabilization_step": 100, "stabilization_fraction": fraction, "mae_bits_at_stabilization": 0.2,
            "mae_bits_final": 0.2 / ratio, "mae_ratio_stabilization_to_final": ratio}}}

    claim = "Frame-precision dissociation (bijection)"
    assert verdicts(result(0.1, 38.0))[claim][1] is True
    assert verdicts(result(0.6, 38.0))[claim][1] is False
    assert verdicts(result(0.1, 1.5))[claim][1] is False
