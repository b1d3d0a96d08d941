"""The Kalman tunnel: its exact predictive against exact Gaussian conditioning of the joint
distribution (numpy, scipy) and against filterpy's Kalman filter; its draw against its own
statistics; the value read-in every model family gets; a training run and the analyses."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from filterpy.kalman import KalmanFilter
from scipy import linalg, stats

from windtunnel.cli import main
from windtunnel.config import ConfigError
from windtunnel.models import build_model
from windtunnel.tunnels import KalmanTunnel, make_tunnel
from windtunnel.tunnels.capabilities import value_dim_of
from windtunnel.tunnels.kalman import bucket_probabilities, kalman_predictive


def _sample(tunnel: KalmanTunnel, n: int, seed: int = 0):
    return tunnel.sample(n, generator=torch.Generator().manual_seed(seed))


def _joint_covariance(A: np.ndarray, c: np.ndarray, r: float, P: np.ndarray, L: int) -> np.ndarray:
    """Cov(y_i, y_j) of a stationary path: c A^(i-j) P c^T for i >= j, plus r on the diagonal."""
    cov = np.empty((L, L))
    power = np.eye(len(c))
    for lag in range(L):
        value = c @ power @ P @ c
        for i in range(lag, L):
            cov[i, i - lag] = cov[i - lag, i] = value
        power = A @ power
    return cov + r * np.eye(L)


def _buckets_by_scipy(mean: float, std: float, edges: np.ndarray) -> np.ndarray:
    cdf = stats.norm.cdf(np.concatenate([[-np.inf], edges, [np.inf]]), loc=mean, scale=std)
    return np.diff(cdf)


@pytest.mark.parametrize("params", [{"n": 1, "K": 3, "L": 10}, {"n": 3, "K": 4, "L": 12, "buckets": 9, "bound": 2.5}])
def test_the_posterior_is_exact_gaussian_conditioning_of_the_joint(params):
    tunnel = KalmanTunnel(**params)
    episode = _sample(tunnel, 3, seed=1)
    A, c, r, P = (t.numpy() for t in tunnel.bank)
    edges = tunnel.edges.numpy()
    L = tunnel.L
    for b in range(3):
        y = episode.observations[b].numpy()
        for t in range(L):  # predict y[t] from y[:t]
            log_marginal, components = [], []
            for k in range(tunnel.K):
                cov = _joint_covariance(A[k], c[k], r[k], P[k], t + 1)
                cross, block = cov[t, :t], cov[:t, :t]
                weights = np.linalg.solve(block, cross) if t else np.zeros(0)
                mean, var = weights @ y[:t], cov[t, t] - weights @ cross
                log_marginal.append(stats.multivariate_normal(np.zeros(t), block).logpdf(y[:t]) if t else 0.0)
                components.append(_buckets_by_scipy(mean, math.sqrt(var), edges))
            w = np.exp(np.array(log_marginal) - max(log_marginal))
            expected = (w / w.sum()) @ np.array(components)
            # float64 solves of a well-conditioned covariance (stationary, noise r >= 0.1 on the
            # diagonal) against a recursion of the same size: agreement to ~1e-12 is the rounding.
            np.testing.assert_allclose(episode.posterior[b, t].numpy(), expected, atol=1e-10)


def test_the_filter_matches_filterpy():
    tunnel = KalmanTunnel(n=2, K=3, L=20)
    episode = _sample(tunnel, 4, seed=2)
    mean, variance, log_weight = kalman_predictive(episode.observations, tunnel.bank)
    A, c, r, P = (t.numpy() for t in tunnel.bank)
    for b in range(4):
        log_likelihood = np.zeros(tunnel.K)
        for k in range(tunnel.K):
            kf = KalmanFilter(dim_x=2, dim_z=1)
            kf.F, kf.H, kf.Q, kf.R = A[k], c[k][None, :], np.eye(2), np.array([[r[k]]])
            kf.x, kf.P = np.zeros((2, 1)), P[k].copy()
            for t in range(tunnel.L):
                if t:
                    kf.predict()
                predicted = (kf.H @ kf.x).item()
                # filterpy's covariance update and ours differ in rounding only (both float64)
                assert mean[b, t, k].item() == pytest.approx(predicted, abs=1e-10)
                kf.update(np.array([[episode.observations[b, t].item()]]))
                assert variance[t, k].item() == pytest.approx(float(kf.S[0, 0]), rel=1e-10)
                log_likelihood[k] += np.asarray(kf.log_likelihood).item()
        # the weight before the last observation: the likelihood of all but it
        last = log_likelihood - stats.norm.logpdf(episode.observations[b, -1].item(), mean[b, -1].numpy(), np.sqrt(variance[-1].numpy()))
        expected = last - np.logaddexp.reduce(last)
        np.testing.assert_allclose(log_weight[b, -1].numpy(), expected, atol=1e-9)


def test_the_bank_is_stable_stationary_and_scaled_to_unit_observation_variance():
    tunnel = KalmanTunnel(n=3, K=5)
    A, c, r, P = tunnel.bank
    for k in range(5):
        assert np.abs(np.linalg.eigvals(A[k].numpy())).max() < 1
        # scipy's discrete Lyapunov solver is the oracle for P = A P A^T + I
        np.testing.assert_allclose(P[k].numpy(), linalg.solve_discrete_lyapunov(A[k].numpy(), np.eye(3)), rtol=1e-10, atol=1e-12)
        assert float(c[k] @ P[k] @ c[k] + r[k]) == pytest.approx(1.0, abs=1e-12)
    assert tunnel.bank.A.equal(KalmanTunnel(n=3, K=5).bank.A) and not tunnel.bank.A.equal(KalmanTunnel(n=3, K=5, bank_seed=1).bank.A)


def test_paths_have_their_systems_covariances():
    tunnel = KalmanTunnel(n=2, K=2, L=6)
    episode = _sample(tunnel, 40_000, seed=3)
    A, c, r, P = tunnel.bank
    for k in range(2):
        y = episode.observations[episode.system == k].numpy()
        n = len(y)
        assert n > 15_000  # systems are drawn uniformly
        # one pair (y_4, y_5) per sequence, independent across sequences: the sample variance's
        # standard error is about sqrt(2 / n); 5 of them is a 1-in-10^6 false alarm
        assert y[:, 4].var() == pytest.approx(1.0, abs=5 * math.sqrt(2 / n))
        lag1 = float(c[k] @ A[k] @ P[k] @ c[k])
        assert np.mean(y[:, 4] * y[:, 5]) == pytest.approx(lag1, abs=5 * math.sqrt(2 / n))


def test_the_targets_drawn_follow_the_predictive():
    tunnel = KalmanTunnel(n=2, K=4, L=16, buckets=12, bound=2.0)
    episode = _sample(tunnel, 4000, seed=4)
    hits = torch.nn.functional.one_hot(episode.targets, 12).double()  # [B, L, C]
    # E[1{target = j}] = E[posterior_j] when each target is drawn from the posterior; the
    # count's variance is at most the sum of p (1 - p) over the positions
    difference = (hits - episode.posterior).sum((0, 1))
    spread = (episode.posterior * (1 - episode.posterior)).sum((0, 1)).sqrt()
    assert (difference / spread).abs().max() < 5


def test_the_buckets_keep_their_precision_in_the_tails():
    edges = torch.linspace(-4.0, 4.0, 31, dtype=torch.float64)
    for mean in (-9.0, 0.3, 9.0):
        ours = bucket_probabilities(torch.tensor([mean], dtype=torch.float64), torch.ones(1, dtype=torch.float64), edges)[0]
        grid = np.concatenate([[-np.inf], edges.numpy(), [np.inf]])
        # scipy from whichever side is far from the mean: the tail's own relative precision
        low, high = grid[:-1], grid[1:]
        expected = np.where(low > mean, stats.norm.sf(low - mean) - stats.norm.sf(high - mean),
                            stats.norm.cdf(high - mean) - stats.norm.cdf(low - mean))
        # each tail to ~1e-14 relative; a difference of two loses the factor tail / bucket (< 1e4 here)
        np.testing.assert_allclose(ours.numpy(), expected, rtol=1e-9, atol=0)
        assert float(ours.sum()) == pytest.approx(1.0, abs=1e-14)


def test_the_first_prediction_is_the_prior_and_one_system_is_the_known_parameters():
    tunnel = KalmanTunnel(n=2, K=4, L=8)
    episode = _sample(tunnel, 16, seed=5)
    expected = _buckets_by_scipy(0.0, 1.0, tunnel.edges.numpy())  # every observation's marginal is N(0, 1)
    np.testing.assert_allclose(tunnel.prior_predictive(8).numpy(), np.tile(expected, (8, 1)), atol=1e-14)
    np.testing.assert_allclose(episode.posterior[:, 0].numpy(), np.tile(expected, (16, 1)), atol=1e-14)
    one = KalmanTunnel(n=2, K=1, L=8)
    single = _sample(one, 16, seed=5)
    torch.testing.assert_close(one.parameter_predictive(single), single.posterior, rtol=0, atol=1e-15)
    # with several systems, the oracle that knows the system is that system's filter alone
    known = tunnel.parameter_predictive(episode)
    A, c, r, P = (t.numpy() for t in tunnel.bank)
    b, k = 0, int(episode.system[0])
    y = episode.observations[0].numpy()
    cov = _joint_covariance(A[k], c[k], r[k], P[k], 8)
    weights = np.linalg.solve(cov[:7, :7], cov[7, :7])
    by_scipy = _buckets_by_scipy(weights @ y[:7], math.sqrt(cov[7, 7] - weights @ cov[7, :7]), tunnel.edges.numpy())
    np.testing.assert_allclose(known[b, 7].numpy(), by_scipy, atol=1e-10)


def test_the_observations_read_are_float32_and_shifted_one_position():
    tunnel = KalmanTunnel(L=10)
    episode = _sample(tunnel, 8)
    assert episode.value_inputs.shape == (8, 10, 1) and value_dim_of(tunnel) == 1
    assert torch.equal(episode.value_inputs[:, 1:, 0], episode.observations[:, :-1])
    assert torch.equal(episode.observations.float().double(), episode.observations)
    assert episode.tokens[:, 0].eq(0).all() and episode.tokens[:, 1:].eq(1).all()
    assert torch.equal(episode.targets, torch.bucketize(episode.observations, tunnel.edges))


@pytest.mark.parametrize(("params", "message"), [
    ({"n": 0}, "n=0 is out of range"),
    ({"K": 300}, "K=300 is out of range"),
    ({"buckets": 2}, "buckets=2 is out of range"),
    ({"bound": float("nan")}, "bound=nan is out of range"),
    ({"rho_min": 0.9, "rho_max": 0.5}, "rho_min=0.9, rho_max=0.5 are out of range"),
    ({"rho_max": 1.0}, "rho_max=1.0 are out of range"),
    ({"signal_min": 0.0}, "signal_min=0.0, signal_max=0.9 are out of range"),
    ({"L": 0}, "L=0 is out of range"),
])
def test_bad_parameters_are_one_line_naming_the_value(params, message):
    with pytest.raises(ConfigError, match=message):
        make_tunnel("kalman", params)


def test_windtunnel_sample_shows_the_values_and_a_bad_parameter_exits_2(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["sample", "kalman", "--n", "1", "--format", "table", "--set", "L=4"]) == 0
    out = capsys.readouterr().out
    assert "system " in out and " of the bank" in out and "  A = " in out and "value" in out
    assert main(["sample", "kalman", "--set", "rho_max=1.5"]) == 2
    assert "rho_max=1.5 are out of range" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("kind", ["transformer", "lstm", "mamba", "mlp"])
def test_every_family_reads_values_causally(kind):
    transformer = {"n_layers": 1, "d_model": 16, "n_heads": 2, "d_mlp": 32}
    sizes = {"lstm": {"n_layers": 1, "d_hidden": 16}, "mamba": {"n_layers": 1, "d_inner": 32}, "mlp": {"n_blocks": 1, "d_hidden": 32}}
    config = transformer if kind == "transformer" else {"d_model": 16, **sizes[kind]}
    model = build_model(kind, config, vocab_size=2, num_classes=5, max_len=6, value_dim=1,
                        generator=torch.Generator().manual_seed(0)).eval()
    tokens = torch.ones(2, 6, dtype=torch.long)
    values = torch.randn(2, 6, 1, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    later = values.clone()
    later[:, 4:] += 1.0
    with torch.no_grad():
        base, moved = model(tokens, values=values), model(tokens, values=later)
        at = model(tokens, values=values, at=torch.tensor([1, 5]))
    assert torch.equal(base[:, :4], moved[:, :4])  # a value changes nothing before its position
    assert not torch.allclose(base[:, 4:], moved[:, 4:])  # and is read at and after it
    torch.testing.assert_close(at, base[:, [1, 5]], rtol=1e-5, atol=1e-5)  # float32 forward, two orders of summation
    with pytest.raises(ValueError, match="values must be given exactly when"):
        model(tokens)


def test_a_model_trains_on_the_kalman_tunnel_and_the_analyses_that_apply_run(tmp_path):
    from windtunnel.analysis.runner import analyze
    from windtunnel.results import RESULT_TYPES
    from windtunnel.run_config import run_config_from_mapping
    from windtunnel.runs import evaluate_run
    from windtunnel.training.trainer import train

    config = run_config_from_mapping({
        "tunnel": {"name": "kalman", "n": 1, "K": 2, "L": 12, "buckets": 10, "bound": 2.0},
        "model": {"kind": "transformer", "n_layers": 2, "n_heads": 2, "d_model": 16, "d_mlp": 32},
        "train": {"steps": 150, "batch_size": 64, "lr": 3e-3, "eval_every": 0, "checkpoint_every": 0, "log_every": 50},
        "eval": {"n": 256, "batch_size": 128, "bootstrap": 20, "horizons": [12]},
    })
    train(config, tmp_path / "run", progress=False)
    scores = evaluate_run(tmp_path / "run")["horizons"]["12"]
    # 150 steps beat the N(0, 1) prior (which ignores the observations); the known-system oracle beats the posterior
    assert scores["kl_bits"] < scores["prior"]["kl_bits"] and scores["oracle"]["kl_bits"] == pytest.approx(0.0, abs=1e-12)
    assert scores["oracle"]["loss_gap_bits"] > 0
    # the one-observation floor of a model that mixes no positions lies between the prior and the posterior
    assert scores["oracle"]["kl_bits"] < scores["position_wise"]["kl_bits"] < scores["prior"]["kl_bits"]
    lines: list[str] = []
    written = analyze([tmp_path / "run"], say=lines.append)
    assert {"calibration", "layer_ablation"} <= set(written)
    skipped = {line.split(":")[0].removeprefix("skipped "): line for line in lines if line.startswith("skipped ")}
    assert "observations are values" in skipped["key_orthogonality"]
    for name, path in written.items():
        assert RESULT_TYPES[name].from_json(json.loads(path.read_text())).tunnel_label == "kalman (n = 1, K = 2, L = 12)"


def test_the_position_wise_floor_is_one_observation_conditioned_on_by_scipy():
    tunnel = KalmanTunnel(n=2, K=3, L=6)
    episode = _sample(tunnel, 5, seed=6)
    floor = tunnel.position_wise_predictive(episode)
    A, c, r, P = (t.numpy() for t in tunnel.bank)
    edges = tunnel.edges.numpy()
    np.testing.assert_allclose(floor[:, 0].numpy(), np.tile(_buckets_by_scipy(0.0, 1.0, edges), (5, 1)), atol=1e-14)
    for b in range(5):
        for t in range(1, 6):
            y = episode.observations[b, t - 1].item()  # what position t reads
            weights, components = [], []
            for k in range(3):
                cov = _joint_covariance(A[k], c[k], r[k], P[k], 2)  # (y_t, y_{t+1}) of a stationary path
                weights.append(stats.norm.pdf(y, 0.0, math.sqrt(cov[0, 0])))
                mean, var = cov[1, 0] / cov[0, 0] * y, cov[1, 1] - cov[1, 0] ** 2 / cov[0, 0]
                components.append(_buckets_by_scipy(mean, math.sqrt(var), edges))
            expected = np.array(weights) @ np.array(components) / sum(weights)
            np.testing.assert_allclose(floor[b, t].numpy(), expected, atol=1e-12)  # float64 rounding of a 2x2 solve


def test_a_model_that_reads_values_is_not_exported_to_transformer_lens():
    from windtunnel.export import ExportError, hooked_transformer_config

    model = build_model("transformer", {"n_layers": 1, "d_model": 16, "n_heads": 2, "d_mlp": 32},
                        vocab_size=2, num_classes=5, max_len=6, value_dim=1)
    with pytest.raises(ExportError, match="reads values beside its tokens"):
        hooked_transformer_config(model)
