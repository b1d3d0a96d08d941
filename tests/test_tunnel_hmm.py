"""HMM tunnel against independent oracles: path enumeration, hmmlearn, closed-form checks."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
import torch
from hmmlearn import hmm as hmmlearn_hmm
from scipy import stats

from windtunnel.config import ConfigError
from windtunnel.tunnels import HMMTunnel, decode_header, forward_filter
from windtunnel.tunnels.hmm import _sample_path, quantize_rows

# The filter normalizes at every step and enumeration sums at most 3^6 products of
# probabilities >= 0.05 grid steps apart; both stay within a few hundred ulps of 1.
FILTER_TOL = dict(rtol=0, atol=1e-12)


def enumerate_posterior(T: np.ndarray, E: np.ndarray, pi: np.ndarray, obs: list[int]) -> np.ndarray:
    """p(s_t | o_1..o_t) by summing the joint over every hidden path s_1..s_t (S^t of them)."""
    S = T.shape[0]
    joint = np.zeros(S)
    for path in itertools.product(range(S), repeat=len(obs)):
        p = pi[path[0]] * E[path[0], obs[0]]
        for t in range(1, len(obs)):
            p *= T[path[t - 1], path[t]] * E[path[t], obs[t]]
        joint[path[-1]] += p
    return joint / joint.sum()


@pytest.mark.parametrize(
    "params",
    [dict(S=2, M=3, K=6, grid=0.05), dict(S=3, M=2, K=6, grid=0.01), dict(S=3, M=3, K=5, initial=(0.6, 0.3, 0.1))],
)
def test_filter_equals_path_enumeration(params):
    tunnel = HMMTunnel(**params)
    episode = tunnel.sample(6, generator=torch.Generator().manual_seed(0))
    for b in range(episode.batch_size):
        T, E = episode.transition[b].numpy(), episode.emission[b].numpy()
        pi = np.asarray(params.get("initial", [1 / tunnel.S] * tunnel.S))
        obs = episode.observations[b].tolist()
        for t in range(tunnel.K):
            expected = enumerate_posterior(T, E, pi, obs[: t + 1])
            np.testing.assert_allclose(episode.posterior[b, t].numpy(), expected, **FILTER_TOL)


def test_log_likelihood_equals_hmmlearn_score():
    tunnel = HMMTunnel(S=4, M=6, K=30, concentration=0.7)
    episode = tunnel.sample(10, generator=torch.Generator().manual_seed(1))
    for b in range(10):
        model = hmmlearn_hmm.CategoricalHMM(n_components=4, n_features=6, init_params="", params="")
        model.startprob_ = episode.initial[b].numpy()
        model.transmat_ = episode.transition[b].numpy()
        model.emissionprob_ = episode.emission[b].numpy()
        with warnings.catch_warnings():  # quantized rows may hold zeros: log(0) warns in hmmlearn
            warnings.simplefilter("ignore", RuntimeWarning)
            score = model.score(episode.observations[b].numpy()[:, None])
        # Both sum 30 log-terms of O(1); agreement to 1e-9 nats leaves room for summation order.
        assert episode.log_likelihood[b].item() == pytest.approx(score, abs=1e-9)


def test_forward_filter_accepts_shared_initial():
    tunnel = HMMTunnel(S=3, M=3, K=4)
    episode = tunnel.sample(5, generator=torch.Generator().manual_seed(2))
    posterior, loglik = forward_filter(episode.transition, episode.emission, tunnel.initial_distribution(), episode.observations)
    assert torch.equal(posterior, episode.posterior) and torch.equal(loglik, episode.log_likelihood)


def test_header_decodes_to_exactly_the_matrices_used():
    tunnel = HMMTunnel(grid=0.02)
    episode = tunnel.sample(64, generator=torch.Generator().manual_seed(3))
    transition, emission = tunnel.decode_header(episode.tokens)
    assert torch.equal(transition, episode.transition) and torch.equal(emission, episode.emission)
    assert torch.equal(decode_header(episode.tokens, 5, 5)[0], episode.transition)
    # On the grid, rows summing to exactly 1 grid-wise: counts are integers summing to 1/grid = 50.
    counts = episode.tokens[:, : tunnel.header_len]
    assert counts.min() >= 0 and counts.max() <= 50
    assert torch.all(counts.view(64, 10, 5).sum(-1) == 50)
    # The posterior is the filter of the decoded HMM (what the model reads).
    posterior, _ = forward_filter(transition, emission, tunnel.initial_distribution(), episode.observations)
    assert torch.equal(posterior, episode.posterior)


def test_tokens_layout():
    tunnel = HMMTunnel(K=7)
    episode = tunnel.sample(4, generator=torch.Generator().manual_seed(4))
    assert tunnel.vocab_size == 106 and tunnel.num_classes == 5 and tunnel.header_len == 50
    assert episode.tokens.shape == (4, 57) and episode.positions.tolist() == list(range(50, 57))
    assert torch.equal(episode.tokens[:, 50:] - 101, episode.observations)
    assert torch.equal(episode.targets, episode.states)
    long = tunnel.sample(2, generator=torch.Generator().manual_seed(4), horizon=50)
    assert long.tokens.shape == (2, tunnel.seq_len(50)) == (2, 100) and long.posterior.shape == (2, 50, 5)


def test_quantize_rows_largest_remainder():
    probs = torch.distributions.Dirichlet(torch.full((7,), 0.5)).sample((2000,)).double()
    exact = probs * 100
    counts = quantize_rows(probs, 100)
    assert torch.all(counts.sum(-1) == 100)
    floor = exact.floor()
    up = counts - floor  # 1 where rounded up, 0 where rounded down: nothing else
    assert torch.all((up == 0) | (up == 1))
    # Largest remainder: every entry rounded up had a remainder at least that of every entry rounded down.
    remainder = exact - floor
    lowest_up = torch.where(up == 1, remainder, torch.inf).min(-1).values
    highest_down = torch.where(up == 0, remainder, -torch.inf).max(-1).values
    assert torch.all(lowest_up >= highest_down)


def test_relabeling_permutes_the_posterior():
    tunnel = HMMTunnel(K=12)
    g = torch.Generator().manual_seed(5)
    episode = tunnel.sample(32, generator=g)
    sigma = torch.rand(32, 5, generator=g).argsort(1)  # new state i is old state sigma[i]
    relabeled = tunnel.relabel(episode, sigma)
    expected = episode.posterior.gather(2, sigma[:, None, :].expand(32, 12, 5))
    # Same filter on permuted rows/columns: equal up to float64 summation order.
    torch.testing.assert_close(relabeled.posterior, expected, rtol=0, atol=1e-14)
    torch.testing.assert_close(relabeled.entropy_bits, episode.entropy_bits, rtol=0, atol=1e-13)
    torch.testing.assert_close(relabeled.log_likelihood, episode.log_likelihood, rtol=0, atol=1e-12)
    for b in range(32):
        s = sigma[b]
        assert torch.equal(relabeled.transition[b], episode.transition[b][s][:, s])
        assert torch.equal(relabeled.emission[b], episode.emission[b][s])
        assert torch.equal(s[relabeled.states[b]], episode.states[b])  # same hidden path, new names
    assert torch.equal(relabeled.observations, episode.observations)
    assert torch.equal(tunnel.decode_header(relabeled.tokens)[0], relabeled.transition)


@pytest.mark.parametrize("params", [dict(), dict(S=3, M=8, K=40, concentration=0.1), dict(S=1, M=2)])
def test_posteriors_normalized_and_entropy_matches_scipy(params):
    episode = HMMTunnel(**params).sample(64, generator=torch.Generator().manual_seed(6))
    post = episode.posterior.numpy()
    assert episode.posterior.dtype == torch.float64 and np.all(post >= 0)
    np.testing.assert_allclose(post.sum(-1), 1.0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(episode.entropy_bits.numpy(), stats.entropy(post, base=2, axis=-1), rtol=0, atol=1e-12)


def _assert_follows(draws: torch.Tensor, counts: torch.Tensor) -> None:
    """Draws of 0..k-1 match probabilities counts/100: zero-probability outcomes never occur,
    the rest pass a chi-square test at significance level 0.001."""
    observed = torch.bincount(draws, minlength=len(counts)).numpy()
    expected = counts.numpy() / 100 * observed.sum()
    possible = expected > 0
    assert observed[~possible].sum() == 0
    if possible.sum() > 1:
        assert stats.chisquare(observed[possible], expected[possible]).pvalue > 1e-3


def test_paths_follow_the_hmm():
    """Chi-square (significance 0.001, fixed seed) of sampled transitions and emissions of one HMM."""
    transition_counts = torch.tensor([[70, 20, 10], [0, 50, 50], [25, 25, 50]])
    emission_counts = torch.tensor([[100, 0], [30, 70], [55, 45]])
    B, K = 4000, 12
    states, obs = _sample_path(
        transition_counts.expand(B, 3, 3), emission_counts.expand(B, 3, 2), torch.tensor([0.2, 0.3, 0.5]).expand(B, 3), K, 100,
        torch.Generator().manual_seed(7),
    )
    for i in range(3):
        _assert_follows(states[:, 1:][states[:, :-1] == i], transition_counts[i])
        _assert_follows(obs[states == i], emission_counts[i])
    first = torch.bincount(states[:, 0], minlength=3).numpy()
    assert stats.chisquare(first, np.array([0.2, 0.3, 0.5]) * B).pvalue > 1e-3


def test_same_seed_same_batch_bit_for_bit():
    tunnel = HMMTunnel(concentration=0.5)
    a = tunnel.sample(40, generator=torch.Generator().manual_seed(8))
    b = tunnel.sample(40, generator=torch.Generator().manual_seed(8))
    c = tunnel.sample(40, generator=torch.Generator().manual_seed(9))
    for name in ("tokens", "targets", "posterior", "entropy_bits", "transition", "emission", "log_likelihood"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert not torch.equal(a.tokens, c.tokens)


@pytest.mark.parametrize(
    "params, name",
    [
        (dict(S=0), "S=0"),
        (dict(M=0), "M=0"),
        (dict(K=0), "K=0"),
        (dict(concentration=0.0), "concentration=0.0"),
        (dict(concentration=-1), "concentration=-1"),
        (dict(grid=0.3), "grid=0.3"),  # 1/grid is not an integer
        (dict(grid=0.5), "grid=0.5"),  # too coarse for rows of 5 entries
        (dict(grid=0.0), "grid=0.0"),
        (dict(initial=(0.5, 0.5)), "initial=[0.5, 0.5]"),
        (dict(S=2, initial=(0.7, 0.7)), "initial=[0.7, 0.7]"),
        (dict(K=2.5), "K=2.5"),
    ],
)
def test_bad_parameters_name_the_problem(params, name):
    with pytest.raises(ConfigError) as info:
        HMMTunnel(**params)
    message = str(info.value)
    assert name in message and "\n" not in message


def test_long_sequences_stay_normalized_and_finite():
    """K = 2000 runs the rescaled recursion hundreds of times; compare with a plain
    step-normalized forward pass in numpy (the textbook form, independent of ours)."""
    tunnel = HMMTunnel(K=2000, concentration=0.3)
    episode = tunnel.sample(3, generator=torch.Generator().manual_seed(10))
    for b in range(3):
        T, E = episode.transition[b].numpy(), episode.emission[b].numpy()
        alpha, loglik = np.full(5, 0.2), 0.0
        for t, o in enumerate(episode.observations[b].tolist()):
            joint = (alpha @ T if t else alpha) * E[:, o]
            loglik += np.log(joint.sum())
            alpha = joint / joint.sum()
            if t % 97 == 0 or t == 1999:
                # Relative error grows ~linearly with t in both recursions; 1e-9 is ample at t < 2000.
                np.testing.assert_allclose(episode.posterior[b, t].numpy(), alpha, rtol=0, atol=1e-9)
        assert episode.log_likelihood[b].item() == pytest.approx(loglik, rel=1e-10)
