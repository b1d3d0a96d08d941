"""Each built-in tunnel's own words for its task variant and its size: what the report prints
beside every number (it reads them from the saved results, never from a tunnel)."""

from __future__ import annotations

import pytest

from windtunnel.tunnels import make_tunnel


@pytest.mark.parametrize(("name", "params", "variant"), [
    ("hmm", {"grid": 0.05}, "no floor, grid 0.05"),
    ("hmm", {"floor": 0.05, "grid": 0.01}, "floor 0.05, grid 0.01"),
    ("hmm", {"grid": 0.05, "stickiness": 0.0, "concentration": 1.0}, "no floor, grid 0.05"),  # the plain values go unsaid
    ("hmm", {"grid": 0.05, "concentration": 0.5, "transition_concentration": 0.2, "stickiness": 0.3},
     "no floor, grid 0.05, concentration 0.5, T concentration 0.2, stickiness 0.3"),
    ("bijection", {}, "without replacement"),
    ("bijection", {"with_replacement": True}, "with replacement"),
    ("assoc_recall", {}, "assoc_recall"),
])
def test_a_tunnel_names_its_variant_for_the_sampling_it_is(name, params, variant):
    assert make_tunnel(name, params).describe() == variant


@pytest.mark.parametrize(("name", "params", "label"), [
    ("hmm", {"S": 4, "M": 3, "K": 30}, "hmm (S = 4, M = 3, K = 30)"),
    ("bijection", {"V": 12}, "bijection (V = 12)"),
    ("assoc_recall", {"n_pairs": 4}, "assoc_recall (n_pairs = 4)"),
])
def test_a_tunnel_labels_itself_with_the_parameters_that_size_it(name, params, label):
    assert make_tunnel(name, params).label() == label
