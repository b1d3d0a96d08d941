"""Scoring against the exact posterior, checked with predictors whose errors are known in closed form."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy import integrate, special, stats

from windtunnel.evaluation import EvalSet, evaluate, oracle_predictor, score, score_relabeling
from windtunnel.tunnels import BijectionTunnel, HMMTunnel


def test_metrics_by_hand():
    """Two sequences, two positions, C = 2: every number computed here with scipy."""
    posterior = torch.tensor([[[0.5, 0.5], [1.0, 0.0]], [[0.9, 0.1], [0.2, 0.8]]], dtype=torch.float64)
    model = torch.tensor([[[0.6, 0.4], [0.7, 0.3]], [[0.5, 0.5], [0.3, 0.7]]], dtype=torch.float64)

    class Fake:
        def __init__(self):
            self.posterior = posterior
            self.entropy_bits = torch.tensor(stats.entropy(posterior.numpy(), base=2, axis=-1))

    h_model = stats.entropy(model.numpy(), base=2, axis=-1)
    h_bayes = stats.entropy(posterior.numpy(), base=2, axis=-1)
    kl = stats.entropy(posterior.numpy(), model.numpy(), base=2, axis=-1)
    result = score([model], [Fake()], bootstrap=200)
    assert result["mae_bits"] == pytest.approx(np.abs(h_model - h_bayes).mean(), abs=1e-12)
    assert result["mae_aggregate_bits"] == pytest.approx(np.abs(h_model.mean(0) - h_bayes.mean(0)).mean(), abs=1e-12)
    assert result["kl_bits"] == pytest.approx(kl.mean(), abs=1e-12)
    assert result["curves"]["kl_bits"] == pytest.approx(kl.mean(0).tolist(), abs=1e-12)
    for name in ("mae_bits", "kl_bits"):
        low, high = result[f"{name}_ci"]
        assert low <= result[name] <= high


def test_oracle_scores_zero_and_prior_scores_its_closed_form():
    tunnel = BijectionTunnel(V=8, L=6)
    eval_set = EvalSet.draw(tunnel, horizon=6, n=300, batch_size=128, seed=3)
    result = evaluate(oracle_predictor, eval_set, tunnel=tunnel)
    assert result["mae_bits"] < 1e-12 and result["kl_bits"] < 1e-12 and result["oracle"]["kl_bits"] < 1e-12
    gap = np.mean([math.log2(8) - math.log2(8 - k) for k in range(6)])  # uniform over 8 vs over the unused outputs
    assert result["prior"]["mae_bits"] == pytest.approx(gap, abs=1e-12)


def test_eval_sets_are_fixed_by_their_seed():
    tunnel = HMMTunnel(K=5)
    a = EvalSet.draw(tunnel, horizon=5, n=100, batch_size=30, seed=4)
    b = EvalSet.draw(tunnel, horizon=5, n=100, batch_size=30, seed=4)
    assert [e.batch_size for e in a.episodes] == [30, 30, 30, 10]
    assert all(torch.equal(x.tokens, y.tokens) for x, y in zip(a.episodes, b.episodes))
    other = EvalSet.draw(tunnel, horizon=6, n=100, batch_size=30, seed=4)
    assert not torch.equal(a.episodes[0].tokens, other.episodes[0].tokens[:, :55])


def test_relabeling_changes_nothing_for_a_filter_and_exposes_a_label_reader():
    tunnel = HMMTunnel(K=8)
    eval_set = EvalSet.draw(tunnel, horizon=8, n=200, batch_size=100, seed=5)
    exact = score_relabeling(oracle_predictor, eval_set, tunnel, seed=5, bootstrap=100)
    assert abs(exact["delta_mae_bits"]) < 1e-12 and exact["mae_bits_before"] < 1e-12

    def state_zero_reader(episode):
        """Predicts the normalized emission row of state 0, read from the header: a label-bound guess."""
        _, emission = tunnel.decode_header(episode.tokens)
        row = emission[:, 0, :5] / emission[:, 0, :5].sum(-1, keepdim=True)  # S = M = 5
        return row[:, None, :].expand(episode.batch_size, 8, 5)

    result = score_relabeling(state_zero_reader, eval_set, tunnel, seed=5, bootstrap=100)
    # Recompute "after" independently: the same permutations, the label-0 row of each permuted HMM.
    generator = torch.Generator().manual_seed(5 + 7)
    after = []
    for episode in eval_set.episodes:
        sigma = torch.rand(episode.batch_size, 5, generator=generator).argsort(dim=1)
        row = episode.emission[torch.arange(episode.batch_size), sigma[:, 0]]  # E'[0] = E[sigma[0]]
        h = stats.entropy(row.numpy(), base=2, axis=-1)
        after += list(np.abs(h[:, None] - episode.entropy_bits.numpy()).mean(1))
    assert result["mae_bits_after"] == pytest.approx(np.mean(after), abs=1e-12)
    # The mean moves little (a random row is as good as row 0 on average), each sequence does.
    moved = np.abs(np.array(result["per_sequence_after"]) - np.array(result["per_sequence_before"]))
    assert moved.mean() > 0.05 and len(moved) == 200


def test_delta_kl_sees_a_predictor_bound_to_state_labels_that_delta_mae_cannot():
    """A predictor that gives each sequence the posterior of its *original* HMM whatever the
    header says: exact before, bound to the old state labels after. Entropy cannot tell
    (ΔMAE = 0); KL compares state by state: ΔKL = mean KL(permuted posterior || original)."""
    tunnel = HMMTunnel(K=6, floor=0.05)  # every posterior entry > 0, so every KL here is finite
    eval_set = EvalSet.draw(tunnel, horizon=6, n=120, batch_size=60, seed=3)
    originals = {e.observations.numpy().tobytes(): e.posterior for e in eval_set.episodes}

    def stale(episode):  # relabeling keeps the observations, so they find the original posterior
        return originals[episode.observations.numpy().tobytes()]

    result = score_relabeling(stale, eval_set, tunnel, seed=3, bootstrap=100)
    assert result["delta_mae_bits"] == pytest.approx(0.0, abs=1e-12)
    assert result["kl_bits_before"] == pytest.approx(0.0, abs=1e-12)
    generator = torch.Generator().manual_seed(3 + 7)  # score_relabeling's permutations, redrawn
    kl = []
    for episode in eval_set.episodes:
        sigma = torch.rand(episode.batch_size, 5, generator=generator).argsort(dim=1).numpy()
        p = episode.posterior.numpy()  # [B, K, S]
        permuted = np.take_along_axis(p, sigma[:, None, :].repeat(p.shape[1], 1), axis=2)  # p'[b, t, i] = p[b, t, sigma[i]]
        kl += list(stats.entropy(permuted, p, base=2, axis=-1).mean(1))
    assert result["delta_kl_bits"] == pytest.approx(np.mean(kl), rel=1e-9)
    assert result["delta_kl_bits"] > 0.1 and result["delta_kl_bits_ci"][0] > 0


# --- bootstrap intervals: coverage on distributions whose means are known -----------------------
#
# Every sequence has one position whose exact posterior is the point mass (1, 0), so H_Bayes = 0,
# and the predictor says (1 - e, e) with e drawn per sequence. Then, in bits,
#     |H_model - H_Bayes| = h2(e)  (binary entropy),   KL(posterior || model) = -log2(1 - e),
# and the true means over e are closed forms, checked again against scipy.integrate.quad.


def binary_entropy_bits(e):
    """h2(e) in bits with h2(0) = 0, from scipy's entr(x) = -x ln x (not windtunnel.metrics)."""
    return (special.entr(e) + special.entr(1.0 - e)) / math.log(2.0)


def mean_binary_entropy_uniform(a):
    """E[h2(e)] for e ~ Uniform(0, a), a <= 1/2, by hand: (1/a) * integral_0^a h2 in bits.

    With integral of -x ln x = -x^2 ln(x) / 2 + x^2 / 4, and the (1 - x) term by u = 1 - x.
    """
    b = 1.0 - a
    nats = (-a * a * math.log(a) / 2 + a * a / 4) + (0.25 - (-b * b * math.log(b) / 2 + b * b / 4))
    return nats / math.log(2.0) / a


def test_the_closed_forms_agree_with_quadrature():
    for a in (0.25, 0.5):
        by_quad = integrate.quad(binary_entropy_bits, 0.0, a, epsabs=0, epsrel=1e-12)[0] / a
        # quad asked for 1e-12 relative; 1e-10 leaves room for its error estimate being optimistic.
        assert mean_binary_entropy_uniform(a) == pytest.approx(by_quad, rel=1e-10)
    assert mean_binary_entropy_uniform(0.5) == pytest.approx(1 / (2 * math.log(2)), rel=1e-14)  # by symmetry of h2
    kl_by_quad = integrate.quad(lambda e: -math.log2(1 - e), 0.0, 0.5, epsabs=0, epsrel=1e-12)[0] / 0.5
    assert kl_by_quad == pytest.approx((1 - math.log(2)) / math.log(2), rel=1e-10)


def point_mass_episode(tokens):
    """What scoring reads, for sequences whose exact posterior is (1, 0) at their one position.

    ``tokens`` ``[B, 2]``: (row of the error tables, which table); the predictor reads them.
    """
    B = tokens.shape[0]
    posterior = torch.tensor([1.0, 0.0], dtype=torch.float64).expand(B, 1, 2)
    return SimpleNamespace(tokens=tokens, positions=torch.tensor([1]), posterior=posterior,
                           entropy_bits=torch.zeros(B, 1, dtype=torch.float64), batch_size=B)


def predict_error(e):
    """``[B]`` errors -> ``[B, 1, 2]`` predictions (1 - e, e)."""
    e = torch.as_tensor(e, dtype=torch.float64)
    return torch.stack([1 - e, e], dim=-1)[:, None, :]


REPEATS, N_SEQUENCES, RESAMPLES = 400, 200, 500


@pytest.fixture
def one_thread():
    """Thousands of small tensor ops: on a shared machine, handing each to a second thread costs ~10x the work."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def coverage_is_nominal(coverage, level, repeats=REPEATS):
    """Whether a coverage measured over ``repeats`` independent data sets is consistent with ``level``.

    Tolerance: 3 binomial standard errors of the measured proportion (a correct interval fails
    this ~0.3% of the time), plus 0.01 below the level for the percentile bootstrap's known
    slight under-coverage at N = 200 (plug-in variance with divisor N and normal rather than
    t quantiles: 95% -> ~94.9%; skewness and the 500 resamples add O(1/N) and O(1/R) more;
    measured here over 2000 repeats: 0.939-0.945). A 50% interval read as a 95% one is off
    by ~40 standard errors.
    """
    se = math.sqrt(level * (1 - level) / repeats)
    return level - 3 * se - 0.01 <= coverage <= level + 3 * se


def test_score_intervals_cover_the_true_means_at_their_level_and_a_50_percent_interval_is_caught(one_thread):
    truth = {"mae_bits": 1 / (2 * math.log(2)), "kl_bits": (1 - math.log(2)) / math.log(2)}
    truth["mae_aggregate_bits"] = truth["mae_bits"]  # one position and all errors positive: |mean| = mean
    rng = np.random.default_rng(0)
    hits = {level: dict.fromkeys(truth, 0) for level in (0.95, 0.5)}
    episode = point_mass_episode(torch.zeros(N_SEQUENCES, 2, dtype=torch.int64))
    for repeat in range(REPEATS):
        prediction = predict_error(rng.uniform(0.0, 0.5, N_SEQUENCES))
        for level, counts in hits.items():
            result = score([prediction], [episode], bootstrap=RESAMPLES, seed=repeat, level=level)
            for name, value in truth.items():
                low, high = result[f"{name}_ci"]
                counts[name] += low <= value <= high
    coverage = {level: {name: n / REPEATS for name, n in counts.items()} for level, counts in hits.items()}
    for name in truth:
        assert coverage_is_nominal(coverage[0.95][name], 0.95), coverage
        assert coverage_is_nominal(coverage[0.5][name], 0.5), coverage
        assert not coverage_is_nominal(coverage[0.5][name], 0.95), coverage  # the check has teeth


class TableTunnel:
    """A fake tunnel for score_relabeling: "relabeling" points every sequence at error table 1."""

    n_labels = 2

    def relabel(self, episode, permutation):
        tokens = episode.tokens.clone()
        tokens[:, 1] = 1
        return point_mass_episode(tokens)

    def prior_predictive(self, n_positions):
        return torch.full((n_positions, 2), 0.5, dtype=torch.float64)


def table_reader(tables):
    """Predicts (1 - e, e) with e = tables[table, row] read from the tokens: errors known per sequence."""
    tables = torch.as_tensor(np.asarray(tables), dtype=torch.float64)  # [2, N]
    return lambda episode: predict_error(tables[episode.tokens[:, 1], episode.tokens[:, 0]])


def table_eval_set(n, batch_size):
    rows = torch.arange(n)
    tokens = torch.stack([rows, torch.zeros_like(rows)], dim=1)  # every sequence starts on table 0
    return EvalSet(tuple(point_mass_episode(tokens[i : i + batch_size]) for i in range(0, n, batch_size)), horizon=1)


def test_relabeling_interval_covers_the_true_mean_change_at_its_level(one_thread):
    # Before: e ~ U(0, 1/4); after: an independent e ~ U(0, 1/2). ΔMAE = E h2(U(0, 1/2)) - E h2(U(0, 1/4)).
    truth = mean_binary_entropy_uniform(0.5) - mean_binary_entropy_uniform(0.25)
    rng = np.random.default_rng(1)
    eval_set, tunnel = table_eval_set(N_SEQUENCES, 128), TableTunnel()  # two batches: 128 + 72
    hits = {0.95: 0, 0.5: 0}
    for repeat in range(REPEATS):
        predictor = table_reader([rng.uniform(0.0, 0.25, N_SEQUENCES), rng.uniform(0.0, 0.5, N_SEQUENCES)])
        for level in hits:
            result = score_relabeling(predictor, eval_set, tunnel, seed=repeat, bootstrap=RESAMPLES, level=level)
            low, high = result["delta_mae_bits_ci"]
            hits[level] += low <= truth <= high
    # The uniform prior against a point mass: exactly 1 bit per sequence (up to float64 rounding of ln 2 / ln 2).
    assert result["mae_bits_prior"] == pytest.approx(1.0, abs=1e-15)
    coverage = {level: n / REPEATS for level, n in hits.items()}
    assert coverage_is_nominal(coverage[0.95], 0.95), coverage
    assert coverage_is_nominal(coverage[0.5], 0.5), coverage
    assert not coverage_is_nominal(coverage[0.5], 0.95), coverage


def test_delta_mae_is_positive_when_relabeling_hurts_and_negative_when_it_helps():
    n = 50
    wrong = np.linspace(0.05, 0.45, n)
    exact = np.zeros(n)  # (1, 0): the posterior itself, error exactly 0
    closed_form = binary_entropy_bits(wrong).mean()  # mean over sequences of h2(e) - h2(0)
    eval_set, tunnel = table_eval_set(n, 20), TableTunnel()
    hurt = score_relabeling(table_reader([exact, wrong]), eval_set, tunnel, seed=0, bootstrap=200)
    helped = score_relabeling(table_reader([wrong, exact]), eval_set, tunnel, seed=0, bootstrap=200)
    # Tolerance: float64 rounding of entropies < 1 bit averaged over 50 sequences.
    assert hurt["delta_mae_bits"] == pytest.approx(closed_form, abs=1e-12) and hurt["mae_bits_before"] == 0.0
    assert helped["delta_mae_bits"] == pytest.approx(-closed_form, abs=1e-12) and helped["mae_bits_after"] == 0.0
    # Every sequence moves the same way, so the whole interval lies on that side of 0.
    assert 0 < hurt["delta_mae_bits_ci"][0] <= hurt["delta_mae_bits_ci"][1]
    assert helped["delta_mae_bits_ci"][0] <= helped["delta_mae_bits_ci"][1] < 0


def entropy_bits_numpy(p):
    """Shannon entropy in bits over the last axis, 0 log 0 = 0: an oracle independent of the package."""
    return -np.where(p > 0, p * np.log2(np.where(p > 0, p, 1.0)), 0.0).sum(-1)


def test_relabeling_reports_the_prior_mae_in_closed_form():
    tunnel = HMMTunnel(K=8)  # uniform initial: the prior predictor is uniform at every position
    eval_set = EvalSet.draw(tunnel, horizon=8, n=200, batch_size=100, seed=6)
    result = score_relabeling(oracle_predictor, eval_set, tunnel, seed=6, bootstrap=50)
    h_bayes = entropy_bits_numpy(np.concatenate([e.posterior.numpy() for e in eval_set.episodes]))  # [N, K]
    # |log2 S - H_Bayes| = log2 S - H_Bayes: no distribution over S states has more entropy than uniform.
    closed_form = (math.log2(5) - h_bayes).mean()
    # Tolerance: float64 rounding of 5-term entropies of ~2 bits, averaged over 1600 values (~1e-15).
    assert result["mae_bits_prior"] == pytest.approx(closed_form, abs=1e-12)
    assert result["mae_bits_before"] < 1e-12 < result["mae_bits_prior"]


def test_relabeling_with_a_non_uniform_initial_permutes_it_with_the_states(one_thread):
    initial = (0.5, 0.2, 0.15, 0.1, 0.05)
    tunnel = HMMTunnel(K=8, initial=initial)
    eval_set = EvalSet.draw(tunnel, horizon=8, n=200, batch_size=100, seed=8)
    g = torch.Generator().manual_seed(8)
    for episode in eval_set.episodes:
        B = episode.batch_size
        sigma = torch.rand(B, 5, generator=g).argsort(dim=1)  # new state i is old state sigma[i]
        relabeled = tunnel.relabel(episode, sigma)
        rows = torch.arange(B)[:, None]
        assert torch.equal(relabeled.initial, episode.initial[rows, sigma])  # pi'[i] = pi[sigma[i]], exactly
        assert not torch.equal(relabeled.initial, episode.initial)  # the test would be vacuous otherwise
        # The first filtering step by hand, pi[s] E[s, o_1] normalized, in both labelings: the
        # initial really enters the posterior. Tolerance: a 5-term normalization in float64.
        o1 = episode.observations[:, 0]
        for e in (episode, relabeled):
            joint = e.initial * e.emission[rows[:, 0], :, o1]  # [B, S]
            torch.testing.assert_close(e.posterior[:, 0], joint / joint.sum(-1, keepdim=True), rtol=0, atol=1e-15)
        # posterior'[b, t, i] == posterior[b, t, sigma[i]]: the same filter with rows and columns
        # permuted; equal up to the order of float64 sums (values <= 1, 8 steps of 5 terms).
        expected = episode.posterior.gather(2, sigma[:, None, :].expand(B, 8, 5))
        torch.testing.assert_close(relabeled.posterior, expected, rtol=0, atol=1e-14)
        assert torch.equal(sigma.gather(1, relabeled.states), episode.states)  # the same path, new names
        assert torch.equal(relabeled.targets, relabeled.states)
    result = score_relabeling(oracle_predictor, eval_set, tunnel, seed=8, bootstrap=100)
    # The oracle's entropy is the very computation H_Bayes is, on the same tensor: exactly 0 both times.
    assert result["mae_bits_before"] == 0.0 and result["mae_bits_after"] == 0.0
    assert result["delta_mae_bits"] == 0.0 and result["delta_mae_bits_ci"] == [0.0, 0.0]
    # The prior predictor says pi at t = 1 and uniform afterwards (HMMTunnel.prior_predictive).
    h_bayes = entropy_bits_numpy(np.concatenate([e.posterior.numpy() for e in eval_set.episodes]))  # [N, 8]
    first = np.abs(entropy_bits_numpy(np.array(initial)) - h_bayes[:, :1])
    closed_form = np.concatenate([first, math.log2(5) - h_bayes[:, 1:]], axis=1).mean()
    assert result["mae_bits_prior"] == pytest.approx(closed_form, abs=1e-12)  # float64 rounding, as above
