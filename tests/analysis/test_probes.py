"""Ridge probes on constructed features whose answers are known."""

from __future__ import annotations

import math

import pytest
import torch

from windtunnel.analysis.probes import (
    PROBABILITY_FLOOR,
    RidgeSolver,
    centered_log,
    fit_ridge,
    fit_ridge_validated,
    linear_probes,
    probe_layer,
    r2_score,
)
from windtunnel.evaluation import EvalSet
from windtunnel.metrics import kl_bits
from windtunnel.models import build_model
from windtunnel.tunnels import BijectionTunnel

TUNNEL = BijectionTunnel(V=6)


def bijection_targets(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``[n, P, C]`` exact posteriors and ``[n, P]`` entropies of fresh bijection sequences."""
    episode = EvalSet.draw(TUNNEL, horizon=TUNNEL.L, n=n, batch_size=n, seed=seed).episodes[0]
    return episode.posterior, episode.entropy_bits


def test_ridge_recovers_an_exact_affine_map():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2000, 8, generator=generator, dtype=torch.float64)
    weight = torch.randn(8, 3, generator=generator, dtype=torch.float64)
    y = x @ weight + torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    probe = fit_ridge(x[:1500], y[:1500], alpha=1e-6)
    # Noise-free targets: the only error is the ridge shrinkage, ~alpha relative; R² is 1 to ~1e-12.
    assert r2_score(probe.predict(x[1500:]), y[1500:]) == pytest.approx(1.0, abs=1e-9)
    assert torch.allclose(probe.weight, weight, atol=1e-5)
    # The eigendecomposed solver agrees with a direct solve of the normal equations.
    xc, yc = x - x.mean(0), y - y.mean(0)
    penalty = 0.3 * (xc.T @ xc).trace() / 8
    direct = torch.linalg.solve(xc.T @ xc + penalty * torch.eye(8, dtype=torch.float64), xc.T @ yc)
    assert torch.allclose(RidgeSolver(x).fit(y, alpha=0.3).weight, direct, atol=1e-10)


def test_ridge_on_pure_noise_explains_nothing():
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(4000, 8, generator=generator, dtype=torch.float64)
    y = torch.randn(4000, 2, generator=generator, dtype=torch.float64)  # independent of x
    probe = fit_ridge_validated(x[:3000].view(300, 10, 8), {"noise": y[:3000].view(300, 10, 2)})["noise"]
    # Held-out R² of a useless 8-feature fit on 3000 points: about -8/3000, with a spread of
    # ~2e-3 (sqrt(8 / 3000) / sqrt(1000) for the cross term): |R²| < 0.02 is many sigmas.
    assert abs(r2_score(probe.predict(x[3000:]), y[3000:])) < 0.02


def test_probes_of_features_that_encode_their_targets_linearly_are_exact():
    posterior, entropy = bijection_targets(200)
    targets = torch.cat([posterior, centered_log(posterior), entropy[..., None]], dim=-1)  # [n, P, 2C + 1]
    mixing = torch.randn(targets.shape[-1], 20, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    features = targets @ mixing  # full column rank: every target is an exact linear function of the features
    scores = probe_layer(features, posterior, entropy)
    # Noise-free: the only error is ridge shrinkage, ~alpha relative to the ratio of the
    # largest feature scale (log-probabilities, ~10) to the smallest (probabilities, ~0.1)
    # squared; validation picks alpha = 1e-8, which leaves R² within ~1e-7 of 1.
    for key in ("posterior_r2", "log_posterior_r2", "entropy_r2"):
        assert scores[key] == pytest.approx(1.0, abs=1e-6)
    # Clipping the probe's near-zero outputs to the floor and renormalizing costs at most
    # log2(1 + C * floor) bits: ~1e-5 here.
    assert 0 <= scores["posterior_kl_bits"] < math.log2(1 + 6 * PROBABILITY_FLOOR) + 1e-6
    # softmax of the exact centered log-posterior puts floor-sized mass on eliminated outputs:
    # again ~C * floor.
    assert scores["log_posterior_kl_bits"] < 1e-4
    assert scores["entropy_mae_bits"] < 1e-4  # the same shrinkage: ~1e-6 bits on entropies of ~2 bits


def test_probes_of_noise_features_do_no_better_than_the_mean():
    posterior, entropy = bijection_targets(400)
    features = torch.randn(400, posterior.shape[1], 12, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    scores = probe_layer(features, posterior, entropy)
    # 300 training sequences x 5 positions = 1500 points for 12 features: R² ~ -12/1500 ± 0.01.
    for key in ("posterior_r2", "log_posterior_r2", "entropy_r2"):
        assert abs(scores[key]) < 0.05
    constant = posterior[:300].flatten(0, 1).mean(0)  # the training mean, as a distribution
    assert scores["posterior_kl_bits"] == pytest.approx(kl_bits(posterior[300:], constant).mean().item(), abs=0.05)


def test_the_embeddings_know_the_entropy_but_not_the_posterior():
    """At the input layer the residual is embed(x_k) + pos(k). Without replacement the entropy
    is log2(V - k), a function of the position alone, so a linear probe reads it exactly
    (a 16-dim space holds the 6 input tokens and 5 positions). The posterior depends on
    which outputs were used, independent of x_k and k for a uniform random bijection: the
    best any function of the embedding can do is the mean, so R² ~ 0."""
    model = build_model(
        "transformer",
        {"n_layers": 2, "n_heads": 2, "d_model": 16, "d_mlp": 32},
        vocab_size=TUNNEL.vocab_size,
        num_classes=TUNNEL.num_classes,
        max_len=TUNNEL.seq_len(),
        generator=torch.Generator().manual_seed(0),
    )
    episodes = EvalSet.draw(TUNNEL, horizon=TUNNEL.L, n=400, batch_size=200, seed=0).episodes
    result = linear_probes([model], episodes)
    assert [row["name"] for row in result["layers"]] == ["input", "block 0", "block 1", "ln_final"]
    assert [row["layer"] for row in result["layers"]] == [-1, 0, 1, 2]
    embeddings = result["layers"][0]
    assert embeddings["entropy_r2"]["mean"] == pytest.approx(1.0, abs=1e-4)
    assert abs(embeddings["posterior_r2"]["mean"]) < 0.05  # 1500 points, 16 features: ~-0.01 ± 0.01
    assert embeddings["posterior_kl_bits"]["mean"] == pytest.approx(result["baseline"]["posterior_kl_bits"], abs=0.05)
    assert result["n_train_sequences"] == 300 and result["n_test_sequences"] == 100
    # An untrained model predicts ~uniform; its KL is KL(posterior || uniform) = log2 V - mean H.
    entropy = torch.cat([e.entropy_bits for e in episodes])[300:]  # the test sequences
    assert result["model_kl_bits"]["mean"] == pytest.approx(math.log2(6) - entropy.mean().item(), abs=0.05)
