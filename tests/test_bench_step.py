"""`bench/step.py` runs in CI's time on a CPU: the paper-shape bijection step, plain against
the full forward, with its FLOPs held to a closed form written here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

STEP = Path(__file__).resolve().parents[1] / "bench" / "step.py"

pytestmark = pytest.mark.slow


def _paper_bijection_training_flops(batch: int = 128, T: int = 39, d: int = 192, d_mlp: int = 768, layers: int = 6, classes: int = 20) -> int:
    """Matmul FLOPs (2 per multiply-add) of a training step computing every position: per token
    and layer the Q, K, V, O projections, both MLP matmuls, and scores and value mixing over
    the whole T x T grid; the head; the backward pass twice the forward."""
    per_token_layer = 2 * (4 * d * d + 2 * d * d_mlp) + 2 * 2 * T * d
    forward = batch * T * (layers * per_token_layer + 2 * d * classes)
    return 3 * forward


def test_bench_step_measures_the_paper_bijection_step_on_cpu():
    result = subprocess.run(
        [sys.executable, str(STEP), "--steps", "3", "--presets", "bijection_transformer", "--variants", "plain", "full_forward",
         "--devices", "cpu", "--threads", "2"],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    entry = report["devices"]["cpu"]["bijection_transformer"]
    assert set(entry) >= {"plain", "full_forward", "over_plain", "flops_per_step", "data_share_of_plain_step"}
    full = _paper_bijection_training_flops()
    # The plain step computes only what the 19 supervised positions need: less than the full
    # forward, and (6 layers, the last one's position-wise work and the head trimmed) more than half.
    assert 0.5 * full < entry["flops_per_step"] < full
    plain = entry["plain"]
    assert plain["steps_per_s"] > 0 and plain["flop_per_s"] == pytest.approx(entry["flops_per_step"] * plain["steps_per_s"], rel=0.01)
    assert entry["over_plain"]["full_forward"] == pytest.approx(entry["full_forward"]["steps_per_s"] / plain["steps_per_s"], rel=0.01)
    assert 0 < entry["data_share_of_plain_step"] < 1
    assert plain["projected_run_min"] == pytest.approx(100_000 / plain["steps_per_s"] / 60, rel=0.01)
    assert "bf16" not in entry  # measured on CUDA only, where the paper-scale runs train


def test_bench_step_refuses_a_device_it_does_not_have():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    result = subprocess.run([sys.executable, str(STEP), "--devices", "cuda"], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "torch sees no CUDA device" in result.stderr


def test_bench_step_measures_run_groups_and_counts_dispatched_ops():
    result = subprocess.run(
        [sys.executable, str(STEP), "--steps", "3", "--presets", "bijection_transformer", "--variants", "plain", "--devices", "cpu",
         "--threads", "1", "--groups", "1", "2", "--configs", str(STEP.parents[1] / "configs" / "cpu")],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    entry = json.loads(result.stdout)["devices"]["cpu"]["bijection_transformer"]
    for size in (1, 2):
        group = entry[f"group_{size}"]
        assert group["runs_steps_per_s"] == pytest.approx(size * group["steps_per_s"], abs=2e-3)  # both rounded to 3 decimals
        assert group["over_plain_lone"] == pytest.approx(group["runs_steps_per_s"] / entry["plain"]["steps_per_s"], rel=1e-2)
    ops = entry["dispatched_ops_per_step"]
    # Two runs draw two batches and clip two gradient sets: more ops than one, and not twice a lone step's.
    assert 0 < ops["lone"] and ops["group_1"] < ops["group_2"] < 2 * ops["group_1"]
