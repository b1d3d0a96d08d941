"""The model-selection tunnel: its exact class and answer posteriors against enumeration of
every member of every class, its draws against uniformity within a class, its symbol modes."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from scipy import stats

from windtunnel.cli import main
from windtunnel.config import ConfigError
from windtunnel.tunnels import make_tunnel
from windtunnel.tunnels.model_selection import CLASSES, ModelSelectionTunnel, class_sizes

from member_enumeration import class_members, posteriors_by_counting


def _is_member(name: str, f: tuple[int, ...], n: int) -> bool:
    if name == "involution":
        return all(f[x] != x and f[f[x]] == x for x in range(n))
    if name == "three_cycles":
        return all(f[x] != x and f[f[f[x]]] == x for x in range(n))
    if name == "rotation":
        return any(all(f[x] == (x + c) % n for x in range(n)) for c in range(n))
    if name == "multiplication":
        return any(all(f[x] == (c * x) % n for x in range(n)) for c in range(1, n))
    return True


def _enumerate(name: str, n: int) -> list[tuple[int, ...]]:
    return [f for f in itertools.permutations(range(n)) if _is_member(name, f, n)]


def _brute_force(tunnel: ModelSelectionTunnel, inputs: list[int], outputs: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """The answer and class posteriors before each pair, by counting the members consistent
    with the pairs before it: w_c proportional to (1 / #classes) |C_c(D)| / |C_c|."""
    n = tunnel.n
    members = {c: _enumerate(c, n) for c in tunnel.classes}
    answers, classes = [], []
    for k in range(len(inputs)):
        seen = list(zip(inputs[:k], outputs[:k]))
        consistent = {c: [f for f in fs if all(f[x] == y for x, y in seen)] for c, fs in members.items()}
        weights = np.array([len(consistent[c]) / len(members[c]) for c in tunnel.classes])
        weights /= weights.sum()
        answer = np.zeros(n)
        for w, c in zip(weights, tunnel.classes):
            for f in consistent[c]:
                answer[f[inputs[k]]] += w / len(consistent[c])
        answers.append(answer)
        classes.append(weights)
    return np.array(answers), np.array(classes)


@pytest.mark.parametrize("params", [
    {"n": 6, "classes": ("involution", "three_cycles"), "L": 6},
    {"n": 6, "classes": ("involution", "three_cycles", "rotation", "bijection"), "L": 5},
    {"n": 7, "classes": ("rotation", "multiplication", "bijection"), "L": 7},
    {"n": 6, "classes": ("three_cycles", "involution"), "L": 9, "with_replacement": True},
    {"n": 5, "classes": ("multiplication", "rotation"), "L": 6, "with_replacement": True},
])
def test_the_posteriors_are_those_of_enumerating_every_member_of_every_class(params):
    tunnel = ModelSelectionTunnel(**params)
    episode = tunnel.sample(12, generator=torch.Generator().manual_seed(3))
    for b in range(12):
        answers, classes = _brute_force(tunnel, episode.inputs[b].tolist(), episode.outputs[b].tolist())
        # counting against closed forms: the same rationals, float64 rounding only
        np.testing.assert_allclose(episode.posterior[b].numpy(), answers, atol=1e-12)
        np.testing.assert_allclose(episode.class_posterior[b].numpy(), classes, atol=1e-12)


def _combinations(names: tuple[str, ...]) -> list[tuple[str, ...]]:
    return [c for r in range(2, len(names) + 1) for c in itertools.combinations(names, r)]


@pytest.mark.parametrize("params", [
    # every combination of the classes that fit n = 9 and n = 12, where the 3-cycles' closed
    # forms meet sequences that have ruled them out
    *({"n": 9, "classes": c, "L": 9} for c in _combinations(("three_cycles", "rotation", "bijection"))),
    {"n": 9, "classes": ("three_cycles", "rotation", "bijection"), "L": 9, "symbols": "opaque"},
    *({"n": 12, "classes": c, "L": 12} for c in _combinations(("involution", "three_cycles", "rotation", "bijection"))),
    {"n": 12, "classes": ("involution", "three_cycles", "bijection"), "L": 16, "with_replacement": True},
], ids=lambda p: "-".join(",".join(v) if isinstance(v, tuple) else str(v) for v in p.values()))
def test_the_posteriors_are_those_of_counting_the_members_of_every_class_at_n_9_and_12(params):
    tunnel = ModelSelectionTunnel(**params)
    members = {c: class_members(c, tunnel.n) for c in tunnel.classes}
    episode = tunnel.sample(32, generator=torch.Generator().manual_seed(3))
    sigma = episode.relabel.numpy()
    for b in range(32):
        answers, classes = posteriors_by_counting(tunnel.n, tunnel.classes, episode.inputs[b].tolist(),
                                                  episode.outputs[b].tolist(), members)
        # counting against closed forms: the same rationals, float64 rounding only
        np.testing.assert_allclose(episode.posterior[b].numpy()[:, sigma[b]], answers, atol=1e-12)
        np.testing.assert_allclose(episode.class_posterior[b].numpy(), classes, atol=1e-12)
    # Among the cases: a class ruled out while another is still in doubt, or only one left.
    assert (episode.class_posterior == 0).any()


def test_a_sequence_that_rules_the_three_cycles_out_keeps_a_distribution():
    """Sequence 99 of ``sample model_selection --n 200 --seed 49 --set n=9 --set
    classes=three_cycles,rotation,bijection --set L=9 --set symbols=opaque``: from pair 5 on
    only the bijections remain (class posterior [0, 0, 1] by counting)."""
    tunnel = ModelSelectionTunnel(n=9, classes=("three_cycles", "rotation", "bijection"), L=9, symbols="opaque")
    episode = tunnel.sample(200, generator=torch.Generator().manual_seed(49))
    members = {c: class_members(c, 9) for c in tunnel.classes}
    answers, classes = posteriors_by_counting(9, tunnel.classes, episode.inputs[99].tolist(), episode.outputs[99].tolist(),
                                              members)
    assert classes[4:].tolist() == [[0.0, 0.0, 1.0]] * 5
    assert torch.isfinite(episode.posterior[99]).all() and torch.isfinite(episode.class_posterior[99]).all()
    np.testing.assert_allclose(episode.class_posterior[99].numpy(), classes, atol=1e-12)
    np.testing.assert_allclose(episode.posterior[99].numpy()[:, episode.relabel[99].numpy()], answers, atol=1e-12)


@pytest.mark.parametrize("n", [5, 6, 7])
def test_members_built_by_construction_are_those_found_by_filtering_every_permutation(n):
    checked = 0
    for name in CLASSES:
        try:
            ModelSelectionTunnel(n=n, classes=(name,), L=1)
        except ConfigError:  # the class does not fit n
            continue
        built = class_members(name, n).tolist()
        assert len(built) == len({tuple(f) for f in built}) and {tuple(f) for f in built} == set(_enumerate(name, n))
        checked += 1
    assert checked >= 3


def test_involutions_against_three_cycles_after_two_pairs_is_four_sevenths():
    tunnel = ModelSelectionTunnel(n=6, classes=("involution", "three_cycles"), L=3)
    _, classes = tunnel.exact_posteriors(torch.tensor([[0, 2, 4]]), torch.tensor([[1, 3, 5]]))
    # |C(D)| / |C|: involutions 1 / 15, 3-cycles 2 / 40
    assert classes[0, 2].tolist() == pytest.approx([4 / 7, 3 / 7], abs=1e-15)


@pytest.mark.parametrize(("name", "n"), [("involution", 6), ("involution", 8), ("three_cycles", 6), ("rotation", 6),
                                         ("multiplication", 7), ("bijection", 5)])
def test_class_sizes_count_the_members(name, n):
    assert class_sizes(name, n) == len(_enumerate(name, n))


@pytest.mark.parametrize("name", ["involution", "three_cycles"])
def test_members_are_drawn_uniformly_within_their_class(name):
    tunnel = ModelSelectionTunnel(n=6, classes=(name,), L=1)
    episode = tunnel.sample(20_000, generator=torch.Generator().manual_seed(4))
    members = _enumerate(name, 6)
    index = {f: i for i, f in enumerate(members)}
    counts = np.bincount([index[tuple(f)] for f in episode.mapping.tolist()], minlength=len(members))
    assert stats.chisquare(counts).pvalue > 1e-4  # a false alarm once in 10^4 runs


def test_the_answers_drawn_follow_the_posterior():
    tunnel = ModelSelectionTunnel(n=6, classes=("involution", "three_cycles", "rotation"), L=6)
    episode = tunnel.sample(4000, generator=torch.Generator().manual_seed(5))
    hits = torch.nn.functional.one_hot(episode.targets, 6).double()
    difference = (hits - episode.posterior).sum((0, 1))
    spread = (episode.posterior * (1 - episode.posterior)).sum((0, 1)).sqrt()
    assert (difference / spread).abs().max() < 5  # z-scores: a count against its expectation


def test_opaque_symbols_state_the_relabelling_and_push_the_posterior_through_it():
    integer = ModelSelectionTunnel(n=6, L=4)
    opaque = ModelSelectionTunnel(n=6, L=4, symbols="opaque")
    episode = opaque.sample(8, generator=torch.Generator().manual_seed(6))
    sigma = episode.relabel
    assert torch.equal(episode.tokens[:, 0], torch.full((8,), 12)) and torch.equal(episode.tokens[:, 7], torch.full((8,), 13))
    assert torch.equal(episode.tokens[:, 1:7], sigma)  # the header: sigma(0) .. sigma(5)
    assert torch.equal(episode.tokens[:, 8::2], sigma.gather(1, episode.inputs))
    assert torch.equal(episode.tokens[:, 9::2], sigma.gather(1, episode.outputs) + 6)
    plain, _ = integer.exact_posteriors(episode.inputs, episode.outputs)
    for b in range(8):
        for j in range(6):  # symbol j is the value sigma^-1(j)
            value = int((sigma[b] == j).nonzero())
            assert torch.equal(episode.posterior[b, :, j], plain[b, :, value])
    assert episode.positions.tolist() == [8, 10, 12, 14]


def test_the_fixed_relabelling_is_one_for_every_sequence_and_shown_nowhere():
    tunnel = ModelSelectionTunnel(n=6, L=4, symbols="fixed")
    first = tunnel.sample(4, generator=torch.Generator().manual_seed(7))
    second = tunnel.sample(4, generator=torch.Generator().manual_seed(8))
    assert (first.relabel == first.relabel[0]).all() and torch.equal(first.relabel, second.relabel)
    assert not torch.equal(first.relabel[0], torch.arange(6)) and first.tokens.shape == (4, 8)
    assert not torch.equal(ModelSelectionTunnel(n=6, L=4, symbols="fixed", relabel_seed=1).sample(
        1, generator=torch.Generator().manual_seed(7)).relabel[0], first.relabel[0])


@pytest.mark.parametrize(("params", "message"), [
    ({"n": 7, "classes": ["involution"]}, "n=7 does not fit class 'involution': it needs n even"),
    ({"n": 8, "classes": ["three_cycles"]}, "it needs n divisible by 3"),
    ({"n": 9, "classes": ["multiplication"], "L": 4}, "it needs n prime"),
    ({"classes": ["lines"]}, "'lines' is not a class"),
    ({"classes": []}, "must name one or more distinct classes"),
    ({"symbols": "emoji"}, "symbols='emoji' is not a symbol mode"),
    ({"n": 6, "L": 7}, "L=7 is out of range"),
])
def test_bad_parameters_are_one_line_naming_the_value(params, message):
    with pytest.raises(ConfigError, match=message):
        make_tunnel("model_selection", params)


def test_windtunnel_sample_prints_the_class_posterior(capsys):
    assert main(["sample", "model_selection", "--n", "1", "--set", "n=5", "--set", "classes=[rotation, multiplication]"]) == 0
    out = capsys.readouterr().out
    assert '"class_posterior"' in out and '"hypothesis_class"' in out
    assert main(["sample", "model_selection", "--set", "n=4", "--set", "classes=[multiplication]"]) == 2
    assert "it needs n prime" in capsys.readouterr().err
    assert math.isclose(sum(ModelSelectionTunnel().prior_predictive(1)[0].tolist()), 1.0)


def test_a_model_trains_on_opaque_symbols_and_the_analyses_that_apply_run(tmp_path):
    import json

    from windtunnel.analysis.runner import analyze
    from windtunnel.results import RESULT_TYPES
    from windtunnel.run_config import run_config_from_mapping
    from windtunnel.runs import evaluate_run
    from windtunnel.training.trainer import train

    config = run_config_from_mapping({
        "tunnel": {"name": "model_selection", "n": 6, "L": 5, "symbols": "opaque"},
        "model": {"kind": "transformer", "n_layers": 2, "n_heads": 2, "d_model": 16, "d_mlp": 32},
        "train": {"steps": 120, "batch_size": 64, "lr": 3e-3, "eval_every": 0, "checkpoint_every": 0, "log_every": 40},
        "eval": {"n": 256, "batch_size": 128, "bootstrap": 20, "horizons": [5]},
    })
    train(config, tmp_path / "run", progress=False)
    scores = evaluate_run(tmp_path / "run")["horizons"]["5"]
    assert scores["oracle"]["kl_bits"] == pytest.approx(0.0, abs=1e-12) and scores["kl_bits"] < scores["prior"]["kl_bits"]
    lines: list[str] = []
    written = analyze([tmp_path / "run"], say=lines.append)
    assert {"calibration", "key_orthogonality"} <= set(written)  # the input symbols' keys compared
    skipped = {line.split(":")[0].removeprefix("skipped "): line for line in lines if line.startswith("skipped ")}
    assert "which earlier pairs are evidence depends on the class" in skipped["qk_sharpening"]
    for name, path in written.items():
        assert RESULT_TYPES[name].from_json(json.loads(path.read_text())).task_variant.startswith("involution vs three_cycles")


def _shown(tunnel: ModelSelectionTunnel, episode, b: int) -> tuple[list[int], list[int]]:
    """Sequence ``b``'s pairs as the model reads them (symbols, the header skipped)."""
    pairs = episode.tokens[b, episode.positions[0]:].tolist()
    return pairs[0::2], [y - tunnel.n for y in pairs[1::2]]


@pytest.mark.parametrize("classes", [("involution", "three_cycles"), ("involution",), ("three_cycles", "bijection")])
@pytest.mark.parametrize("symbols", ["integer", "fixed"])
def test_a_relabelled_relational_sequence_has_the_posterior_of_counting_what_the_model_reads(classes, symbols):
    # Without a header the model reads the symbols as values: the relabelled pairs must be ones the
    # classes make, with the posterior of counting the members consistent with them.
    tunnel = ModelSelectionTunnel(n=6, classes=classes, L=6, symbols=symbols)
    generator = torch.Generator().manual_seed(5)
    episode = tunnel.sample(8, generator=generator)
    relabelled = tunnel.relabel(episode, torch.stack([torch.randperm(6, generator=generator) for _ in range(8)]))
    assert not torch.equal(relabelled.tokens, episode.tokens)
    for b in range(8):
        inputs, outputs = _shown(tunnel, relabelled, b)
        answers, class_posterior = _brute_force(tunnel, inputs, outputs)
        # counting against closed forms: the same rationals, float64 rounding only
        np.testing.assert_allclose(relabelled.posterior[b].numpy(), answers, atol=1e-12)
        np.testing.assert_allclose(relabelled.class_posterior[b].numpy(), class_posterior, atol=1e-12)


@pytest.mark.parametrize("classes", [("rotation",), ("multiplication", "rotation"), ("involution", "three_cycles")])
def test_a_relabelled_opaque_sequence_states_its_new_relabelling_and_pushes_the_posterior_through_it(classes):
    n = 7 if "multiplication" in classes else 6
    tunnel = ModelSelectionTunnel(n=n, classes=classes, L=n, symbols="opaque")
    generator = torch.Generator().manual_seed(8)
    episode = tunnel.sample(6, generator=generator)
    relabelled = tunnel.relabel(episode, torch.randperm(n, generator=generator))
    for b in range(6):
        sigma = relabelled.tokens[b, 1:n + 1].tolist()  # the header's relabelling
        inverse = {s: v for v, s in enumerate(sigma)}
        inputs, outputs = _shown(tunnel, relabelled, b)
        answers, class_posterior = _brute_force(tunnel, [inverse[s] for s in inputs], [inverse[s] for s in outputs])
        # counting the values the header decodes, then each value's probability on its symbol
        np.testing.assert_allclose(relabelled.posterior[b].numpy(), answers[:, np.argsort(sigma)], atol=1e-12)
        np.testing.assert_allclose(relabelled.class_posterior[b].numpy(), class_posterior, atol=1e-12)


@pytest.mark.parametrize("symbols", ["integer", "fixed"])
def test_relabeling_is_ruled_out_for_arithmetic_classes_without_a_header(symbols):
    from windtunnel.tunnels.capabilities import Relabeling, lacks

    rotations = ModelSelectionTunnel(n=7, classes=("rotation",), L=7, symbols=symbols)
    episode = rotations.sample(64, generator=torch.Generator().manual_seed(0))
    # Why it must be: relabelled, most rotation sequences are made by no rotation at all.
    impossible = 0
    for b in range(64):
        sigma = torch.randperm(7, generator=torch.Generator().manual_seed(b)).tolist()
        inputs = [sigma[x] for x in episode.tokens[b, 0::2].tolist()]
        outputs = [sigma[y - 7] for y in episode.tokens[b, 1::2].tolist()]
        impossible += not any(all((x + c) % 7 == y for x, y in zip(inputs, outputs)) for c in range(7))
    assert impossible > 32
    assert "rotation" in lacks(rotations, Relabeling)
    with pytest.raises(ConfigError, match="relabeling does not apply"):
        rotations.relabel(episode, torch.arange(7))
    assert lacks(ModelSelectionTunnel(n=7, classes=("rotation",), L=7, symbols="opaque"), Relabeling) is None
    assert lacks(ModelSelectionTunnel(n=6, classes=("involution",), L=6, symbols=symbols), Relabeling) is None


@pytest.mark.parametrize("symbols", ["integer", "opaque"])
def test_the_permutation_reference_is_counting_every_permutation(symbols):
    tunnel = ModelSelectionTunnel(n=6, classes=("involution", "three_cycles"), L=6, symbols=symbols)
    every = ModelSelectionTunnel(n=6, classes=("bijection",), L=6)
    episode = tunnel.sample(6, generator=torch.Generator().manual_seed(2))
    reference = tunnel.permutation_predictive(episode)
    for b in range(6):
        answers, _ = _brute_force(every, episode.inputs[b].tolist(), episode.outputs[b].tolist())  # all 720 permutations
        sigma = episode.relabel[b].numpy()
        np.testing.assert_allclose(reference[b].numpy(), answers[:, np.argsort(sigma)], atol=1e-12)


def test_the_permutation_row_of_rotations_is_the_closed_form():
    from windtunnel.evaluation import EvalSet, evaluate, oracle_predictor

    tunnel = ModelSelectionTunnel(n=7, classes=("rotation",), L=7)
    scores = evaluate(oracle_predictor, EvalSet.draw(tunnel, horizon=7, n=256, batch_size=128, seed=0), tunnel=tunnel)
    # Every rotation sequence: a point mass from the second pair on, where the reference is uniform
    # over the 7 - k + 1 unused answers and the prior over all 7; the first pair is uniform for all.
    assert scores["permutation"]["kl_bits"] == pytest.approx(math.log2(math.factorial(6)) / 7, abs=1e-12)
    assert scores["prior"]["kl_bits"] == pytest.approx(6 * math.log2(7) / 7, abs=1e-12)


def test_eval_relabel_on_rotations_without_a_header_is_one_line_and_writes_nothing(tmp_path, capsys):
    from windtunnel.run_config import run_config_from_mapping
    from windtunnel.training.trainer import train

    config = run_config_from_mapping({
        "tunnel": {"name": "model_selection", "n": 7, "classes": ["rotation"], "L": 7},
        "model": {"kind": "transformer", "n_layers": 1, "n_heads": 1, "d_model": 8, "d_mlp": 16},
        "train": {"steps": 4, "batch_size": 8, "eval_every": 0, "checkpoint_every": 0, "log_every": 2},
        "eval": {"n": 16, "batch_size": 16, "bootstrap": 2},
    })
    train(config, tmp_path / "run", progress=False)
    before = sorted(p.name for p in (tmp_path / "run").iterdir())
    assert main(["eval", str(tmp_path / "run"), "--relabel"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--relabel does not apply" in err[0] and "a relabelled rotation is no longer one" in err[0]
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == before
    assert main(["eval", str(tmp_path / "run")]) == 0
    assert "permutation" in capsys.readouterr().out
