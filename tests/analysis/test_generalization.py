"""Length generalization, relabeling, Table 1, late attention and seeds on constructed models.

Every model here predicts one fixed distribution q at every position (all weights zero
but the unembedding bias, so logits = log q + c whatever the tokens). Its errors then
have closed forms computed from the episodes alone, independently of the analysis code:
|H(q) − H_Bayes| per position, KL(posterior ‖ q), and with q uniform the context-free
prior's row (every tunnel here has a uniform prior predictive by symmetry).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from windtunnel.analysis import ANALYSES, Run, eval_set_for
from windtunnel.analysis.generalization import boundary_step
from windtunnel.analysis.runner import analyze_runs
from windtunnel.config import ConfigError
from windtunnel.run_config import run_config_from_mapping
from windtunnel.run_config import build_run_model

HMM = {
    "tunnel": {"name": "hmm", "S": 3, "M": 3, "K": 4, "grid": 0.1},
    "model": {"kind": "transformer", "n_layers": 2, "n_heads": 2, "d_model": 16, "d_mlp": 32},
    "eval": {"n": 96, "batch_size": 48, "horizons": [4, 7], "bootstrap": 200},
}
MLP = {"kind": "mlp", "n_blocks": 2, "d_hidden": 16, "d_model": 16}
LATE = {**HMM["model"], "no_attention_layers": [1]}


def constant_run(model: dict, distribution: list[float], *, seed: int = 0, base: dict = HMM) -> Run:
    """A run whose model predicts ``distribution`` at every position, whatever it reads."""
    config = run_config_from_mapping({**base, "model": model}, [f"train.seed={seed}"])
    net = build_run_model(config)
    with torch.no_grad():
        for parameter in net.parameters():
            parameter.zero_()
        net.head.bias.copy_(torch.tensor(distribution).log())
    return Run(Path(f"/constructed/{model['kind']}/{seed}"), config, net.eval(), 0)


def closed_form(run: Run, distribution: list[float], horizon: int) -> dict[str, np.ndarray | float]:
    """Errors of the constant predictor q against the exact posteriors, in numpy."""
    q = np.asarray(distribution, dtype=np.float64)
    h_q = -(q * np.log2(q)).sum()
    posterior = np.concatenate([e.posterior.numpy() for e in eval_set_for(run.config, horizon=horizon).episodes])  # [N, P, C]
    with np.errstate(divide="ignore", invalid="ignore"):
        h_bayes = -np.where(posterior > 0, posterior * np.log2(posterior), 0.0).sum(-1)  # [N, P]
        kl = np.where(posterior > 0, posterior * np.log2(posterior / q), 0.0).sum(-1)
    return {
        "abs_error_curve": np.abs(h_q - h_bayes).mean(0),
        "kl_curve": kl.mean(0),
        "mae_bits": np.abs(h_q - h_bayes).mean(),
        "mae_aggregate_bits": np.abs(h_q - h_bayes.mean(0)).mean(),
        "kl_bits": kl.mean(),
    }


UNIFORM = [1 / 3] * 3
SKEWED = [0.7, 0.2, 0.1]


def test_length_generalization_matches_the_closed_form_at_each_horizon():
    run = constant_run(HMM["model"], SKEWED)
    result = ANALYSES["length_generalization"].compute([run])
    assert result["training_horizon"] == 4 and set(result["horizons"]) == {"4", "7"}
    for horizon in (4, 7):
        expected = closed_form(run, SKEWED, horizon)
        row = result["horizons"][str(horizon)]
        # float32 logits of log q: q is reproduced to ~1e-7 relative, far below these tolerances.
        assert row["mae_bits"]["mean"] == pytest.approx(expected["mae_bits"], rel=1e-5)
        assert row["kl_bits"]["mean"] == pytest.approx(expected["kl_bits"], rel=1e-5)
        np.testing.assert_allclose(row["curves"]["abs_error_bits"], expected["abs_error_curve"], rtol=1e-5)
        assert len(row["curves"]["kl_bits"]) == horizon
    beyond = result["horizons"]["7"]
    curve = expected["abs_error_curve"]
    assert beyond["beyond_training_mae_bits"] == pytest.approx(curve[4:].mean(), rel=1e-5)
    assert beyond["within_training_mae_bits"] == pytest.approx(curve[:4].mean(), rel=1e-5)
    assert beyond["jump_at_training_horizon"] == pytest.approx(curve[4:7].mean() / curve[:4].mean(), rel=1e-5)
    for metric, curve in (("mae_bits", expected["abs_error_curve"]), ("kl_bits", expected["kl_curve"])):
        row = beyond["beyond"][metric]
        assert row["within_training"] == pytest.approx(curve[:4].mean(), rel=1e-5)
        assert row["beyond_training"] == pytest.approx(curve[4:].mean(), rel=1e-5)
        steps = np.diff(curve)  # steps[i]: t = i + 1 -> i + 2; the boundary t = 4 -> 5 is steps[3]
        assert row["boundary"]["step"] == pytest.approx(steps[3], rel=1e-4, abs=1e-9)
        assert row["boundary"]["largest_neighbor_step"] == pytest.approx(np.abs(np.r_[steps[:3], steps[4:]]).max(), rel=1e-4)


def test_each_seed_gets_its_own_boundary_from_its_own_curve():
    # Two constant "seeds": each per-run row is judged on that seed's closed-form curve, not the mean.
    runs = [constant_run(HMM["model"], SKEWED, seed=0), constant_run(HMM["model"], [0.5, 0.3, 0.2], seed=1)]
    result = ANALYSES["length_generalization"].compute(runs)
    rows = result["horizons"]["7"]["per_run"]
    for run, distribution, row in zip(runs, (SKEWED, [0.5, 0.3, 0.2]), rows):
        curve = closed_form(run, distribution, 7)["kl_curve"]
        steps = np.diff(curve)
        got = row["beyond"]["kl_bits"]
        assert got["within_training"] == pytest.approx(curve[:4].mean(), rel=1e-5)
        assert got["boundary"]["step"] == pytest.approx(steps[3], rel=1e-4, abs=1e-9)
        assert got["boundary"]["largest_neighbor_step"] == pytest.approx(np.abs(np.r_[steps[:3], steps[4:]]).max(), rel=1e-4)
    assert rows[0]["beyond"]["kl_bits"]["within_training"] != pytest.approx(rows[1]["beyond"]["kl_bits"]["within_training"])
    assert "beyond" not in result["horizons"]["4"]["per_run"][0]  # the training horizon has nothing beyond


def test_the_boundary_step_tells_a_break_from_a_drift():
    K = 20
    flat = [0.001] * K
    ramp = flat + [0.001 + 0.004 * i for i in range(1, 31)]  # drifts upward from t = K on, steadily
    jump = flat + [0.05 + 0.004 * i for i in range(30)]  # a step of 0.049 at t = K -> K + 1, then the same drift
    drift = boundary_step(ramp, K)
    assert drift["step"] == pytest.approx(0.004) and drift["largest_neighbor_step"] == pytest.approx(0.004)
    assert drift["ratio"] == pytest.approx(1.0)
    broken = boundary_step(jump, K)
    assert broken["step"] == pytest.approx(0.049) and broken["ratio"] == pytest.approx(0.049 / 0.004)
    # Neighbors: the 5 steps into t = K, the 5 steps after t = K + 1; a wider window reaches further.
    noisy = [0.0] * 10 + [0.0, 0.0, 0.0, 0.0, 0.01, 0.0, 0.0, 0.0, 0.0, 0.0] + [0.0, 0.03, 0.0, 0.0, 0.0, 0.0, 0.0, 0.2]
    # positions 15 (0.01), 22 (0.03) and 28 (0.2, outside the window): largest |step| nearby is 0.03
    assert boundary_step(noisy, K)["largest_neighbor_step"] == pytest.approx(0.03)
    assert boundary_step(noisy, K, window=8)["largest_neighbor_step"] == pytest.approx(0.2)
    assert boundary_step(flat + flat, K)["ratio"] is None  # nothing moves: no ratio
    with pytest.raises(ValueError, match="does not extend past"):
        boundary_step(flat, K)


def test_a_predictor_blind_to_the_header_is_exactly_relabeling_invariant():
    runs = [constant_run(HMM["model"], SKEWED, seed=s) for s in (0, 1)]
    result = ANALYSES["relabeling"].compute(runs)
    # A relabeling leaves the observations, and so the entropy of every exact posterior,
    # unchanged; a predictor that ignores the header is therefore exactly as good after it.
    # Up to float64 rounding: the permuted posterior's entropy sums the same terms in another order.
    assert result["delta_mae_bits"]["mean"] == pytest.approx(0.0, abs=1e-12)
    assert result["per_run"][0]["delta_mae_bits_ci"] == pytest.approx([0.0, 0.0], abs=1e-12)
    np.testing.assert_allclose(result["scatter"]["before"], result["scatter"]["after"], atol=1e-12)
    assert len(result["scatter"]["before"]) == HMM["eval"]["n"]


def test_the_relative_change_is_the_size_of_the_mean_change_over_the_mean_error_before(monkeypatch):
    """Relabeling that helps (ΔMAE < 0) or hurts moves the error by |mean ΔMAE| / mean MAE before: a size, never negative."""
    rows = iter([(0.2, 0.1), (0.3, 0.28), (0.7, 0.61),  # MAE before and after of each run: ΔMAE -0.1, -0.02, -0.09
                 (0.25, 0.5), (0.25, 0.25)])  # then a relabeling that hurts: ΔMAE +0.25, 0

    def scored(predictor, eval_set, tunnel, *, seed, bootstrap):  # the runs are scored in order
        b, a = next(rows)
        return {"mae_bits_before": b, "mae_bits_after": a, "delta_mae_bits": a - b, "delta_mae_bits_ci": [a - b, a - b],
                "per_sequence_before": [b], "per_sequence_after": [a]}

    monkeypatch.setattr("windtunnel.analysis.generalization.score_relabeling", scored)
    result = ANALYSES["relabeling"].compute([constant_run(HMM["model"], SKEWED, seed=s) for s in (0, 1, 2)])
    # Mean ΔMAE (0.61 + 0.28 + 0.1 - 0.7 - 0.3 - 0.2) / 3 = -0.07; mean MAE before 1.2 / 3 = 0.4.
    # Tolerance: float64 rounding of three-term sums.
    assert result["delta_mae_bits"]["mean"] == pytest.approx(-0.07, abs=1e-15)
    assert result["relative_change"] == pytest.approx(0.07 / 0.4, rel=1e-12)  # 0.175, not -0.175
    # Not the medians' (0.09 / 0.3), nor against the error after (0.07 / 0.33).
    assert result["relative_change"] != pytest.approx(0.3) and result["relative_change"] != pytest.approx(0.07 / 0.33)
    assert result["scatter"] == {"before": [0.2], "after": [0.1]}  # the first run's sequences
    assert [row["delta_mae_bits"] for row in result["per_run"]] == pytest.approx([-0.1, -0.02, -0.09], abs=1e-15)
    hurt = ANALYSES["relabeling"].compute([constant_run(HMM["model"], SKEWED, seed=s) for s in (0, 1)])
    # Mean ΔMAE 0.125 over mean MAE before 0.25 (powers of two: exact).
    assert hurt["delta_mae_bits"]["mean"] == 0.125 and hurt["relative_change"] == 0.5


def test_model_comparison_table_against_closed_forms_and_the_prior_row():
    transformer = constant_run(HMM["model"], SKEWED)
    mlp = constant_run(MLP, UNIFORM)
    result = ANALYSES["model_comparison"].compute([transformer, mlp])
    assert result["reference"] == "transformer" and set(result["models"]) == {"transformer", "mlp"}
    for horizon in (4, 7):
        skewed, uniform = closed_form(transformer, SKEWED, horizon), closed_form(mlp, UNIFORM, horizon)
        rows = {name: model["horizons"][str(horizon)] for name, model in result["models"].items()}
        assert rows["mlp"]["mae_bits"]["mean"] == pytest.approx(uniform["mae_bits"], rel=1e-5)
        # The uniform predictor is the context-free prior here (symmetric Dirichlet priors).
        assert rows["mlp"]["mae_bits"]["mean"] == pytest.approx(rows["mlp"]["prior"]["mae_bits"], rel=1e-5)
        assert rows["transformer"]["kl_bits"]["mean"] == pytest.approx(skewed["kl_bits"], rel=1e-5)
        ratio = result["ratios"]["mlp"][str(horizon)]["mae_bits"]
        assert ratio == pytest.approx(uniform["mae_bits"] / skewed["mae_bits"], rel=1e-5)
    lines = result["markdown"].splitlines()
    assert lines[0].startswith("| model | seeds | horizon | mae_bits")
    assert len(lines) == 2 + 2 * 2 + 2  # header, rule, 2 models x 2 horizons, a prior row per horizon


def test_late_attention_factor_is_the_ratio_of_the_two_models_errors():
    full = constant_run(HMM["model"], SKEWED)
    late = constant_run(LATE, UNIFORM)
    result = ANALYSES["late_attention"].compute([full, late])
    assert result["no_attention_layers"] == [1]
    for horizon in (4, 7):
        variant, reference = closed_form(late, UNIFORM, horizon), closed_form(full, SKEWED, horizon)
        row = result["horizons"][str(horizon)]
        for metric in ("mae_aggregate_bits", "mae_bits", "kl_bits"):
            assert row["factors"][metric] == pytest.approx(variant[metric] / reference[metric], rel=1e-5), metric
        assert row["kl_factor"] == row["factors"]["kl_bits"] and row["mae_factor"] == row["factors"]["mae_bits"]


def test_late_attention_factor_is_taken_against_the_median_seed():
    # Three full-model seeds, one of them stuck at a worse predictor (as an HMM seed still on
    # its plateau): the factor divides by the median seed's error, not by their mean.
    full = [constant_run(HMM["model"], SKEWED, seed=0), constant_run(HMM["model"], UNIFORM, seed=1),
            constant_run(HMM["model"], SKEWED, seed=2)]
    late = constant_run(LATE, UNIFORM, seed=0)
    result = ANALYSES["late_attention"].compute([*full, late])
    for horizon in (4, 7):
        variant, median_seed = closed_form(late, UNIFORM, horizon), closed_form(full[0], SKEWED, horizon)
        row = result["horizons"][str(horizon)]
        assert row["factors"]["kl_bits"] == pytest.approx(variant["kl_bits"] / median_seed["kl_bits"], rel=1e-5)
        stuck = closed_form(full[1], UNIFORM, horizon)["kl_bits"]
        mean_seed = (2 * median_seed["kl_bits"] + stuck) / 3
        assert abs(row["factors"]["kl_bits"] - variant["kl_bits"] / mean_seed) > 0.1 * row["factors"]["kl_bits"]  # the mean would differ


def test_seeds_spread_and_gap_to_the_mlp():
    # Two "seeds" predicting different constants: their spread is the difference of their
    # closed-form errors; the MLP's gap is measured from their mean.
    seed0, seed1 = constant_run(HMM["model"], SKEWED, seed=0), constant_run(HMM["model"], [0.5, 0.3, 0.2], seed=1)
    mlp = constant_run(MLP, UNIFORM)
    result = ANALYSES["seeds"].compute([seed0, seed1, mlp])
    assert result["seeds"] == [0, 1] and result["model"] == "transformer"
    row = result["horizons"]["4"]
    a, b = closed_form(seed0, SKEWED, 4)["mae_bits"], closed_form(seed1, [0.5, 0.3, 0.2], 4)["mae_bits"]
    m = closed_form(mlp, UNIFORM, 4)["mae_bits"]
    assert row["spread_bits"] == pytest.approx(abs(a - b), rel=1e-4)
    assert row["gap_to_mlp_bits"] == pytest.approx(m - (a + b) / 2, rel=1e-4)
    assert row["gap_over_spread"] == pytest.approx((m - (a + b) / 2) / abs(a - b), rel=1e-3)
    # The same for every metric (the claim reads the paper's metric of the tunnel).
    for metric in ("mae_aggregate_bits", "mae_bits", "kl_bits"):
        a, b = closed_form(seed0, SKEWED, 4)[metric], closed_form(seed1, [0.5, 0.3, 0.2], 4)[metric]
        m = closed_form(mlp, UNIFORM, 4)[metric]
        stats = row["metrics"][metric]
        assert stats["mean"] == pytest.approx((a + b) / 2, rel=1e-5) and stats["spread"] == pytest.approx(abs(a - b), rel=1e-4)
        assert stats["mlp"] == pytest.approx(m, rel=1e-5) and stats["gap_to_mlp"] == pytest.approx(m - (a + b) / 2, rel=1e-4)
        assert stats["gap_over_spread"] == pytest.approx((m - (a + b) / 2) / abs(a - b), rel=1e-3)


def test_which_analyses_apply(tmp_path):
    single = [constant_run(HMM["model"], UNIFORM)]
    mixed = [*single, constant_run(MLP, UNIFORM)]
    assert ANALYSES["model_comparison"].applies_to(single) is not None
    assert ANALYSES["seeds"].applies_to(mixed) is not None  # one seed of each model
    assert ANALYSES["late_attention"].applies_to(mixed) is not None
    assert ANALYSES["layer_ablation"].applies_to(mixed) is not None  # averages seeds of one model only
    bijection = constant_run({**HMM["model"]}, [1 / 4] * 4, base={"tunnel": {"name": "bijection", "V": 4}, "eval": {"n": 32}})
    assert "the bijection tunnel does not declare Relabeling" in ANALYSES["relabeling"].applies_to([bijection])
    with pytest.raises(ConfigError, match="does not apply"):
        analyze_runs([bijection], tmp_path, only=["relabeling"])


def test_analyze_runs_writes_json_markdown_and_figures(tmp_path):
    runs = [constant_run(HMM["model"], SKEWED), constant_run(MLP, UNIFORM), constant_run(LATE, UNIFORM)]
    written = analyze_runs(runs, tmp_path)
    assert set(written) == {"model_comparison", "late_attention"}
    assert (tmp_path / "model_comparison.md").read_text().startswith("| model |")
    # Every saved result names its task variant: the runs' tunnel parameters.
    saved = json.loads((tmp_path / "model_comparison.json").read_text())
    assert saved["tunnel"] == {"name": "hmm", "S": 3, "M": 3, "K": 4, "concentration": 1.0, "transition_concentration": None, "stickiness": 0.0, "grid": 0.1, "floor": 0.0, "initial": None}
    for name in written:
        assert (tmp_path / f"{name}.png").stat().st_size > 10_000  # a drawn figure, not an empty canvas
    # Re-running with skip_existing reuses the JSON: nothing is recomputed.
    before = (tmp_path / "late_attention.json").stat().st_mtime_ns
    analyze_runs(runs, tmp_path, skip_existing=True)
    assert (tmp_path / "late_attention.json").stat().st_mtime_ns == before


def test_bijection_closed_form_prior_entropy():
    """Sanity of the oracle used above on the bijection: the uniform predictor's error at
    step k is |log2 V − log2(V − k + 1)|, the closed form of the posterior's entropy."""
    run = constant_run({**HMM["model"]}, [1 / 5] * 5, base={"tunnel": {"name": "bijection", "V": 5}, "eval": {"n": 32}})
    horizons = ANALYSES["length_generalization"].compute([run])["horizons"]
    curve = horizons[str(run.config.tunnel.horizon)]["curves"]["abs_error_bits"]
    # float32 logits of log(1/5): the predicted entropy is log2 5 to ~1e-7.
    np.testing.assert_allclose(curve, [math.log2(5) - math.log2(5 - k + 1) for k in range(1, len(curve) + 1)], atol=1e-6)
