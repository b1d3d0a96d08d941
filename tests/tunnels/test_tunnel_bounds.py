"""Each tunnel's parameters at the edges of what it accepts: the last value allowed builds a
tunnel, the first one past it is refused with the one line that names the parameter and what
is allowed (the same line `windtunnel` prints, exit 2)."""

from __future__ import annotations

import re

import pytest
import torch

from windtunnel.config import ConfigError
from windtunnel.tunnels import AssocRecallTunnel, BijectionTunnel, HMMTunnel
from windtunnel.tunnels.hmm import MAX_OBSERVATIONS

ACCEPTED = [
    (BijectionTunnel, {"V": 2}),
    (BijectionTunnel, {"V": 4, "L": 1}),
    (BijectionTunnel, {"V": 4, "L": 4}),
    (BijectionTunnel, {"V": 4, "L": 9, "with_replacement": True}),
    (HMMTunnel, {"S": 1, "M": 1, "K": 1, "grid": 1.0}),  # one grid step per row: the rows are point masses
    (HMMTunnel, {"S": 2, "M": 2, "K": 3, "grid": 0.5}),  # 1/grid = 2 steps = max(S, M)
    (HMMTunnel, {"S": 2, "M": 2, "K": MAX_OBSERVATIONS, "grid": 0.5}),
    (HMMTunnel, {"S": 3, "M": 2, "initial": (0.0, 0.5, 0.5)}),  # a state that never starts
    (HMMTunnel, {"S": 2, "M": 2, "initial": (0.5 + 5e-10, 0.5)}),  # within 1e-9 of summing to 1
    (HMMTunnel, {"S": 4, "M": 4, "grid": 0.01, "floor": 0.2499}),
    (AssocRecallTunnel, {"key_vocab": 1, "n_pairs": 1, "value_vocab": 1, "p_stored": 1.0, "n_queries": 1, "n_filler": 0}),
    (AssocRecallTunnel, {"key_vocab": 4, "n_pairs": 2, "value_vocab": 4, "p_stored": 0.0}),
]

REFUSED = [
    (BijectionTunnel, {"V": 1}, "V=1 is out of range: need V >= 2"),
    (BijectionTunnel, {"V": 4, "L": 0}, "L=0 is out of range: need at least 1 pair"),
    (BijectionTunnel, {"V": 4, "L": 5}, "L=5 is out of range: without replacement at most V=4 distinct inputs exist "
                                        "(set with_replacement=true for longer sequences)"),
    (HMMTunnel, {"M": 0}, "M=0 is out of range: need at least 1 observation symbol"),
    (HMMTunnel, {"K": 0}, "K=0 is out of range: need at least 1 observation"),
    (HMMTunnel, {"K": MAX_OBSERVATIONS + 1}, f"K={MAX_OBSERVATIONS + 1} is out of range: at most {MAX_OBSERVATIONS:,} observations"),
    (HMMTunnel, {"S": 3, "M": 2, "grid": 0.5}, "grid=0.5 is too coarse or not a divisor of 1: need 1/grid an integer >= max(S, M) = 3 "
                                               "so every row can sum to exactly 1 on the grid (e.g. grid=0.01)"),
    (HMMTunnel, {"S": 2, "M": 2, "grid": 2.0}, "grid=2.0 is too coarse or not a divisor of 1"),
    (HMMTunnel, {"S": 2, "M": 2, "grid": 0.3}, "grid=0.3 is too coarse or not a divisor of 1"),
    (HMMTunnel, {"S": 4, "M": 4, "grid": 0.01, "floor": 0.25},
     "floor=0.25 is out of range: need a finite value in [0, 1/max(S, M)) = [0, 0.25) (e.g. floor=0.05)"),
    (HMMTunnel, {"S": 2, "M": 5, "grid": 0.01, "floor": 0.2},
     "floor=0.2 is out of range: need a finite value in [0, 1/max(S, M)) = [0, 0.2) (e.g. floor=0.05)"),
    (HMMTunnel, {"S": 2, "M": 2, "initial": (0.5, 0.5, 0.0)}, "initial=[0.5, 0.5, 0.0] is not a distribution over S=2 states: "
                                                              "need 2 non-negative numbers summing to 1 (or leave it unset for uniform)"),
    (HMMTunnel, {"S": 2, "M": 2, "initial": (1.1, -0.1)}, "initial=[1.1, -0.1] is not a distribution over S=2 states"),
    (AssocRecallTunnel, {"key_vocab": 0, "n_pairs": 0}, "key_vocab=0 is out of range: need key_vocab >= 1"),
    (AssocRecallTunnel, {"key_vocab": 4, "n_pairs": 5}, "n_pairs=5 is out of range: need 1 <= n_pairs <= key_vocab=4"),
    (AssocRecallTunnel, {"key_vocab": 4, "n_pairs": 2, "value_vocab": 3},
     "value_vocab=3 is out of range: need value_vocab >= key_vocab=4 (every key is bound to a distinct value)"),
    (AssocRecallTunnel, {"p_stored": 1.01}, "p_stored=1.01 is out of range: need 0 <= p_stored <= 1"),
    (AssocRecallTunnel, {"p_stored": -0.01}, "p_stored=-0.01 is out of range: need 0 <= p_stored <= 1"),
    (AssocRecallTunnel, {"key_vocab": 4, "n_pairs": 4, "value_vocab": 4, "p_stored": 0.99},
     "p_stored=0.99 asks for unstored keys, but n_pairs=4 stores every key: lower n_pairs below key_vocab or set p_stored = 1"),
    (AssocRecallTunnel, {"n_queries": 0}, "n_queries=0 is out of range: need at least 1 query"),
    (HMMTunnel, {"S": 2, "M": 2, "initial": (0.5 + 2e-9, 0.5)}, "initial=[0.500000002, 0.5] is not a distribution over S=2 states"),
]


@pytest.mark.parametrize("cls, params", ACCEPTED, ids=lambda v: str(v))
def test_the_last_value_allowed_builds_a_tunnel(cls, params):
    cls(**params)


@pytest.mark.parametrize("cls, params, message", REFUSED, ids=lambda v: str(v)[:40])
def test_the_first_value_past_it_is_refused_with_its_line(cls, params, message):
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        cls(**params)


def test_a_floor_the_grid_cannot_hold_is_refused_with_the_arithmetic():
    HMMTunnel(S=4, M=4, grid=0.05, floor=0.24)  # at least 5 of 20 steps per entry: 4 x 5 = 20 fits exactly
    with pytest.raises(ConfigError, match=r"^floor=0.24 is infeasible on grid=0.1: rows of 4 entries of at least 3 steps need "
                                          r"4 x 3 = 12 grid steps per row but the grid has 10$"):
        HMMTunnel(S=4, M=4, grid=0.1, floor=0.24)


def test_a_horizon_is_checked_where_a_sample_asks_for_one():
    with pytest.raises(ConfigError, match=r"^horizon=0 is out of range: need at least 1 observation$"):
        HMMTunnel().sample(1, generator=torch.Generator().manual_seed(0), horizon=0)
    with pytest.raises(ConfigError, match=r"^horizon=5 is out of range: without replacement at most V=4"):
        BijectionTunnel(V=4).sample(1, generator=torch.Generator().manual_seed(0), horizon=5)


def test_assoc_recall_values_are_the_tokens_after_the_keys():
    tunnel = AssocRecallTunnel()
    keys, names = tunnel.symbol_tokens()
    assert keys == list(range(tunnel.key_vocab)) and names[0] == "k=0"
    assert tunnel.hypothesis_tokens() == list(range(tunnel.key_vocab, tunnel.key_vocab + tunnel.value_vocab))
    assert tunnel.value_vocab > 1 and tunnel.key_vocab > 1


def test_a_registered_tunnel_needs_a_name_a_dataclass_and_the_whole_contract():
    import dataclasses

    from windtunnel.tunnels import register_tunnel

    class Nameless:
        pass

    with pytest.raises(ValueError, match=r"^Nameless has no name: give it a class attribute name: ClassVar\[str\]$"):
        register_tunnel(Nameless)

    class Plain:
        name = "plain"

    with pytest.raises(ValueError, match=r"^Plain is not a dataclass: a tunnel's parameters are its dataclass fields$"):
        register_tunnel(Plain)

    @dataclasses.dataclass(frozen=True)
    class Partial:
        name = "partial"

        def sample(self):
            pass

    with pytest.raises(ValueError, match=r"^Partial does not keep the Tunnel contract: it lacks vocab_size, num_classes, horizon, "
                                         r"check_horizon, seq_len, prior_predictive, sample_bytes, describe, label$"):
        register_tunnel(Partial)
    with pytest.raises(ValueError, match=r"^a tunnel named 'hmm' is registered already \(HMMTunnel\)$"):
        register_tunnel(HMMTunnel)


def test_an_assoc_recall_horizon_is_checked_under_its_own_name():
    with pytest.raises(ConfigError, match=r"^horizon=0 is out of range: need at least 1 query$"):
        AssocRecallTunnel().sample(1, generator=torch.Generator().manual_seed(0), horizon=0)


def test_the_grid_accepts_an_integer_reciprocal_up_to_float64_rounding_and_refuses_zero():
    # 1/1e-5 is 99999.99999999999 in float64: 1.5e-11 from an integer, inside the relative
    # tolerance 1e-9 (1e-4 here) that absorbs rounding, far outside 1e-9 / 1e5.
    assert HMMTunnel(S=2, M=2, grid=1e-5).levels == 100000
    # The smallest tunnel (S = M = 1) takes any grid of at least one step; zero has no steps.
    for grid in (0.0, -0.5):
        with pytest.raises(ConfigError, match=rf"^grid={grid} is too coarse or not a divisor of 1"):
            HMMTunnel(S=1, M=1, grid=grid)


def test_an_unknown_tunnel_lists_the_registered_names_and_a_name_must_be_a_string():
    from windtunnel.tunnels import TUNNELS, register_tunnel, tunnel_class

    names = ", ".join(sorted(TUNNELS))
    assert "assoc_recall, bijection" in names
    with pytest.raises(ConfigError, match=rf"^unknown tunnel 'nope'; choose one of: {re.escape(names)}$"):
        tunnel_class("nope")

    class Numbered:
        name = 7  # truthy, but not a string

    with pytest.raises(ValueError, match=r"^Numbered has no name"):
        register_tunnel(Numbered)


def test_an_episode_moves_every_tensor_and_one_hot_rows_are_float64():
    from windtunnel.tunnels.base import one_hot

    episode = HMMTunnel(S=2, M=2, K=3).sample(2, generator=torch.Generator().manual_seed(0))
    moved = episode.to("meta")  # a device that exists everywhere: only shapes and dtypes move
    for name, value in vars(episode).items():
        if torch.is_tensor(value):
            moved_value = getattr(moved, name)
            assert moved_value.device.type == "meta" and moved_value.dtype == value.dtype and moved_value.shape == value.shape, name
    assert episode.tokens.device.type == "cpu"  # a copy: the original stays
    rows = one_hot(torch.tensor([[2, 0]]), 3)
    assert rows.dtype == torch.float64
    assert rows.tolist() == [[[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]]


def test_a_capability_missing_from_an_object_without_a_name_names_its_type():
    from windtunnel.tunnels.capabilities import AttentionCategories, lacks

    class Bare:
        pass

    assert lacks(Bare(), AttentionCategories).startswith("the Bare tunnel does not declare AttentionCategories (")
