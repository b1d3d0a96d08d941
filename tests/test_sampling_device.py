"""Tunnels draw on their generator's device (``train.data_on_device``), and a CPU draw is unchanged.

A GPU is not needed to check that every tensor of a draw is made where the generator lives:
under ``torch.device("meta")`` any factory call that forgets ``device=generator.device``
makes a meta tensor, which then either poisons the episode (a field ends up on ``meta``) or
fails outright. So a draw made under it, from a CPU generator, must come out on the CPU and
equal to the same draw made normally, bit for bit.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from windtunnel.run_config import TrainConfig, load_run_config
from windtunnel.training.trainer import data_device_for
from windtunnel.tunnels import make_tunnel

CONFIGS = Path(__file__).resolve().parents[1] / "src" / "windtunnel" / "configs"

# Every preset's training tunnel, at the start of its curriculum where it has one, plus the
# sampling branches no preset takes (a query, repeats without a window, Gamma draws at
# concentrations above and below 1, stickiness, an explicit initial distribution).
PRESET_TUNNELS = sorted(str(p.relative_to(CONFIGS)) for p in CONFIGS.glob("*/*.toml"))
EXTRA_TUNNELS = [
    ("bijection", {"V": 7, "query": True}),
    ("bijection", {"V": 9, "L": 14, "with_replacement": True, "repeat_rate": 0.4}),
    ("bijection", {"V": 9, "L": 14, "with_replacement": True, "repeat_rate": 0.4, "repeat_window": 3}),
    ("hmm", {"S": 3, "M": 4, "K": 9, "concentration": 0.3, "transition_concentration": 2.5, "stickiness": 0.2}),
    ("hmm", {"S": 3, "M": 3, "K": 6, "grid": 0.05, "floor": 0.05, "initial": [0.5, 0.3, 0.2]}),
    ("assoc_recall", {}),
]


def _tensor_fields(episode) -> dict[str, torch.Tensor]:
    return {f.name: getattr(episode, f.name) for f in dataclasses.fields(episode) if torch.is_tensor(getattr(episode, f.name))}


def _check_follows_generator(tunnel) -> None:
    reference = tunnel.sample(6, generator=torch.Generator().manual_seed(11))
    with torch.device("meta"):
        drawn = tunnel.sample(6, generator=torch.Generator().manual_seed(11))
    expected = _tensor_fields(reference)
    got = _tensor_fields(drawn)
    assert got.keys() == expected.keys()
    for name, value in got.items():
        assert value.device.type == "cpu", f"{name} was made on {value.device}, not on the generator's device"
        assert value.dtype == expected[name].dtype and torch.equal(value, expected[name]), name


@pytest.mark.parametrize("preset", PRESET_TUNNELS)
def test_every_presets_tunnel_draws_on_its_generators_device(preset):
    config = load_run_config(CONFIGS / preset)
    _check_follows_generator(config.training_tunnel(0))


@pytest.mark.parametrize(("name", "params"), EXTRA_TUNNELS)
def test_every_sampling_branch_draws_on_its_generators_device(name, params):
    _check_follows_generator(make_tunnel(name, params))


def test_the_check_catches_a_draw_made_off_the_generators_device():
    """The oracle itself: a sampler that makes one tensor without ``device=`` is caught."""

    @dataclasses.dataclass(frozen=True)
    class Careless:
        inner: object

        def sample(self, batch_size, *, generator):
            episode = self.inner.sample(batch_size, generator=generator)
            return dataclasses.replace(episode, positions=torch.arange(len(episode.positions)))

    with pytest.raises(AssertionError, match="positions was made on meta"):
        _check_follows_generator(Careless(make_tunnel("bijection", {"V": 5})))


def test_batches_are_drawn_on_cuda_by_default_and_on_the_host_when_asked():
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert data_device_for(TrainConfig(), cuda) == cuda
    assert data_device_for(TrainConfig(data_on_device=False), cuda) == cpu
    assert data_device_for(TrainConfig(), cpu) == cpu
    assert data_device_for(TrainConfig(data_on_device=True), cpu) == cpu
