"""Strict typed parameters: unknown keys, wrong types and typed command-line overrides."""

from __future__ import annotations

import pytest

from windtunnel.config import ConfigError, apply_overrides, from_mapping, parse_text, to_mapping
from windtunnel.run_config import TrainConfig
from windtunnel.tunnels import TUNNELS, BijectionTunnel, HMMTunnel, make_tunnel, tunnel_class


def test_overrides_are_typed_by_the_dataclass():
    data = apply_overrides(HMMTunnel, {"S": 3}, ["K=50", "concentration=0.5", "grid=1e-2", "initial=0.2,0.3,0.5"])
    assert data == {"S": 3, "K": 50, "concentration": 0.5, "grid": 0.01, "initial": (0.2, 0.3, 0.5)}
    tunnel = from_mapping(HMMTunnel, data)
    assert tunnel == HMMTunnel(S=3, K=50, concentration=0.5, initial=(0.2, 0.3, 0.5))
    assert apply_overrides(HMMTunnel, {}, ["initial=none"]) == {"initial": None}
    assert apply_overrides(BijectionTunnel, {}, ["with_replacement=true", "query=False"]) == {
        "with_replacement": True,
        "query": False,
    }


def test_round_trip_through_a_mapping():
    for tunnel in (BijectionTunnel(V=7, query=True), HMMTunnel(S=2, initial=(0.25, 0.75))):
        assert from_mapping(type(tunnel), to_mapping(tunnel)) == tunnel


def test_ints_are_floats_but_not_the_reverse():
    assert HMMTunnel(concentration=2).concentration == 2.0
    assert isinstance(HMMTunnel(concentration=2).concentration, float)
    with pytest.raises(ConfigError, match=r"S=2.0 has the wrong type: expected int"):
        HMMTunnel(S=2.0)
    with pytest.raises(ConfigError, match="expected bool"):
        BijectionTunnel(query="yes")


@pytest.mark.parametrize(
    "assignment, message",
    [
        ("Q=1", "unknown key 'Q' for HMMTunnel; allowed keys: S, M, K, concentration, transition_concentration, stickiness, grid, floor, initial"),
        ("K=abc", "K='abc' has the wrong type: expected int"),
        ("K", "is not of the form key=value"),
        ("K.x=1", "'K' is a value, not a section"),
        ("initial=0.5,x", "initial='0.5,x' has the wrong type: expected list of float | none"),
    ],
)
def test_bad_overrides_say_what_is_wrong(assignment, message):
    with pytest.raises(ConfigError) as info:
        apply_overrides(HMMTunnel, {}, [assignment])
    assert message in str(info.value)


def test_registry_lists_valid_names():
    assert tunnel_class("hmm") is HMMTunnel
    with pytest.raises(ConfigError, match=f"unknown tunnel 'hmmm'; choose one of: {', '.join(sorted(TUNNELS))}$"):
        make_tunnel("hmmm")
    with pytest.raises(ConfigError, match="unknown key 'v'"):
        make_tunnel("bijection", {"v": 3})
    assert make_tunnel("bijection", {"V": 5}, ["L=3"]) == BijectionTunnel(V=5, L=3)


def test_parse_text_bool_words():
    assert parse_text("on", bool, "x") is True and parse_text("0", bool, "x") is False
    with pytest.raises(ConfigError, match="expected bool"):
        parse_text("maybe", bool, "x")


@pytest.mark.parametrize(
    "cls, field, value, message",
    [
        (HMMTunnel, "concentration", float("nan"), "concentration=nan is out of range: need a finite number"),
        (HMMTunnel, "grid", float("inf"), "grid=inf is out of range: need a finite number"),
        # inside a list, and under a union with None: still "out of range", never "wrong type"
        (HMMTunnel, "initial", (float("nan"), 0.5, 0.5), "initial[0]=nan is out of range: need a finite number"),
        (TrainConfig, "lr", float("inf"), "lr=inf is out of range: need a finite number"),
        (TrainConfig, "weight_decay", float("nan"), "weight_decay=nan is out of range"),
        (TrainConfig, "grad_clip", float("nan"), "grad_clip=nan is out of range"),  # NaN used to turn clipping off
        (TrainConfig, "seed", 2**63, "seed=9223372036854775808 is out of range: need an integer that fits in 64 bits"),
    ],
)
def test_values_no_parameter_can_take_are_out_of_range(cls, field, value, message):
    # NaN passes every comparison-based range check (each comparison is false), so the
    # check has to be its own; these used to be accepted and diverge (or silently misbehave).
    with pytest.raises(ConfigError) as info:
        cls(**{field: value})
    assert message in str(info.value)
    assert TrainConfig(seed=2**63 - 1).seed == 2**63 - 1  # the largest that fits is fine


def test_a_config_saved_with_a_byte_order_mark_reads_as_without(tmp_path):
    """Some editors start a UTF-8 file with a byte-order mark; TOML has no place for it."""
    from windtunnel.run_config import load_run_config

    text = '[tunnel]\nname = "bijection"\nV = 6\n[model]\nkind = "transformer"\n'
    plain, marked = tmp_path / "plain.toml", tmp_path / "marked.toml"
    plain.write_text(text)
    marked.write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert load_run_config(marked) == load_run_config(plain)
