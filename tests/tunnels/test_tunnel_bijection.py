"""Bijection tunnel against independent oracles: brute-force counting over all V! bijections."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
import torch
from scipy import stats

from windtunnel.config import ConfigError
from windtunnel.tunnels import BijectionTunnel
from windtunnel.tunnels.bijection import _repeat_earlier

# Posterior entries are ratios of small integers; float64 division is within 1 ulp of them.
EXACT = dict(rtol=0, atol=1e-12)


def brute_force_posterior(V: int, shown: list[tuple[int, int]], x: int) -> np.ndarray:
    """p(pi(x) = y | shown pairs) by counting every bijection consistent with the pairs."""
    counts = np.zeros(V)
    for perm in itertools.permutations(range(V)):
        if all(perm[a] == b for a, b in shown):
            counts[perm[x]] += 1
    return counts / counts.sum()


@pytest.mark.parametrize(
    "params",
    [
        dict(V=4),
        dict(V=5, L=5),
        dict(V=5, with_replacement=True, L=8),
        dict(V=6, with_replacement=True, L=7, query=True),
        dict(V=6, L=3, query=True),
        dict(V=5, with_replacement=True, L=9, repeat_rate=0.6),
    ],
)
def test_posterior_equals_brute_force_counting(params):
    tunnel = BijectionTunnel(**params)
    episode = tunnel.sample(12, generator=torch.Generator().manual_seed(1))
    V = tunnel.V
    for b in range(episode.batch_size):
        tokens = episode.tokens[b].tolist()
        pairs = [(tokens[2 * k], tokens[2 * k + 1] - V) for k in range(tunnel.L)]
        for p, pos in enumerate(episode.positions.tolist()):
            x = tokens[pos]
            shown = pairs[: pos // 2]  # pairs strictly before this input token
            expected = brute_force_posterior(V, shown, x)
            np.testing.assert_allclose(episode.posterior[b, p].numpy(), expected, **EXACT)
            assert episode.targets[b, p] == episode.mapping[b, x]  # the label is pi(x)


def test_layout_and_fields_agree():
    tunnel = BijectionTunnel(V=7, L=5, query=True)
    episode = tunnel.sample(9, generator=torch.Generator().manual_seed(2))
    assert tunnel.vocab_size == 14 and tunnel.num_classes == 7
    assert episode.tokens.shape == (9, tunnel.seq_len()) == (9, 11)
    assert episode.positions.tolist() == [0, 2, 4, 6, 8, 10]
    assert torch.equal(episode.tokens[:, 0:10:2], episode.inputs)
    assert torch.equal(episode.tokens[:, 1:10:2] - 7, episode.outputs)
    assert torch.equal(episode.outputs, episode.mapping.gather(1, episode.inputs))
    # Every mapping is a bijection; without replacement inputs are distinct.
    assert torch.equal(episode.mapping.sort(1).values, torch.arange(7).expand(9, 7))
    assert all(len(set(row)) == 5 for row in episode.inputs.tolist())
    # The query repeats a shown input and its answer is known.
    q = episode.query_index
    assert torch.equal(episode.tokens[:, -1], episode.inputs.gather(1, q[:, None]).squeeze(1))
    assert torch.all(episode.entropy_bits[:, -1] == 0)
    mask = episode.mask
    assert mask.shape == episode.tokens.shape and mask[:, 0::2].all() and not mask[:, 1::2].any()


def test_entropy_closed_form_without_replacement():
    V = 20
    episode = BijectionTunnel(V=V).sample(64, generator=torch.Generator().manual_seed(3))
    expected = torch.tensor([math.log2(V - k + 1) for k in range(1, V)], dtype=torch.float64)
    torch.testing.assert_close(episode.entropy_bits, expected.expand(64, V - 1), rtol=0, atol=1e-12)


@pytest.mark.parametrize("params", [dict(V=20), dict(V=9, with_replacement=True, L=30, query=True)])
def test_posteriors_normalized_and_entropy_matches_scipy(params):
    episode = BijectionTunnel(**params).sample(32, generator=torch.Generator().manual_seed(4))
    post = episode.posterior.numpy()
    assert episode.posterior.dtype == torch.float64
    np.testing.assert_allclose(post.sum(-1), 1.0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(episode.entropy_bits.numpy(), stats.entropy(post, base=2, axis=-1), rtol=0, atol=1e-12)


def test_with_replacement_staircase():
    """A repeated input has entropy 0; a new one has log2(#unused outputs)."""
    episode = BijectionTunnel(V=5, L=12, with_replacement=True).sample(16, generator=torch.Generator().manual_seed(5))
    for b in range(16):
        seen: set[int] = set()
        for k, x in enumerate(episode.inputs[b].tolist()):
            expected = 0.0 if x in seen else math.log2(5 - len(seen))
            assert episode.entropy_bits[b, k].item() == pytest.approx(expected, abs=1e-12)
            seen.add(x)


def _chi_square_pvalue(rows: list[list[int]], outcomes: list[tuple[int, ...]]) -> float:
    index = {outcome: i for i, outcome in enumerate(outcomes)}
    counts = np.zeros(len(outcomes))
    for row in rows:
        counts[index[tuple(row)]] += 1
    return stats.chisquare(counts).pvalue


def test_sampled_bijections_are_uniform():
    """Pearson chi-square, significance level 0.001, fixed seed: over the 24 bijections of V=4,
    and over the 24 ordered draws of 3 distinct inputs (sampling without replacement)."""
    episode = BijectionTunnel(V=4).sample(48_000, generator=torch.Generator().manual_seed(6))
    assert _chi_square_pvalue(episode.mapping.tolist(), list(itertools.permutations(range(4)))) > 1e-3
    assert _chi_square_pvalue(episode.inputs.tolist(), list(itertools.permutations(range(4), 3))) > 1e-3


def test_same_seed_same_batch_bit_for_bit():
    tunnel = BijectionTunnel(V=10, with_replacement=True, L=15, query=True)
    a = tunnel.sample(50, generator=torch.Generator().manual_seed(7))
    b = tunnel.sample(50, generator=torch.Generator().manual_seed(7))
    c = tunnel.sample(50, generator=torch.Generator().manual_seed(8))
    for name in ("tokens", "targets", "posterior", "entropy_bits", "mapping", "query_index"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert not torch.equal(a.tokens, c.tokens)


def test_evaluation_horizon():
    tunnel = BijectionTunnel(V=10, L=5, with_replacement=True)
    episode = tunnel.sample(3, generator=torch.Generator().manual_seed(9), horizon=25)
    assert episode.tokens.shape == (3, tunnel.seq_len(25)) == (3, 50)


@pytest.mark.parametrize(
    "params, name",
    [
        (dict(V=1), "V=1"),
        (dict(V=5, L=6), "L=6"),
        (dict(V=5, L=0), "L=0"),
        (dict(V="20"), "V='20'"),
        (dict(V=5, query=1), "query=1"),
        (dict(V=5, with_replacement=True, repeat_rate=1.0), "repeat_rate=1.0"),
        (dict(V=5, with_replacement=True, repeat_rate=-0.1), "repeat_rate=-0.1"),
        (dict(V=5, with_replacement=True, repeat_rate=float("nan")), "repeat_rate=nan"),
        (dict(V=5, repeat_rate=0.5), "repeat_rate=0.5 needs with_replacement=true"),
        (dict(V=5, with_replacement=True, repeat_window=-1), "repeat_window=-1 is out of range"),
    ],
)
def test_bad_parameters_name_the_problem(params, name):
    with pytest.raises(ConfigError) as info:
        BijectionTunnel(**params)
    message = str(info.value)
    assert name in message and "\n" not in message


def test_bad_horizon():
    with pytest.raises(ConfigError, match="horizon=9"):
        BijectionTunnel(V=8).sample(2, generator=torch.Generator(), horizon=9)


def test_repeat_rate_draws_repeats_at_the_closed_form_rate():
    """With rate r, input k (k >= 2) copies an earlier one with probability r, else is
    uniform over V, so the expected number of distinct inputs follows
    E[d_k] = E[d_{k-1}] (1 - (1 - r) / V) + (1 - r) from d_1 = 1 (which holds only if
    every copy is one of the earlier inputs, never a new value)."""
    V, L, r, n = 12, 10, 0.7, 40_000
    inputs = BijectionTunnel(V=V, L=L, with_replacement=True, repeat_rate=r).sample(n, generator=torch.Generator().manual_seed(8)).inputs
    distinct = torch.tensor([[len(set(row[: k + 1])) for k in range(L)] for row in inputs.tolist()], dtype=torch.float64)
    expected = [1.0]
    for _ in range(1, L):
        expected.append(expected[-1] * (1 - (1 - r) / V) + (1 - r))
    # d_k has standard deviation below sqrt(L) / 2, so its mean over n rows is within
    # 5 standard errors (a 6e-7 two-sided tail per position) of E[d_k] at 5 * 1.6 / 200.
    np.testing.assert_allclose(distinct.mean(0).numpy(), expected, rtol=0, atol=5 * math.sqrt(L) / 2 / math.sqrt(n))
    # The plain sampler (rate 0) shows about 7.0 distinct inputs by k = L here, against 3.2.
    plain = BijectionTunnel(V=V, L=L, with_replacement=True).sample(n, generator=torch.Generator().manual_seed(8)).inputs
    assert float(torch.tensor([len(set(row)) for row in plain.tolist()], dtype=torch.float64).mean()) > expected[-1] + 2


def test_repeat_rate_zero_is_the_plain_sampler_bit_for_bit():
    a = BijectionTunnel(V=9, L=14, with_replacement=True).sample(32, generator=torch.Generator().manual_seed(4))
    b = BijectionTunnel(V=9, L=14, with_replacement=True, repeat_rate=0.0).sample(32, generator=torch.Generator().manual_seed(4))
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.posterior, b.posterior)


@pytest.mark.parametrize("window, p_latest", [(0, 1 / 2), (1, 3 / 4)])
def test_repeat_window_draws_recent_sources_at_the_closed_form_rate(window, p_latest):
    """Three inputs from V = 10^6 (a fresh draw repeats an earlier one with probability
    below 3e-6, so equal inputs are copies). Input 1 copies input 0 with probability r;
    input 2 copies with probability r, from pair 1 with probability p_latest (1/2 for a
    uniform source; 1/2 + 1/4 with window 1: half the time the latest pair, else uniform).
    So the patterns of equal inputs have probabilities r^2, r (1 - r), (1 - r) r p_latest,
    (1 - r) r (1 - p_latest), (1 - r)^2, checked by a chi-square test."""
    r, n = 0.6, 20_000
    tunnel = BijectionTunnel(V=10**6, L=3, with_replacement=True, repeat_rate=r, repeat_window=window)
    # Sampling a bijection of 10^6 per row is costly: draw the inputs only, as sample() does.
    generator = torch.Generator().manual_seed(11)
    fresh = torch.randint(0, tunnel.V, (n, 3), generator=generator)
    x = _repeat_earlier(fresh, r, window, generator).tolist()
    patterns = [(a == b, c == b, c == a) for a, b, c in x]
    observed = [
        sum(p == (True, True, True) for p in patterns),
        sum(p == (True, False, False) for p in patterns),
        sum(p == (False, True, False) for p in patterns),
        sum(p == (False, False, True) for p in patterns),
        sum(p == (False, False, False) for p in patterns),
    ]
    expected = np.array([r * r, r * (1 - r), (1 - r) * r * p_latest, (1 - r) * r * (1 - p_latest), (1 - r) ** 2]) * n
    assert sum(observed) == n
    assert stats.chisquare(observed, expected).pvalue > 1e-4  # fails a true sampler 1 time in 10^4


# --- what the analyses read off a bijection sequence, against loops over its tokens -------------


def _categories_by_hand(tokens: list[int], queries: list[int], V: int) -> dict[str, list[list[bool]]]:
    """Each key position t of each query q classified from the definitions, one pair at a time:
    inputs are tokens < V, each followed by its output; a repeat's evidence is the output of an
    earlier pair with the same input, otherwise every earlier output is evidence."""
    out = {name: [] for name in ("evidence", "matching_input", "other_output", "other_input", "self")}
    for q in queries:
        matching = [t < q and tokens[t] < V and tokens[t] == tokens[q] for t in range(len(tokens))]
        repeat = any(matching)
        evidence = [
            t < q and tokens[t] >= V and (not repeat or (t >= 1 and matching[t - 1])) for t in range(len(tokens))
        ]
        out["evidence"].append(evidence)
        out["matching_input"].append(matching)
        out["other_output"].append([t < q and tokens[t] >= V and not evidence[t] for t in range(len(tokens))])
        out["other_input"].append([t < q and tokens[t] < V and not matching[t] for t in range(len(tokens))])
        out["self"].append([t == q for t in range(len(tokens))])
    return out


@pytest.mark.parametrize("query", [False, True])
def test_attention_categories_match_a_pair_by_pair_reading_of_the_tokens(query):
    tunnel = BijectionTunnel(V=4, L=7, with_replacement=True, query=query)  # 7 draws of 4 inputs: repeats are certain
    episode = tunnel.sample(6, generator=torch.Generator().manual_seed(3))
    categories = tunnel.attention_categories(episode)
    queries = episode.positions.tolist()
    for b in range(episode.batch_size):
        expected = _categories_by_hand(episode.tokens[b].tolist(), queries, tunnel.V)
        for name, mask in expected.items():
            assert categories[name][b].tolist() == mask, (name, b)
    assert categories["matching_input"].any() and not categories["matching_input"].all(-1).any()  # repeats and first sightings


def test_symbol_hypothesis_and_value_tokens_are_the_inputs_outputs_and_answers_of_the_pairs():
    tunnel = BijectionTunnel(V=5, query=True)
    episode = tunnel.sample(8, generator=torch.Generator().manual_seed(4))
    assert tunnel.symbol_tokens() == ([0, 1, 2, 3, 4], ["x=0", "x=1", "x=2", "x=3", "x=4"])
    assert tunnel.hypothesis_tokens() == [5, 6, 7, 8, 9]
    tokens = episode.tokens
    assert set(tokens[:, 0 : 2 * tunnel.L : 2].unique().tolist()) == set(tunnel.symbol_tokens()[0])  # inputs
    assert set(tokens[:, 1 : 2 * tunnel.L : 2].unique().tolist()) == set(tunnel.hypothesis_tokens())  # outputs
    value_at, kept = tunnel.value_positions(episode)
    # Every input but the final query (the last token, answered by no token) has its output next.
    assert kept.tolist() == list(range(tunnel.L)) and value_at.tolist() == [2 * k + 1 for k in range(tunnel.L)]
    assert torch.equal(tokens[:, value_at] - tunnel.V, episode.mapping.gather(1, tokens[:, value_at - 1]))
    plain = BijectionTunnel(V=5)  # no query: the last input's output is the last token
    value_at, kept = plain.value_positions(plain.sample(2, generator=torch.Generator().manual_seed(4)))
    assert kept.tolist() == [0, 1, 2, 3] and value_at.tolist() == [1, 3, 5, 7]


def test_a_record_is_the_sequence_read_back_from_its_tokens():
    tunnel = BijectionTunnel(V=6, L=4, query=True)
    episode = tunnel.sample(3, generator=torch.Generator().manual_seed(5))
    for i in range(3):
        record = json.loads(json.dumps(episode.record(i)))  # JSON-able as it is
        assert set(record) == {"tokens", "positions", "targets", "posterior", "entropy_bits", "mapping", "inputs", "outputs", "query"}
        assert record["entropy_bits"] == episode.entropy_bits[i].tolist() and record["posterior"] == episode.posterior[i].tolist()
        tokens = episode.tokens[i].tolist()
        inputs, outputs = tokens[0:8:2], [y - 6 for y in tokens[1:8:2]]
        assert record["tokens"] == tokens and record["inputs"] == inputs and record["outputs"] == outputs
        assert [record["mapping"][x] for x in inputs] == outputs and sorted(record["mapping"]) == list(range(6))
        pair = inputs.index(tokens[8])
        assert record["query"] == {"input": tokens[8], "output": outputs[pair], "pair": pair}
        assert record["positions"] == [0, 2, 4, 6, 8] and record["targets"] == outputs + [outputs[pair]]
    assert "query" not in BijectionTunnel(V=6, L=4).sample(1, generator=torch.Generator().manual_seed(0)).record(0)


def test_inputs_with_replacement_and_the_query_pair_are_uniform():
    tunnel = BijectionTunnel(V=6, L=5, with_replacement=True, query=True)
    episode = tunnel.sample(6000, generator=torch.Generator().manual_seed(8))
    inputs = episode.tokens[:, 0:10:2].flatten()
    assert stats.chisquare(np.bincount(inputs.numpy(), minlength=6)).pvalue > 1e-4  # 30,000 draws, each of 0..5
    # The query copies a uniformly chosen pair: its input is that pair's input.
    query_pair = episode.query_index
    assert stats.chisquare(np.bincount(query_pair.numpy(), minlength=5)).pvalue > 1e-4
    assert torch.equal(episode.tokens[:, -1], episode.tokens[torch.arange(6000), 2 * query_pair])


def test_the_tunnels_repeat_window_reaches_the_repeat_sampler(monkeypatch):
    """The sampler's law is checked above, on the sampler; here, that sample() gives it the
    tunnel's rate and window (and calls it only with a rate)."""
    import windtunnel.tunnels.bijection as bijection

    calls = []
    real = bijection._repeat_earlier

    def spy(inputs, rate, window, generator):
        calls.append((rate, window))
        return real(inputs, rate, window, generator)

    monkeypatch.setattr(bijection, "_repeat_earlier", spy)
    generator = torch.Generator().manual_seed(0)
    BijectionTunnel(V=6, L=5, with_replacement=True, repeat_rate=0.3, repeat_window=2).sample(4, generator=generator)
    BijectionTunnel(V=6, L=5, with_replacement=True).sample(4, generator=generator)
    assert calls == [(0.3, 2)]
