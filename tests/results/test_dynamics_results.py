"""The typed training-dynamics result: the saved files round-trip byte for byte, a fresh
result validates (with attention, and without: the MLP control's nulls), and damage is
named by its path."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from windtunnel.analysis import ANALYSES, Run
from windtunnel.results.base import ResultError

# Importing the module registers its result type, which ANALYSES[...].run looks up.
from windtunnel.results.base import Metrics
from windtunnel.results.dynamics import MetricRatios, TrainingDynamics
from windtunnel.run_config import build_run_model, run_config_from_mapping
from windtunnel.training.checkpoint import save_snapshot

REPO = Path(__file__).resolve().parents[2]

TRANSFORMER = {
    "tunnel": {"name": "bijection", "V": 6},
    "model": {"kind": "transformer", "n_layers": 2, "n_heads": 2, "d_model": 16, "d_mlp": 32},
    "eval": {"n": 64, "batch_size": 64},
}
MLP = {**TRANSFORMER, "model": {"kind": "mlp", "d_model": 16, "n_blocks": 2, "d_hidden": 32}}


def saved() -> list[Path]:
    return sorted(REPO.glob("results/*/analysis*/*/training_dynamics.json"))


def test_every_saved_result_round_trips_byte_for_byte():
    files = saved()
    assert files, f"no saved training_dynamics.json under {REPO / 'results'}"
    for path in files:
        text = path.read_text()
        assert json.dumps(TrainingDynamics.from_json(json.loads(text)).to_json(), indent=1) == text, path


def test_saved_result_is_typed():
    result = TrainingDynamics.from_json(json.loads(saved()[0].read_text()))
    assert isinstance(result.final, Metrics) and isinstance(result.at_stabilization, Metrics)
    assert isinstance(result.ratio_stabilization_to_final, MetricRatios)
    assert result.stabilization_step in result.steps and result.reference_step == result.steps[-1]
    assert len(result.attention_jsd_by_layer_bits) == len(result.steps)
    assert all(len(row) == len(result.attention_layers) for row in result.attention_jsd_by_layer_bits)
    assert result.mae_bits_final == result.final.mae_bits == result.mae_bits[-1]


def history(mapping: dict, folder: Path) -> list[Run]:
    """A run directory holding three snapshots of different (untrained) weights, without
    training: the analysis reads the snapshots only, the run's model gives the device."""
    config = run_config_from_mapping(mapping)
    folder.mkdir()
    (folder / "config.json").write_text(config.to_json())
    for seed, step in enumerate((0, 4, 12)):
        weights = run_config_from_mapping(mapping, [f"train.seed={seed}"])
        save_snapshot(folder, build_run_model(weights), step, {})
    return [Run(folder, config, build_run_model(config).eval(), 12)]


def test_fresh_result_with_attention_validates(tmp_path):
    result = ANALYSES["training_dynamics"].run(history(TRANSFORMER, tmp_path / "transformer"))
    assert isinstance(result, TrainingDynamics)
    assert result.steps == (0, 4, 12) and result.attention_layers == (0, 1) and result.run == "transformer seed 0"
    # The final snapshot is its own reference (divergence 0), so the frame settles at the latest there.
    assert result.stabilization_step is not None and isinstance(result.at_stabilization, Metrics)
    assert isinstance(result.ratio_stabilization_to_final, MetricRatios)
    assert TrainingDynamics.from_json(json.loads(json.dumps(result.to_json()))) == result


def test_fresh_result_without_attention_validates(tmp_path):
    result = ANALYSES["training_dynamics"].run(history(MLP, tmp_path / "mlp"))
    assert isinstance(result, TrainingDynamics) and result.attention_layers == ()
    assert result.attention_jsd_bits is None and result.attention_jsd_by_layer_bits is None
    assert result.stabilization_step is None and result.at_stabilization is None and result.ratio_stabilization_to_final is None
    assert isinstance(result.final, Metrics) and len(result.pc1_variance_explained) == 3
    saved_form = result.to_json()
    assert saved_form["at_stabilization"] is None  # always written, null without a stabilization step
    assert TrainingDynamics.from_json(json.loads(json.dumps(saved_form))) == result


@pytest.mark.parametrize(
    "change, path, complaint",
    [
        (lambda d: d["final"].pop("kl_bits"), "final.kl_bits", "missing"),
        (lambda d: d["at_stabilization"].update(mae_bits="x"), "at_stabilization.mae_bits", "expected a number"),
        (lambda d: d["attention_jsd_by_layer_bits"][1].__setitem__(0, "x"), "attention_jsd_by_layer_bits[1][0]", "expected a number"),
        (lambda d: d["pc1_variance_explained"].__setitem__(2, "x"), "pc1_variance_explained[2]", "expected a number"),
        (lambda d: d["steps"].__setitem__(1, 1.5), "steps[1]", "expected an integer"),
        (lambda d: d.pop("stabilization_step"), "stabilization_step", "missing"),
        (lambda d: d.update(final=None), "final", "expected an object"),
    ],
)
def test_damage_is_named_by_its_path(change, path, complaint):
    data = copy.deepcopy(json.loads(saved()[0].read_text()))
    change(data)
    with pytest.raises(ResultError, match=f"^{re.escape(path)}: {complaint}"):
        TrainingDynamics.from_json(data)
