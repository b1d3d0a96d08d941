"""Scoring against the exact posterior, checked with predictors whose errors are known in closed form."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy import integrate, special, stats

from windtunnel.evaluation import (
    EvalSet,
    bootstrap_weights,
    evaluate,
    model_predictor,
    oracle_predictor,
    percentile_interval,
    prior_predictor,
    score,
    score_relabeling,
)
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


# --- shapes that tell the metrics apart: more sequences than positions, errors of both signs -----


def _unequal_episode_and_model():
    """N = 3 sequences, P = 2 positions, C = 3: the model's entropy is above Bayes on some
    sequences and below on others, and on average above at one position and below at the
    other, so |mean over sequences| (the aggregate), the mean of |per-sequence error| and
    |grand mean| all differ, and N != P tells the axes apart."""
    posterior = np.array(
        [
            [[1.0, 0.0, 0.0], [0.5, 0.5, 0.0]],
            [[0.2, 0.3, 0.5], [0.9, 0.05, 0.05]],
            [[0.6, 0.2, 0.2], [1 / 3, 1 / 3, 1 / 3]],
        ]
    )
    model = np.array(
        [
            [[0.8, 0.1, 0.1], [0.9, 0.1, 0.0]],
            [[0.7, 0.2, 0.1], [0.98, 0.01, 0.01]],
            [[0.4, 0.3, 0.3], [0.8, 0.1, 0.1]],
        ]
    )
    episode = SimpleNamespace(posterior=torch.tensor(posterior), entropy_bits=torch.tensor(entropy_bits_numpy(posterior)))
    return episode, torch.tensor(model), posterior, model


def test_the_aggregate_and_the_per_sequence_error_are_told_apart_and_the_curves_are_per_position():
    episode, prediction, posterior, model = _unequal_episode_and_model()
    error = entropy_bits_numpy(model) - entropy_bits_numpy(posterior)  # [N = 3, P = 2]
    assert (error > 0).any() and (error < 0).any()  # both signs: the magnitudes are taken where they should be
    aggregate, per_sequence = np.abs(error.mean(0)).mean(), np.abs(error).mean()
    assert abs(aggregate - per_sequence) > 0.1  # this data can tell the two metrics apart
    assert abs(np.abs(error.mean(1)).mean() - aggregate) > 0.1  # and the two axes
    assert abs(abs(error.mean()) - aggregate) > 0.1  # and the magnitude per position from that of the grand mean
    kl = stats.entropy(posterior, model, base=2, axis=-1)  # [N, P]; the model is positive where the posterior is
    result = score([prediction], [episode])
    # Tolerance: float64 entropies of 3 terms, averaged over 6 values (rounding ~1e-15).
    assert result["n"] == 3
    assert result["mae_aggregate_bits"] == pytest.approx(aggregate, abs=1e-12)
    assert result["mae_bits"] == pytest.approx(per_sequence, abs=1e-12)
    assert result["kl_bits"] == pytest.approx(kl.mean(), abs=1e-12)
    curves = result["curves"]
    assert set(curves) == {"model_entropy_bits", "bayes_entropy_bits", "abs_error_bits", "kl_bits"}
    assert curves["model_entropy_bits"] == pytest.approx(entropy_bits_numpy(model).mean(0).tolist(), abs=1e-12)
    assert curves["bayes_entropy_bits"] == pytest.approx(entropy_bits_numpy(posterior).mean(0).tolist(), abs=1e-12)
    assert curves["abs_error_bits"] == pytest.approx(np.abs(error).mean(0).tolist(), abs=1e-12)
    assert curves["kl_bits"] == pytest.approx(kl.mean(0).tolist(), abs=1e-12)
    assert not any(key.endswith("_ci") for key in result)  # bootstrap = 0 by default: no intervals


def test_every_interval_is_the_percentile_interval_of_its_own_statistic_over_resampled_sequences():
    """The intervals recomputed in numpy from the resample weights: the aggregate's interval is
    |weighted mean over sequences| per position, then the mean over positions, which on this
    data differs from the per-sequence statistic in every resample."""
    episode, prediction, posterior, model = _unequal_episode_and_model()
    error = entropy_bits_numpy(model) - entropy_bits_numpy(posterior)
    kl = stats.entropy(posterior, model, base=2, axis=-1)
    result = score([prediction], [episode], bootstrap=400, seed=11, level=0.8)
    weights = bootstrap_weights(3, 400, torch.Generator().manual_seed(11)).numpy()  # [R, N]
    counts = weights * 3
    assert np.allclose(counts, np.round(counts)) and np.allclose(weights.sum(1), 1.0)  # multinomial resamples of 3
    statistics = {
        "mae_aggregate_bits": np.abs(weights @ error).mean(1),
        "mae_bits": weights @ np.abs(error).mean(1),
        "kl_bits": weights @ kl.mean(1),
    }
    for name, values in statistics.items():
        # np.quantile's default is the same linear interpolation; tolerance: float64 rounding of 6-term sums.
        assert result[f"{name}_ci"] == pytest.approx(np.quantile(values, [0.1, 0.9]).tolist(), abs=1e-12), name


def test_the_seed_fixes_the_resamples_and_defaults_to_0():
    rng = np.random.default_rng(0)
    posterior, model = rng.dirichlet(np.ones(3), size=(50, 4)), rng.dirichlet(np.ones(3), size=(50, 4))
    episode = SimpleNamespace(posterior=torch.tensor(posterior), entropy_bits=torch.tensor(entropy_bits_numpy(posterior)))
    prediction = torch.tensor(model)
    result = score([prediction], [episode], bootstrap=100, seed=11)
    assert result == score([prediction], [episode], bootstrap=100, seed=11)
    other = score([prediction], [episode], bootstrap=100, seed=12)
    assert all(result[f"{name}_ci"] != other[f"{name}_ci"] for name in ("mae_aggregate_bits", "mae_bits", "kl_bits"))
    assert score([prediction], [episode], bootstrap=100) == score([prediction], [episode], bootstrap=100, seed=0)


def test_bootstrap_weights_draw_each_sequence_with_probability_one_over_n():
    n, resamples = 4, 20_000
    weights = bootstrap_weights(n, resamples, torch.Generator().manual_seed(0)).numpy()
    # Each count is Binomial(n, 1/n): mean 1, variance 1 - 1/n; the mean over 80,000 counts has
    # standard error sqrt(0.75 / 80,000) ~ 0.003, so 0.02 is more than 6 standard errors.
    counts = weights * n
    assert abs(counts.mean() - 1.0) < 0.02 and abs(counts.var() - (1 - 1 / n)) < 0.03
    assert (counts[:, 0] == 0).mean() == pytest.approx((1 - 1 / n) ** n, abs=0.02)  # P(sequence 0 never drawn)
    assert np.array_equal(weights, bootstrap_weights(n, resamples, torch.Generator().manual_seed(0)).numpy())


def test_the_percentile_interval_is_numpys_quantile_and_needs_a_level_strictly_inside_0_1():
    values = torch.tensor(np.random.default_rng(3).normal(size=1001))
    # The default level is 95%; tolerance: float64 interpolation between two order statistics.
    assert percentile_interval(values) == pytest.approx(np.quantile(values.numpy(), [0.025, 0.975]).tolist(), abs=1e-12)
    assert percentile_interval(values, 0.5) == pytest.approx(np.quantile(values.numpy(), [0.25, 0.75]).tolist(), abs=1e-12)
    for level in (0.0, 1.0, -0.5, 1.5):
        with pytest.raises(ValueError, match=rf"^level={level} is not a probability strictly between 0 and 1$"):
            percentile_interval(values, level)


def test_an_eval_set_is_drawn_at_the_horizon_asked_for():
    tunnel = BijectionTunnel(V=8, L=8)
    eval_set = EvalSet.draw(tunnel, horizon=3, n=10, batch_size=4, seed=0)
    assert eval_set.horizon == 3
    assert [tuple(e.posterior.shape) for e in eval_set.episodes] == [(4, 3, 8), (4, 3, 8), (2, 3, 8)]


def test_an_eval_set_too_large_for_memory_is_refused_with_its_size_at_its_horizon(monkeypatch):
    """The oracle is the bytes the drawn set really holds: a draw that fits in them is allowed,
    one with less memory than the set holds at *its* horizon is refused (not at the tunnel's L)."""
    from windtunnel.config import ConfigError

    tunnel = BijectionTunnel(V=64, L=64)
    held = sum(
        v.nbytes for e in EvalSet.draw(tunnel, horizon=4, n=50, batch_size=50, seed=0).episodes for v in vars(e).values() if torch.is_tensor(v)
    )
    monkeypatch.setattr("windtunnel.memory.available_bytes", lambda: held)
    EvalSet.draw(tunnel, horizon=4, n=50, batch_size=50, seed=0)  # the estimate is a lower bound of what it holds
    monkeypatch.setattr("windtunnel.memory.available_bytes", lambda: int(0.8 * held))  # the estimate is >= 0.9 of it
    with pytest.raises(ConfigError, match=r"^a held-out set of 50 sequences at horizon 4 needs at least .* is available: lower --n or eval.n$"):
        EvalSet.draw(tunnel, horizon=4, n=50, batch_size=50, seed=0)


def test_evaluate_passes_its_bootstrap_and_seed_to_every_row_and_keeps_curves_for_the_model_only():
    tunnel = BijectionTunnel(V=6, L=6)
    eval_set = EvalSet.draw(tunnel, horizon=6, n=40, batch_size=20, seed=1)
    prior = prior_predictor(tunnel)
    result = evaluate(prior, eval_set, tunnel=tunnel, bootstrap=30, seed=5)
    own = score([prior(e) for e in eval_set.episodes], eval_set.episodes, bootstrap=30, seed=5)
    assert {k: v for k, v in result.items() if k not in ("oracle", "prior")} == own
    assert result["prior"] == {k: v for k, v in own.items() if k != "curves"}  # the same predictor, the same resamples
    # The oracle row: its errors are float64 rounding of entropies (< 1e-15 bits), in every resample too.
    assert "curves" not in result["oracle"] and max(map(abs, result["oracle"]["mae_bits_ci"])) < 1e-12
    assert evaluate(prior, eval_set, references=False) == score([prior(e) for e in eval_set.episodes], eval_set.episodes)
    assert evaluate(prior, eval_set, tunnel=tunnel, bootstrap=30) == evaluate(prior, eval_set, tunnel=tunnel, bootstrap=30, seed=0)
    with pytest.raises(ValueError, match=r"^evaluate\(references=True\) needs the tunnel for the prior row$"):
        evaluate(prior, eval_set)


def test_relabeling_reports_kl_before_after_and_their_change_by_hand_and_its_level():
    n = 40
    small, wrong = np.linspace(0.01, 0.1, n), np.linspace(0.05, 0.45, n)
    eval_set, tunnel = table_eval_set(n, 16), TableTunnel()
    result = score_relabeling(table_reader([small, wrong]), eval_set, tunnel, seed=2, bootstrap=300)
    kl_before, kl_after = -np.log2(1 - small), -np.log2(1 - wrong)  # KL((1, 0) || (1 - e, e)) in bits
    # Tolerance: float64 logs averaged over 40 sequences.
    assert result["kl_bits_before"] == pytest.approx(kl_before.mean(), abs=1e-12)
    assert result["kl_bits_after"] == pytest.approx(kl_after.mean(), abs=1e-12)
    assert result["delta_kl_bits"] == pytest.approx((kl_after - kl_before).mean(), abs=1e-12)
    assert result == score_relabeling(table_reader([small, wrong]), eval_set, tunnel, seed=2, bootstrap=300)  # seeded
    narrow = score_relabeling(table_reader([small, wrong]), eval_set, tunnel, seed=2, bootstrap=300, level=0.5)
    for name in ("delta_mae_bits_ci", "delta_kl_bits_ci"):
        assert result[name][0] < narrow[name][0] <= narrow[name][1] < result[name][1], name  # 95% by default, wider than 50%
    single = score_relabeling(table_reader([small, wrong]), eval_set, tunnel, seed=2, bootstrap=0)
    assert single["delta_mae_bits_ci"][0] == single["delta_mae_bits_ci"][1]  # one resample: a point


def test_the_delta_kl_interval_is_the_percentile_interval_of_the_paired_change_over_resampled_sequences():
    """Recomputed in numpy: each resample draws sequences with their before and after together,
    and the interval is the resampled mean change's (1 - level) / 2 and (1 + level) / 2 quantiles."""
    n, resamples, seed, level = 40, 300, 2, 0.9
    small, wrong = np.linspace(0.01, 0.1, n), np.linspace(0.05, 0.45, n)  # after is worst where before is worst
    eval_set, tunnel = table_eval_set(n, 16), TableTunnel()
    result = score_relabeling(table_reader([small, wrong]), eval_set, tunnel, seed=seed, bootstrap=resamples, level=level)
    kl_before, kl_after = -np.log2(1 - small), -np.log2(1 - wrong)  # KL((1, 0) || (1 - e, e)) in bits
    change = {"delta_kl_bits": kl_after - kl_before,
              "delta_mae_bits": binary_entropy_bits(wrong) - binary_entropy_bits(small)}
    # score_relabeling's generator: seeded with seed + 7, one permutation draw per batch, then the resamples.
    generator = torch.Generator().manual_seed(seed + 7)
    for episode in eval_set.episodes:
        torch.rand(episode.batch_size, tunnel.n_labels, generator=generator)
    draws = torch.randint(0, n, (resamples, n), generator=generator).numpy()  # [R, n] sequence indices
    for name, per_sequence in change.items():
        resampled = per_sequence[draws].mean(1)  # the mean change over each resample of sequences
        # Tolerance: float64 rounding of 40-term means of values under 1 bit.
        assert result[name + "_ci"] == pytest.approx(np.quantile(resampled, [0.05, 0.95]).tolist(), abs=1e-12), name
        low, high = result[name + "_ci"]
        assert low < per_sequence.mean() < high, name
    # Resampling before and after apart (another resample for each) would read a wider interval:
    # the two rise together over the sequences, and pairing cancels that.
    unpaired = kl_after[draws].mean(1) - kl_before[draws[::-1]].mean(1)
    paired_low, paired_high = result["delta_kl_bits_ci"]
    assert np.diff(np.quantile(unpaired, [0.05, 0.95]))[0] > paired_high - paired_low


def test_a_constant_change_in_kl_has_a_zero_width_interval_at_that_change():
    """Each sequence's KL rises by exactly 1 bit: every resample's mean change is 1, so is the
    interval's each end, whatever the resample (the MAE's change is not constant, its interval is wide)."""
    k = np.tile([1.0, 2.0, 3.0, 4.0], 8)  # 32 sequences
    before, after = 1 - 2.0 ** -k, 1 - 2.0 ** -(k + 1)  # KL -log2(1 - e) = k bits before, k + 1 after: exact
    eval_set, tunnel = table_eval_set(32, 16), TableTunnel()  # weights count / 32: exact sums
    result = score_relabeling(table_reader([before, after]), eval_set, tunnel, seed=4, bootstrap=200)
    assert result["kl_bits_before"] == 2.5 and result["kl_bits_after"] == 3.5
    assert result["delta_kl_bits"] == 1.0 and result["delta_kl_bits_ci"] == [1.0, 1.0]
    low, high = result["delta_mae_bits_ci"]
    assert low < result["delta_mae_bits"] < high


def _small_transformer(tunnel):
    from windtunnel.models import build_model

    config = {"n_layers": 2, "n_heads": 2, "d_model": 16, "d_mlp": 32}
    return build_model("transformer", config, vocab_size=tunnel.vocab_size, num_classes=tunnel.num_classes,
                       max_len=tunnel.seq_len(), generator=torch.Generator().manual_seed(0))


def test_a_model_predictor_is_the_models_softmax_in_float64_at_the_supervised_positions():
    from windtunnel.models import Trace

    tunnel = BijectionTunnel(V=6, L=6)
    model = _small_transformer(tunnel)
    episode = tunnel.sample(5, generator=torch.Generator().manual_seed(1))
    model.train()
    with torch.no_grad():
        model.eval()
        logits = model(episode.tokens, at=episode.positions)
        ablated = model(episode.tokens, trace=Trace((), mask_heads={0: [1]}), at=episode.positions)
    model.train()
    # scipy's softmax of the float64 logits: the oracle. Tolerance: float64 exp/normalize of 6 terms.
    expected = special.softmax(logits.double().numpy(), axis=-1)
    predicted = model_predictor(model)(episode)
    assert predicted.dtype == torch.float64 and model.training  # eval mode inside, restored after
    assert np.allclose(predicted.numpy(), expected, rtol=0, atol=1e-12)
    assert np.allclose(model_predictor(model, device="cpu")(episode).numpy(), expected, rtol=0, atol=1e-12)
    masked = model_predictor(model, interventions={"mask_heads": {0: [1]}})(episode).numpy()
    assert np.allclose(masked, special.softmax(ablated.double().numpy(), axis=-1), rtol=0, atol=1e-12)
    assert not np.allclose(masked, expected, rtol=0, atol=1e-6)  # the intervention really changes the model


def test_an_eval_set_moved_to_a_device_holds_the_same_sequences():
    eval_set = EvalSet.draw(BijectionTunnel(V=6, L=6), horizon=4, n=7, batch_size=3, seed=2)
    moved = eval_set.to("cpu")
    assert moved.horizon == 4 and len(moved.episodes) == 3
    assert all(torch.equal(a.tokens, b.tokens) and torch.equal(a.posterior, b.posterior) for a, b in zip(eval_set.episodes, moved.episodes))


def test_a_predictor_runs_where_its_model_lives_and_an_eval_set_moves_every_episode():
    # "meta" is a device every machine has (shapes and dtypes only): a move to it is seen
    # without a GPU, and a forward that stayed on the host would fail against meta weights.
    tunnel = BijectionTunnel(V=6, L=6)
    model = _small_transformer(tunnel).to("meta")
    episode = tunnel.sample(5, generator=torch.Generator().manual_seed(1))
    predicted = model_predictor(model)(episode)
    assert predicted.device.type == "meta" and predicted.shape == episode.posterior.shape and predicted.dtype == torch.float64
    eval_set = EvalSet.draw(tunnel, horizon=4, n=7, batch_size=3, seed=2)
    moved = eval_set.to("meta")
    assert moved.horizon == 4 and len(moved.episodes) == 3
    assert all(e.tokens.device.type == "meta" and e.posterior.device.type == "meta" for e in moved.episodes)
