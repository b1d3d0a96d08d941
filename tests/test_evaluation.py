"""Scoring against the exact posterior, checked with predictors whose errors are known in closed form."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

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
