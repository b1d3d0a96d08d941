"""windtunnel lm-score: the text formats, the restriction of a language model's next-token
distribution to the symbols, the exact next-symbol predictive, the geometry, and bad input.

The language model is a tiny randomly initialized Llama built here with a byte-level BPE
tokenizer trained here (no download); the oracles are hand computations (a softmax
restricted by hand, a brute-force sum over the HMM's state paths, the RMSNorm and W_K
applied by hand), never the code under test.
"""

from __future__ import annotations

import itertools
import json
import math
from fractions import Fraction
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from windtunnel.cli import main  # noqa: E402
from windtunnel.lm.geometry import language_model_geometry  # noqa: E402
from windtunnel.lm.load import load_language_model  # noqa: E402
from windtunnel.lm.score import next_symbol_episode, reliability, restricted_predictive, score_language_model  # noqa: E402
from windtunnel.tunnels import Episode  # noqa: E402
from windtunnel.lm.text import format_for  # noqa: E402
from windtunnel.tunnels import make_tunnel  # noqa: E402

CORPUS = [
    "A -> a, B -> b, C -> c, D -> d, E -> e, F -> f, G -> g, H -> h",
    "States: 2. Symbols: A B C. Initial state distribution: uniform.",
    "Transition probabilities (row: from state 1..2; column: to state 1..2): 0.25 0.75; 0.5 0.5.",
    "Emission probabilities (row: state 1..2; column: symbol A B C): 0.1 0.2 0.7; 0.05 0.15 0.8.",
    "Observations: A B C A B C D E F G H",
    "Each capital letter stands for a different small letter, the same one every time; complete each arrow.",
] * 20


def _tiny_model(folder: Path, *, max_positions: int = 512, seed: int = 0) -> Path:
    """A 2-layer Llama (4 query heads over 2 key-value heads) and a BPE tokenizer, saved as a model folder."""
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE())
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=400, initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
                                             special_tokens=["<pad>"])
    bpe.train_from_iterator(CORPUS, trainer=trainer)
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>")
    for symbol in [" A", " B", " C", " a", " b", " c"]:  # the fixture's premise: one token each
        assert len(tokenizer.encode(symbol, add_special_tokens=False)) == 1, symbol
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
                                      pad_token_id=tokenizer.pad_token_id)
    model = transformers.LlamaForCausalLM(config)
    # A random init puts nearly uniform mass on every token; a larger output scale makes the
    # restriction and the leaked mass matter in the checks below.
    with torch.no_grad():
        model.lm_head.weight.mul_(30.0)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return _tiny_model(tmp_path_factory.mktemp("tiny_lm"))


def test_restriction_and_renormalization_match_a_hand_computation():
    logits = torch.tensor([[[0.0, 1.0, -2.0, 3.0, 0.5], [2.0, -1.0, 0.0, 0.0, 4.0]]])  # [B=1, T=2, vocab=5]
    read_at, classes = torch.tensor([[0, 1]]), torch.tensor([[3, 1, 4]])
    probs, leaked = restricted_predictive(logits, read_at, classes)
    for t in range(2):
        e = [math.exp(v) for v in logits[0, t].tolist()]
        on = [e[3], e[1], e[4]]
        assert probs[0, t].tolist() == pytest.approx([v / sum(on) for v in on], abs=1e-15)  # float64 round-off
        assert leaked[0, t].item() == pytest.approx(1 - sum(on) / sum(e), abs=1e-15)
    assert probs.dtype == torch.float64


def test_reliability_bins_match_a_hand_count():
    q = torch.tensor([[[0.05, 0.95], [0.5, 0.5]], [[0.12, 0.88], [1.0, 0.0]]], dtype=torch.float64)  # [B=2, P=2, C=2]
    p = torch.tensor([[[0.0, 1.0], [0.3, 0.7]], [[0.2, 0.8], [1.0, 0.0]]], dtype=torch.float64)
    target = Episode(torch.zeros(2, 2, dtype=torch.int64), torch.arange(2), torch.zeros(2, 2, dtype=torch.int64), p, p[..., 0])
    curve = reliability([q], [target], bins=4)
    # by hand: [0, .25): 0.05, 0.12, 0.0 -> exact 0.0, 0.2, 0.0; [.5, .75): 0.5, 0.5 -> 0.3, 0.7;
    # [.75, 1]: 0.95, 0.88, 1.0 -> 1.0, 0.8, 1.0 (q = 1 in the last bin); [.25, .5) empty
    assert curve["count"] == [3, 0, 2, 3]
    assert curve["mean_predicted"][0] == pytest.approx(0.17 / 3, abs=1e-15) and curve["mean_exact"][0] == pytest.approx(0.2 / 3, abs=1e-15)
    assert curve["mean_predicted"][1] is None and curve["mean_exact"][1] is None
    assert curve["mean_predicted"][2] == pytest.approx(0.5, abs=1e-15) and curve["mean_exact"][2] == pytest.approx(0.5, abs=1e-15)
    assert curve["mean_predicted"][3] == pytest.approx(2.83 / 3, abs=1e-15) and curve["mean_exact"][3] == pytest.approx(2.8 / 3, abs=1e-15)


def test_bijection_text_is_the_stated_format(tiny):
    _, tokenizer = load_language_model(tiny)
    tunnel = make_tunnel("bijection", overrides=["V=3"])
    episode = tunnel.sample(2, generator=torch.Generator().manual_seed(0))
    rendered = format_for(tunnel, tokenizer).render(episode)
    x, y = episode.inputs[0].tolist(), episode.outputs[0].tolist()
    expected = ", ".join(f"{'ABC'[a]} -> {'abc'[b]}" for a, b in zip(x, y))
    assert rendered.text == " " + expected
    ids = rendered.ids[0].tolist()
    arrow = tokenizer.encode(" ->", add_special_tokens=False)
    for k, position in enumerate(rendered.read_at[0].tolist()):
        assert ids[position - len(arrow) + 1:position + 1] == arrow  # read at the arrow after x_k
        assert ids[position + 1] == tokenizer.encode(" " + "abc"[y[k]], add_special_tokens=False)[0]  # then y_k
    assert rendered.class_tokens[0].tolist() == [tokenizer.encode(f" {c}", add_special_tokens=False)[0] for c in "abc"]


def test_fresh_symbols_give_each_sequence_its_own_map(tiny):
    _, tokenizer = load_language_model(tiny)
    tunnel = make_tunnel("bijection", overrides=["V=3"])
    episode = tunnel.sample(16, generator=torch.Generator().manual_seed(1))
    rendered = format_for(tunnel, tokenizer).render(episode, generator=torch.Generator().manual_seed(0))
    maps = {tuple(row) for row in rendered.class_tokens.tolist()}
    assert len(maps) > 1 and all(len(set(m)) == 3 for m in maps)
    for i in range(16):  # the token after each read position is the class token of the answer, under the sequence's map
        for k, position in enumerate(rendered.read_at[i].tolist()):
            assert rendered.ids[i, position + 1].item() == rendered.class_tokens[i, episode.outputs[i, k]].item()


def test_hmm_header_text_states_exactly_what_the_posterior_conditions_on(tiny):
    _, tokenizer = load_language_model(tiny)
    tunnel = make_tunnel("hmm", overrides=["S=2", "M=3", "K=6"])
    episode = tunnel.sample(3, generator=torch.Generator().manual_seed(2))
    rendered = format_for(tunnel, tokenizer).render(episode)
    text = tokenizer.decode(rendered.ids[0][rendered.attention_mask[0].bool()].tolist())
    for name, matrix in (("Transition", episode.transition[0]), ("Emission", episode.emission[0])):
        line = next(line for line in text.splitlines() if line.startswith(name))
        rows = line.split("): ", 1)[1].rstrip(".").split("; ")
        parsed = [[Fraction(v) for v in row.split()] for row in rows]
        assert parsed == [[Fraction(v).limit_denominator(1000) for v in row] for row in matrix.tolist()]
    observations = text.split("Observations:")[1].split()
    assert observations == ["ABC"[o] for o in episode.observations[0].tolist()]


def _brute_force_next_symbol(T: torch.Tensor, E: torch.Tensor, initial: torch.Tensor, observations: list[int]) -> list[list[float]]:
    """p(o_{t+1} | o_1..o_t) = p(o_1..o_{t+1}) / p(o_1..o_t), each a sum over every state path."""
    S, M = E.shape

    def likelihood(seq: list[int]) -> float:
        total = 0.0
        for path in itertools.product(range(S), repeat=len(seq)):
            p = initial[path[0]].item() * E[path[0], seq[0]].item()
            for a, b, o in zip(path, path[1:], seq[1:]):
                p *= T[a, b].item() * E[b, o].item()
            total += p
        return total

    return [[likelihood(observations[: t + 1] + [o]) / likelihood(observations[: t + 1]) for o in range(M)]
            for t in range(len(observations))]


def test_hmm_next_symbol_predictive_matches_brute_force():
    tunnel = make_tunnel("hmm", overrides=["S=2", "M=3", "K=5"])
    episode = tunnel.sample(4, generator=torch.Generator().manual_seed(3))
    predictive = next_symbol_episode(tunnel, episode).posterior
    for b in range(4):
        expected = _brute_force_next_symbol(episode.transition[b], episode.emission[b], episode.initial[b],
                                            episode.observations[b].tolist())
        assert torch.allclose(predictive[b], torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-12)  # sums of <= 2**6 float64 products


def test_bijection_next_symbol_predictive_is_the_posterior():
    tunnel = make_tunnel("bijection", overrides=["V=4"])
    episode = tunnel.sample(2, generator=torch.Generator().manual_seed(4))
    assert torch.equal(next_symbol_episode(tunnel, episode).posterior, episode.posterior)


def test_scores_equal_an_independent_forward_pass(tiny):
    model, tokenizer = load_language_model(tiny)
    tunnel = make_tunnel("bijection", overrides=["V=3"])
    result, episodes, rendered = score_language_model(model, format_for(tunnel, tokenizer), tunnel, n=6, batch_size=3, seed=0)
    kls, leaks, ruled_out = [], [], []
    for episode, r in zip(episodes, rendered):
        for i in range(episode.batch_size):
            x, y = episode.inputs[i].tolist(), episode.outputs[i].tolist()
            ids = []
            for k, (a, b) in enumerate(zip(x, y)):  # the stated format, tokenized here piece by piece
                if k:
                    ids += tokenizer.encode(",", add_special_tokens=False)
                ids += tokenizer.encode(f" {'ABC'[a]}", add_special_tokens=False)
                ids += tokenizer.encode(" ->", add_special_tokens=False)
                with torch.no_grad():
                    logits = model(input_ids=torch.tensor([ids])).logits[0, -1].double()
                e = torch.exp(logits - logits.max())
                classes = [tokenizer.encode(f" {c}", add_special_tokens=False)[0] for c in "abc"]
                q = e[classes] / e[classes].sum()
                leaks.append(1 - (e[classes].sum() / e.sum()).item())
                p = episode.posterior[i, k]
                kls.append(sum(pk * math.log2(pk / qk) for pk, qk in zip(p.tolist(), q.tolist()) if pk > 0))
                ruled_out.append(sum(qk for pk, qk in zip(p.tolist(), q.tolist()) if pk == 0))
                ids += tokenizer.encode(f" {'abc'[b]}", add_special_tokens=False)
    row = result["rows"]["language_model"]
    # float32 forward passes of the same ids, batched (padded) there and one by one here
    assert row["kl_bits"] == pytest.approx(sum(kls) / len(kls), rel=1e-4)
    assert row["leaked_mass"] == pytest.approx(sum(leaks) / len(leaks), rel=1e-4)
    assert row["impossible_mass"] == pytest.approx(sum(ruled_out) / len(ruled_out), rel=1e-4) and row["impossible_mass"] > 0
    assert result["rows"]["uniform"]["kl_bits"] == pytest.approx(
        sum(math.log2(3) - h for h in [math.log2(3), 1.0]) / 2, abs=1e-12)  # KL(p || uniform) = log2 C - H(p); L = V - 1 pairs


def test_geometry_layer0_keys_match_the_norm_and_w_k_by_hand(tiny):
    model, tokenizer = load_language_model(tiny, attention="eager")
    tunnel = make_tunnel("hmm", overrides=["S=2", "M=3", "K=8"])
    result, episodes, rendered = score_language_model(model, format_for(tunnel, tokenizer), tunnel, n=8, batch_size=4, seed=0)
    geometry = language_model_geometry(model, tunnel, episodes, rendered, n_sequences=8)
    layer = model.model.layers[0]
    tokens = geometry["key_tokens"]
    x = model.model.embed_tokens.weight.detach().double()[tokens]
    normed = x / torch.sqrt(x.square().mean(-1, keepdim=True) + layer.input_layernorm.variance_epsilon)
    keys = (normed * layer.input_layernorm.weight.double()) @ layer.self_attn.k_proj.weight.double().T  # [X, 2 * 8]
    expected = []
    for h in range(2):
        k = keys[:, h * 8:(h + 1) * 8]
        unit = k / k.norm(dim=-1, keepdim=True)
        cos = unit @ unit.T
        expected.append(sum(abs(cos[i, j].item()) for i in range(3) for j in range(3) if i != j) / 6)
    row = geometry["layers"][0]
    # layer 0 reads the embedding alone and k_proj is before the rotary embedding: in context and
    # from the embedding are the same keys (float32 forward against float64 here)
    assert row["normalized_embedding_keys"]["per_head"] == pytest.approx(expected, abs=1e-9)
    assert row["in_context_keys"]["per_head"] == pytest.approx(expected, abs=1e-5)
    assert 0 < row["attention_entropy_bits"] <= geometry["uniform_attention_entropy_bits"] + 1e-9
    assert "probe_state_posterior" in row and geometry["n_layers"] == 2


def test_lm_score_command_writes_the_scoring(tiny, tmp_path, capsys):
    out = tmp_path / "scored"
    assert main(["lm-score", "hmm", "--model", str(tiny), "--out", str(out), "--n", "4", "--batch-size", "2", "--geometry",
                 "--geometry-n", "4", "--fresh-symbols", "--instruction", "--set", "S=2", "--set", "M=3", "--set", "K=6"]) == 0
    printed = json.loads(capsys.readouterr().out)
    saved = json.loads((out / "lm_score.json").read_text())
    assert saved["rows"]["language_model"]["kl_bits"] == printed["language_model"]["kl_bits"]
    assert saved["how"]["command"].startswith("windtunnel lm-score hmm --out")
    assert saved["model"]["path"] == tiny.name  # outside any installed package: its name, no path of this machine
    assert {p.name for p in out.iterdir()} - {".lock"} == {"lm_score.json", "calibration.png", "geometry.png", "report.md"}
    assert "A measurement, not a claim of the paper" in (out / "report.md").read_text()


@pytest.mark.parametrize("case", ["not_a_model_file", "folder_without_config", "missing", "no_format", "too_long",
                                  "not_single_tokens", "out_not_empty"])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(case, tiny, tmp_path, capsys):
    out, model, tunnel, sets = tmp_path / "out", str(tiny), "bijection", ["--set", "V=3"]
    if case == "not_a_model_file":
        (tmp_path / "weights.txt").write_text("no")
        model = str(tmp_path / "weights.txt")
    elif case == "folder_without_config":
        (tmp_path / "empty").mkdir()
        model = str(tmp_path / "empty")
    elif case == "missing":
        model = str(tmp_path / "nowhere")
    elif case == "no_format":
        tunnel, sets = "markov", []
    elif case == "too_long":
        model = str(_tiny_model(tmp_path / "short", max_positions=16))
        tunnel, sets = "hmm", ["--set", "S=2", "--set", "M=3", "--set", "K=10"]
    elif case == "not_single_tokens":
        sets = ["--set", "V=26"]  # " Z" and " z" are not in the tiny tokenizer's merges
    elif case == "out_not_empty":
        out.mkdir()
        (out / "kept").write_text("mine")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    capsys.readouterr()  # what building a model above printed is not the command's
    assert main(["lm-score", tunnel, "--model", model, "--out", str(out), "--n", "2", *sets]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("windtunnel: error:"), error
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
