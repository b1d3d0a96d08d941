"""The typed results of key orthogonality, QK sharpening and the value manifold: every saved
file round-trips byte for byte, a fresh result is its type, and damage is named by its path.

Fresh results come from untrained runs built from small configs, as in the end-to-end test of
tests/analysis/test_geometry.py: the bijection (every key measure, every value-manifold
measure), the HMM (the measures it has no tokens for are skipped), a transformer with a layer
without attention (None in the per-head grids and the heat map) and the MLP control (the
residual space only).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from windtunnel.analysis import ANALYSES, Run
from windtunnel.analysis.attention import qk_sharpening
from windtunnel.analysis.base import diagnostic_episodes
from windtunnel.analysis.keys import key_orthogonality
from windtunnel.analysis.manifold import value_manifold
from windtunnel.results.attention import AttentionLayer, HeadAttention, InitialAttention, QKSharpening
from windtunnel.results.base import AnalysisResult, ResultError, Summary

# Importing the modules registers their result types, which ANALYSES[...].run looks up.
from windtunnel.results.keys import AbsCosineChance, FrameHead, KeyGeometry, KeyOrthogonality, SignedCosineChance
from windtunnel.results.manifold import EntropyCorrelation, InitialManifold, ManifoldSpace, ValueManifold
from windtunnel.run_config import build_run_model, run_config_from_mapping
from scopes import once_per_module

ROOT = Path(__file__).resolve().parents[2]

TYPES: dict[str, type[AnalysisResult]] = {
    "key_orthogonality": KeyOrthogonality,
    "qk_sharpening": QKSharpening,
    "value_manifold": ValueManifold,
}


def saved(name: str) -> list[Path]:
    """The repository's saved results of analysis ``name`` (every study, trained and at init)."""
    return sorted(ROOT.glob(f"results/*/analysis*/*/{name}.json"))


def saved_of(name: str, tunnel: str) -> Path:
    """The first saved result of ``name`` for a transformer on ``tunnel``."""
    return next(p for p in saved(name) if p.parent.name == f"{tunnel}_transformer")


# --- checks every result of a type must pass ---------------------------------------------


def check_key_orthogonality(r: KeyOrthogonality) -> None:
    assert r.layers and all(type(row.layer) is int and isinstance(row.mean_abs_offdiag_cos, Summary) for row in r.layers)
    assert len(r.frame_heads) == r.runs == len(r.heads_mean_abs_offdiag_cos)
    assert all(isinstance(f, FrameHead) and type(f.head) is int for f in r.frame_heads)
    assert len(r.frame_head_cos) == len(r.token_values) == len(r.token_labels)
    assert isinstance(r.random_init, KeyGeometry) and isinstance(r.random_init.frame_head_mean_abs_offdiag_cos, Summary)
    assert {"in_context_input_keys", "in_context_input_keys_centered", "embedding_keys_all_tokens_signed"} <= set(r.measures)
    assert set(r.measures).isdisjoint(r.measures_skipped)
    for measure in r.measures.values():
        # The chance level is the one of the measure's statistic.
        assert isinstance(measure.chance, AbsCosineChance if measure.statistic == "mean_abs_cos" else SignedCosineChance)
        assert measure.n_tokens == len(measure.tokens) and [row.layer for row in measure.layers] == [row.layer for row in r.layers]
        assert isinstance(measure.layers[0].best_head, Summary) and isinstance(measure.layers[0].random_init_best_head, Summary)
        assert measure.random_init_heads is not None and len(measure.heads) == r.runs


def check_qk_sharpening(r: QKSharpening) -> None:
    assert type(r.tunnel) is str and r.tunnel_label.startswith(r.tunnel)
    assert r.layers and all(isinstance(row, AttentionLayer) and type(row.layer) is int for row in r.layers)
    for row in r.layers:
        assert list(row.mass) == list(row.lift) == list(row.heads.mass) == list(r.categories) == list(r.uniform_mass)
        assert isinstance(row.mass[r.categories[0]], Summary) and isinstance(row.heads, HeadAttention)
        assert isinstance(row.random_init, InitialAttention) and isinstance(row.random_init.entropy_bits, Summary)
        assert all((lift is None) == (r.uniform_mass[name] == 0) for name, lift in row.lift.items())
    cosine = r.authors_query_key_cosine
    assert [row.layer for row in cosine.layers] == [row.layer for row in r.layers]
    assert [i for i, grid in enumerate(cosine.heatmap) if grid is not None] == [row.layer for row in r.layers]
    grid = cosine.heatmap[r.layers[0].layer]
    assert grid[0][0] is None and (len(grid) < 2 or isinstance(grid[1][0], float))  # only earlier keys have a cosine


def check_value_manifold(r: ValueManifold) -> None:
    assert "resid_post" in r.spaces and all(isinstance(space, ManifoldSpace) for space in r.spaces.values())
    for space in r.spaces.values():
        assert type(space.dim) is int and isinstance(space.pc1_variance, Summary)
        assert len(space.scatter.pc1) == len(space.scatter.pc2) == len(space.scatter.entropy_bits) > 0
    assert {"resid_supervised_spearman_pc1", "ln_final_supervised_abs_pearson_pc1"} <= set(r.measures)
    assert set(r.measures) | set(r.measures_skipped) == {
        "resid_supervised_spearman_pc1",
        "ln_final_value_positions_max_pearson",
        "ln_final_supervised_abs_pearson_pc1",
    }
    for measure in r.measures.values():
        assert isinstance(measure.correlation, EntropyCorrelation) and type(measure.correlation.pc) is int
        assert isinstance(measure.random_init, InitialManifold) and isinstance(measure.random_init.pc1_variance, Summary)


CHECKS: dict[str, Callable[[Any], None]] = {
    "key_orthogonality": check_key_orthogonality,
    "qk_sharpening": check_qk_sharpening,
    "value_manifold": check_value_manifold,
}


# --- saved results --------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(TYPES))
def test_every_saved_result_round_trips_byte_for_byte(name):
    files = saved(name)
    assert files, f"no saved {name}.json under {ROOT / 'results'}"
    for path in files:
        text = path.read_text()
        result = TYPES[name].from_json(json.loads(text))
        assert json.dumps(result.to_json(), indent=1) == text, path
        CHECKS[name](result)


def test_saved_files_cover_the_tunnels_and_their_skipped_measures():
    bijection = KeyOrthogonality.from_json(json.loads(saved_of("key_orthogonality", "bijection").read_text()))
    assert "normalized_output_keys_abs" in bijection.measures and bijection.measures_skipped == {}
    hmm = KeyOrthogonality.from_json(json.loads(saved_of("key_orthogonality", "hmm").read_text()))
    assert "normalized_output_keys_abs" in hmm.measures_skipped and "normalized_output_keys_abs" not in hmm.measures

    sharpening = QKSharpening.from_json(json.loads(saved_of("qk_sharpening", "bijection").read_text()))
    assert sharpening.tunnel == "bijection" and "evidence" in sharpening.categories
    # Uniform attention gives some bijection categories no mass at the supervised queries:
    # their lift is None, kept as null.
    assert any(lift is None for lift in sharpening.layers[0].lift.values())

    manifold = ValueManifold.from_json(json.loads(saved_of("value_manifold", "bijection").read_text()))
    assert list(manifold.spaces) == ["resid_post", "attn_v", "attn_z"] and len(manifold.measures) == 3
    mlp = [ValueManifold.from_json(json.loads(p.read_text())) for p in saved("value_manifold") if p.parent.name.endswith("_mlp")]
    assert mlp and all(list(r.spaces) == ["resid_post"] for r in mlp)  # the MLP control has no attention spaces


# --- fresh results ------------------------------------------------------------------------

TRANSFORMER = {"kind": "transformer", "n_layers": 2, "n_heads": 2, "d_model": 16, "d_mlp": 32}
BIJECTION = {"tunnel": {"name": "bijection", "V": 6}, "model": TRANSFORMER, "eval": {"n": 48, "batch_size": 48}}
HMM = {"tunnel": {"name": "hmm", "S": 3, "M": 3, "K": 4, "grid": 0.1}, "model": TRANSFORMER, "eval": {"n": 48, "batch_size": 48}}
LATE = {**BIJECTION, "model": {**TRANSFORMER, "no_attention_layers": [1]}}
MLP_CONTROL = {**HMM, "model": {"kind": "mlp", "n_blocks": 2, "d_hidden": 16, "d_model": 16}}


def untrained_runs(config: dict, seeds: tuple[int, ...], where: Path) -> list[Run]:
    """Runs of ``config`` at step 0 (their initial models are themselves; the shape is what is checked)."""
    runs = []
    for seed in seeds:
        seeded = run_config_from_mapping(config, [f"train.seed={seed}"])
        runs.append(Run(where / f"seed{seed}", seeded, build_run_model(seeded).eval(), 0))
    return runs


@pytest.fixture(scope=once_per_module)
def fresh(tmp_path_factory) -> dict[str, AnalysisResult]:
    where = tmp_path_factory.mktemp("runs")
    bijection = untrained_runs(BIJECTION, (0, 1), where / "bijection")
    hmm = untrained_runs(HMM, (0,), where / "hmm")
    late = untrained_runs(LATE, (0,), where / "late")
    mlp = untrained_runs(MLP_CONTROL, (0,), where / "mlp")
    results = {}
    for name in TYPES:
        results[f"{name} bijection"] = ANALYSES[name].run(bijection)
        results[f"{name} hmm"] = ANALYSES[name].run(hmm)
        results[f"{name} late"] = ANALYSES[name].run(late)
    results["value_manifold mlp"] = ANALYSES["value_manifold"].run(mlp)
    return results


FRESH = [f"{name} {case}" for name in TYPES for case in ("bijection", "hmm", "late")] + ["value_manifold mlp"]


@pytest.mark.parametrize("key", FRESH)
def test_a_fresh_result_is_its_type_and_round_trips(fresh, key):
    name = key.split()[0]
    result = fresh[key]
    assert type(result) is TYPES[name] and result.analysis == name
    assert TYPES[name].from_json(result.to_json()) == result
    text = json.dumps(result.to_json(), indent=1)  # as windtunnel analyze saves it
    assert json.dumps(TYPES[name].from_json(json.loads(text)).to_json(), indent=1) == text
    CHECKS[name](result)


def test_fresh_results_keep_what_each_case_writes(fresh):
    assert fresh["key_orthogonality bijection"].runs == 2 and "normalized_output_keys_abs" in fresh["key_orthogonality bijection"].measures
    assert "normalized_output_keys_abs" in fresh["key_orthogonality hmm"].measures_skipped
    # A layer without attention is None in every per-head grid and in the heat map.
    keys = fresh["key_orthogonality late"]
    assert keys.heads_mean_abs_offdiag_cos[0][1] is None and keys.measures["in_context_input_keys"].heads[0][1] is None
    sharpening = fresh["qk_sharpening late"]
    assert sharpening.tunnel == "bijection" and sharpening.authors_query_key_cosine.heatmap[1] is None
    assert "ln_final_value_positions_max_pearson" in fresh["value_manifold hmm"].measures_skipped
    assert list(fresh["value_manifold mlp"].spaces) == ["resid_post"]
    assert list(fresh["value_manifold bijection"].spaces) == ["resid_post", "attn_v", "attn_z"]


@pytest.fixture(scope=once_per_module)
def without_initial_models(tmp_path_factory) -> dict[str, dict[str, Any]]:
    """Each analysis's JSON as its compute function writes it given no initial models (every
    random-init field null), after the header ``Analysis.run`` puts first."""
    runs = untrained_runs(BIJECTION, (0,), tmp_path_factory.mktemp("runs"))
    models, episodes, tunnel = [r.model for r in runs], diagnostic_episodes(runs), runs[0].config.tunnel
    header = {
        "analysis": "",
        "run_dirs": [str(r.directory) for r in runs],
        "tunnel": runs[0].config.to_mapping()["tunnel"],
        "task_variant": tunnel.describe(),
        "tunnel_label": tunnel.label(),
    }
    computed = {
        "key_orthogonality": key_orthogonality(models, episodes, tunnel),
        "qk_sharpening": qk_sharpening(models, episodes, tunnel),
        "value_manifold": value_manifold(models, episodes, tunnel=tunnel),
    }
    return {name: json.loads(json.dumps({**header, "analysis": name, **data})) for name, data in computed.items()}


@pytest.mark.parametrize("name", list(TYPES))
def test_without_initial_models_the_random_init_fields_are_kept_null(without_initial_models, name):
    data = without_initial_models[name]
    text = json.dumps(data, indent=1)
    result = TYPES[name].from_json(data)
    assert json.dumps(result.to_json(), indent=1) == text
    if isinstance(result, KeyOrthogonality):
        assert result.random_init is None
        assert all(m.random_init_heads is None and m.layers[0].random_init_best_head is None for m in result.measures.values())
    elif isinstance(result, QKSharpening):
        assert all(row.random_init is None for row in result.layers)
        assert all(row.random_init_mean_cos is None for row in result.authors_query_key_cosine.layers)
    else:
        assert all(m.random_init is None for m in result.measures.values())


def test_the_header_tunnel_is_the_name_only_for_qk_sharpening(fresh):
    assert fresh["qk_sharpening hmm"].tunnel == "hmm"
    assert fresh["key_orthogonality hmm"].tunnel["name"] == "hmm" and fresh["value_manifold hmm"].tunnel["S"] == 3
    with pytest.raises(ResultError, match=r"^tunnel: expected a text"):
        QKSharpening.from_json({**fresh["qk_sharpening hmm"].to_json(), "tunnel": {"name": "hmm"}})


# --- damage --------------------------------------------------------------------------------


def _set(path: list[Any], value: Any) -> Callable[[dict], None]:
    """A change that puts ``value`` at ``path`` (keys and indices) of the saved object."""

    def change(data: dict) -> None:
        target = data
        for step in path[:-1]:
            target = target[step]
        target[path[-1]] = value

    return change


def _pop(path: list[Any]) -> Callable[[dict], None]:
    """A change that removes the key at the end of ``path``."""

    def change(data: dict) -> None:
        target = data
        for step in path[:-1]:
            target = target[step]
        del target[path[-1]]

    return change


DAMAGE = [
    # key_orthogonality
    ("key_orthogonality", _pop(["measures", "in_context_input_keys", "layers", 0, "best_head"]),
     "measures.in_context_input_keys.layers[0].best_head", "missing"),
    ("key_orthogonality", _set(["frame_heads", 0, "head"], "2"), "frame_heads[0].head", "expected an integer"),
    ("key_orthogonality", _set(["random_init", "layers", 0, "mean_abs_offdiag_cos", "median"], "x"),
     "random_init.layers[0].mean_abs_offdiag_cos.median", "expected a number"),
    ("key_orthogonality", _set(["heads_mean_abs_offdiag_cos", 0, 0, 1], "0.5"), "heads_mean_abs_offdiag_cos[0][0][1]", "expected a number"),
    ("key_orthogonality", _pop(["measures", "normalized_output_keys_abs", "chance", "welch_rms_bound"]),
     "measures.normalized_output_keys_abs.chance.welch_rms_bound", "missing"),
    ("key_orthogonality", _pop(["random_init", "frame_head_cos_centered"]), "random_init.frame_head_cos_centered", "missing"),
    # qk_sharpening
    ("qk_sharpening", _pop(["layers", 1, "mass", "evidence", "median"]), "layers[1].mass.evidence.median", "missing"),
    ("qk_sharpening", _set(["layers", 0, "lift", "evidence"], "1.2"), "layers[0].lift.evidence", "expected a number"),
    ("qk_sharpening", _set(["authors_query_key_cosine", "heatmap", 0, 2, 0], "x"),
     "authors_query_key_cosine.heatmap[0][2][0]", "expected a number"),
    ("qk_sharpening", _pop(["layers", 0, "heads", "entropy_bits"]), "layers[0].heads.entropy_bits", "missing"),
    ("qk_sharpening", _pop(["layers", 2, "random_init", "entropy_bits", "std"]), "layers[2].random_init.entropy_bits.std", "missing"),
    # value_manifold
    ("value_manifold", _pop(["spaces", "resid_post", "scatter", "pc2"]), "spaces.resid_post.scatter.pc2", "missing"),
    ("value_manifold", _set(["measures", "resid_supervised_spearman_pc1", "correlation", "pc"], 1.0),
     "measures.resid_supervised_spearman_pc1.correlation.pc", "expected an integer"),
    ("value_manifold", _set(["measures", "ln_final_supervised_abs_pearson_pc1", "random_init", "correlation", "value", "max"], "0.9"),
     "measures.ln_final_supervised_abs_pearson_pc1.random_init.correlation.value.max", "expected a number"),
    ("value_manifold", _set(["spaces", "attn_v", "dim"], "16"), "spaces.attn_v.dim", "expected an integer"),
    ("value_manifold", _set(["spaces", "resid_post", "colour"], "red"), "spaces.resid_post", "unexpected key 'colour'"),
]


@pytest.mark.parametrize("name, change, path, complaint", DAMAGE, ids=[f"{d[0]}:{d[2]}" for d in DAMAGE])
def test_damage_is_named_by_its_path(name, change, path, complaint):
    data = copy.deepcopy(json.loads(saved_of(name, "bijection").read_text()))
    TYPES[name].from_json(copy.deepcopy(data))  # undamaged, it fits
    change(data)
    with pytest.raises(ResultError, match=f"^{re.escape(path)}: {complaint}"):
        TYPES[name].from_json(data)
