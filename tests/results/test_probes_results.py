"""The typed linear-probes result: the saved files round-trip byte for byte, a fresh result
validates, and damage is named by its path."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from windtunnel.analysis import ANALYSES, Run
from windtunnel.results.base import ResultError, Summary

# Importing the module registers its result type, which ANALYSES[...].run looks up.
from windtunnel.results.probes import ConstantBaseline, LinearProbes, ProbedDepth
from windtunnel.run_config import build_run_model, run_config_from_mapping

REPO = Path(__file__).resolve().parents[2]


def saved() -> list[Path]:
    return sorted(REPO.glob("results/*/analysis*/*/linear_probes.json"))


def test_every_saved_result_round_trips_byte_for_byte():
    files = saved()
    assert files, f"no saved linear_probes.json under {REPO / 'results'}"
    for path in files:
        text = path.read_text()
        assert json.dumps(LinearProbes.from_json(json.loads(text)).to_json(), indent=1) == text, path


def test_saved_result_is_typed():
    result = LinearProbes.from_json(json.loads(saved()[0].read_text()))
    depth = result.layers[0]
    assert isinstance(depth, ProbedDepth) and depth.layer == -1 and depth.name == "input"
    assert isinstance(depth.posterior_r2, Summary) and isinstance(result.model_kl_bits, Summary)
    assert isinstance(result.baseline, ConstantBaseline)
    assert len(depth.entropy_alpha) == result.runs and set(depth.entropy_alpha) <= set(result.alphas)
    assert result.layers[-1].name == "ln_final" and result.layers[-1].layer == len(result.layers) - 2


def test_fresh_result_validates(tmp_path):
    config = run_config_from_mapping(
        {
            "tunnel": {"name": "bijection", "V": 6},
            "model": {"kind": "transformer", "n_layers": 2, "n_heads": 2, "d_model": 16, "d_mlp": 32},
            "eval": {"n": 48, "batch_size": 48},
        }
    )
    runs = []
    for seed in (0, 1):
        seeded = run_config_from_mapping(config.to_mapping(), [f"train.seed={seed}"])
        runs.append(Run(tmp_path, seeded, build_run_model(seeded).eval(), 0))  # untrained: the shape is what is checked
    result = ANALYSES["linear_probes"].run(runs)
    assert isinstance(result, LinearProbes)
    assert [depth.name for depth in result.layers] == ["input", "block 0", "block 1", "ln_final"]
    assert result.runs == 2 and all(len(depth.posterior_alpha) == 2 for depth in result.layers)
    assert result.n_train_sequences + result.n_test_sequences == 48
    assert LinearProbes.from_json(json.loads(json.dumps(result.to_json()))) == result


@pytest.mark.parametrize(
    "change, path, complaint",
    [
        (lambda d: d["layers"][2]["entropy_r2"].update(median="x"), "layers[2].entropy_r2.median", "expected a number"),
        (lambda d: d["layers"][1].pop("log_posterior_kl_bits"), "layers[1].log_posterior_kl_bits", "missing"),
        (lambda d: d["layers"][0]["posterior_alpha"].__setitem__(0, "1e-4"), "layers[0].posterior_alpha[0]", "expected a number"),
        (lambda d: d["layers"][0].update(layer="input"), "layers[0].layer", "expected an integer"),
        (lambda d: d["baseline"].pop("entropy_mae_bits"), "baseline.entropy_mae_bits", "missing"),
        (lambda d: d["model_kl_bits"].update(std=[0.1]), "model_kl_bits.std", "expected a number"),
    ],
)
def test_damage_is_named_by_its_path(change, path, complaint):
    data = copy.deepcopy(json.loads(saved()[0].read_text()))
    change(data)
    with pytest.raises(ResultError, match=f"^{re.escape(path)}: {complaint}"):
        LinearProbes.from_json(data)
