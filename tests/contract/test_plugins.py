"""A tunnel is one module: a toy tunnel, written here in test code alone, registered by name,
then sampled, trained on, evaluated and analyzed through the same commands as the built-in
ones; analyses that need task knowledge it does not declare say so instead of crashing."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
from torch import Tensor

from windtunnel.analysis import ANALYSES
from windtunnel.cli import main
from windtunnel.config import ConfigError, check_field_types
from windtunnel.metrics import entropy_bits
from windtunnel.run_config import run_config_from_mapping
from windtunnel.runs import evaluate_run
from windtunnel.training.trainer import train
from windtunnel.tunnels import TUNNELS, BijectionTunnel, Episode, HMMTunnel, make_tunnel, register_tunnel, unregister_tunnel
from windtunnel.tunnels.capabilities import HypothesisTokens, Relabeling, SymbolTokens, capabilities_of, declares, lacks

BOS = 2  # token ids: flips 0 and 1, then the start token


@dataclass(frozen=True)
class CoinTunnel:
    """Beta-Bernoulli: each sequence draws a coin bias p ~ Uniform(0, 1) and shows K - 1 flips
    after a start token; at position t the model predicts flip t + 1 from the t flips seen.
    Exact posterior predictive (Laplace's rule): p(heads) = (heads + 1) / (t + 2)."""

    name: ClassVar[str] = "coin"

    K: int = 8

    def __post_init__(self) -> None:
        check_field_types(self)
        self.check_horizon(self.K, name="K")

    def check_horizon(self, horizon: int, *, name: str = "horizon") -> None:
        if horizon < 1:
            raise ConfigError(f"{name}={horizon} is out of range: need at least 1 flip")

    def describe(self) -> str:
        return "uniform bias"

    def label(self) -> str:
        return f"coin (K = {self.K})"

    @property
    def vocab_size(self) -> int:
        return 3

    @property
    def num_classes(self) -> int:
        return 2

    @property
    def horizon(self) -> int:
        return self.K

    def seq_len(self, horizon: int | None = None) -> int:
        return self.K if horizon is None else horizon

    def prior_predictive(self, n_positions: int) -> Tensor:
        return torch.full((n_positions, 2), 0.5, dtype=torch.float64)

    def sample_bytes(self, batch_size: int, horizon: int | None = None) -> int:
        return batch_size * 8 * 5 * self.seq_len(horizon)

    def sample(self, batch_size: int, *, generator: torch.Generator, horizon: int | None = None) -> Episode:
        K = self.seq_len(horizon)
        bias = torch.rand(batch_size, 1, generator=generator, dtype=torch.float64)  # [B, 1]
        flips = (torch.rand(batch_size, K, generator=generator, dtype=torch.float64) < bias).long()  # [B, K]
        heads_seen = torch.cat([torch.zeros(batch_size, 1), flips[:, :-1].cumsum(1).double()], dim=1)  # [B, K]
        p_heads = (heads_seen + 1) / (torch.arange(K, dtype=torch.float64) + 2)  # [B, K]
        posterior = torch.stack([1 - p_heads, p_heads], dim=-1)  # [B, K, 2]
        tokens = torch.cat([torch.full((batch_size, 1), BOS), flips[:, :-1]], dim=1)  # [B, K]
        return Episode(tokens, torch.arange(K), flips, posterior, entropy_bits(posterior))


@pytest.fixture
def coin():
    register_tunnel(CoinTunnel)
    yield CoinTunnel
    unregister_tunnel("coin")


def test_the_toy_posterior_is_the_integral_over_the_bias(coin):
    # Oracle: p(next = heads | flips) = E[p | flips], integrated numerically over a grid of p.
    episode = make_tunnel("coin", {"K": 6}).sample(16, generator=torch.Generator().manual_seed(0))
    grid = torch.linspace(0, 1, 200_001, dtype=torch.float64)
    for b in range(4):
        for t in range(6):
            shown = episode.tokens[b, 1 : t + 1]
            h, n = int(shown.sum()), t
            likelihood = grid**h * (1 - grid) ** (n - h)
            expected = torch.trapezoid(grid * likelihood, grid) / torch.trapezoid(likelihood, grid)
            # the trapezoid rule on 2e5 intervals is exact to ~1e-10 for these polynomials
            assert math.isclose(episode.posterior[b, t, 1].item(), expected.item(), abs_tol=1e-8)


def test_registration_refuses_a_taken_name_or_a_class_that_breaks_the_contract(coin):
    with pytest.raises(ValueError, match="registered already"):
        register_tunnel(CoinTunnel)

    @dataclass(frozen=True)
    class NoSample:
        name: ClassVar[str] = "no_sample"

    with pytest.raises(ValueError, match="lacks .*sample"):
        register_tunnel(NoSample)
    with pytest.raises(ValueError, match="cannot be unregistered"):
        unregister_tunnel("hmm")
    assert "no_sample" not in TUNNELS


def test_unregistering_removes_the_name_and_an_unknown_name_is_no_error():
    register_tunnel(CoinTunnel)
    assert TUNNELS["coin"] is CoinTunnel
    unregister_tunnel("coin")
    assert "coin" not in TUNNELS and "hmm" in TUNNELS
    unregister_tunnel("coin")  # a clean-up that runs twice


def test_capabilities_each_built_in_tunnel_declares():
    assert capabilities_of(BijectionTunnel) == [
        "SymbolTokens", "HypothesisTokens", "AttentionCategories", "ClosedFormEntropy", "ValuePositions", "NextSymbolPredictive",
    ]
    assert capabilities_of(HMMTunnel) == ["SymbolTokens", "AttentionCategories", "Relabeling", "NextSymbolPredictive"]
    assert capabilities_of(CoinTunnel) == []
    # an absent capability: the tunnel's own reason where it gives one, else what it would define
    assert "hidden states are never shown" in lacks(HMMTunnel(), HypothesisTokens)
    reason = lacks(CoinTunnel(), SymbolTokens)
    assert reason.startswith("the coin tunnel does not declare SymbolTokens") and "symbol_tokens" in reason
    assert declares(HMMTunnel, Relabeling) and not declares(CoinTunnel, Relabeling)


def test_a_registered_tunnel_samples_trains_evaluates_and_analyzes(coin, tmp_path, capsys):
    assert main(["sample", "coin", "--set", "K=5", "--n", "2", "--seed", "3"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(lines) == 2 and lines[0]["tokens"][0] == BOS and len(lines[0]["posterior"]) == 5

    config = run_config_from_mapping(
        {
            "tunnel": {"name": "coin", "K": 8},
            "model": {"kind": "transformer", "n_layers": 2, "n_heads": 2, "d_model": 16, "d_mlp": 32},
            "train": {"steps": 60, "batch_size": 64, "lr": 3e-3, "eval_every": 0, "checkpoint_every": 0, "log_every": 20},
            "eval": {"n": 256, "batch_size": 128, "bootstrap": 20, "horizons": [8, 12]},
        }
    )
    run = tmp_path / "coin_run"
    result = train(config, run, progress=False)
    scores = evaluate_run(run)["horizons"]["8"]
    # Trained, it beats the context-free prior (0.5 / 0.5) on KL, and the oracle row is exact.
    assert scores["kl_bits"] < scores["prior"]["kl_bits"] and scores["oracle"]["kl_bits"] == pytest.approx(0.0, abs=1e-12)
    assert result.steps == 60

    assert main(["analyze", str(run)]) == 0
    captured = capsys.readouterr()
    written = json.loads(captured.out)
    skipped = {
        line.split(":")[0].removeprefix("[analyze] skipped "): line.split(": ", 1)[1]
        for line in captured.err.splitlines()
        if line.startswith("[analyze] skipped ")
    }
    assert set(written) | set(skipped) == set(ANALYSES)
    # the analyses that need task knowledge the toy tunnel does not declare skip, naming it
    assert "SymbolTokens" in skipped["key_orthogonality"]
    assert "AttentionCategories" in skipped["qk_sharpening"]
    assert "Relabeling" in skipped["relabeling"]
    assert {"layer_ablation", "head_ablation", "calibration", "length_generalization", "value_manifold"} <= set(written)
    manifold = json.loads((run / "analysis" / "value_manifold.json").read_text())
    assert "ValuePositions" in manifold["measures_skipped"]["ln_final_value_positions_max_pearson"]
    calibration = json.loads((run / "analysis" / "calibration.json").read_text())
    assert calibration["closed_form_bits"] is None


def test_a_tunnel_names_its_primitive_with_a_string_or_not_at_all():
    from windtunnel.tunnels.base import primitive_of

    assert primitive_of(HMMTunnel()) == "belief transport" and primitive_of(BijectionTunnel(V=4)) == "belief accumulation"
    assert primitive_of(object()) is None  # no attribute: no primitive, no error

    class Odd:
        primitive = 3

    assert primitive_of(Odd()) is None
