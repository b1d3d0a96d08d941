"""The typed calibration result: the saved files round-trip byte for byte, a fresh result
validates, and damage is named by its path."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from windtunnel.analysis import ANALYSES, Run
from windtunnel.results.base import ResultError

# Importing the module registers its result type, which ANALYSES[...].run looks up.
from windtunnel.results.calibration import Calibration, RunCalibration, Trace, Traces
from windtunnel.run_config import build_run_model, run_config_from_mapping

REPO = Path(__file__).resolve().parents[2]


def saved() -> list[Path]:
    return sorted(REPO.glob("results/*/analysis*/*/calibration.json"))


def test_every_saved_result_round_trips_byte_for_byte():
    files = saved()
    assert files, f"no saved calibration.json under {REPO / 'results'}"
    for path in files:
        text = path.read_text()
        assert json.dumps(Calibration.from_json(json.loads(text)).to_json(), indent=1) == text, path


def test_saved_results_are_typed():
    results = [Calibration.from_json(json.loads(path.read_text())) for path in saved()]
    for result in results:
        assert isinstance(result.tunnel, str) and result.tunnel_label.startswith(result.tunnel)
        assert isinstance(result.runs[0], RunCalibration) and isinstance(result.traces, Traces)
        assert isinstance(result.traces.sequences[0], Trace)
        assert result.positions == tuple(range(1, len(result.bayes_entropy_bits) + 1))
    # Both forms of the closed-form line are among the saved results: a curve and null.
    assert {result.closed_form_bits is None for result in results} == {True, False}


@pytest.mark.parametrize("with_replacement", [False, True])
def test_fresh_result_validates(tmp_path, with_replacement):
    config = run_config_from_mapping(
        {
            "tunnel": {"name": "bijection", "V": 6, "with_replacement": with_replacement},
            "model": {"kind": "transformer", "n_layers": 1, "n_heads": 2, "d_model": 16, "d_mlp": 32},
            "eval": {"n": 48, "batch_size": 32},
        }
    )
    runs = []
    for seed in (0, 1):
        seeded = run_config_from_mapping(config.to_mapping(), [f"train.seed={seed}"])
        runs.append(Run(tmp_path, seeded, build_run_model(seeded).eval(), 0))  # untrained: the shape is what is checked
    result = ANALYSES["calibration"].run(runs)
    assert isinstance(result, Calibration)
    assert result.tunnel == "bijection" and [run.step for run in result.runs] == [0, 0]
    # The closed form exists without replacement only (with it, each sequence has its own staircase).
    assert (result.closed_form_bits is None) == with_replacement
    assert len(result.traces.sequences) == 8 and all(isinstance(trace.index, int) for trace in result.traces.sequences)
    assert Calibration.from_json(json.loads(json.dumps(result.to_json()))) == result


@pytest.mark.parametrize(
    "change, path, complaint",
    [
        (lambda d: d["traces"]["sequences"][0].pop("mae_bits"), "traces.sequences[0].mae_bits", "missing"),
        (lambda d: d["traces"]["sequences"][2]["model_entropy_bits"].__setitem__(3, "x"), "traces.sequences[2].model_entropy_bits[3]", "expected a number"),
        (lambda d: d["runs"][0].update(step=1.5), "runs[0].step", "expected an integer"),
        (lambda d: d["runs"][0].pop("label"), "runs[0].label", "missing"),
        (lambda d: d["bayes_entropy_bits"].__setitem__(0, None), "bayes_entropy_bits[0]", "expected a number"),
        (lambda d: d.update(tunnel={"name": "bijection"}), "tunnel", "expected a text"),
        (lambda d: d.pop("trace_mae_bits"), "trace_mae_bits", "missing"),
    ],
)
def test_damage_is_named_by_its_path(change, path, complaint):
    data = copy.deepcopy(json.loads(saved()[0].read_text()))
    change(data)
    with pytest.raises(ResultError, match=f"^{re.escape(path)}: {complaint}"):
        Calibration.from_json(data)
