"""Training phases: the plateau exit, the slope after it and the dissociation on constructed
curves with answers worked out by hand, and the analysis end to end on a tiny trained run,
checked against the run's own history and an independent reading of its snapshots."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from windtunnel.analysis import ANALYSES, load_runs
from windtunnel.analysis.dynamics import training_dynamics
from windtunnel.analysis.phases import dissociates, learning_step, log_log_slope, plateau_exit
from windtunnel.results.phases import TrainingPhases
from windtunnel.run_config import run_config_from_mapping
from windtunnel.training.trainer import train
from scopes import once_per_module

STEPS = list(range(0, 1050, 50))  # 0, 50, ..., 1000


def hmm_like_curve(exit_at: int) -> list[float]:
    """0.45 at the start, down to a 0.1 plateau by step 100, then from ``exit_at`` a fall to 0.01."""
    curve = []
    for step in STEPS:
        if step < 100:
            curve.append(0.45 - step * 0.0035)
        elif step < exit_at:
            curve.append(0.1 - 0.00001 * (step - 100))  # a plateau, drifting by at most 1%
        else:
            curve.append(max(0.01, 0.1 * 10 ** (-(step - exit_at + 50) / 150)))
    return curve


def test_the_plateau_is_the_first_flat_stretch_after_the_warm_up_and_the_exit_the_first_below_the_log_midpoint():
    errors = hmm_like_curve(exit_at=500)
    found = plateau_exit(STEPS, errors, warmup_steps=100)
    # The stretch from step 100 is flat (it drifts by at most 1%); the median of its six values
    # (steps 100-350) is the mean of the 3rd and 4th: 0.1 - 0.00001 * 125 = 0.09875.
    assert found["plateau_step"] == 100 and found["plateau"] == pytest.approx(0.09875, abs=1e-15)
    assert found["final"] == 0.01 and found["left"]
    # sqrt(0.09875 * 0.01) = 0.0314: at step 500 the curve is 0.1 * 10^(-1/3) = 0.046, at 550 0.1 * 10^(-2/3) = 0.0215.
    assert found["exit_step"] == 550
    assert plateau_exit(STEPS, hmm_like_curve(exit_at=800), warmup_steps=100)["exit_step"] == 850


def test_a_falling_curve_has_no_plateau_and_a_flat_one_that_ends_flat_was_not_left():
    power_law = [3.0 * step ** -0.8 for step in STEPS[1:]]  # slope -0.8 everywhere: steeper than -0.25
    assert plateau_exit(STEPS[1:], power_law, warmup_steps=100) == {
        "plateau_step": None, "plateau": None, "final": power_law[-1], "left": None, "exit_step": None}
    stuck = [0.4, 0.2, *[0.1 - 0.00002 * i for i in range(19)]]  # flat from step 100 to the end
    found = plateau_exit(STEPS, stuck, warmup_steps=100)
    assert found["plateau_step"] == 100 and found["left"] is False and found["exit_step"] is None
    # Down to exactly half of the plateau's median is leaving it (LEFT_FACTOR = 2).
    level = plateau_exit(STEPS, stuck, warmup_steps=100)["plateau"]
    ends_at_half = [*stuck[:-1], level / 2]
    assert plateau_exit(STEPS, ends_at_half, warmup_steps=100)["left"] is True


def test_the_learning_step_is_half_way_from_the_first_evaluation_to_the_last():
    # sqrt(0.45 * 0.01) = 0.067: the HMM-like curve with its exit at 500 is 0.046 at step 500, 0.0965 at 450.
    assert learning_step(STEPS, hmm_like_curve(exit_at=500)) == 500
    assert learning_step([0, 1, 2], [0.4, 0.3, 0.25]) is None  # fell by less than half


def test_without_an_evaluation_after_the_warm_up_there_is_no_plateau():
    found = plateau_exit([0, 10, 20], [0.5, 0.2, 0.1], warmup_steps=100)
    assert found["plateau"] is None and found["exit_step"] is None
    with pytest.raises(ValueError, match="one error per step"):
        plateau_exit([0, 10], [0.5], warmup_steps=0)


def _least_squares(x: list[float], y: list[float]) -> float:
    """The slope of y on x by numpy's polynomial fit (the oracle for the analysis' own sums)."""
    return float(np.polyfit(x, y, 1)[0])


def test_the_slope_after_the_exit_is_a_power_laws_exponent():
    steps = [100, 200, 400, 800, 1600]
    errors = [3.0 * s ** -0.7 for s in steps]
    assert log_log_slope(steps, errors, 100) == pytest.approx(-0.7, abs=1e-12)  # exact up to rounding
    assert log_log_slope(steps, errors, 400) == pytest.approx(-0.7, abs=1e-12)
    assert log_log_slope(steps, errors, 800) is None  # two points are not a fit
    assert log_log_slope([0, 100, 200, 300], [1.0, 0.5, 0.25, 0.125], 0) == pytest.approx(
        (math.log10(0.125) - math.log10(0.5)) / (math.log10(300) - math.log10(100)), rel=0.05)  # step 0 left out
    # Step 1 is a point like any other (log10 1 = 0); an error of exactly 0 has no logarithm and is
    # left out, not an error: 1, 10, 100 on one power law, and a bent point at 1000 with error 0.
    assert log_log_slope([1, 10, 100, 1000], [2.0, 0.2, 0.02, 0.0]) == pytest.approx(-1.0, abs=1e-12)
    assert log_log_slope([1, 10, 100, 1000], [2.0, 0.5, 0.02, 0.002]) == pytest.approx(
        _least_squares([0, 1, 2, 3], [math.log10(e) for e in (2.0, 0.5, 0.02, 0.002)]), abs=1e-12)


def test_the_dissociation_holds_where_precision_had_twice_as_far_to_go_and_not_otherwise():
    assert dissociates(0.10, 0.02) is True
    assert dissociates(0.04, 0.02) is True  # exactly twice
    assert dissociates(0.03, 0.02) is False
    assert dissociates(None, 0.02) is None


def test_the_plateau_level_is_the_median_of_the_flat_stretch():
    steps = list(range(10, 130, 10))  # 10, 20, ..., 120
    # Warm-up at step 10 (below the plateau, so a slice starting one early has another median);
    # the flat stretch is steps 20-70 (it rises, so its slope is above -0.25); a spike at 80 (so a
    # slice starting one late has another median); then a fall to 0.01.
    window = [0.095, 0.100, 0.101, 0.104, 0.097, 0.112]
    errors = [0.09, *window, 0.2, 0.05, 0.03, 0.02, 0.01]
    found = plateau_exit(steps, errors, warmup_steps=20)
    assert found["plateau_step"] == 20
    # Sorted: 0.095 0.097 0.100 0.101 0.104 0.112; the median of six is (0.100 + 0.101) / 2 = 0.1005.
    # The mean (0.1015), min, max, the first (0.095), last (0.112), middle (0.104), low (0.100) and
    # high (0.101) median, and the medians one slice early (0.0985) or late (0.1025) all differ.
    # Tolerance: the float rounding of a two-term mean.
    assert found["plateau"] == pytest.approx(0.1005, abs=1e-15)
    # Half-way on a log scale: sqrt(0.1005 * 0.01) = 0.0317, first passed by 0.03 at step 100
    # (the arithmetic midpoint, 0.055, would be passed at step 90 already).
    assert found["left"] is True and found["exit_step"] == 100


def test_the_exit_is_the_first_evaluation_strictly_below_the_geometric_midpoint():
    steps = list(range(10, 110, 10))
    # Plateau 0.5, final 0.125: the geometric midpoint sqrt(0.5 * 0.125) = 0.25 exactly (powers
    # of two), the arithmetic one 0.3125. 0.3 is below the arithmetic one only; 0.25 ties the
    # geometric one and is not below it; 0.2 is the first below it.
    errors = [0.5] * 6 + [0.3, 0.25, 0.2, 0.125]
    found = plateau_exit(steps, errors, warmup_steps=10)
    assert (found["plateau_step"], found["plateau"], found["final"], found["left"]) == (10, 0.5, 0.125, True)
    assert found["exit_step"] == 90


def test_the_exit_is_searched_from_the_plateaus_start_on():
    steps = list(range(10, 120, 10))
    # A warm-up evaluation already below the midpoint (0.25) does not count: it precedes the plateau.
    errors = [0.2, *[0.5] * 6, 0.4, 0.3, 0.2, 0.125]
    assert plateau_exit(steps, errors, warmup_steps=20)["exit_step"] == 100
    # The plateau's own first evaluation does count: a stretch that rises from 0.1 is flat (its
    # slope is above -0.25), its median is 0.5, and 0.1 is already below the midpoint 0.25.
    rising = [0.9, 0.1, *[0.5] * 5, 0.4, 0.3, 0.2, 0.125]
    found = plateau_exit(steps, rising, warmup_steps=20)
    assert (found["plateau_step"], found["plateau"], found["exit_step"]) == (20, 0.5, 20)


def test_the_plateau_is_left_at_exactly_left_factor_times_below_it_and_not_short_of_that():
    steps = list(range(10, 80, 10))
    plateau = [0.5] * 6
    # The factor multiplies the final error: 0.125 * 4 = 0.5 <= 0.5 (exactly, powers of two) is left ...
    assert plateau_exit(steps, [*plateau, 0.125], warmup_steps=10, left_factor=4.0)["left"] is True
    # ... 0.13 * 4 = 0.52 is not, though it is more than twice below the plateau.
    found = plateau_exit(steps, [*plateau, 0.13], warmup_steps=10, left_factor=4.0)
    assert found["left"] is False and found["exit_step"] is None
    # The default factor 2: 0.25 is left, 0.26 is not.
    assert plateau_exit(steps, [*plateau, 0.25], warmup_steps=10)["left"] is True
    assert plateau_exit(steps, [*plateau, 0.26], warmup_steps=10)["left"] is False


def test_a_stretch_exactly_at_the_flat_slope_is_not_flat():
    # Errors of exactly 1 have log 0 at every step: a slope of exactly 0.0.
    steps, errors = list(range(10, 110, 10)), [1.0] * 10
    assert plateau_exit(steps, errors, warmup_steps=10, flat_slope=0.0)["plateau_step"] is None  # "above", not "at least"
    assert plateau_exit(steps, errors, warmup_steps=10, flat_slope=-1e-9)["plateau_step"] == 10


def test_the_last_full_window_can_hold_the_plateau_and_a_shorter_one_cannot():
    steps = list(range(1, 11))
    errors = [1.0, 0.5, 0.25, 0.125, *[0.1] * 6]  # steep, then flat over the last six evaluations
    # From step 5 the last six evaluations (steps 5-10) make one full window: a plateau.
    found = plateau_exit(steps, errors, warmup_steps=5)
    assert found["plateau_step"] == 5 and found["plateau"] == 0.1
    # From step 6 only five evaluations remain: too few for a window of six.
    assert plateau_exit(steps, errors, warmup_steps=6)["plateau_step"] is None


def test_a_plateau_may_start_exactly_at_the_end_of_the_warm_up_but_not_at_step_0():
    steps = list(range(0, 120, 10))
    flat = [0.5] * 12  # flat everywhere: the plateau starts at the first step allowed
    assert plateau_exit(steps, flat, warmup_steps=30)["plateau_step"] == 30
    # Step 0 has no logarithm: with no warm-up the plateau starts at the first positive step.
    assert plateau_exit(steps, flat, warmup_steps=0)["plateau_step"] == 10


def test_the_learning_step_is_the_first_strictly_below_the_geometric_midpoint():
    # First 0.5, last 0.125: geometric midpoint 0.25 exactly, arithmetic 0.3125. 0.3 is below
    # the arithmetic one only, 0.25 ties the geometric one, 0.2 at step 3 is the first below it.
    assert learning_step([0, 1, 2, 3, 4], [0.5, 0.3, 0.25, 0.2, 0.125]) == 3
    # A fall by exactly the factor counts: 0.25 * 2 = 0.5; the midpoint sqrt(0.125) = 0.354 is
    # first passed at step 2. The factor multiplies the last error: 0.25 * 4 = 1 > 0.5 has not.
    assert learning_step([0, 1, 2], [0.5, 0.4, 0.25]) == 2
    assert learning_step([0, 1, 2], [0.5, 0.4, 0.25], left_factor=4.0) is None
    # The first evaluation is the start, not the highest: a rise from 0.5 to 0.8 does not move the midpoint.
    assert learning_step([0, 1, 2, 3, 4], [0.5, 0.8, 0.3, 0.2, 0.125]) == 3


def test_the_dissociation_factor_multiplies_the_final_error():
    assert dissociates(0.5, 0.125, factor=4.0) is True  # 4 x 0.125 = 0.5 exactly: at least
    assert dissociates(0.49, 0.125, factor=4.0) is False
    assert dissociates(0.3, 0.125, factor=2.0) is True and dissociates(0.3, 0.125, factor=4.0) is False


# --- the analysis on a trained run ----------------------------------------------------

CONFIG = {
    "tunnel": {"name": "bijection", "V": 6},
    "model": {"kind": "transformer", "n_layers": 2, "n_heads": 2, "d_model": 16, "d_mlp": 32},
    "train": {"steps": 40, "batch_size": 32, "lr": 3e-3, "warmup_steps": 5, "eval_every": 5, "checkpoint_every": 0,
              "log_every": 5, "snapshots_per_decade": 4},
    "eval": {"n": 64, "batch_size": 64},
}


@pytest.fixture(scope=once_per_module)
def trained_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("phases") / "run"
    train(run_config_from_mapping(CONFIG), run_dir, progress=False)
    return run_dir


def test_the_analysis_reads_the_runs_history_and_snapshots(trained_run):
    result = ANALYSES["training_phases"].run(load_runs([trained_run]))
    assert isinstance(result, TrainingPhases)
    run = result.runs[0]
    records = [json.loads(line) for line in (trained_run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if "eval_mae_bits" in r]
    assert list(run.eval_steps) == [r["step"] for r in evals] and list(run.eval_mae_bits) == [r["eval_mae_bits"] for r in evals]
    assert run.final_kl_bits == evals[-1]["eval_kl_bits"]
    assert run.final_mae_bits == evals[-1]["eval_mae_bits"]
    dynamics = training_dynamics(trained_run)
    assert run.attention_moved == (dynamics["attention_jsd_bits"][0] >= dynamics["jsd_threshold_bits"])
    assert run.frame_step == (dynamics["stabilization_step"] if run.attention_moved else None)
    assert run.pc1_variance_explained == dynamics["pc1_variance_explained"][-1]
    assert run.d_head == 8 and run.key_cos_chance == pytest.approx(
        math.gamma(4) / (math.sqrt(math.pi) * math.gamma(4.5)), rel=1e-12)  # E|cos| of random vectors in 8 dimensions
    assert len(run.attention_entropy_bits_by_layer) == 2 and len(run.evidence_lift_by_layer) == 2
    assert TrainingPhases.from_json(json.loads(json.dumps(result.to_json()))) == result


def test_the_analysis_needs_held_out_evaluations_and_snapshots(tmp_path):
    run_dir = tmp_path / "run"
    config = {**CONFIG, "train": {**CONFIG["train"], "steps": 4, "eval_every": 0}}
    train(run_config_from_mapping(config), run_dir, progress=False)
    reason = ANALYSES["training_phases"].applies_to(load_runs([run_dir]))
    assert reason is not None and "fewer than 3 evaluations" in reason


# --- the verdicts of the analysis on a constructed history and constructed dynamics -------

# Evaluations every 5 steps from the warm-up's end (CONFIG: warmup_steps = 5): flat at 0.5 over
# steps 5-30, then down to 0.125. Plateau 0.5 from step 5, final 0.125, midpoint sqrt(0.5 *
# 0.125) = 0.25 exactly: the first below it is 0.2 at step 50 (also the learning step: the
# first evaluation is on the plateau).
HISTORY_STEPS = list(range(5, 65, 5))
HISTORY_MAE = [0.5] * 6 + [0.4, 0.3, 0.25, 0.2, 0.15, 0.125]


def phases_with(monkeypatch, run_dir, *, jsd_at_init: float, frame_step: int, mae_at_frame: float, mae_final: float) -> dict:
    """The analysis of the trained run with its history and its snapshots' dynamics replaced by
    constructed ones (JSD threshold 0.25 bits), so that every verdict is known by hand."""
    records = [{"step": s, "eval_mae_bits": e, "eval_kl_bits": e / 2} for s, e in zip(HISTORY_STEPS, HISTORY_MAE)]
    dynamics = {
        "attention_jsd_bits": [jsd_at_init, 0.1, 0.0],  # the last snapshot is the final model: 0 to itself
        "jsd_threshold_bits": 0.25,
        "stabilization_step": frame_step,
        "mae_bits_at_stabilization": mae_at_frame,
        "mae_bits_final": mae_final,
        "pc1_variance_explained": [0.1, 0.5, 0.9],
        "pc1_entropy_spearman_abs": [0.2, 0.4, 0.8],
    }
    monkeypatch.setattr("windtunnel.analysis.phases.read_metrics", lambda directory: records)
    monkeypatch.setattr("windtunnel.analysis.phases.training_dynamics", lambda directory, device=None: dynamics)
    return ANALYSES["training_phases"].compute(load_runs([run_dir]))["runs"][0]


def test_attention_at_exactly_the_threshold_from_the_final_at_init_has_moved_and_its_frame_is_read(monkeypatch, trained_run):
    run = phases_with(monkeypatch, trained_run, jsd_at_init=0.25, frame_step=30, mae_at_frame=0.22, mae_final=0.1)
    assert (run["plateau_step"], run["plateau_mae_bits"], run["final_mae_bits"], run["left_plateau"]) == (5, 0.5, 0.125, True)
    assert run["exit_step"] == 50 and run["learning_step"] == 50 and run["final_kl_bits"] == 0.0625
    # The slope after the exit: the least-squares fit over steps 50, 55, 60, by numpy.
    fit = np.polyfit(np.log10([50, 55, 60]), np.log10([0.2, 0.15, 0.125]), 1)[0]
    assert run["slope_after_exit"] == pytest.approx(fit, rel=1e-12)  # two least-squares codes agree to rounding
    assert run["attention_moved"] is True and run["frame_step"] == 30 and run["mae_bits_at_frame"] == 0.22
    assert run["frame_before_exit"] is True  # 30 <= 50
    # Dissociation against the snapshots' own final error (0.22 >= 2 x 0.1), not the history's
    # final evaluation (0.22 < 2 x 0.125 would say no).
    assert run["dissociation"] is True
    assert run["pc1_variance_explained"] == 0.9 and run["pc1_entropy_spearman_abs"] == 0.8  # the final snapshot's


def test_a_frame_at_the_exit_step_is_before_it_and_one_after_is_not(monkeypatch, trained_run):
    at_exit = phases_with(monkeypatch, trained_run, jsd_at_init=0.5, frame_step=50, mae_at_frame=0.19, mae_final=0.1)
    assert at_exit["frame_step"] == 50 and at_exit["frame_before_exit"] is True
    assert at_exit["dissociation"] is False  # 0.19 < 2 x 0.1
    after = phases_with(monkeypatch, trained_run, jsd_at_init=0.5, frame_step=55, mae_at_frame=0.2, mae_final=0.1)
    assert after["frame_before_exit"] is False and after["dissociation"] is True  # 0.2 >= 2 x 0.1, exactly


def test_attention_that_never_left_the_threshold_of_the_final_has_no_frame(monkeypatch, trained_run):
    run = phases_with(monkeypatch, trained_run, jsd_at_init=0.2499, frame_step=0, mae_at_frame=0.5, mae_final=0.1)
    assert run["attention_moved"] is False
    assert run["frame_step"] is None and run["mae_bits_at_frame"] is None
    assert run["frame_before_exit"] is None and run["dissociation"] is None
    assert run["exit_step"] == 50  # the error curve's verdicts do not depend on the attention's


def test_a_plateau_may_start_at_step_1_with_no_warm_up():
    # Step 0 is the untrained model (no log-log point); step 1 is the first a plateau can start at.
    found = plateau_exit(list(range(1, 9)), [0.5] * 8, warmup_steps=0)
    assert (found["plateau_step"], found["plateau"], found["left"]) == (1, 0.5, False)


def test_the_final_geometry_is_layer_0s_keys_and_every_layers_attention_of_the_final_weights(trained_run):
    """The geometry columns are the key-orthogonality and QK-sharpening analyses of the same
    run: layer 0's mean |off-diagonal cosine| (not another layer's), every layer's attention
    entropy and evidence lift, and the uniform attention's entropy."""
    runs = load_runs([trained_run])
    run = ANALYSES["training_phases"].compute(runs)["runs"][0]
    keys = ANALYSES["key_orthogonality"].compute(runs)["layers"]
    sharpening = ANALYSES["qk_sharpening"].compute(runs)
    assert run["key_cos_layer0"] == keys[0]["mean_abs_offdiag_cos"]["mean"] != keys[1]["mean_abs_offdiag_cos"]["mean"]
    assert run["attention_entropy_bits_by_layer"] == [row["entropy_bits"]["mean"] for row in sharpening["layers"]]
    assert run["evidence_lift_by_layer"] == [row["lift"]["evidence"] for row in sharpening["layers"]]
    assert run["uniform_attention_entropy_bits"] == sharpening["uniform_entropy_bits"] > 0


def test_a_tunnel_without_evidence_tokens_has_no_evidence_lift(trained_run, monkeypatch):
    """Where QK sharpening finds no evidence category (a tunnel whose tokens carry none), the
    column is empty, not a list of blanks per layer."""
    sharpening = ANALYSES["qk_sharpening"]
    real = sharpening.compute

    def without_evidence(runs):
        result = real(runs)
        result["categories"] = [c for c in result["categories"] if c != "evidence"]
        for row in result["layers"]:
            row["lift"].pop("evidence", None)
        return result

    monkeypatch.setitem(ANALYSES, "qk_sharpening", dataclasses.replace(sharpening, compute=without_evidence))
    run = ANALYSES["training_phases"].compute(load_runs([trained_run]))["runs"][0]
    assert run["evidence_lift_by_layer"] is None and run["attention_entropy_bits_by_layer"]


def test_three_held_out_evaluations_are_enough_for_a_curve_and_two_are_not(tmp_path):
    reasons = []
    for steps in (15, 10):  # evaluations every 5 steps: at 5, 10 (and 15)
        config = {**CONFIG, "train": {**CONFIG["train"], "steps": steps}}
        train(run_config_from_mapping(config), tmp_path / str(steps), progress=False)
        reasons.append(ANALYSES["training_phases"].applies_to(load_runs([tmp_path / str(steps)])))
    assert reasons[0] is None
    assert reasons[1] is not None and "fewer than 3 evaluations" in reasons[1]
