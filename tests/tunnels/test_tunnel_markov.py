"""The Laplace tunnels (markov, dirichlet) against oracles outside their code: the joint
probability of each sequence in closed form (Gamma functions), the predictive by numerical
integration over the prior, and the targets drawn against the predictive itself."""

from __future__ import annotations

import json
import math

import pytest
import torch
from scipy import integrate

from windtunnel.cli import main
from windtunnel.config import ConfigError
from windtunnel.tunnels import DirichletTunnel, MarkovTunnel, make_tunnel


def log_marginal(symbols: list[int], V: int, k: int, c: float) -> float:
    """log p(x_1..x_L) with the rows integrated out: the first k symbols uniform, then for each
    context its Dirichlet-multinomial, Gamma(Vc) / Gamma(Vc + n_s) prod_v Gamma(c + n_sv) / Gamma(c)."""
    counts: dict[tuple[int, ...], list[int]] = {}
    for i in range(k, len(symbols)):
        counts.setdefault(tuple(symbols[i - k:i]), [0] * V)[symbols[i]] += 1
    total = -min(k, len(symbols)) * math.log(V)
    for row in counts.values():
        total += math.lgamma(V * c) - math.lgamma(V * c + sum(row))
        total += sum(math.lgamma(c + n) - math.lgamma(c) for n in row)
    return total


@pytest.mark.parametrize("tunnel", [MarkovTunnel(V=3, k=1, beta=1.0, L=40), MarkovTunnel(V=2, k=3, beta=0.3, L=50),
                                    DirichletTunnel(V=4, alpha=0.5, L=30), DirichletTunnel(V=2, alpha=2.0, L=12)])
def test_the_predictives_multiply_to_the_closed_form_probability_of_the_sequence(tunnel):
    episode = tunnel.sample(16, generator=torch.Generator().manual_seed(2))
    k, c = (tunnel.k, tunnel.beta) if isinstance(tunnel, MarkovTunnel) else (0, tunnel.alpha)
    for b in range(episode.batch_size):
        # the symbols read off the tokens the model sees, and the last target
        tokens, targets = episode.tokens[b].tolist(), episode.targets[b].tolist()
        symbols = tokens[1:] + [targets[-1]]
        assert tokens[0] == tunnel.V and targets == symbols
        chain_rule = episode.posterior[b].gather(-1, episode.targets[b][:, None]).log().sum().item()
        # ~50 float64 logs and lgammas of numbers below 100: rounding ~1e-13 each
        assert chain_rule == pytest.approx(log_marginal(symbols, tunnel.V, k, c), abs=1e-9)


def test_the_dirichlet_predictive_is_the_integral_over_the_bias():
    # V = 2: p(next = 1 | data) = ∫ p Beta(p; a + n1, a + n0) dp, integrated numerically.
    tunnel = DirichletTunnel(V=2, alpha=0.7, L=10)
    episode = tunnel.sample(4, generator=torch.Generator().manual_seed(5))
    for b in range(4):
        symbols = episode.targets[b].tolist()
        for t in range(tunnel.L):
            n1 = sum(symbols[:t])
            n0 = t - n1
            weight = lambda p: p ** (tunnel.alpha + n1 - 1) * (1 - p) ** (tunnel.alpha + n0 - 1)  # noqa: E731
            mass, _ = integrate.quad(weight, 0, 1)
            mean, _ = integrate.quad(lambda p: p * weight(p), 0, 1)
            # quad's error on these smooth Beta integrands is far below 1e-8
            assert episode.posterior[b, t, 1].item() == pytest.approx(mean / mass, abs=1e-8)


@pytest.mark.parametrize("tunnel", [MarkovTunnel(V=3, k=2, beta=0.5, L=12), DirichletTunnel(V=3, alpha=1.0, L=12)])
def test_the_targets_drawn_follow_the_predictive(tunnel):
    # Under the prior the predictive is the exact conditional law of the next symbol, so the
    # mean of onehot(target) - predictive over fresh sequences is 0 at every position and symbol.
    n = 40_000
    episode = tunnel.sample(n, generator=torch.Generator().manual_seed(9))
    residual = torch.nn.functional.one_hot(episode.targets, tunnel.V).double() - episode.posterior  # [n, L, V]
    z = residual.mean(0) / (residual.std(0) / math.sqrt(n))
    assert z.abs().max().item() < 5.0  # 36 z-scores: |z| >= 5 has probability ~2e-5 in all


def test_a_long_chain_shows_its_own_rows():
    tunnel = MarkovTunnel(V=3, k=1, beta=1.0, L=20_000)
    episode = tunnel.sample(2, generator=torch.Generator().manual_seed(4))
    for b in range(2):
        x = episode.symbols[b]
        counts = torch.zeros(3, 3, dtype=torch.float64)
        counts.index_put_((x[:-1], x[1:]), torch.ones(len(x) - 1, dtype=torch.float64), accumulate=True)
        empirical = counts / counts.sum(-1, keepdim=True)
        # each row seen ~6,700 times: the standard error of a frequency is below 0.007
        assert torch.allclose(empirical, episode.rows[b], atol=0.035)
        # and the predictive after the whole chain is close to its true rows too
        last_context = x[-2].item()
        assert torch.allclose(episode.posterior[b, -1], episode.rows[b, last_context], atol=0.035)


def test_the_prior_is_uniform_and_the_first_k_symbols_are_too():
    tunnel = MarkovTunnel(V=4, k=2, L=8)
    episode = tunnel.sample(3, generator=torch.Generator().manual_seed(0))
    assert torch.equal(episode.posterior[:, :2], torch.full((3, 2, 4), 0.25, dtype=torch.float64))
    assert torch.equal(tunnel.prior_predictive(5), torch.full((5, 4), 0.25, dtype=torch.float64))
    assert (episode.tokens.shape, episode.positions.tolist()) == ((3, 8), list(range(8)))
    assert tunnel.sample(2, generator=torch.Generator().manual_seed(0), horizon=20).tokens.shape == (2, 20)


@pytest.mark.parametrize(("name", "params", "message"), [
    ("markov", {"V": 1}, "^V=1 is out of range: need V >= 2$"),
    ("markov", {"k": 0}, r"^k=0 is out of range: need k >= 1 \(the order-0 chain is the dirichlet tunnel\)$"),
    ("markov", {"V": 5, "k": 6}, r"^V\^k = 5\^6 contexts is out of range: need at most 4096$"),
    ("markov", {"beta": 0.0}, "^beta=0.0 is out of range: need beta > 0$"),
    ("markov", {"L": 0}, "^L=0 is out of range: need at least 1 symbol$"),
    ("dirichlet", {"alpha": float("nan")}, "^alpha=nan is out of range: need a finite number$"),  # check_field_types
    ("dirichlet", {"alpha": -1.0}, "^alpha=-1.0 is out of range: need alpha > 0$"),
])
def test_bad_parameters_are_one_line_naming_the_value(name, params, message):
    with pytest.raises(ConfigError, match=message):
        make_tunnel(name, params)


def test_windtunnel_sample_prints_a_chain_and_its_exact_predictive(capsys):
    assert main(["sample", "markov", "--n", "1", "--set", "V=2", "--set", "L=5"]) == 0
    (record,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(record["tokens"]) == 5 and len(record["rows"]) == 2 and record["posterior"][0] == [0.5, 0.5]
    assert main(["sample", "markov", "--set", "k=0"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_a_model_trains_on_a_chain_and_the_analyses_that_apply_run(tmp_path):
    from windtunnel.analysis.runner import analyze
    from windtunnel.results import RESULT_TYPES
    from windtunnel.run_config import run_config_from_mapping
    from windtunnel.runs import evaluate_run, format_table
    from windtunnel.training.trainer import train

    config = run_config_from_mapping({
        "tunnel": {"name": "markov", "V": 2, "k": 1, "L": 16},
        "model": {"kind": "transformer", "n_layers": 2, "n_heads": 2, "d_model": 16, "d_mlp": 32},
        "train": {"steps": 150, "batch_size": 64, "lr": 3e-3, "eval_every": 0, "checkpoint_every": 0, "log_every": 50},
        "eval": {"n": 256, "batch_size": 128, "bootstrap": 20, "horizons": [16]},
    })
    train(config, tmp_path / "run", progress=False)
    evaluated = evaluate_run(tmp_path / "run")
    scores = evaluated["horizons"]["16"]
    gaps = scores["loss_gap_bits"], scores["oracle"]["loss_gap_bits"], scores["prior"]["loss_gap_bits"]
    assert gaps[1] <= gaps[0] < gaps[2] and f"model {gaps[0]:.5f}, exact posterior {gaps[1]:.5f}" in format_table(evaluated)
    # 150 steps beat the uniform prior (which ignores the counts), and the oracle row is exact
    assert scores["kl_bits"] < scores["prior"]["kl_bits"] and scores["oracle"]["kl_bits"] == pytest.approx(0.0, abs=1e-12)
    lines: list[str] = []
    written = analyze([tmp_path / "run"], say=lines.append)
    assert {"calibration", "layer_ablation", "key_orthogonality"} <= set(written)  # symbol keys compared
    skipped = {line.split(":")[0].removeprefix("skipped "): line for line in lines if line.startswith("skipped ")}
    assert "does not declare AttentionCategories" in skipped["qk_sharpening"]
    for name, path in written.items():  # each saved result reads back as its type, naming the task variant
        assert RESULT_TYPES[name].from_json(json.loads(path.read_text())).task_variant == "order 1, beta 1"


def test_the_loss_gap_is_against_the_oracle_that_knows_the_rows():
    from windtunnel.evaluation import EvalSet, evaluate, prior_predictor

    tunnel = MarkovTunnel(V=3, k=2, beta=0.5, L=12)
    eval_set = EvalSet.draw(tunnel, horizon=12, n=64, batch_size=32, seed=3)
    scores = evaluate(prior_predictor(tunnel), eval_set, tunnel=tunnel)
    # By hand: the uniform prior's log-loss is log2 V at every position; the rows' is that of
    # the true row of each symbol's context (uniform for the first k), read in Python loops.
    gaps = []
    for e in eval_set.episodes:
        for b in range(e.batch_size):
            x = e.symbols[b].tolist()
            for i, v in enumerate(x):
                p_true = 1 / 3 if i < 2 else e.rows[b, x[i - 2] * 3 + x[i - 1], v].item()
                gaps.append(math.log2(p_true) + math.log2(3))
    assert scores["loss_gap_bits"] == pytest.approx(sum(gaps) / len(gaps), rel=1e-12)  # 768 float64 logs
    assert scores["prior"]["loss_gap_bits"] == scores["loss_gap_bits"]
    # The exact posterior pays for not knowing the rows: a positive gap, below the prior's.
    assert 0 < scores["oracle"]["loss_gap_bits"] < scores["loss_gap_bits"]
    # A tunnel that knows no parameters has no gap to report.
    assert "loss_gap_bits" not in evaluate(prior_predictor(make_tunnel("bijection")), EvalSet.draw(
        make_tunnel("bijection"), horizon=19, n=8, batch_size=8, seed=0), tunnel=make_tunnel("bijection"))


def test_the_dirichlet_position_wise_floor_is_the_pair_probability_over_the_single():
    from scipy.special import gammaln

    tunnel = DirichletTunnel(V=4, alpha=0.7, L=6)
    episode = tunnel.sample(3, generator=torch.Generator().manual_seed(2))
    floor = tunnel.position_wise_predictive(episode)
    V, a = 4, 0.7

    def log_probability(counts):  # the Dirichlet-multinomial probability of one ordered sequence
        return gammaln(V * a) - gammaln(V * a + sum(counts)) + sum(gammaln(a + n) - gammaln(a) for n in counts)

    for b in range(3):
        assert floor[b, 0].tolist() == pytest.approx([1 / V] * V, abs=1e-15)  # BOS: nothing read
        for t in range(1, 6):
            s = int(episode.tokens[b, t])
            single = [1 if u == s else 0 for u in range(V)]
            pair = [[single[u] + (u == v) for u in range(V)] for v in range(V)]
            expected = [math.exp(log_probability(pair[v]) - log_probability(single)) for v in range(V)]
            assert floor[b, t].tolist() == pytest.approx(expected, abs=1e-13)  # gammaln rounding


def test_the_markov_chain_says_why_it_has_no_position_wise_floor():
    from windtunnel.tunnels.capabilities import PositionWiseFloor, lacks

    assert "no closed form" in lacks(MarkovTunnel(), PositionWiseFloor)
