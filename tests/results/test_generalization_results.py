"""The typed results of length generalization, relabeling, Table 1, late attention and seeds:
every saved file round-trips byte for byte, a fresh result is its type, and damage is named
by its path.

Fresh results come from constructed runs as in tests/analysis/test_generalization.py: every
weight zero but the unembedding bias, so each model predicts one fixed distribution (fast,
and each analysis sees distinct models).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from windtunnel.analysis import ANALYSES, Run
from windtunnel.results.base import AnalysisResult, ResultError, Summary
from windtunnel.results.generalization import (
    BeyondHorizonScores,
    HorizonScores,
    LateAttention,
    LengthGeneralization,
    ModelComparison,
    Relabeling,
    Seeds,
    SeedsHorizon,
    SeedsHorizonAgainstMlp,
    SeedSpread,
    SeedSpreadAgainstMlp,
)
from windtunnel.run_config import build_run_model, run_config_from_mapping
from scopes import once_per_module

ROOT = Path(__file__).resolve().parents[2]

TYPES: dict[str, type[AnalysisResult]] = {
    "length_generalization": LengthGeneralization,
    "relabeling": Relabeling,
    "model_comparison": ModelComparison,
    "late_attention": LateAttention,
    "seeds": Seeds,
}


def saved(name: str) -> list[Path]:
    """The repository's saved results of analysis ``name`` (every study, trained and at init)."""
    return sorted(ROOT.glob(f"results/*/analysis*/*/{name}.json"))


def check_length_generalization(r: LengthGeneralization) -> None:
    assert r.horizons and all(type(h) is int for h in r.horizons)
    for h, scores in r.horizons.items():
        assert isinstance(scores.kl_bits, Summary) and isinstance(scores.per_run[0].mae_bits_ci, tuple)
        # Past the training horizon (only there) the analysis writes the beyond-training keys.
        assert isinstance(scores, BeyondHorizonScores) == (h > r.training_horizon)
        assert (scores.per_run[0].beyond is not None) == (h > r.training_horizon)


def check_relabeling(r: Relabeling) -> None:
    assert isinstance(r.delta_mae_bits, Summary) and len(r.per_run) == r.n_runs
    assert len(r.per_run[0].delta_kl_bits_ci) == 2 and len(r.scatter.before) == len(r.scatter.after) > 0


def check_model_comparison(r: ModelComparison) -> None:
    assert all(type(h) is int for h in r.horizons)
    for model in r.models.values():
        assert set(model.horizons) == set(r.horizons)
        assert all(isinstance(scores.mae_bits, Summary) for scores in model.horizons.values())
    for name, per_horizon in r.ratios.items():
        assert name in r.models and name != r.reference and set(per_horizon) == set(r.horizons)


def check_late_attention(r: LateAttention) -> None:
    for scores in r.horizons.values():
        assert isinstance(scores.full, HorizonScores) and isinstance(scores.variant.kl_bits, Summary)
        assert scores.mae_factor == scores.factors.mae_bits and scores.kl_factor == scores.factors.kl_bits


def check_seeds(r: Seeds) -> None:
    assert all(type(h) is int for h in r.horizons)
    for scores in r.horizons.values():
        assert [s.seed for s in scores.per_seed] == list(r.seeds)
        against_mlp = isinstance(scores, SeedsHorizonAgainstMlp)
        for metric in (scores.metrics.mae_aggregate_bits, scores.metrics.mae_bits, scores.metrics.kl_bits):
            assert isinstance(metric, Summary) and isinstance(metric, SeedSpreadAgainstMlp) == against_mlp


#: Typed values that matter to a reader, checked on saved and fresh results alike.
CHECKS: dict[str, Callable[[Any], None]] = {
    "length_generalization": check_length_generalization,
    "relabeling": check_relabeling,
    "model_comparison": check_model_comparison,
    "late_attention": check_late_attention,
    "seeds": check_seeds,
}


@pytest.mark.parametrize("name", TYPES)
def test_every_saved_result_round_trips_byte_for_byte(name):
    paths = saved(name)
    assert paths, f"no saved {name}.json under {ROOT / 'results'}"
    for path in paths:
        text = path.read_text()
        result = TYPES[name].from_json(json.loads(text))
        assert json.dumps(result.to_json(), indent=1) == text, path
        CHECKS[name](result)


def test_saved_files_cover_both_sides_of_the_training_horizon():
    # The union types are exercised on real files: a horizon within training and one beyond.
    kinds = set()
    for path in saved("length_generalization"):
        result = LengthGeneralization.from_json(json.loads(path.read_text()))
        kinds |= {type(scores) for scores in result.horizons.values()}
    assert kinds == {HorizonScores, BeyondHorizonScores}


# --- fresh results ------------------------------------------------------------------------

HMM = {
    "tunnel": {"name": "hmm", "S": 3, "M": 3, "K": 4, "grid": 0.1},
    "model": {"kind": "transformer", "n_layers": 2, "n_heads": 2, "d_model": 16, "d_mlp": 32},
    "eval": {"n": 96, "batch_size": 48, "horizons": [4, 7], "bootstrap": 50},
}
MLP = {"kind": "mlp", "n_blocks": 2, "d_hidden": 16, "d_model": 16}
LATE = {**HMM["model"], "no_attention_layers": [1]}


def constant_run(model: dict, distribution: list[float], *, seed: int = 0) -> Run:
    """A run whose model predicts ``distribution`` at every position, whatever it reads."""
    config = run_config_from_mapping({**HMM, "model": model}, [f"train.seed={seed}"])
    net = build_run_model(config)
    with torch.no_grad():
        for parameter in net.parameters():
            parameter.zero_()
        net.head.bias.copy_(torch.tensor(distribution).log())
    return Run(Path(f"/constructed/{model['kind']}/{seed}"), config, net.eval(), 0)


@pytest.fixture(scope=once_per_module)
def fresh() -> dict[str, AnalysisResult]:
    """Each analysis run on constructed runs (the same run objects, so each is scored once)."""
    seed0, seed1 = constant_run(HMM["model"], [0.7, 0.2, 0.1], seed=0), constant_run(HMM["model"], [0.5, 0.3, 0.2], seed=1)
    mlp, late = constant_run(MLP, [1 / 3] * 3), constant_run(LATE, [1 / 3] * 3)
    return {
        "length_generalization": ANALYSES["length_generalization"].run([seed0, seed1]),
        "relabeling": ANALYSES["relabeling"].run([seed0, seed1]),
        "model_comparison": ANALYSES["model_comparison"].run([seed0, seed1, mlp, late]),
        "late_attention": ANALYSES["late_attention"].run([seed0, late]),
        "seeds": ANALYSES["seeds"].run([seed0, seed1, mlp]),
        "seeds without an MLP": ANALYSES["seeds"].run([seed0, seed1, late]),
    }


@pytest.mark.parametrize("key", [*TYPES, "seeds without an MLP"])
def test_a_fresh_result_is_its_type_and_round_trips(fresh, key):
    name = key.split()[0]
    result = fresh[key]
    assert type(result) is TYPES[name] and result.analysis == name
    assert TYPES[name].from_json(result.to_json()) == result
    text = json.dumps(result.to_json(), indent=1)  # as windtunnel analyze saves it
    assert json.dumps(TYPES[name].from_json(json.loads(text)).to_json(), indent=1) == text
    CHECKS[name](result)


def test_seeds_against_the_mlp_only_when_there_is_one(fresh):
    assert all(isinstance(h, SeedsHorizonAgainstMlp) for h in fresh["seeds"].horizons.values())
    plain = fresh["seeds without an MLP"].horizons.values()
    assert all(type(h) is SeedsHorizon and type(h.metrics.kl_bits) is SeedSpread for h in plain)
    assert all("mlp" not in h and "gap_over_spread" not in h for h in fresh["seeds without an MLP"].to_json()["horizons"].values())


def test_a_null_in_a_conditional_group_is_kept(fresh):
    # jump_at_training_horizon and gap_over_spread are written only in some cases, and may then
    # be null: the null must come back as null, not as an absent key.
    data = fresh["length_generalization"].to_json()
    data["horizons"]["7"]["jump_at_training_horizon"] = None
    data["horizons"]["7"]["beyond"]["kl_bits"]["boundary"]["ratio"] = None
    assert LengthGeneralization.from_json(data).to_json() == data
    data = fresh["seeds"].to_json()
    data["horizons"]["4"]["gap_over_spread"] = None
    data["horizons"]["4"]["metrics"]["mae_bits"]["gap_over_spread"] = None
    assert Seeds.from_json(data).to_json() == data


def test_a_key_always_written_keeps_its_null(fresh):
    data = replaced(fresh["relabeling"].to_json(), "relative_change", None)
    assert Relabeling.from_json(data).to_json() == data
    data = replaced(replaced(fresh["model_comparison"].to_json(), "primitive", None), "reference", None)
    data["ratios"] = {}  # no reference: nothing to divide by
    assert ModelComparison.from_json(data).to_json() == data


# --- damage --------------------------------------------------------------------------------


def _at(data: Any, path: str) -> tuple[Any, str | int]:
    """The container holding the dotted ``path`` (list indices as ``[i]``) and the last key."""
    keys: list[str | int] = []
    for part in path.split("."):
        name, *indices = part.replace("]", "").split("[")
        keys += [name, *map(int, indices)] if name else list(map(int, indices))
    for key in keys[:-1]:
        data = data[key]
    return data, keys[-1]


def dropped(data: Any, path: str) -> Any:
    data = copy.deepcopy(data)
    holder, key = _at(data, path)
    del holder[key]
    return data


def replaced(data: Any, path: str, value: Any) -> Any:
    data = copy.deepcopy(data)
    holder, key = _at(data, path)
    holder[key] = value
    return data


#: Damage to a fresh result: which result, what is done at the path ("drop": the key is deleted;
#: "text": a string where a number belongs; else the value put there), the path, and what the
#: message says after the path.
DAMAGE = [
    ("model_comparison", "drop", "models.transformer.horizons.7.kl_bits.median", "missing"),
    ("model_comparison", "text", "models.mlp.horizons.4.per_run[0].kl_bits_ci[1]", "expected a number"),
    ("model_comparison", 1.5, "models.mlp.n_parameters", "expected an integer"),
    ("model_comparison", "drop", "ratios.mlp.4.kl_bits", "missing"),
    ("length_generalization", "text", "horizons.7.per_run[1].beyond.kl_bits.boundary.step", "expected a number"),
    ("length_generalization", "drop", "horizons.7.jump_at_training_horizon", "missing"),
    # Within training: the richer horizon type is tried first and must not mask the damage.
    ("length_generalization", "drop", "horizons.4.curves.kl_bits", "missing"),
    ("length_generalization", "text", "horizons.4.prior.mae_bits", "expected a number"),
    ("relabeling", [0.0, 0.1, 0.2], "per_run[1].delta_mae_bits_ci", "expected a list of 2"),
    ("relabeling", "drop", "scatter.after", "missing"),
    ("late_attention", "text", "horizons.4.variant.prior.kl_bits", "expected a number"),
    ("seeds", "text", "horizons.4.metrics.kl_bits.gap_to_mlp", "expected a number"),
    ("seeds", "drop", "horizons.4.metrics.mae_aggregate_bits.median", "missing"),
    ("seeds", "drop", "horizons.7.mlp.abs_error_bits", "missing"),
    ("seeds without an MLP", "text", "horizons.7.metrics.kl_bits.spread", "expected a number"),
    ("seeds without an MLP", 0.5, "horizons.4.per_seed[1].seed", "expected an integer"),
]


@pytest.mark.parametrize(("key", "damage", "path", "expected"), DAMAGE)
def test_damage_is_named_by_its_path(fresh, key, damage, path, expected):
    data = fresh[key].to_json()
    bad = dropped(data, path) if damage == "drop" else replaced(data, path, "0.1" if damage == "text" else damage)
    with pytest.raises(ResultError) as raised:
        TYPES[key.split()[0]].from_json(bad)
    assert str(raised.value).startswith(f"{path}: {expected}"), str(raised.value)


def test_an_unknown_key_and_a_text_horizon_are_refused(fresh):
    data = fresh["late_attention"].to_json()
    with pytest.raises(ResultError, match=r"^horizons\.4: unexpected key 'mean_factor' for LateAttentionHorizon"):
        LateAttention.from_json(replaced(data, "horizons.4.mean_factor", 1.0))
    data = fresh["length_generalization"].to_json()
    data["horizons"]["seven"] = data["horizons"].pop("7")
    with pytest.raises(ResultError, match="^horizons: expected integer keys"):
        LengthGeneralization.from_json(data)
