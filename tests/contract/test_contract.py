"""The plug-in contract (windtunnel.contract) over every registered tunnel and model family,
whatever is registered; and each rule shown to fail a plug-in that breaks it."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import pytest
import torch
from torch import nn

from windtunnel.contract import ContractError, check_model_family, check_tunnel
from windtunnel.models import MODELS, Transformer, TransformerConfig, register_model
from windtunnel.tunnels import TUNNELS, make_tunnel


@pytest.mark.parametrize("name", sorted(TUNNELS))
def test_every_registered_tunnel_keeps_the_contract(name):
    check_tunnel(TUNNELS[name]())


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_every_registered_model_family_keeps_the_contract(kind):
    check_model_family(kind)


class Broken:
    """A real tunnel with one thing done wrong to each draw (``spoil(episode, generator)``)."""

    def __init__(self, spoil, sample_bytes=None, words=None) -> None:
        self.inner, self.spoil, self._bytes = make_tunnel("bijection", {"V": 5}), spoil, sample_bytes
        self._words = words or {}

    def describe(self) -> str:
        return self._words.get("describe", self.inner.describe())

    def label(self) -> str:
        return self._words.get("label", self.inner.label())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def sample_bytes(self, batch_size: int, horizon: int | None = None) -> int:
        return self._bytes(batch_size) if self._bytes else self.inner.sample_bytes(batch_size, horizon)

    def sample(self, batch_size: int, *, generator: torch.Generator, horizon: int | None = None):
        return self.spoil(self.inner.sample(batch_size, generator=generator, horizon=horizon), generator)


def _one_hot_elsewhere(episode, _):
    """The posterior a point mass on a class other than the target drawn: normalized, but wrong."""
    wrong = (episode.targets + 1) % episode.posterior.shape[-1]
    posterior = torch.nn.functional.one_hot(wrong, episode.posterior.shape[-1]).to(torch.float64)
    return dataclasses.replace(episode, posterior=posterior, entropy_bits=torch.zeros_like(episode.entropy_bits))


@pytest.mark.parametrize(("spoil", "sample_bytes", "rule"), [
    (lambda e, g: dataclasses.replace(e, posterior=e.posterior * 1.01), None, "sums to 1"),
    (lambda e, g: dataclasses.replace(e, entropy_bits=e.entropy_bits + 0.01), None, "entropy_bits differs"),
    (_one_hot_elsewhere, None, "posterior probability 0"),
    (lambda e, g: dataclasses.replace(e, tokens=e.tokens.to(torch.int32)), None, "tokens must be int64"),
    (lambda e, g: dataclasses.replace(e, posterior=e.posterior.float()), None, "posterior must be float64"),
    # the rows shuffled by the global random stream, not the generator given
    (lambda e, g: dataclasses.replace(e, tokens=e.tokens[torch.randperm(e.tokens.shape[0])]), None, "seeded alike differ"),
    (lambda e, g: dataclasses.replace(e, positions=torch.arange(len(e.positions))), None, "positions was made on meta"),
    (lambda e, g: e, lambda b: 8 * b, "sample_bytes"),
])
def test_each_tunnel_rule_fails_a_tunnel_that_breaks_it(spoil, sample_bytes, rule):
    with pytest.raises(ContractError, match=rule):
        check_tunnel(Broken(spoil, sample_bytes))


@pytest.mark.parametrize(("words", "rule"), [
    ({"describe": ""}, "describe\\(\\) must give a one-line text"),
    ({"describe": "two\nlines"}, "describe\\(\\) must give a one-line text"),
    ({"label": None}, "label\\(\\) must give a one-line text"),
    ({"label": "V = 5"}, "label\\(\\) must start with the tunnel's name"),
])
def test_a_tunnel_whose_words_the_report_cannot_print_fails(words, rule):
    with pytest.raises(ContractError, match=rule):
        check_tunnel(Broken(lambda e, g: e, words=words))


@dataclasses.dataclass(frozen=True)
class HalfInitializedConfig(TransformerConfig):
    """Its own config class (the registry gives each family one)."""


@dataclasses.dataclass(frozen=True)
class UnseededConfig(TransformerConfig):
    """Its own config class (the registry gives each family one)."""


class HalfInitialized(Transformer):
    """A transformer with one extra layer it never initializes from the generator: nn.Linear's
    own reset reads the global random stream."""

    kind: ClassVar[str] = "half_initialized"
    config_class: ClassVar[type] = HalfInitializedConfig

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.extra = nn.Linear(4, 4)


class Unseeded(Transformer):
    """Ignores the generator altogether: every seed gives the same weights."""

    kind: ClassVar[str] = "unseeded"
    config_class: ClassVar[type] = UnseededConfig

    def __init__(self, *args, generator=None, **kwargs) -> None:
        super().__init__(*args, generator=torch.Generator().manual_seed(0), **kwargs)


@pytest.mark.parametrize(("family", "rule"), [(HalfInitialized, "extra.weight, extra.bias not drawn from the generator"),
                                              (Unseeded, "another seed gives the same weights")])
def test_a_family_that_does_not_initialize_from_its_generator_fails(family, rule):
    register_model(family)
    try:
        with pytest.raises(ContractError, match=rule):
            check_model_family(family.kind)
    finally:
        MODELS.pop(family.kind)


def test_the_check_leaves_the_global_random_stream_as_it_found_it():
    before = torch.random.get_rng_state()
    check_model_family("transformer")
    assert torch.equal(torch.random.get_rng_state(), before)
