"""Run configs: strict loading, typed dotted overrides, cross-field checks, round trip, paper presets."""

from __future__ import annotations

import dataclasses

import json
from pathlib import Path

import pytest

from windtunnel.config import ConfigError
from windtunnel.models import MLPConfig, TransformerConfig
from windtunnel.run_config import RunConfig, load_run_config, run_config_from_mapping
from windtunnel.tunnels import BijectionTunnel, HMMTunnel

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
PAPER = sorted((CONFIGS / "paper").glob("*.toml"))


def test_paper_presets_follow_the_paper_protocol():
    assert {p.stem for p in PAPER} == {
        "bijection_transformer", "bijection_mlp", "bijection_lstm", "bijection_mamba", "bijection_replacement_transformer",
        "hmm_transformer", "hmm_mlp", "hmm_lstm", "hmm_mamba", "hmm_late_attention_off",
    }
    for path in PAPER:
        config = load_run_config(path)
        t = config.train
        assert (t.betas, t.weight_decay, t.grad_clip, t.steps >= 100_000) == ((0.9, 0.999), 0.01, 1.0, True), path
        if isinstance(config.tunnel, BijectionTunnel):
            assert (config.tunnel.V, t.lr, t.schedule, t.batch_size) == (20, 1e-3, "constant", 128)
        else:
            assert config.tunnel == HMMTunnel(S=5, M=5, K=20)
            assert (t.lr, t.schedule, t.warmup_steps) == (3e-4, "cosine", 1000)
            assert config.horizons == (20, 30, 50) and config.max_len == 100
    replacement = load_run_config(CONFIGS / "paper" / "bijection_replacement_transformer.toml")
    assert replacement.tunnel == BijectionTunnel(V=20, L=19, with_replacement=True)
    late = load_run_config(CONFIGS / "paper" / "hmm_late_attention_off.toml").model
    assert late == TransformerConfig(n_layers=9, n_heads=8, d_model=256, d_mlp=1024, no_attention_layers=(7, 8))


@pytest.mark.parametrize("path", PAPER, ids=lambda p: p.stem)
def test_round_trip_through_json(path, tmp_path):
    config = load_run_config(path)
    (tmp_path / "config.json").write_text(config.to_json())
    assert load_run_config(tmp_path / "config.json") == config
    assert run_config_from_mapping(json.loads(config.to_json())) == config


def test_overrides_are_typed_and_reach_every_section():
    config = load_run_config(
        CONFIGS / "paper" / "hmm_mlp.toml",
        ["train.lr=1e-3", "train.steps=10", "tunnel.K=30", "eval.horizons=30,60", "model.matched_to.d_mlp=512", "train.target=hard"],
    )
    assert (config.train.lr, config.train.steps, config.tunnel.K, config.eval.horizons) == (1e-3, 10, 30, (30, 60))
    assert config.model == MLPConfig(d_model=256, matched_to=TransformerConfig(9, 8, 256, 512))
    assert config.max_len == 110 and config.train.target == "hard"
    with pytest.raises(ConfigError, match="unknown key 'model.n_layers' for MLPConfig"):  # keys are checked against the new kind
        load_run_config(CONFIGS / "paper" / "bijection_transformer.toml", ["model.kind=mlp"])


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["train.lr=-1"], "train.lr=-1.0 is out of range"),
        (["train.stepz=3"], "unknown key 'train.stepz' for TrainConfig"),
        (["train.steps=1.5"], "train.steps='1.5' has the wrong type: expected int"),
        (["train.schedule=linear"], "train.schedule='linear' has the wrong type: expected 'constant' | 'cosine'"),
        (["lr=1"], "does not start with a section"),
        (["tunnel.name=nope"], "unknown tunnel 'nope'"),
        (["model.kind=rnn"], "model kind 'rnn' is unknown"),
        (["eval.horizons=10,25"], "eval.horizons=25 is out of range: without replacement at most V=20"),
        (["model.max_len=30"], "model.max_len=30 is out of range"),
    ],
)
def test_bad_values_name_the_problem(overrides, message):
    with pytest.raises(ConfigError) as info:
        load_run_config(CONFIGS / "paper" / "bijection_transformer.toml", overrides)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_run_config(tmp_path / "missing.toml")
    (tmp_path / "broken.toml").write_text("[train\nsteps = 3")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        load_run_config(tmp_path / "broken.toml")
    (tmp_path / "extra.toml").write_text('[tunnel]\nname = "hmm"\n[model]\nkind = "transformer"\n[optim]\nlr = 1\n')
    with pytest.raises(ConfigError, match="unknown section 'optim'"):
        load_run_config(tmp_path / "extra.toml")
    (tmp_path / "unnamed.toml").write_text("[tunnel]\nV = 3\n[model]\nkind = 'mlp'\n")
    with pytest.raises(ConfigError, match="tunnel.name=None is missing"):
        load_run_config(tmp_path / "unnamed.toml")


def test_defaults_fill_missing_sections():
    config = run_config_from_mapping({"tunnel": {"name": "hmm"}, "model": {"kind": "transformer"}})
    assert isinstance(config, RunConfig) and config.tunnel == HMMTunnel() and config.horizons == (20,)


@pytest.mark.parametrize("scale", ["paper", "cpu"])
def test_protocol_is_identical_across_architectures_within_a_task(scale):
    """docs/protocol.md §5: within a task every model sees the same tunnel, training and evaluation."""
    folder = CONFIGS / scale
    assert {p.stem for p in folder.glob("*.toml")} == {
        "bijection_transformer", "bijection_mlp", "bijection_lstm", "bijection_mamba", "bijection_replacement_transformer",
        "hmm_transformer", "hmm_mlp", "hmm_lstm", "hmm_mamba", "hmm_late_attention_off",
    }
    replacement = load_run_config(folder / "bijection_replacement_transformer.toml")
    reference = load_run_config(folder / "bijection_transformer.toml")
    # Only the tunnel differs, and the training stream's curriculum (which draws from the tunnel).
    assert replacement.model == reference.model
    assert dataclasses.replace(replacement.train, curriculum=reference.train.curriculum) == reference.train
    for task, variants in (("bijection", ["mlp", "lstm", "mamba"]), ("hmm", ["mlp", "lstm", "mamba", "late_attention_off"])):
        reference = load_run_config(folder / f"{task}_transformer.toml")
        for variant in variants:
            config = load_run_config(folder / f"{task}_{variant}.toml")
            assert (config.tunnel, config.train, config.eval) == (reference.tunnel, reference.train, reference.eval)
            if variant in ("mlp", "lstm", "mamba"):  # the controls: matched to the transformer
                assert config.model.matched_to == reference.model and config.model.d_model == reference.model.d_model
            else:
                top_two = (reference.model.n_layers - 2, reference.model.n_layers - 1)
                assert config.model.no_attention_layers == top_two


CURRICULUM = ["train.curriculum.param=concentration", "train.curriculum.start=0.25", "train.curriculum.steps=400"]


def test_curriculum_anneals_geometrically_into_the_tunnels_own_value(tmp_path):
    config = load_run_config(CONFIGS / "cpu" / "hmm_transformer.toml", CURRICULUM)
    # Closed form: 0.25 * (1 / 0.25) ** (s / 400): 0.25, 0.5 at the midpoint, 1 from step 400 on.
    expected = {0: 0.25, 200: 0.5, 100: 0.25 * 4**0.25, 399: 0.25 * 4 ** (399 / 400), 400: 1.0, 10_000: 1.0}
    for step, value in expected.items():
        assert config.training_tunnel(step).concentration == pytest.approx(value, rel=1e-12)
        assert config.training_tunnel(step).grid == config.tunnel.grid  # only the named parameter moves
    assert config.training_tunnel(400) is config.tunnel
    plain = load_run_config(CONFIGS / "cpu" / "hmm_transformer.toml")
    assert plain.training_tunnel(0) is plain.tunnel
    (tmp_path / "config.json").write_text(config.to_json())
    assert load_run_config(tmp_path / "config.json") == config


def test_linear_curriculum_anneals_a_rate_to_zero():
    """The with-replacement bijection's repeat rate, 0.6 down to the tunnel's 0 over 1,000 steps."""
    config = load_run_config(
        CONFIGS / "cpu" / "bijection_replacement_transformer.toml",
        ["train.curriculum.param=repeat_rate", "train.curriculum.start=0.6", "train.curriculum.steps=1000", "train.curriculum.shape=linear"],
    )
    # Closed form: 0.6 * (1 - s / 1000).
    for step, value in {0: 0.6, 250: 0.45, 500: 0.3, 999: 0.0006, 1000: 0.0, 5000: 0.0}.items():
        assert config.training_tunnel(step).repeat_rate == pytest.approx(value, rel=1e-12, abs=1e-15)
    assert config.training_tunnel(1000) is config.tunnel


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["train.curriculum.param=K", "train.curriculum.steps=10"], "train.curriculum.param='K' is not a float parameter of the hmm tunnel; allowed: concentration, stickiness, grid, floor, transition_concentration (once set)"),
        (["train.curriculum.param=transition_concentration", "train.curriculum.start=0.2", "train.curriculum.steps=10"], "anneals into the tunnel's own transition_concentration, which is unset: give tunnel.transition_concentration a value"),
        (["train.curriculum.param=concentration", "train.curriculum.start=0", "train.curriculum.steps=10"], "train.curriculum.start=0.0 is out of range"),
        (["train.curriculum.param=concentration", "train.curriculum.start=nan", "train.curriculum.steps=10"], "train.curriculum.start=nan is out of range"),
        (["train.curriculum.param=concentration"], "train.curriculum.steps=0 is out of range"),
        (["train.curriculum.param=floor", "train.curriculum.start=0.5", "train.curriculum.steps=10", "train.curriculum.shape=linear"], "the tunnel refuses it: floor=0.5 is out of range"),
        (["train.curriculum.param=floor", "train.curriculum.start=0.01", "train.curriculum.steps=10"], "train.curriculum.shape='geometric' cannot anneal into hmm floor=0.0"),
        (["train.curriculum.param=concentration", "train.curriculum.steps=10", "train.curriculum.shape=cubic"], "shape='cubic' is not a curriculum shape; allowed: geometric, linear"),
    ],
)
def test_bad_curricula_name_the_problem(overrides, message):
    with pytest.raises(ConfigError) as info:
        load_run_config(CONFIGS / "cpu" / "hmm_transformer.toml", overrides)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_an_unknown_section_is_named_on_one_line_whatever_its_name():
    # A TOML quoted key may hold a newline; the message still fits one line (the repr escapes it).
    with pytest.raises(ConfigError) as raised:
        run_config_from_mapping({"tunnel": {"name": "bijection"}, "model": {"kind": "transformer"}, "a\nb": {}})
    assert str(raised.value) == "unknown section 'a\\nb' in run config; allowed sections: tunnel, model, train, eval"
