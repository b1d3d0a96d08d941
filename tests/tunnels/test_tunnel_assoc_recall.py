"""The associative-recall tunnel against a brute-force oracle: every injection enumerated."""

from __future__ import annotations

import itertools
import json

import pytest
import torch

from windtunnel.cli import main
from windtunnel.config import ConfigError
from windtunnel.tunnels import AssocRecallTunnel, make_tunnel


def brute_force_posterior(keys: list[int], values: list[int], query: int, key_vocab: int, value_vocab: int) -> list[float]:
    """p(f(query) = v | the stored pairs) by counting the injections consistent with them
    (the prior is uniform over all injections of the keys into the values)."""
    counts = [0] * value_vocab
    for image in itertools.permutations(range(value_vocab), key_vocab):  # image[k] = f(k)
        if all(image[k] == v for k, v in zip(keys, values)):
            counts[image[query]] += 1
    return [c / sum(counts) for c in counts]


@pytest.mark.parametrize(
    "params", [dict(n_pairs=2, key_vocab=3, value_vocab=4), dict(n_pairs=3, key_vocab=4, value_vocab=4), dict(n_pairs=1, key_vocab=2, value_vocab=5)]
)
def test_posterior_matches_enumerating_every_injection(params):
    tunnel = AssocRecallTunnel(n_queries=5, n_filler=2, p_stored=0.5, **params)
    episode = tunnel.sample(24, generator=torch.Generator().manual_seed(1))
    n_keys, n_values = params["key_vocab"], params["value_vocab"]
    for b in range(episode.batch_size):
        # read the pairs and queries off the tokens the model sees, not the episode's own fields
        tokens = episode.tokens[b].tolist()
        keys, values = tokens[0 : 2 * tunnel.n_pairs : 2], [v - n_keys for v in tokens[1 : 2 * tunnel.n_pairs : 2]]
        assert tokens[2 * tunnel.n_pairs : tunnel.first_query] == [tunnel.fill_token] * 2
        for p, position in enumerate(episode.positions.tolist()):
            expected = brute_force_posterior(keys, values, tokens[position], n_keys, n_values)
            # exact fractions with small denominators: float64 agrees to rounding
            assert episode.posterior[b, p].tolist() == pytest.approx(expected, abs=1e-12)
            assert episode.targets[b, p] == episode.mapping[b, tokens[position]]


def test_queries_mix_stored_and_unstored_keys_at_p_stored_and_unbound_values_are_uniform():
    tunnel = AssocRecallTunnel(n_pairs=2, n_queries=8, n_filler=0, key_vocab=3, value_vocab=4, p_stored=0.3)
    episode = tunnel.sample(4000, generator=torch.Generator().manual_seed(2))
    stored = episode.stored
    in_pairs = (episode.queries[..., None] == episode.keys[:, None, :]).any(-1)  # [B, Q]
    assert torch.equal(in_pairs, stored)
    n = stored.numel()
    # binomial: 32,000 queries, std sqrt(0.3 * 0.7 / n) = 0.0026; 5 std
    assert abs(stored.float().mean().item() - 0.3) < 5 * (0.21 / n) ** 0.5
    # an unstored key's value is either of the 2 unbound values with probability 1/2
    bound = episode.values.sort(dim=1).values  # [B, 2]
    unbound_low = torch.tensor([[v for v in range(4) if v not in row][0] for row in bound.tolist()])  # [B]
    low = (episode.targets == unbound_low[:, None])[~stored]
    assert abs(low.float().mean().item() - 0.5) < 5 * (0.25 / low.numel()) ** 0.5
    # the mapping is an injection
    assert all(len(set(row)) == 3 for row in episode.mapping.tolist())


def test_horizon_changes_the_number_of_queries_and_categories_partition_the_causal_keys():
    tunnel = AssocRecallTunnel(n_pairs=3, n_queries=4, n_filler=2, key_vocab=6, value_vocab=8)
    episode = tunnel.sample(16, generator=torch.Generator().manual_seed(3), horizon=7)
    assert episode.tokens.shape == (16, tunnel.seq_len(7)) == (16, 6 + 2 + 7)
    categories = tunnel.attention_categories(episode)
    count = sum(mask.long() for mask in categories.values())  # [B, P, T]
    causal = torch.arange(episode.tokens.shape[1])[None, :] <= episode.positions[:, None]  # [P, T]
    assert torch.equal(count, causal.long().expand_as(count))
    # a stored query's evidence is exactly its value token, right after the matching key
    b, p = next((b, p) for b in range(16) for p in range(7) if episode.stored[b, p])
    (where,) = categories["evidence"][b, p].nonzero().flatten().tolist()
    assert episode.tokens[b, where - 1] == episode.queries[b, p] and episode.tokens[b, where] == episode.targets[b, p] + 6


@pytest.mark.parametrize(
    "params, message",
    [
        (dict(value_vocab=4, key_vocab=5, n_pairs=2), "value_vocab=4 is out of range"),
        (dict(p_stored=1.5), "p_stored=1.5 is out of range"),
        (dict(p_stored=float("nan")), "p_stored=nan is out of range"),
        (dict(n_pairs=16, key_vocab=16, p_stored=0.5), "stores every key"),
        (dict(n_pairs=0), "n_pairs=0 is out of range"),
        (dict(n_filler=-1), "n_filler=-1 is out of range"),
        (dict(n_queries=0), "n_queries=0 is out of range"),
    ],
)
def test_bad_parameters_are_refused_with_one_line(params, message):
    with pytest.raises(ConfigError, match=message):
        make_tunnel("assoc_recall", params)


def test_sample_command(capsys):
    assert main(["sample", "assoc_recall", "--n", "2", "--set", "n_pairs=2", "--set", "key_vocab=4", "--set", "value_vocab=4"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(records) == 2 and all(len(r["queries"]) == 8 and len(r["posterior"]) == 8 for r in records)


def test_a_transformer_trains_on_it_and_every_analysis_that_applies_runs(tmp_path, capsys):
    from windtunnel.run_config import run_config_from_mapping
    from windtunnel.training.trainer import train

    config = run_config_from_mapping(
        {
            "tunnel": {"name": "assoc_recall", "n_pairs": 3, "n_queries": 4, "n_filler": 1, "key_vocab": 6, "value_vocab": 6},
            "model": {"kind": "transformer", "n_layers": 2, "n_heads": 2, "d_model": 16, "d_mlp": 32},
            "train": {"steps": 10, "batch_size": 32, "eval_every": 5, "checkpoint_every": 0, "log_every": 5},
            "eval": {"n": 64, "batch_size": 64, "bootstrap": 10, "horizons": [4, 6]},
        }
    )
    train(config, tmp_path / "run", progress=False)
    assert main(["analyze", str(tmp_path / "run")]) == 0
    captured = capsys.readouterr()
    written = json.loads(captured.out)
    # its capabilities put the attention analyses to work; relabeling and the value-token measure skip
    assert {"key_orthogonality", "qk_sharpening", "layer_ablation", "head_ablation", "length_generalization"} <= set(written)
    assert "[analyze] skipped relabeling: the assoc_recall tunnel does not declare Relabeling" in captured.err
    sharpening = json.loads((tmp_path / "run" / "analysis" / "qk_sharpening.json").read_text())
    assert sharpening["categories"] == list(AssocRecallTunnel.category_meanings)
    keys = json.loads((tmp_path / "run" / "analysis" / "key_orthogonality.json").read_text())
    assert keys["token_values"] == list(range(6)) and "normalized_output_keys_abs" in keys["measures"]


def test_queries_pick_stored_slots_and_unstored_keys_uniformly_and_independently_per_sequence():
    """Where each query lands, read from the tokens: a stored query's key is one of the stored
    pairs, each slot with probability 1/n_pairs; an unstored one is one of the other keys, each
    with probability 1/(key_vocab - n_pairs); and each sequence draws its own (chi-square, 1e-4)."""
    import numpy as np
    from scipy import stats

    tunnel = AssocRecallTunnel(n_pairs=4, key_vocab=10, value_vocab=11, n_queries=3, n_filler=0, p_stored=0.5)
    episode = tunnel.sample(4000, generator=torch.Generator().manual_seed(9))
    tokens = episode.tokens
    keys = tokens[:, 0 : 2 * 4 : 2]  # [B, n_pairs] the stored keys, in slot order
    first_query = tokens[:, 8]
    slot = (keys == first_query[:, None]).float().argmax(1)
    stored = (keys == first_query[:, None]).any(1)
    assert abs(stored.float().mean().item() - 0.5) < 0.03  # p_stored; 0.03 is 3.8 standard errors of 4000 draws
    assert stats.chisquare(np.bincount(slot[stored].numpy(), minlength=4)).pvalue > 1e-4
    unstored_keys = first_query[~stored].numpy()
    counts = np.bincount(unstored_keys, minlength=10)
    # Which keys are unstored differs per sequence; by symmetry each key is queried equally often.
    assert stats.chisquare(counts).pvalue > 1e-4
    # Unstored: the uniform posterior over the values no stored key holds, 1/(11 - 4) to the last
    # float64 bit (1/7 is not exact in float32: a float32 step anywhere would show).
    posterior = episode.posterior[~stored, 0]
    assert posterior.dtype == torch.float64
    assert set(posterior[posterior > 0].unique().tolist()) == {1 / 7}


def test_the_prior_is_uniform_over_the_values_in_float64():
    tunnel = AssocRecallTunnel(key_vocab=4, n_pairs=2, value_vocab=7)
    prior = tunnel.prior_predictive(3)
    assert prior.dtype == torch.float64 and prior.shape == (3, 7) and set(prior.flatten().tolist()) == {1 / 7}


def test_two_unstored_queries_of_one_sequence_coincide_as_independent_uniform_draws_do():
    """Within a sequence, two queries of unstored keys name the same key with probability
    1/(key_vocab - n_pairs), two of stored keys with probability 1/n_pairs: each query draws its
    key afresh and uniformly (a binomial test at 1e-4 on every pair of queries)."""
    from scipy import stats

    tunnel = AssocRecallTunnel(n_pairs=4, key_vocab=10, value_vocab=11, n_queries=6, n_filler=0, p_stored=0.5)
    episode = tunnel.sample(3000, generator=torch.Generator().manual_seed(4))
    for stored, chance in ((False, 1 / 6), (True, 1 / 4)):
        same = trials = 0
        for i, j in itertools.combinations(range(6), 2):
            both = (episode.stored[:, i] == stored) & (episode.stored[:, j] == stored)
            trials += int(both.sum())
            same += int((both & (episode.queries[:, i] == episode.queries[:, j])).sum())
        assert stats.binomtest(same, trials, chance).pvalue > 1e-4, (stored, same / trials, chance)


def test_a_point_mass_has_entropy_plus_zero_and_unstored_queries_take_every_stored_value_as_evidence():
    tunnel = AssocRecallTunnel(n_pairs=3, n_queries=6, n_filler=1, key_vocab=7, value_vocab=8, p_stored=0.5)
    episode = tunnel.sample(32, generator=torch.Generator().manual_seed(5))
    stored = episode.stored
    assert stored.any() and (~stored).any()
    # A stored query's posterior is a point mass: entropy exactly +0.0 (a -0.0 prints as "-0").
    assert not torch.signbit(episode.entropy_bits[stored]).any()
    evidence = tunnel.attention_categories(episode)["evidence"]  # [B, P, T]
    value_slots = torch.zeros(episode.tokens.shape[1], dtype=torch.bool)
    value_slots[1 : 2 * 3 : 2] = True  # the three stored value tokens sit at 1, 3, 5
    for b in range(32):
        for p in range(6):
            if stored[b, p]:
                assert int(evidence[b, p].sum()) == 1
            else:  # checked per sequence: a batch that has some stored query must not change it
                assert torch.equal(evidence[b, p], value_slots), (b, p)
