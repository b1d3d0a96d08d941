"""HMM tunnel against independent oracles: path enumeration, hmmlearn, closed-form checks."""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from hmmlearn import hmm as hmmlearn_hmm
from scipy import stats

from windtunnel.config import ConfigError
from windtunnel.tunnels import HMMTunnel, decode_header, forward_filter
from windtunnel.tunnels.hmm import _sample_path, quantize_rows, round_rows_with_floor

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
    [
        dict(S=2, M=3, K=6, grid=0.05),
        dict(S=3, M=2, K=6, grid=0.01),
        dict(S=3, M=3, K=5, initial=(0.6, 0.3, 0.1)),
        dict(S=3, M=2, K=6, grid=0.01, floor=0.05),  # the paper's generator
        dict(S=2, M=3, K=6, grid=0.05, floor=0.07),  # not a multiple of the grid: at least 2 steps of 0.05
        dict(S=3, M=3, K=5, grid=0.01, floor=0.035, initial=(0.6, 0.3, 0.1)),  # at least 4 steps of 0.01
    ],
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


def test_round_rows_with_floor_by_hand():
    # Rounded 10, 6, 3, 1; raised to the minimum 2: 21 units, one over; taken from the largest.
    probs = torch.tensor([[0.50, 0.30, 0.15, 0.05]], dtype=torch.float64)
    assert round_rows_with_floor(probs, 20, 2).tolist() == [[9, 6, 3, 2]]
    # Rounded 97, 1, 1, 1 -> 97, 5, 5, 5 = 112: only the first entry is above the minimum, so
    # each pass over the descending order takes its one unit from it, twelve times.
    lopsided = torch.tensor([[0.97, 0.01, 0.01, 0.01]], dtype=torch.float64)
    assert round_rows_with_floor(lopsided, 100, 5).tolist() == [[85, 5, 5, 5]]
    # 2.5 rounds half to even, to 2: 8 units, two short; all tie, so the first two by position get one.
    even = torch.full((1, 4), 0.25, dtype=torch.float64)
    assert round_rows_with_floor(even, 10, 1).tolist() == [[3, 3, 2, 2]]
    # 1.4, 1.4, 7.2 round to 1, 1, 7 = 9, one short: the smallest count, first by position, gets it.
    short = torch.tensor([[0.14, 0.14, 0.72]], dtype=torch.float64)
    assert round_rows_with_floor(short, 10, 1).tolist() == [[2, 1, 7]]
    # levels == k * minimum: every entry is exactly the minimum.
    assert round_rows_with_floor(probs, 20, 5).tolist() == [[5, 5, 5, 5]]
    with pytest.raises(ValueError, match="minimum=6"):
        round_rows_with_floor(probs, 20, 6)


def the_authors_rounding(p: np.ndarray, levels: int, minimum: int) -> np.ndarray:
    """The authors' rule for one row, written as they describe it: round to units, raise
    to the minimum, then walk a fixed order (ascending to add, descending to take, fixed
    before any fix, ties by position) one unit per visited entry, cycling, skipping
    entries at the minimum when taking."""
    units = np.maximum(np.rint(p * levels).astype(np.int64), minimum)
    diff = levels - int(units.sum())
    order = np.argsort(units, kind="stable") if diff > 0 else np.argsort(-units, kind="stable")
    i = 0
    while diff != 0:
        j = order[i % len(units)]
        if diff > 0:
            units[j] += 1
            diff -= 1
        elif units[j] > minimum:
            units[j] -= 1
            diff += 1
        i += 1
    return units


def test_round_rows_with_floor_is_the_authors_rule_on_random_rows():
    probs = torch.distributions.Dirichlet(torch.full((6,), 0.7)).sample((3000,)).double().clamp_min(0.05)
    probs = probs / probs.sum(-1, keepdim=True)
    ours = round_rows_with_floor(probs, 100, 5).numpy()
    theirs = np.stack([the_authors_rounding(row, 100, 5) for row in probs.numpy()])
    np.testing.assert_array_equal(ours, theirs)
    assert (ours.sum(-1) == 100).all() and ours.min() == 5


@pytest.mark.parametrize(
    "params, steps",
    [
        (dict(grid=0.01, floor=0.05), 5),  # the paper's generator
        (dict(grid=0.05, floor=0.05), 1),
        (dict(grid=0.01, floor=0.035), 4),  # not a multiple of the grid: rounded up
        (dict(grid=0.05, floor=0.07), 2),
        (dict(S=3, M=4, grid=0.05, floor=0.24), 5),  # 4 x 5 = 20: every emission entry is exactly 5
        (dict(grid=0.05, floor=0.19), 4),  # 5 x 4 = 20: the floor leaves nothing to draw (N == k*m)
        (dict(grid=0.01, floor=0.07), 7),  # 0.07 * 100 = 7.000000000000001 in float64: still 7 steps, not 8
        (dict(grid=0.01, floor=0.14), 14),  # 0.14 * 100 = 14.000000000000002 in float64
        (dict(grid=0.01, floor=0.051), 6),  # 5.1 steps: rounded up, not to the nearest
        (dict(grid=0.01, floor=0.05 * (1 + 1e-8)), 6),  # truly above 5 steps (by 10x the 1e-9 read): not a rounding error
    ],
)
def test_floor_bounds_every_header_entry(params, steps):
    tunnel = HMMTunnel(K=8, **params)
    assert tunnel.floor_steps == steps
    N, S, M = tunnel.levels, tunnel.S, tunnel.M
    episode = tunnel.sample(256, generator=torch.Generator().manual_seed(11))
    counts = episode.tokens[:, : tunnel.header_len]
    transition_counts, emission_counts = counts[:, : S * S].view(-1, S, S), counts[:, S * S :].view(-1, S, M)
    for rows in (transition_counts, emission_counts):
        assert torch.all(rows.sum(-1) == N)
        # A Dirichlet(1) row of up to 5 entries has one under the floor often: 256*S rows reach it.
        assert rows.min() == steps
    assert episode.transition.min() >= tunnel.floor and episode.emission.min() >= tunnel.floor
    if M * steps == N:
        assert torch.all(emission_counts == steps)
    transition, emission = tunnel.decode_header(episode.tokens)
    assert torch.equal(transition, episode.transition) and torch.equal(emission, episode.emission)
    posterior, _ = forward_filter(transition, emission, tunnel.initial_distribution(), episode.observations)
    assert torch.equal(posterior, episode.posterior)


def test_the_floors_step_count_is_the_fewest_grid_steps_at_or_above_the_floor():
    """The definition checked by brute force: the smallest m in 0..N with m / N >= floor, in
    float64 (m / N and the floor are each the double nearest their decimal, so the comparison
    is exact wherever they differ), for every floor of three decimals the tunnel accepts."""
    for grid in (0.01, 0.05, 0.02):
        N = round(1 / grid)
        for thousandths in range(0, 200):
            floor = thousandths / 1000
            fewest = next(m for m in range(N + 1) if m / N >= floor)
            if 5 * fewest > N:  # five entries per row (S = M = 5) cannot all take that many steps
                continue
            assert HMMTunnel(K=4, grid=grid, floor=floor).floor_steps == fewest, (grid, floor)


def test_zero_floor_is_the_floorless_tunnel_bit_for_bit():
    for params in (dict(), dict(S=3, M=2, K=6, concentration=0.5)):
        a = HMMTunnel(**params).sample(64, generator=torch.Generator().manual_seed(12))
        b = HMMTunnel(**params, floor=0.0).sample(64, generator=torch.Generator().manual_seed(12))
        for name in ("tokens", "targets", "posterior", "entropy_bits", "transition", "emission", "log_likelihood"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
    # Recorded from the tunnel before `floor` existed: the same draws and the same arithmetic.
    episode = HMMTunnel(S=3, M=2, K=6).sample(2, generator=torch.Generator().manual_seed(0))
    assert episode.tokens.tolist() == [
        [66, 23, 11, 49, 20, 31, 13, 29, 58, 42, 58, 17, 83, 14, 86, 102, 102, 101, 102, 102, 102],
        [30, 53, 17, 21, 47, 32, 44, 39, 17, 24, 76, 44, 56, 84, 16, 101, 101, 101, 102, 102, 101],
    ]


def test_transition_concentration_shapes_the_rows_of_T_alone():
    """Every entry of a symmetric Dirichlet(a) row over k entries is Beta(a, (k - 1) a): mean
    1/k and variance (k - 1) / (k^2 (k a + 1)). On a 0.001 grid the rounding moves each entry
    by at most 0.0005, far inside the sampling error checked here."""
    S, M, n = 4, 6, 5000
    episode = HMMTunnel(S=S, M=M, K=1, grid=0.001, concentration=2.0, transition_concentration=0.1).sample(
        n, generator=torch.Generator().manual_seed(3)
    )
    for matrix, k, a in ((episode.transition, S, 0.1), (episode.emission, M, 2.0)):
        entries = matrix.reshape(-1).numpy()
        variance = (k - 1) / (k**2 * (k * a + 1))
        # the sample variance of N entries has a standard error of about var * sqrt(2 / N) for
        # these light tails; rows share a sum, so allow 6x that (the two concentrations give
        # variances 2.5x (T) and 14x (E) apart, so swapping them fails by far)
        assert abs(entries.var() - variance) < 6 * variance * math.sqrt(2 / (n * S)), (k, a)
        assert abs(entries.mean() - 1 / k) < 1e-12  # rows sum to exactly 1 on the grid


def test_transition_concentration_equal_to_concentration_is_the_default_tunnel_bit_for_bit():
    a = HMMTunnel(concentration=0.7).sample(64, generator=torch.Generator().manual_seed(4))
    b = HMMTunnel(concentration=0.7, transition_concentration=0.7).sample(64, generator=torch.Generator().manual_seed(4))
    for name in ("tokens", "targets", "posterior", "transition", "emission"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


def test_stickiness_mixes_the_identity_into_T():
    """Row i of T is (1 - rho) Dirichlet(a) + rho e_i: its diagonal has mean rho + (1 - rho) / S
    and never falls below rho, off-diagonal entries have mean (1 - rho) / S, E is untouched.
    On a 0.001 grid rounding moves an entry by at most 0.0005 (the largest-remainder rule
    changes each entry by less than one step)."""
    S, M, n, rho = 4, 3, 4000, 0.6
    episode = HMMTunnel(S=S, M=M, K=1, grid=0.001, stickiness=rho).sample(n, generator=torch.Generator().manual_seed(6))
    diagonal = episode.transition.diagonal(dim1=1, dim2=2).reshape(-1)
    off = episode.transition[:, ~torch.eye(S, dtype=torch.bool)].reshape(-1)
    # the standard error of a mean of N Beta(1, 3) entries scaled by 0.4 is 0.4 * 0.19 / sqrt(N) < 0.002
    assert abs(diagonal.mean().item() - (rho + (1 - rho) / S)) < 0.01
    assert abs(off.mean().item() - (1 - rho) / S) < 0.01
    assert diagonal.min().item() >= rho - 0.0005
    assert abs(episode.emission.reshape(-1).var().item() - (M - 1) / (M**2 * (M + 1))) < 0.01  # Dirichlet(1) rows
    posterior, _ = forward_filter(episode.transition, episode.emission, HMMTunnel(S=S, M=M).initial_distribution(), episode.observations)
    assert torch.equal(posterior, episode.posterior)  # the posterior is that of the sticky T the header holds


def paper_rows(rng: np.random.Generator, n_rows: int, k: int) -> np.ndarray:
    """The authors' generator: Dirichlet(1), max(p, 0.05), renormalize, then their rounding
    to cents with a 5-cent minimum."""
    p = rng.dirichlet(np.ones(k), size=n_rows)
    p = np.maximum(p, 0.05)
    p /= p.sum(1, keepdims=True)
    return np.stack([the_authors_rounding(row, 100, 5) for row in p]) / 100


def paper_uniform_kl(rng: np.random.Generator, n: int, S: int, M: int, K: int) -> np.ndarray:
    """``[n]``: per sequence, the mean over positions of log2(S) - H(p(s_t | o_1..o_t)) under
    the authors' generator, with a numpy path sampler and a step-normalized forward filter."""
    T = paper_rows(rng, n * S, S).reshape(n, S, S)
    E = paper_rows(rng, n * S, M).reshape(n, S, M)
    seq = np.arange(n)
    state = rng.integers(S, size=n)
    belief = np.full((n, S), 1 / S)
    kl = np.zeros((n, K))
    for t in range(K):
        if t:  # inverse CDF; min() guards a last cumulative sum that rounds just under 1
            state = np.minimum((rng.random((n, 1)) >= T[seq, state].cumsum(1)).sum(1), S - 1)
            belief = np.einsum("bi,bij->bj", belief, T)
        obs = np.minimum((rng.random((n, 1)) >= E[seq, state].cumsum(1)).sum(1), M - 1)
        joint = belief * E[seq, :, obs]
        belief = joint / joint.sum(1, keepdims=True)
        kl[:, t] = math.log2(S) + (belief * np.log2(belief)).sum(1)  # every entry >= 0.05: no log(0)
    return kl.mean(1)


def test_floor_matches_the_authors_generator():
    """KL(posterior || uniform) of the context-free predictor, mean over K = 20 positions,
    against an independent numpy reimplementation of the authors' generator and the
    published 0.414 bits.

    Standard errors are over sequences (positions within a sequence are correlated, so the
    per-sequence mean is the independent unit): measured 0.0020 bits for each side at n =
    4000 (0.0028 for their difference), 0.0026 for floor = 0.
    """
    n, S, K = 4000, 5, 20

    def ours(floor: float) -> np.ndarray:
        episode = HMMTunnel(S=S, M=S, K=K, grid=0.01, floor=floor).sample(n, generator=torch.Generator().manual_seed(13))
        return (math.log2(S) - episode.entropy_bits.numpy()).mean(1)

    def mean_and_se(x: np.ndarray) -> tuple[float, float]:
        return x.mean(), x.std(ddof=1) / math.sqrt(len(x))

    ours_kl, ours_se = mean_and_se(ours(0.05))
    paper_kl, paper_se = mean_and_se(paper_uniform_kl(np.random.default_rng(13), n, S, S, K))
    # The same distribution drawn two ways: within 4 standard errors of their difference.
    assert abs(ours_kl - paper_kl) <= 4 * math.hypot(ours_se, paper_se)
    # Published to 3 decimals: 4 standard errors plus half a unit in the last place.
    assert abs(paper_kl - 0.414) <= 4 * paper_se + 0.0005
    assert abs(ours_kl - 0.414) <= 4 * ours_se + 0.0005
    # Without the floor, near-zero entries make observations far more informative:
    # 0.517 +- 0.0005 at n = 100,000, about 30 standard errors of the difference above.
    floorless_kl, floorless_se = mean_and_se(ours(0.0))
    assert floorless_kl - ours_kl >= 0.08 and abs(floorless_kl - 0.517) <= 4 * floorless_se


def test_sample_cli_with_floor():
    def windtunnel(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "windtunnel", *args], capture_output=True, text=True, timeout=120, check=False)

    result = windtunnel("sample", "hmm", "--n", "1", "--seed", "0", "--set", "floor=0.05")
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    entries = [p for row in record["T"] + record["E"] for p in row]
    assert len(entries) == 50 and min(entries) >= 0.05
    bad = windtunnel("sample", "hmm", "--n", "1", "--seed", "0", "--set", "floor=0.5")
    assert bad.returncode == 2 and bad.stdout == ""
    assert len(bad.stderr.strip().splitlines()) == 1 and "floor=0.5" in bad.stderr and "Traceback" not in bad.stderr


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
        (dict(floor=-0.01), "floor=-0.01"),
        (dict(floor=math.nan), "floor=nan"),
        (dict(floor=math.inf), "floor=inf"),
        (dict(floor=0.2), "floor=0.2"),  # 1/max(S, M): five entries cannot all exceed it
        (dict(S=2, M=3, floor=0.34), "floor=0.34"),
        (dict(grid=0.125, floor=0.15), "floor=0.15"),  # < 1/5 but 5 x 2 = 10 steps > 8 on the grid
        (dict(floor="0.05"), "floor='0.05'"),
        (dict(transition_concentration=0.0), "transition_concentration=0.0"),
        (dict(stickiness=1.0), "stickiness=1.0"),
        (dict(stickiness=-0.1), "stickiness=-0.1"),
        (dict(stickiness=math.nan), "stickiness=nan"),
        (dict(transition_concentration=-0.5), "transition_concentration=-0.5"),
        (dict(transition_concentration=math.nan), "transition_concentration=nan"),
        (dict(transition_concentration=math.inf), "transition_concentration=inf"),
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


# --- what the analyses read off an HMM sequence, against loops over its layout -----------------


def test_attention_categories_are_the_header_blocks_and_the_observations_before_each_query():
    tunnel = HMMTunnel(S=3, M=2, K=5)  # S*S = 9 transition tokens, S*M = 6 emission tokens: the blocks differ in size
    episode = tunnel.sample(2, generator=torch.Generator().manual_seed(0))
    categories = tunnel.attention_categories(episode)
    T = episode.tokens.shape[1]
    assert T == 9 + 6 + 5
    for p, q in enumerate(episode.positions.tolist()):
        assert q >= 15  # every query is an observation
        expected = {
            "header_transition": [t < 9 for t in range(T)],
            "header_emission": [9 <= t < 15 for t in range(T)],
            "observations": [15 <= t < q for t in range(T)],
            "self": [t == q for t in range(T)],
        }
        for name, mask in expected.items():
            for b in range(2):
                assert categories[name][b, p].tolist() == mask, (name, q)
    assert set(categories) == set(tunnel.category_meanings)


def test_observation_symbols_are_the_tokens_after_the_header_and_a_record_reads_the_header_back():
    tunnel = HMMTunnel(S=3, M=4, K=6, grid=0.05)  # N = 20 grid steps per row
    episode = tunnel.sample(3, generator=torch.Generator().manual_seed(1))
    symbols, names = tunnel.symbol_tokens()
    assert symbols == [21, 22, 23, 24] and names == ["o=0", "o=1", "o=2", "o=3"]  # after the counts 0..20
    assert torch.equal(episode.tokens[:, tunnel.header_len :] - 21, episode.observations)
    for i in range(3):
        record = json.loads(json.dumps(episode.record(i)))
        counts = episode.tokens[i, : tunnel.header_len].tolist()
        # The header is counts of 1/20: rows of T then rows of E, each summing to 20.
        assert record["T"] == [[c / 20 for c in counts[3 * r : 3 * r + 3]] for r in range(3)]
        assert record["E"] == [[c / 20 for c in counts[9 + 4 * r : 9 + 4 * r + 4]] for r in range(3)]
        assert record["states"] == episode.states[i].tolist() and record["observations"] == episode.observations[i].tolist()
        assert record["tokens"] == episode.tokens[i].tolist() and record["positions"] == episode.positions.tolist()


def test_ties_are_broken_by_position_in_long_rows_and_any_leading_shape():
    # 40 entries of 2.5 units: each rounds (half to even) to 2; 80 units, 20 short; all tie, so
    # the first 20 by position get one. Rows this long are where an unstable sort would reorder ties.
    uniform = torch.full((2, 3, 40), 1 / 40, dtype=torch.float64)
    assert round_rows_with_floor(uniform, 100, 1).tolist() == [[[3] * 20 + [2] * 20] * 3] * 2
    # 40 entries of 1.5 units: each rounds to 2; 80 units, 20 over: the first 20 by position give one back.
    assert round_rows_with_floor(uniform, 60, 1).tolist() == [[[1] * 20 + [2] * 20] * 3] * 2
    # Largest remainders: 2.5 units each, floored to 2, 20 missing; equal remainders go by position too.
    assert quantize_rows(uniform, 100).tolist() == [[[3] * 20 + [2] * 20] * 3] * 2


def test_a_header_is_refused_when_short_negative_or_its_rows_disagree_and_each_sequence_has_its_own_grid():
    S, M = 2, 3
    good = torch.tensor([[3, 1, 2, 2, 1, 1, 2, 4, 0, 0], [15, 5, 10, 10, 10, 5, 5, 0, 20, 0]])  # grids of 4 and of 20 steps
    transition, emission = decode_header(good, S, M)
    assert transition.tolist() == [[[0.75, 0.25], [0.5, 0.5]], [[0.75, 0.25], [0.5, 0.5]]]
    assert emission.tolist() == [[[0.25, 0.25, 0.5], [1.0, 0.0, 0.0]], [[0.5, 0.25, 0.25], [0.0, 1.0, 0.0]]]
    with pytest.raises(ValueError, match=r"^not an HMM header: need 10 non-negative count tokens$"):
        decode_header(good[:, :9], S, M)
    negative = good.clone()
    negative[0, 0], negative[0, 1] = 5, -1  # the row still sums to 4
    with pytest.raises(ValueError, match=r"^not an HMM header: need 10 non-negative count tokens$"):
        decode_header(negative, S, M)
    for bad_entry in (1, 6):  # a transition row, then an emission row, off by one step
        bad = good.clone()
        bad[1, bad_entry] += 1
        with pytest.raises(ValueError, match=r"^not an HMM header: every row must sum to the same number of grid steps$"):
            decode_header(bad, S, M)
    tunnel = HMMTunnel(S=2, M=3, grid=0.25)
    with pytest.raises(ValueError, match=r"^not a header of this tunnel: rows must sum to 1/grid = 4 steps$"):
        tunnel.decode_header(good)  # the second sequence's grid is 20 steps
    assert torch.equal(tunnel.decode_header(good[:1])[0], transition[:1])


def test_the_sequence_length_is_the_header_and_the_observations():
    tunnel = HMMTunnel(S=3, M=4, K=7)
    assert tunnel.seq_len() == 9 + 12 + 7 and tunnel.seq_len(20) == 9 + 12 + 20
    assert tunnel.sample(2, generator=torch.Generator().manual_seed(0)).tokens.shape == (2, tunnel.seq_len())
