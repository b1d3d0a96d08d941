"""Entropy calibration (Fig 1/5, 2/7) against predictors whose entropies are known by hand."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from matplotlib import image

from windtunnel.analysis.base import Run
from windtunnel.analysis.calibration import (
    calibration_of_runs,
    closed_form_entropy_bits,
    entropy_calibration,
    select_traces,
)
from windtunnel.evaluation import EvalSet, oracle_predictor, prior_predictor
from windtunnel.figures import FIGURES
from windtunnel.run_config import run_config_from_mapping
from windtunnel.run_config import build_run_model
from windtunnel.tunnels.bijection import BijectionTunnel
from windtunnel.tunnels.hmm import HMMTunnel


def _eval_set(tunnel, n=40, batch_size=16, seed=3):
    # Several batches, so the analysis must pool sequences across episodes.
    return EvalSet.draw(tunnel, horizon=tunnel.horizon, n=n, batch_size=batch_size, seed=seed)


@pytest.mark.parametrize("V, query", [(6, False), (5, True)])
def test_oracle_equals_bayes_and_the_closed_form(V, query):
    tunnel = BijectionTunnel(V=V, query=query)
    result = entropy_calibration({"oracle": oracle_predictor}, _eval_set(tunnel), tunnel)
    n_pairs = V - 1
    expected = [math.log2(V - k + 1) for k in range(1, n_pairs + 1)] + [0.0] * query  # query: answer was shown
    assert result["positions"] == list(range(1, len(expected) + 1))
    assert result["closed_form_bits"] == pytest.approx(expected, abs=1e-12)
    assert result["bayes_entropy_bits"] == pytest.approx(expected, abs=1e-12)
    # The model row's entropy is computed from the probabilities, Bayes' in closed form: equal to rounding.
    assert result["model_entropy_bits"] == pytest.approx(result["bayes_entropy_bits"], abs=1e-12)
    for name in ("mae_aggregate_bits", "mae_bits", "kl_bits", "mae_of_mean_curve_bits", "trace_mae_bits"):
        assert result[name] == pytest.approx(0.0, abs=1e-12)
    assert len(result["traces"]["sequences"]) == 8 and result["n_sequences"] == 40


def test_oracle_on_the_hmm_tunnel_has_no_closed_form():
    tunnel = HMMTunnel()
    result = entropy_calibration({"oracle": oracle_predictor}, _eval_set(tunnel, n=16), tunnel)
    assert result["closed_form_bits"] is None
    assert result["mae_bits"] == pytest.approx(0.0, abs=1e-12) and result["kl_bits"] == pytest.approx(0.0, abs=1e-12)
    for trace in result["traces"]["sequences"]:
        assert trace["model_entropy_bits"] == pytest.approx(trace["bayes_entropy_bits"], abs=1e-12)


def test_uniform_predictor_error_by_hand():
    # The prior is uniform over V outputs at every position: entropy log2(V), exact is log2(V - k + 1).
    V = 6
    tunnel = BijectionTunnel(V=V)
    result = entropy_calibration({"prior": prior_predictor(tunnel)}, _eval_set(tunnel), tunnel)
    gaps = [math.log2(V) - math.log2(V - k + 1) for k in range(1, V)]
    assert result["model_entropy_bits"] == pytest.approx([math.log2(V)] * (V - 1), abs=1e-12)
    # Every sequence has the same entropies, so the per-sequence and aggregate errors agree.
    assert result["mae_aggregate_bits"] == pytest.approx(sum(gaps) / len(gaps), abs=1e-12)
    assert result["mae_bits"] == pytest.approx(sum(gaps) / len(gaps), abs=1e-12)
    # KL(uniform over V-k+1 || uniform over V) = log2(V / (V - k + 1)) = the entropy gap.
    assert result["kl_bits"] == pytest.approx(sum(gaps) / len(gaps), abs=1e-12)
    assert result["traces"]["sequences"][0]["mae_bits"] == pytest.approx(sum(gaps) / len(gaps), abs=1e-12)


def test_select_traces_takes_the_most_varied_first_among_ties():
    h = torch.tensor(
        [
            [3.0, 2.0, 1.0],  # variation 2
            [3.0, 0.0, 3.0],  # 6
            [1.0, 1.0, 1.0],  # 0
            [2.0, 1.0, 0.0],  # 2 (ties with row 0, which comes first)
            [0.0, 2.0, 0.0],  # 4
        ],
        dtype=torch.float64,
    )
    assert select_traces(h, 3) == [1, 4, 0]
    assert select_traces(h, 10) == [1, 4, 0, 3, 2]


def test_with_replacement_traces_are_staircases():
    V, L = 5, 9
    tunnel = BijectionTunnel(V=V, L=L, with_replacement=True)
    eval_set = _eval_set(tunnel, n=32)
    result = entropy_calibration({"oracle": oracle_predictor}, eval_set, tunnel)
    assert closed_form_entropy_bits(tunnel, L) is None and result["closed_form_bits"] is None
    inputs = torch.cat([e.inputs for e in eval_set.episodes])  # [N, L]
    for trace in result["traces"]["sequences"]:
        seen: set[int] = set()
        expected = []
        for x in inputs[trace["index"]].tolist():
            # A repeated input has a known answer; a new one is uniform over the unused outputs.
            expected.append(0.0 if x in seen else math.log2(V - len(seen)))
            seen.add(x)
        assert trace["bayes_entropy_bits"] == pytest.approx(expected, abs=1e-12)
    # The traces chosen vary at least as much as any sequence left out.
    h = np.array([np.abs(np.diff(row)).sum() for row in torch.cat([e.entropy_bits for e in eval_set.episodes]).numpy()])
    chosen = [t["index"] for t in result["traces"]["sequences"]]
    assert h[chosen].min() >= np.delete(h, chosen).max()


def test_registered_analysis_on_two_runs_and_its_figure(tmp_path):
    config = run_config_from_mapping(
        {
            "tunnel": {"name": "bijection", "V": 6},
            "model": {"kind": "transformer", "n_layers": 1, "n_heads": 2, "d_model": 16, "d_mlp": 32},
            "eval": {"n": 48, "batch_size": 32},
        }
    )
    runs = []
    for seed in (0, 1):
        seeded = run_config_from_mapping(config.to_mapping(), [f"train.seed={seed}"])
        runs.append(Run(tmp_path, seeded, build_run_model(seeded).eval(), 0))  # untrained: nothing to wait for
    result = json.loads(json.dumps(calibration_of_runs(runs)))  # JSON-able, as the runner saves it
    assert [r["label"] for r in result["runs"]] == ["transformer seed 0", "transformer seed 1"]
    assert [r["step"] for r in result["runs"]] == [0, 0]
    mean_curve = np.mean([r["model_entropy_bits"] for r in result["runs"]], axis=0)
    assert result["model_entropy_bits"] == pytest.approx(mean_curve.tolist(), abs=1e-12)
    assert result["mae_bits"] == pytest.approx(np.mean([r["mae_bits"] for r in result["runs"]]), abs=1e-12)
    # |mean of errors| <= mean of |errors| at every position.
    assert result["mae_of_mean_curve_bits"] <= result["mae_aggregate_bits"] + 1e-12
    assert result["traces"]["run"] == "transformer seed 0"
    path = tmp_path / "calibration.png"
    FIGURES["calibration"](result, path)
    pixels = image.imread(path)
    assert pixels.ndim == 3 and pixels.shape[1] > 800 and pixels.std() > 0
