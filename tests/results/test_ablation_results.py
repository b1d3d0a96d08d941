"""The typed layer and head ablation results: the saved files round-trip byte for byte, a
fresh result validates, and damage is named by its path."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from windtunnel.analysis import ANALYSES, Run

# Importing the module registers its result types, which ANALYSES[...].run looks up.
from windtunnel.results.ablation import (
    AblatedHead,
    AblatedLayer,
    HeadAblation,
    HeadRanking,
    LayerAblation,
    MostDestructiveHead,
    RankedHead,
)
from windtunnel.results.base import MetricSummaries, Metrics, ResultError, Summary
from windtunnel.run_config import build_run_model, run_config_from_mapping

REPO = Path(__file__).resolve().parents[2]


def saved(name: str) -> list[Path]:
    """The repository's saved results of analysis ``name``."""
    return sorted(REPO.glob(f"results/*/analysis*/*/{name}.json"))


def first_saved(name: str) -> dict:
    return json.loads(saved(name)[0].read_text())


def runs_of(model: dict, seeds: tuple[int, ...], folder: Path) -> list[Run]:
    """Untrained runs of a tiny model on the V = 6 bijection: the result's shape is what is
    checked, and an untrained model has every part of it."""
    config = run_config_from_mapping({"tunnel": {"name": "bijection", "V": 6}, "model": model, "eval": {"n": 48, "batch_size": 48}})
    runs = []
    for seed in seeds:
        seeded = run_config_from_mapping(config.to_mapping(), [f"train.seed={seed}"])
        runs.append(Run(folder, seeded, build_run_model(seeded).eval(), 0))
    return runs


TRANSFORMER = {"kind": "transformer", "n_layers": 2, "n_heads": 2, "d_model": 16, "d_mlp": 32}


@pytest.mark.parametrize("name, kind", [("layer_ablation", LayerAblation), ("head_ablation", HeadAblation)])
def test_every_saved_result_round_trips_byte_for_byte(name, kind):
    files = saved(name)
    assert files, f"no saved {name}.json under {REPO / 'results'}"
    for path in files:
        text = path.read_text()
        assert json.dumps(kind.from_json(json.loads(text)).to_json(), indent=1) == text, path


def test_saved_layer_ablation_is_typed():
    result = LayerAblation.from_json(first_saved("layer_ablation"))
    assert isinstance(result.intact, MetricSummaries) and isinstance(result.intact.mae_bits, Summary)
    assert isinstance(result.intact_per_run[0], Metrics)
    layer = result.layers[-1]
    assert isinstance(layer, AblatedLayer) and layer.layer == len(result.layers) - 1
    assert isinstance(layer.ratios.kl_bits, Summary) and isinstance(layer.per_run[0], Metrics)
    assert len(layer.per_run) == len(result.intact_per_run) == result.runs
    assert isinstance(result.run_dirs, tuple)


def test_saved_head_ablation_is_typed():
    result = HeadAblation.from_json(first_saved("head_ablation"))
    assert isinstance(result.heads[0], AblatedHead) and isinstance(result.heads[0].ratios.mae_bits, Summary)
    assert isinstance(result.most_destructive, MostDestructiveHead)
    ranking = result.per_run[0]
    assert isinstance(ranking, HeadRanking) and isinstance(ranking.worst, RankedHead)
    assert isinstance(result.mae_ratio, tuple) and isinstance(result.mae_ratio[0], tuple)
    most = result.most_destructive
    assert result.mae_ratio[most.layer][most.head] == most.mae_ratio


def test_fresh_layer_ablation_validates(tmp_path):
    result = ANALYSES["layer_ablation"].run(runs_of(TRANSFORMER, (0, 1), tmp_path))
    assert isinstance(result, LayerAblation)
    assert [row.layer for row in result.layers] == [0, 1] and result.runs == 2
    assert isinstance(result.layers[0].mae_bits, Summary) and len(result.layers[0].per_run) == 2
    assert LayerAblation.from_json(json.loads(json.dumps(result.to_json()))) == result


def test_fresh_head_ablation_validates(tmp_path):
    result = ANALYSES["head_ablation"].run(runs_of(TRANSFORMER, (0, 1), tmp_path))
    assert isinstance(result, HeadAblation)
    assert [(row.layer, row.head) for row in result.heads] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(isinstance(ranking.second, RankedHead) for ranking in result.per_run)
    assert HeadAblation.from_json(json.loads(json.dumps(result.to_json()))) == result


def test_fresh_head_ablation_of_one_head_and_a_layer_without_attention(tmp_path):
    # One head: no runner-up to rank (second and top_over_second are null); a layer
    # without attention: a row of nulls in the heat-map grid.
    model = {**TRANSFORMER, "n_heads": 1, "no_attention_layers": [1]}
    result = ANALYSES["head_ablation"].run(runs_of(model, (0,), tmp_path))
    assert isinstance(result, HeadAblation)
    assert result.mae_ratio == ((result.heads[0].mae_ratio,), (None,))
    assert result.per_run[0].second is None and result.per_run[0].top_over_second is None
    saved_form = result.to_json()
    assert saved_form["per_run"][0]["second"] is None and saved_form["mae_ratio"][1] == [None]
    assert HeadAblation.from_json(json.loads(json.dumps(saved_form))) == result


def damaged(data: dict, change) -> dict:
    data = copy.deepcopy(data)
    change(data)
    return data


@pytest.mark.parametrize(
    "change, path, complaint",
    [
        (lambda d: d["layers"][0].pop("kl_ratio"), "layers[0].kl_ratio", "missing"),
        (lambda d: d["layers"][1]["ratios"]["mae_bits"].pop("median"), "layers[1].ratios.mae_bits.median", "missing"),
        (lambda d: d["layers"][1]["ratios"]["mae_bits"].update(mean="0.5"), "layers[1].ratios.mae_bits.mean", "expected a number"),
        (lambda d: d["intact_per_run"][0].update(kl_bits="big"), "intact_per_run[0].kl_bits", "expected a number"),
        (lambda d: d["layers"][0].update(layer=0.5), "layers[0].layer", "expected an integer"),
        (lambda d: d.update(runs="3"), "runs", "expected an integer"),
    ],
)
def test_damaged_layer_ablation_names_the_path(change, path, complaint):
    data = damaged(first_saved("layer_ablation"), change)
    with pytest.raises(ResultError, match=f"^{re.escape(path)}: {complaint}"):
        LayerAblation.from_json(data)


@pytest.mark.parametrize(
    "change, path, complaint",
    [
        (lambda d: d["heads"][0].pop("mae_ratio_std"), "heads[0].mae_ratio_std", "missing"),
        (lambda d: d["mae_ratio"][0].__setitem__(1, "x"), "mae_ratio[0][1]", "expected a number"),
        (lambda d: d["per_run"][0]["worst"].update(delta_mae_bits="x"), "per_run[0].worst.delta_mae_bits", "expected a number"),
        (lambda d: d["per_run"][0]["second"].pop("head"), "per_run[0].second.head", "missing"),
        (lambda d: d["most_destructive"].update(head="1"), "most_destructive.head", "expected an integer"),
    ],
)
def test_damaged_head_ablation_names_the_path(change, path, complaint):
    data = damaged(first_saved("head_ablation"), change)
    with pytest.raises(ResultError, match=f"^{re.escape(path)}: {complaint}"):
        HeadAblation.from_json(data)
