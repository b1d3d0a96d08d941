"""Training phases: the plateau exit, the slope after it and the dissociation on constructed
curves with answers worked out by hand, and the analysis end to end on a tiny trained run,
checked against the run's own history and an independent reading of its snapshots."""

from __future__ import annotations

import json
import math

import pytest

from windtunnel.analysis import ANALYSES, load_runs
from windtunnel.analysis.dynamics import training_dynamics
from windtunnel.analysis.phases import dissociates, learning_step, log_log_slope, plateau_exit
from windtunnel.results.phases import TrainingPhases
from windtunnel.run_config import run_config_from_mapping
from windtunnel.training.trainer import train

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


def test_the_slope_after_the_exit_is_a_power_laws_exponent():
    steps = [100, 200, 400, 800, 1600]
    errors = [3.0 * s ** -0.7 for s in steps]
    assert log_log_slope(steps, errors, 100) == pytest.approx(-0.7, abs=1e-12)  # exact up to rounding
    assert log_log_slope(steps, errors, 400) == pytest.approx(-0.7, abs=1e-12)
    assert log_log_slope(steps, errors, 800) is None  # two points are not a fit
    assert log_log_slope([0, 100, 200, 300], [1.0, 0.5, 0.25, 0.125], 0) == pytest.approx(
        (math.log10(0.125) - math.log10(0.5)) / (math.log10(300) - math.log10(100)), rel=0.05)  # step 0 left out


def test_the_dissociation_holds_where_precision_had_twice_as_far_to_go_and_not_otherwise():
    assert dissociates(0.10, 0.02) is True
    assert dissociates(0.04, 0.02) is True  # exactly twice
    assert dissociates(0.03, 0.02) is False
    assert dissociates(None, 0.02) is None


# --- the analysis on a trained run ----------------------------------------------------

CONFIG = {
    "tunnel": {"name": "bijection", "V": 6},
    "model": {"kind": "transformer", "n_layers": 2, "n_heads": 2, "d_model": 16, "d_mlp": 32},
    "train": {"steps": 40, "batch_size": 32, "lr": 3e-3, "warmup_steps": 5, "eval_every": 5, "checkpoint_every": 0,
              "log_every": 5, "snapshots_per_decade": 4},
    "eval": {"n": 64, "batch_size": 64},
}


@pytest.fixture(scope="module")
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
