"""Property-based tests (hypothesis) of the config parser and ``--set`` overrides: any input
either parses to a valid config or raises the one-line ConfigError, never anything else."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from windtunnel.config import ConfigError
from windtunnel.run_config import RunConfig, run_config_from_mapping
from windtunnel.tunnels import TUNNELS, make_tunnel

# Keys that exist (so values reach the type and range checks) and some that do not.
SECTION_KEYS = {
    "tunnel": ["name", "V", "L", "with_replacement", "query", "repeat_rate", "repeat_window", "S", "M", "K",
               "concentration", "transition_concentration", "stickiness", "grid", "floor", "initial", "bogus"],
    "model": ["kind", "n_layers", "n_heads", "d_model", "d_mlp", "max_len", "no_attention_layers", "n_blocks",
              "d_hidden", "bogus"],
    "train": ["steps", "batch_size", "lr", "schedule", "warmup_steps", "min_lr", "weight_decay", "betas", "grad_clip",
              "target", "seed", "eval_every", "checkpoint_every", "log_every", "device", "compile", "fused_adamw", "data_on_device", "supervised_only",
              "curriculum", "log_to", "bogus"],
    "eval": ["n", "batch_size", "horizons", "seed", "bootstrap", "bogus"],
}
NAMES = st.sampled_from(["bijection", "hmm", "transformer", "mlp", "maze", "", "cosine", "soft", "cpu", "V"])
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(min_value=-3, max_value=64),  # small values, where most valid settings are
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=0, max_value=1),
    NAMES,
    st.text(max_size=8),
)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=3)), max_leaves=8)


@st.composite
def config_mappings(draw):
    data = {}
    for section, keys in SECTION_KEYS.items():
        if draw(st.integers(0, 9)) == 0:
            data[section] = draw(VALUES)  # sometimes not a table at all
            continue
        chosen = draw(st.lists(st.sampled_from(keys), unique=True, max_size=5))
        table = {key: draw(VALUES) for key in chosen}
        if section == "tunnel" and draw(st.booleans()):
            table["name"] = draw(st.sampled_from(["bijection", "hmm"]))
        if section == "model" and draw(st.booleans()):
            table["kind"] = draw(st.sampled_from(["transformer", "mlp"]))
        data[section] = table
    if draw(st.integers(0, 9)) == 0:
        data[draw(st.text(max_size=6))] = draw(VALUES)
    return data


def _assignment_texts():
    keys = st.one_of(*(st.sampled_from([f"{section}.{key}" for key in keys]) for section, keys in SECTION_KEYS.items()),
                     st.text(max_size=12))
    values = st.one_of(st.text(max_size=12), st.sampled_from(["nan", "inf", "-inf", "1e999", "true", "1,2", "[1, 2]",
                                                              "0.5", "-1", "99999999999999999999999", ""]))
    return st.one_of(st.builds(lambda k, v: f"{k}={v}", keys, values), st.text(max_size=20))


VALID = {"tunnel": {"name": "bijection", "V": 6}, "model": {"kind": "transformer", "n_layers": 1, "n_heads": 2, "d_model": 16, "d_mlp": 32}}
PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _parses_or_refuses(build) -> RunConfig | None:
    try:
        config = build()
    except ConfigError as error:
        message = str(error)
        assert message and "\n" not in message  # the one line the CLI prints
        return None
    assert isinstance(config, RunConfig)
    return config


@PROPERTY
@given(config_mappings())
def test_any_mapping_parses_or_raises_config_error(data):
    config = _parses_or_refuses(lambda: run_config_from_mapping(data))
    if config is not None:  # what parsed is valid: it round-trips through its own mapping unchanged
        assert run_config_from_mapping(config.to_mapping()) == config
        assert math.isfinite(config.train.lr) and config.train.lr > 0 and config.train.steps >= 1


@PROPERTY
@given(st.lists(_assignment_texts(), max_size=4))
def test_any_overrides_parse_or_raise_config_error(overrides):
    config = _parses_or_refuses(lambda: run_config_from_mapping(VALID, overrides))
    if config is not None:
        assert run_config_from_mapping(config.to_mapping()) == config


@PROPERTY
@given(st.sampled_from(sorted(TUNNELS)), st.lists(st.builds(lambda k, v: f"{k}={v}", st.sampled_from(SECTION_KEYS["tunnel"][1:]),
                                                          st.sampled_from(["0", "1", "2", "5", "-1", "0.05", "0.5", "nan", "inf",
                                                                           "true", "x", "0.2,0.8", "1e30", ""])), max_size=4))
def test_any_tunnel_overrides_build_a_tunnel_or_raise_config_error(name, overrides):
    try:
        tunnel = make_tunnel(name, overrides=overrides)
    except ConfigError as error:
        assert "\n" not in str(error)
        return
    assert tunnel.name == name and tunnel.vocab_size >= 2 and tunnel.num_classes >= 1
