"""Key orthogonality, QK sharpening and the value manifold on constructed cases with known answers.

The models here are built by hand: embeddings on chosen basis directions, projections
that read chosen coordinates, and blocks whose writes are zeroed so the residual stream
stays what was put in. Every expected number is then worked out on paper.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import scipy.stats
import torch
from matplotlib import image

from windtunnel.analysis import probes  # noqa: F401  (registers linear_probes for the end-to-end test)
from windtunnel.analysis.base import Run
from windtunnel.analysis.stats import average_ranks, pca, pearson, spearman
from windtunnel.analysis.attention import qk_sharpening
from windtunnel.analysis.keys import cosine_matrix, expected_abs_cosine, key_orthogonality, welch_rms_bound
from windtunnel.analysis.manifold import value_manifold
from windtunnel.analysis.runner import analyze_runs
from windtunnel.evaluation import EvalSet
from windtunnel.models import build_model
from windtunnel.run_config import run_config_from_mapping
from windtunnel.run_config import build_run_model
from windtunnel.tunnels import BijectionTunnel, Episode, HMMTunnel

D_MODEL, N_HEADS, D_HEAD = 16, 2, 8


def transformer(tunnel, *, n_layers: int = 2, no_attention_layers: tuple[int, ...] = (), seed: int = 0):
    return build_model(
        "transformer",
        {
            "n_layers": n_layers,
            "n_heads": N_HEADS,
            "d_model": D_MODEL,
            "d_mlp": 32,
            "no_attention_layers": no_attention_layers,
        },
        vocab_size=tunnel.vocab_size,
        num_classes=tunnel.num_classes,
        max_len=tunnel.seq_len(),
        generator=torch.Generator().manual_seed(seed),
    )


def episodes_of(tunnel, n: int = 64, seed: int = 0) -> list[Episode]:
    return list(EvalSet.draw(tunnel, horizon=tunnel.horizon, n=n, batch_size=n, seed=seed).episodes)


def e(*dims: int) -> torch.Tensor:
    """Sum of basis vectors of the residual stream."""
    v = torch.zeros(D_MODEL)
    v[list(dims)] = 1.0
    return v


@torch.no_grad()
def freeze_residual(model) -> None:
    """Zero what every block writes (attention W_O, MLP output): the residual stream passes
    through all layers unchanged, so every layer reads the embeddings."""
    for block in model.blocks:
        if block.attn is not None:
            block.attn.proj.weight.zero_()
        block.mlp.fc_out.weight.zero_()
        block.mlp.fc_out.bias.zero_()


@torch.no_grad()
def set_rows(model, layer: int, which: str, head: int, rows: list[torch.Tensor]) -> None:
    """Set head ``head``'s W_Q/W_K rows (one per head dimension; missing rows are zero)."""
    offset = {"q": 0, "k": D_MODEL}[which] + head * D_HEAD
    weight = model.blocks[layer].attn.qkv.weight  # [3 * d_model, d_model]
    weight[offset : offset + D_HEAD] = 0.0
    for f, row in enumerate(rows):
        weight[offset + f] = row


# --- key orthogonality -------------------------------------------------------------------


@torch.no_grad()
def orthogonal_key_model(tunnel: BijectionTunnel):
    """Layer 0 keys: head 0 orthogonal over the inputs x; head 1 gives x=0 and x=1 the same key.

    Input x embeds as e_{2x} - e_{2x+1} (zero mean over the 16 coordinates, so the
    LayerNorm only rescales it), outputs on coordinates 8..15, positions embed to zero.
    Head 0's key reads coordinates 0..7: the keys are the embeddings themselves, on
    disjoint supports. Head 1 reads (0+2, 1+3, 4, 5, 6, 7): x=0 and x=1 both map to (1, -1, 0...).
    """
    assert tunnel.V == 4
    model = transformer(tunnel, n_layers=2, no_attention_layers=(1,))
    model.token_embed.weight.zero_()
    for x in range(4):
        model.token_embed.weight[x] = e(2 * x) - e(2 * x + 1)
        model.token_embed.weight[4 + x] = e(8 + 2 * x) - e(9 + 2 * x)
    model.pos_embed.weight.zero_()
    set_rows(model, 0, "k", 0, [e(f) for f in range(8)])
    set_rows(model, 0, "k", 1, [e(0, 2), e(1, 3), e(4), e(5), e(6), e(7)])
    return model


def test_orthogonal_keys_have_zero_cosine_and_shared_keys_cosine_one():
    tunnel = BijectionTunnel(V=4)
    result = key_orthogonality([orthogonal_key_model(tunnel)], episodes_of(tunnel), tunnel)
    assert result["token_values"] == [0, 1, 2, 3]
    heads = result["heads_mean_abs_offdiag_cos"][0]
    assert heads[1] is None and [row["layer"] for row in result["layers"]] == [0]  # layer 1 has no attention
    # Head 0: disjoint supports, cos exactly 0. Head 1: one pair of 12 off-diagonal entries
    # (both orders) has cos 1, the rest 0: mean 2/12. Float32 keys: 1e-6 is generous.
    assert heads[0][0] == pytest.approx(0.0, abs=1e-6)
    assert heads[0][1] == pytest.approx(2 / 12, abs=1e-6)
    assert result["frame_heads"] == [{"layer": 0, "head": 0, "mean_abs_offdiag_cos": pytest.approx(0.0, abs=1e-6)}]
    assert torch.tensor(result["frame_head_cos"]) == pytest.approx(torch.eye(4), abs=1e-6)
    # Centered orthonormal vectors have cosine -1/(X-1) off the diagonal: the stated reference.
    assert result["heads_mean_abs_offdiag_cos_centered"][0][0][0] == pytest.approx(1 / 3, abs=1e-6)
    assert result["centered_orthonormal_reference"] == pytest.approx(1 / 3)
    assert result["layers"][0]["mean_abs_offdiag_cos"]["mean"] == pytest.approx(1 / 12, abs=1e-6)  # (0 + 1/6) / 2


def test_hmm_keys_are_compared_over_observation_symbols_and_skip_the_output_token_measure():
    tunnel = HMMTunnel(S=2, M=3, K=4, grid=0.25)
    result = key_orthogonality([transformer(tunnel)], episodes_of(tunnel), tunnel)
    assert result["token_values"] == [5, 6, 7]  # symbol o is token N + 1 + o with N = 1/grid = 4
    assert len(result["frame_head_cos"]) == 3 and len(result["layers"]) == 2
    # No hidden state is ever a token: the authors' output-token measure has nothing to read.
    assert "normalized_output_keys_abs" not in result["measures"]
    assert "hypothesis tokens" in result["measures_skipped"]["normalized_output_keys_abs"]
    assert set(result["measures"]) == {
        "in_context_input_keys",
        "in_context_input_keys_centered",
        "embedding_keys_all_tokens_signed",
    }
    assert result["measures"]["embedding_keys_all_tokens_signed"]["tokens"] == list(range(tunnel.vocab_size))


def test_the_in_context_measures_are_the_existing_numbers():
    tunnel = BijectionTunnel(V=4)
    result = key_orthogonality([orthogonal_key_model(tunnel)], episodes_of(tunnel), tunnel)
    measures = result["measures"]
    assert measures["in_context_input_keys"]["heads"] == result["heads_mean_abs_offdiag_cos"]
    assert measures["in_context_input_keys_centered"]["heads"] == result["heads_mean_abs_offdiag_cos_centered"]
    layer0 = measures["in_context_input_keys"]["layers"][0]
    assert layer0["mean_over_heads"] == result["layers"][0]["mean_abs_offdiag_cos"]
    assert layer0["best_head"]["mean"] == result["frame_heads"][0]["mean_abs_offdiag_cos"]  # the frame head
    assert measures["in_context_input_keys"]["tokens"] == [0, 1, 2, 3]
    assert measures["in_context_input_keys"]["d_head"] == D_HEAD
    # Without initial models every random-init field is None.
    assert result["random_init"] is None
    assert layer0["random_init_mean_over_heads"] is None and layer0["random_init_best_head"] is None
    assert all(m["random_init_heads"] is None for m in measures.values())


@pytest.mark.parametrize("d", [8, 16, 32])
def test_expected_abs_cosine_is_the_mean_of_the_square_root_of_a_beta(d):
    # cos^2 of two isotropic directions in d dimensions is Beta(1/2, (d-1)/2): scipy
    # integrates E[sqrt(cos^2)] numerically (quad's default tolerance is 1.5e-8).
    oracle = scipy.stats.beta(0.5, (d - 1) / 2).expect(np.sqrt)
    assert expected_abs_cosine(d) == pytest.approx(oracle, abs=1e-7)


def test_the_welch_bound_is_attained_by_a_regular_simplex_and_zero_when_the_vectors_fit():
    d = 5
    # A regular simplex: the d + 1 basis vectors of R^(d+1), centered (they then span d
    # dimensions), written in an orthonormal basis of that span and normalized.
    centered = torch.eye(d + 1, dtype=torch.float64) - 1 / (d + 1)
    basis, _ = torch.linalg.qr(centered[:, :d])  # [d + 1, d]: orthonormal basis of the centered span
    simplex = centered @ basis  # [d + 1, d]
    cos = cosine_matrix(simplex)
    off = ~torch.eye(d + 1, dtype=torch.bool)
    assert cos[off] == pytest.approx(torch.full((d * (d + 1),), -1 / d, dtype=torch.float64), abs=1e-12)
    rms = cos[off].square().mean().sqrt().item()
    assert welch_rms_bound(d + 1, d) == pytest.approx(1 / d, abs=1e-15) == pytest.approx(rms, abs=1e-12)
    assert welch_rms_bound(d, d) == welch_rms_bound(3, d) == welch_rms_bound(1, d) == 0.0  # orthonormal vectors fit
    # Any other configuration has an RMS at least the bound (a theorem, so no tolerance).
    random = torch.randn(20, d, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    off = ~torch.eye(20, dtype=torch.bool)
    assert cosine_matrix(random)[off].square().mean().sqrt().item() >= welch_rms_bound(20, d)


@torch.no_grad()
def embedding_key_model(tunnel: BijectionTunnel):
    """Token t (of 2V = 6) embeds as e_t + e_8: one-hot plus a component every token shares.

    Both layers, both heads: head 0's key reads coordinates 0..7, so the keys are e_t, orthonormal.
    Head 1's key reads coordinates 0..5 and, into its last dimension, coordinate 8: keys
    e_t + e_7 (in head space), which share one unit component: every off-diagonal cosine is 1/2.
    """
    assert tunnel.V == 3
    model = transformer(tunnel)
    model.token_embed.weight.zero_()
    for t in range(6):
        model.token_embed.weight[t] = e(t, 8)
    for layer in (0, 1):
        set_rows(model, layer, "k", 0, [e(f) for f in range(8)])
        set_rows(model, layer, "k", 1, [e(f) for f in range(6)] + [torch.zeros(D_MODEL), e(8)])
    return model


def test_embedding_keys_signed_mean_sees_a_shared_component_and_orthogonal_keys_score_zero():
    tunnel = BijectionTunnel(V=3)
    result = key_orthogonality([embedding_key_model(tunnel)], episodes_of(tunnel), tunnel)
    measure = result["measures"]["embedding_keys_all_tokens_signed"]
    assert measure["tokens"] == list(range(6)) and measure["statistic"] == "signed_mean_cos"
    assert measure["chance"] == {"expected_signed_cos": 0.0}
    # Head 0: orthonormal keys, cos 0. Head 1: cos a^2 / (1 + a^2) = 1/2 with a = 1 for every pair.
    # float64 from float32 weights that are exactly 0 and 1: 1e-12.
    for layer in (0, 1):
        assert measure["heads"][0][layer] == pytest.approx([0.0, 0.5], abs=1e-12)
        row = measure["layers"][layer]
        assert row["mean_over_heads"]["mean"] == pytest.approx(0.25, abs=1e-12)
        assert row["best_head"]["mean"] == pytest.approx(0.0, abs=1e-12)


def test_embedding_keys_signed_mean_of_a_shared_key_pair():
    # The orthogonal-key model's head 1 gives x=0 and x=1 the key (1, -1, 0...) and x=2, x=3
    # keys on disjoint supports; its outputs embed on coordinates 8..15, which neither head
    # reads (zero keys: cosine 0 by convention). Head 1: the pair (0, 1) in both orders of
    # 8 * 7 off-diagonal entries, 2/56; head 0: 0.
    tunnel = BijectionTunnel(V=4)
    result = key_orthogonality([orthogonal_key_model(tunnel)], episodes_of(tunnel), tunnel)
    heads = result["measures"]["embedding_keys_all_tokens_signed"]["heads"][0]
    assert heads[0] == pytest.approx([0.0, 2 / 56], abs=1e-12) and heads[1] is None  # layer 1 has no attention


def normalized_output_keys(model, tunnel):
    result = key_orthogonality([model], episodes_of(tunnel, n=16), tunnel)
    return result["measures"]["normalized_output_keys_abs"]


@torch.no_grad()
def test_normalized_output_keys_read_the_centered_scaled_embedding_only():
    tunnel = BijectionTunnel(V=3)
    model = embedding_key_model(tunnel)
    measure = normalized_output_keys(model, tunnel)
    assert measure["tokens"] == [3, 4, 5] and measure["n_tokens"] == 3
    # Output token t embeds as e_t + e_8 over 16 coordinates: LayerNorm centering subtracts 1/8
    # everywhere (its scale does not change a cosine). Head 0 reads coordinates 0..7: 7/8 at t,
    # -1/8 elsewhere, so for t != u: dot (2 (7/8)(-1/8) + 6/64) = -8/64, norm^2 (49 + 7)/64,
    # cos -1/7. Head 1 reads 0..5 and coordinate 8 (7/8): dot (-14 + 4 + 49)/64, norm^2
    # (49 + 5 + 49)/64, cos 39/103. LayerNorm eps (1e-5 on a variance 7/64) scales all
    # coordinates alike: no effect on a cosine; float64 arithmetic: 1e-12.
    expected = [1 / 7, 39 / 103]
    assert measure["heads"][0][0] == pytest.approx(expected, abs=1e-12)
    assert measure["layers"][0]["best_head"]["mean"] == pytest.approx(1 / 7, abs=1e-12)  # the authors' number
    assert measure["layers"][0]["mean_over_heads"]["mean"] == pytest.approx(sum(expected) / 2, abs=1e-12)
    # 3 keys fit in d_head = 8 dimensions: the Welch bound is 0.
    assert measure["chance"] == {"expected_abs_cos": expected_abs_cosine(D_HEAD), "welch_rms_bound": 0.0}
    # Neither the position embedding nor the LayerNorm shift enters; the LayerNorm scale and
    # the embedding do.
    model.pos_embed.weight.normal_(generator=torch.Generator().manual_seed(1))
    model.blocks[0].attn.ln.bias.fill_(0.7)
    assert normalized_output_keys(model, tunnel)["heads"][0][0] == pytest.approx(expected, abs=1e-12)
    model.blocks[0].attn.ln.weight[8] = 0.0  # head 1 loses its shared component: cos (-14 + 4)/(49 + 5) < 0
    assert normalized_output_keys(model, tunnel)["heads"][0][0][1] == pytest.approx(10 / 54, abs=1e-12)
    model.blocks[0].attn.ln.weight[8] = 1.0
    model.token_embed.weight[3] = e(3)  # token 3 loses the shared component
    assert normalized_output_keys(model, tunnel)["heads"][0][0] != pytest.approx(expected, abs=1e-3)


def test_random_init_fields_are_the_same_analysis_of_the_initial_models():
    tunnel = BijectionTunnel(V=4)
    trained, initial = orthogonal_key_model(tunnel), transformer(tunnel, no_attention_layers=(1,), seed=3)
    episodes = episodes_of(tunnel)
    result = key_orthogonality([trained], episodes, tunnel, initial_models=[initial])
    reference = key_orthogonality([initial], episodes, tunnel)
    for key in ("layers", "heads_mean_abs_offdiag_cos", "frame_heads", "frame_head_mean_abs_offdiag_cos"):
        assert result["random_init"][key] == reference[key]
    for name, measure in result["measures"].items():
        assert measure["random_init_heads"] == reference["measures"][name]["heads"]
        for row, ref in zip(measure["layers"], reference["measures"][name]["layers"]):
            assert row["random_init_mean_over_heads"] == ref["mean_over_heads"]
            assert row["random_init_best_head"] == ref["best_head"]
        assert measure["heads"] != measure["random_init_heads"]  # the trained numbers are the trained model's


# --- QK sharpening -------------------------------------------------------------------------


def test_bijection_key_categories_of_a_written_out_sequence():
    # V = 4; pairs (1 -> 2), (3 -> 0), then x=1 again: tokens x=1 y=2 x=3 y=0 x=1 y=2.
    tokens = torch.tensor([[1, 6, 3, 4, 1, 6]])
    episode = Episode(
        tokens, torch.tensor([0, 2, 4]), torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 3, 4), torch.zeros(1, 3)
    )
    categories = {
        name: mask[0].nonzero().tolist() for name, mask in BijectionTunnel(V=4).attention_categories(episode).items()
    }
    assert categories == {
        # query p=1 (x=3, new): every earlier output is evidence; p=2 (x=1, repeat): the answer y=2 at position 1
        "evidence": [[1, 1], [2, 1]],
        "matching_input": [[2, 0]],
        "other_output": [[2, 3]],
        "other_input": [[1, 0], [2, 2]],
        "self": [[0, 0], [1, 2], [2, 4]],
    }


@pytest.mark.parametrize(
    "tunnel", [BijectionTunnel(V=5, with_replacement=True, L=8), HMMTunnel(S=2, M=2, K=3, grid=0.5)]
)
def test_key_categories_partition_the_causal_keys(tunnel):
    episode = episodes_of(tunnel, n=32)[0]
    categories = tunnel.attention_categories(episode)
    count = sum(mask.long() for mask in categories.values())  # [B, P, T]
    causal = torch.arange(episode.tokens.shape[1])[None, :] <= episode.positions[:, None]  # [P, T]
    assert torch.equal(count, causal.long().expand_as(count))


@torch.no_grad()
def uniform_attention(model) -> None:
    """Zero W_Q everywhere: every score is 0, so each query attends uniformly to its causal keys."""
    for block in model.blocks:
        block.attn.qkv.weight[:D_MODEL] = 0.0


def test_uniform_attention_gives_count_shares_and_log2_keys():
    tunnel = BijectionTunnel(V=6)  # queries at 0, 2, 4, 6, 8; the first sees only itself and is left out
    model = transformer(tunnel)
    uniform_attention(model)
    result = qk_sharpening([model], episodes_of(tunnel), tunnel)
    k = torch.arange(1, 5, dtype=torch.float64)  # earlier pairs at queries 2, 4, 6, 8
    expected = {"evidence": k / (2 * k + 1), "other_input": k / (2 * k + 1), "self": 1 / (2 * k + 1)}
    entropy = torch.log2(2 * k + 1).mean().item()
    assert result["uniform_entropy_bits"] == pytest.approx(entropy, abs=1e-12)
    for row in result["layers"]:
        for name, share in expected.items():
            # float32 softmax of equal scores: exact to ~1e-7
            assert row["mass"][name]["mean"] == pytest.approx(share.mean().item(), abs=1e-6)
            assert result["uniform_mass"][name] == pytest.approx(share.mean().item(), abs=1e-12)
        assert row["mass"]["matching_input"]["mean"] == 0 and row["mass"]["other_output"]["mean"] == 0
        assert row["entropy_bits"]["mean"] == pytest.approx(entropy, abs=1e-5)
        assert row["lift"]["evidence"] == pytest.approx(1.0, abs=1e-5)


@torch.no_grad()
def sharpening_model(tunnel: BijectionTunnel):
    """Layer 0 attends uniformly; layer 1's queries at inputs attend only to output tokens.

    Inputs embed as e_2 - e_3, outputs as e_0 - e_1 (LayerNorm scales both by s = 1/sqrt(2/16)).
    Layer 1: q reads 5 (x_2 - x_3), k reads (x_0 - x_1): score 5 * (2s)^2 / sqrt(8) ~ 57 on
    outputs, 0 elsewhere, so the mass off the outputs is below 10 * e^-57.
    """
    model = transformer(tunnel)
    freeze_residual(model)
    model.token_embed.weight[: tunnel.V] = e(2) - e(3)
    model.token_embed.weight[tunnel.V :] = e(0) - e(1)
    model.pos_embed.weight.zero_()
    uniform_attention(model)
    for head in range(N_HEADS):
        set_rows(model, 1, "q", head, [5 * (e(2) - e(3))])
        set_rows(model, 1, "k", head, [e(0) - e(1)])
    return model


def test_focused_attention_puts_all_mass_on_the_evidence_with_entropy_log2_k():
    tunnel = BijectionTunnel(V=6)
    result = qk_sharpening([sharpening_model(tunnel)], episodes_of(tunnel), tunnel)
    first, second = result["layers"]
    k = torch.arange(1, 5, dtype=torch.float64)
    assert first["mass"]["evidence"]["mean"] == pytest.approx((k / (2 * k + 1)).mean().item(), abs=1e-6)
    assert second["mass"]["evidence"]["mean"] == pytest.approx(1.0, abs=1e-6)
    assert second["heads"]["mass"]["evidence"] == pytest.approx([1.0, 1.0], abs=1e-6)
    # Uniform over the k earlier outputs: log2 k bits.
    assert second["entropy_bits"]["mean"] == pytest.approx(torch.log2(k).mean().item(), abs=1e-5)
    assert second["entropy_bits"]["mean"] < first["entropy_bits"]["mean"]  # sharpened with depth


def test_hmm_uniform_attention_splits_header_and_observations_by_count():
    tunnel = HMMTunnel(S=2, M=2, K=3, grid=0.5)  # header: 4 tokens of T, 4 of E; queries at 8, 9, 10
    model = transformer(tunnel)
    uniform_attention(model)
    result = qk_sharpening([model], episodes_of(tunnel), tunnel)
    n_keys = torch.tensor([9.0, 10.0, 11.0], dtype=torch.float64)
    expected = {
        "header_transition": (4 / n_keys).mean(),
        "header_emission": (4 / n_keys).mean(),
        "observations": (torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64) / n_keys).mean(),
        "self": (1 / n_keys).mean(),
    }
    for name, share in expected.items():
        assert result["layers"][0]["mass"][name]["mean"] == pytest.approx(share.item(), abs=1e-6)
    assert result["layers"][1]["entropy_bits"]["mean"] == pytest.approx(torch.log2(n_keys).mean().item(), abs=1e-5)


@torch.no_grad()
def query_key_cosine_model(tunnel: BijectionTunnel):
    """Both layers: queries and keys whose cosines depend on the pair index, by construction.

    Inputs embed as e_2 - e_3; the k-th input's position (2k) adds k (e_6 - e_7); outputs and
    their positions are left random (the measure reads the inputs only). Every input's
    residual has zero mean, so the LayerNorm only rescales it, which no cosine sees.
    Head 0: q reads (x_2 - x_3), k reads (x_2 - x_3, x_6 - x_7): q_i = (2, 0), k_j = (2, 2j),
    cos 1/sqrt(1 + j^2). Head 1: q reads (x_6 - x_7), k reads (x_2 - x_3): q_i = (2i), k_j = (2),
    cos 1 for every query i >= 1 (the only ones with an earlier key).
    """
    model = transformer(tunnel)
    freeze_residual(model)
    model.token_embed.weight[: tunnel.V] = e(2) - e(3)
    for k in range(tunnel.L):
        model.pos_embed.weight[2 * k] = k * (e(6) - e(7))
    for layer in (0, 1):
        set_rows(model, layer, "q", 0, [e(2) - e(3)])
        set_rows(model, layer, "k", 0, [e(2) - e(3), e(6) - e(7)])
        set_rows(model, layer, "q", 1, [e(6) - e(7)])
        set_rows(model, layer, "k", 1, [e(2) - e(3)])
    return model


def test_the_authors_query_key_cosine_of_hand_set_queries_and_keys():
    tunnel = BijectionTunnel(V=6)  # 5 inputs, at positions 0, 2, 4, 6, 8
    result = qk_sharpening([query_key_cosine_model(tunnel)], episodes_of(tunnel), tunnel)
    authors = result["authors_query_key_cosine"]
    expected = [[(1 + 1 / math.sqrt(1 + j * j)) / 2 if j < i else None for j in range(5)] for i in range(5)]
    pairs = [v for row in expected for v in row if v is not None]
    for layer in (0, 1):
        heatmap = authors["heatmap"][layer]
        assert [[v is None for v in row] for row in heatmap] == [[v is None for v in row] for row in expected]
        for row, expected_row in zip(heatmap, expected):
            # float32 queries and keys, cosines in float64: 1e-6 covers the rounding
            earlier = [v for v in expected_row if v is not None]
            assert [v for v in row if v is not None] == pytest.approx(earlier, abs=1e-6)
        assert authors["layers"][layer]["mean_cos"]["mean"] == pytest.approx(sum(pairs) / len(pairs), abs=1e-6)
        assert authors["layers"][layer]["random_init_mean_cos"] is None
    assert "no scalar and no threshold" in authors["note"]
    assert all(row["random_init"] is None for row in result["layers"])


def test_qk_random_init_fields_are_the_same_analysis_of_the_initial_models():
    tunnel = BijectionTunnel(V=6)
    trained, initial = sharpening_model(tunnel), transformer(tunnel, seed=5)
    episodes = episodes_of(tunnel, n=32)
    result = qk_sharpening([trained], episodes, tunnel, initial_models=[initial])
    reference = qk_sharpening([initial], episodes, tunnel)
    for row, ref in zip(result["layers"], reference["layers"]):
        assert row["random_init"] == {"lift": ref["lift"], "entropy_bits": ref["entropy_bits"]}
        assert row["random_init"]["lift"] != row["lift"]
    for row, ref in zip(result["authors_query_key_cosine"]["layers"], reference["authors_query_key_cosine"]["layers"]):
        assert row["random_init_mean_cos"] == ref["mean_cos"]


def test_hmm_query_key_cosine_reads_the_observations():
    tunnel = HMMTunnel(S=2, M=2, K=3, grid=0.5)  # observations at 8, 9, 10
    result = qk_sharpening([transformer(tunnel)], episodes_of(tunnel, n=16), tunnel)
    heatmap = result["authors_query_key_cosine"]["heatmap"][0]
    assert [[v is not None for v in row] for row in heatmap] == [[False] * 3, [True, False, False], [True, True, False]]


# --- value manifold ------------------------------------------------------------------------


def test_pca_recovers_a_known_variance_split_and_the_generating_coordinate():
    generator = torch.Generator().manual_seed(0)
    N = 500
    a = torch.randn(N, generator=generator, dtype=torch.float64)
    a -= a.mean()
    b = torch.randn(N, generator=generator, dtype=torch.float64)
    b -= b.mean()
    b -= (b @ a) / (a @ a) * a  # exactly orthogonal to a, still centered
    b *= 0.5 * a.norm() / b.norm()  # |b|^2 = |a|^2 / 4: variance split 0.8 / 0.2
    directions, _ = torch.linalg.qr(torch.randn(6, 2, generator=generator, dtype=torch.float64))  # orthonormal [6, 2]
    points = a[:, None] * directions[:, 0] + b[:, None] * directions[:, 1] + 3.0  # an offset PCA must remove
    ratio, scores = pca(points)
    assert ratio[:2].tolist() == pytest.approx([0.8, 0.2], abs=1e-12)
    assert ratio[2:].abs().max() < 1e-12
    assert torch.allclose(scores[:, 0].abs(), a.abs(), atol=1e-10)
    entropy = torch.exp(a)  # monotone in a: PC1 ranks it perfectly, in one direction or the other
    assert abs(spearman(scores[:, 0], entropy)) == pytest.approx(1.0, abs=1e-12)


def test_spearman_matches_scipy_with_ties():
    generator = torch.Generator().manual_seed(1)
    x = torch.randint(0, 6, (300,), generator=generator).double()  # many ties, like the bijection's entropies
    y = x + torch.randn(300, generator=generator, dtype=torch.float64)
    assert average_ranks(x).tolist() == pytest.approx(scipy.stats.rankdata(x.numpy()).tolist(), abs=1e-12)
    assert spearman(x, y) == pytest.approx(scipy.stats.spearmanr(x.numpy(), y.numpy()).statistic, abs=1e-12)
    assert spearman(-x, y) == pytest.approx(-spearman(x, y), abs=1e-12)
    assert math.isnan(spearman(torch.ones(5), torch.arange(5.0)))


@torch.no_grad()
def test_a_residual_stream_that_is_entropy_along_one_direction_has_one_component():
    tunnel = BijectionTunnel(V=6)
    model = transformer(tunnel)
    freeze_residual(model)  # the last resid_post is the embedding sum, exactly
    model.token_embed.weight.zero_()
    model.pos_embed.weight.zero_()
    direction = e(0, 5, 9) / math.sqrt(3)
    for k in range(tunnel.L):  # the k-th input (position 2k) has entropy log2(V - k)
        model.pos_embed.weight[2 * k] = math.log2(tunnel.V - k) * direction
    result = value_manifold([model], episodes_of(tunnel))
    resid = result["spaces"]["resid_post"]
    assert resid["pc1_variance"]["mean"] == pytest.approx(1.0, abs=1e-6)  # rank one up to float32 rounding
    # Points at the same position are identical, but their PC scores differ by SVD rounding
    # (~1e-16), which breaks ties the entropies keep: a loss of order 1e-4 in rank correlation.
    assert resid["spearman_pc1_entropy"]["mean"] == pytest.approx(1.0, abs=1e-3)
    assert set(result["spaces"]) == {"resid_post", "attn_v", "attn_z"}
    scatter = resid["scatter"]
    assert len(scatter["pc1"]) == len(scatter["entropy_bits"]) == result["n_points"] == 64 * 5
    # Oriented: PC1 rises with the entropy.
    assert scipy.stats.spearmanr(scatter["pc1"], scatter["entropy_bits"]).statistic > 0.99


def test_pearson_matches_scipy():
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(200, generator=generator, dtype=torch.float64)
    y = x.square() + torch.randn(200, generator=generator, dtype=torch.float64)
    assert pearson(x, y) == pytest.approx(scipy.stats.pearsonr(x.numpy(), y.numpy()).statistic, abs=1e-12)
    assert pearson(x, 3 * x + 1) == pytest.approx(1.0, abs=1e-12) and pearson(-x, x) == pytest.approx(-1.0, abs=1e-12)
    assert math.isnan(pearson(torch.ones(5), torch.arange(5.0)))


@torch.no_grad()
def manifold_model(tunnel: BijectionTunnel) -> tuple[object, torch.Tensor, float]:
    """A frozen residual stream whose final LayerNorm output is known exactly, position by position.

    The k-th input (position 2k) holds H_k (e_2 - e_3) + g_k (e_4 - e_5), its value token
    (2k + 1) a_k (e_2 - e_3) + H_k (e_6 - e_7) + g'_k (e_4 - e_5), with H_k = log2(V - k) the
    exact entropy there. g and g' make every squared norm R^2, so the LayerNorm divides
    every position by the same sigma = sqrt(2 R^2 / 16 + eps); its scale is zero on
    coordinates 4 and 5, so ln_final is H_k (e_2 - e_3) / sigma at the inputs and
    (a_k (e_2 - e_3) + H_k (e_6 - e_7)) / sigma at the values. a is uncorrelated with H
    over k and has 4 times its variance: at the values PC1 (a) takes 4/5 of the variance
    and does not correlate with H; PC2 is H itself.

    Returns the model, ``a`` and ``R^2``.
    """
    model = transformer(tunnel)
    freeze_residual(model)
    model.token_embed.weight.zero_()
    model.pos_embed.weight.zero_()
    k = torch.arange(tunnel.L, dtype=torch.float64)
    entropy = torch.log2(tunnel.V - k)  # [L]
    centered = entropy - entropy.mean()
    a = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0], dtype=torch.float64)
    a = a - a.mean()
    a = a - (a @ centered) / (centered @ centered) * centered  # zero mean, orthogonal to H - mean(H)
    a = a * 2 * centered.norm() / a.norm()  # variance 4 var(H)
    R2 = (a.square() + entropy.square()).max().item() + 1.0
    for i in range(tunnel.L):
        h, g, g_value = entropy[i].item(), math.sqrt(R2 - entropy[i] ** 2), math.sqrt(R2 - a[i] ** 2 - entropy[i] ** 2)
        model.pos_embed.weight[2 * i] = h * (e(2) - e(3)) + g * (e(4) - e(5))
        model.pos_embed.weight[2 * i + 1] = a[i].item() * (e(2) - e(3)) + h * (e(6) - e(7)) + g_value * (e(4) - e(5))
    model.ln_final.weight[4:6] = 0.0
    return model, a, R2


def test_the_authors_manifold_measures_on_a_known_final_layernorm_output():
    tunnel = BijectionTunnel(V=6)
    model, _, _ = manifold_model(tunnel)
    result = value_manifold([model], episodes_of(tunnel), tunnel=tunnel)
    measures = result["measures"]
    assert set(measures) == {
        "resid_supervised_spearman_pc1",
        "ln_final_value_positions_max_pearson",
        "ln_final_supervised_abs_pearson_pc1",
    } and result["measures_skipped"] == {}
    # Tolerances: float32 activations (relative rounding ~6e-8) through float64 PCA; 1e-6.
    # At the inputs ln_final is H_k times one direction: one component, Pearson 1.
    supervised = measures["ln_final_supervised_abs_pearson_pc1"]
    assert supervised["activation"] == "ln_final" and supervised["n_points"] == 64 * 5
    assert supervised["pc1_variance"]["mean"] == pytest.approx(1.0, abs=1e-6)
    assert supervised["correlation"]["value"]["mean"] == pytest.approx(1.0, abs=1e-6)
    assert supervised["correlation"]["pc"] == 1 and supervised["correlation"]["statistic"] == "abs_pearson_pc1"
    # At the value tokens (p + 1), labelled with the entropy at p: PC1 holds 4/5 of the
    # variance and is uncorrelated with H; the max over PCs finds H on PC2. Reading p instead
    # would give PC1 = 100%, pc 1.
    values = measures["ln_final_value_positions_max_pearson"]
    assert values["n_points"] == 64 * 5 and values["activation"] == "ln_final"
    assert values["pc1_variance"]["mean"] == pytest.approx(0.8, abs=1e-6)
    assert values["correlation"] == {
        "statistic": "max_abs_pearson_pc1_to_pc5",
        "value": {"mean": pytest.approx(1.0, abs=1e-6), "std": 0.0, "median": pytest.approx(1.0, abs=1e-6),
                  "min": pytest.approx(1.0, abs=1e-6), "max": pytest.approx(1.0, abs=1e-6)},
        "pc": 2,
    }
    # Ours reads the residual stream before the final norm: the numbers of spaces["resid_post"].
    ours, space = measures["resid_supervised_spearman_pc1"], result["spaces"]["resid_post"]
    assert ours["pc1_variance"] == space["pc1_variance"]
    assert ours["correlation"]["value"] == space["spearman_pc1_entropy"] and ours["correlation"]["pc"] == 1
    assert ours["activation"] == "blocks.1.resid_post" and ours["random_init"] is None


def test_the_max_over_pcs_skips_components_that_are_float_rounding():
    tunnel = BijectionTunnel(V=6)
    model, a, R2 = manifold_model(tunnel)
    with torch.no_grad():  # value tokens now hold a alone: one component, uncorrelated with H
        for i in range(tunnel.L):
            model.pos_embed.weight[2 * i + 1] = a[i].item() * (e(2) - e(3)) + math.sqrt(R2 - a[i] ** 2) * (e(4) - e(5))
    result = value_manifold([model], episodes_of(tunnel), tunnel=tunnel)
    values = result["measures"]["ln_final_value_positions_max_pearson"]
    assert values["pc1_variance"]["mean"] == pytest.approx(1.0, abs=1e-6)  # float32 rounding, as above
    # a is orthogonal to H - mean(H) in float64; stored in float32 its correlation is ~1e-7.
    assert values["correlation"]["value"]["mean"] == pytest.approx(0.0, abs=1e-5)
    # PC2..PC5 carry ~1e-17 of the variance (rounding), whose scores can correlate with H by
    # chance (|r| ~ 0.7 here): they are skipped, and PC1 stands.
    assert values["correlation"]["pc"] == 1


def test_a_final_query_has_no_value_token_and_is_dropped():
    tunnel = BijectionTunnel(V=6, query=True)  # supervised at 0, 2, .., 8 and the query at 10 (the last position)
    result = value_manifold([transformer(tunnel)], episodes_of(tunnel, n=16), tunnel=tunnel)
    assert result["measures"]["ln_final_supervised_abs_pearson_pc1"]["n_points"] == 16 * 6
    assert result["measures"]["ln_final_value_positions_max_pearson"]["n_points"] == 16 * 5


def test_hmm_manifold_skips_the_value_positions_and_fills_random_init_from_the_initial_models():
    tunnel = HMMTunnel(S=2, M=2, K=3, grid=0.5)
    trained, initial = transformer(tunnel), transformer(tunnel, seed=7)
    episodes = episodes_of(tunnel, n=32)
    result = value_manifold([trained], episodes, tunnel=tunnel, initial_models=[initial])
    assert set(result["measures"]) == {"resid_supervised_spearman_pc1", "ln_final_supervised_abs_pearson_pc1"}
    assert "no value tokens" in result["measures_skipped"]["ln_final_value_positions_max_pearson"]
    reference = value_manifold([initial], episodes, tunnel=tunnel)["measures"]
    for name, measure in result["measures"].items():
        assert measure["random_init"] == {key: reference[name][key] for key in ("pc1_variance", "correlation")}
        assert measure["random_init"]["pc1_variance"] != measure["pc1_variance"]


def test_value_manifold_of_the_mlp_control_reads_the_residual_stream_only():
    tunnel = BijectionTunnel(V=6)
    model = build_model(
        "mlp", {"d_model": 16, "n_blocks": 2, "d_hidden": 32}, vocab_size=12, num_classes=6, max_len=tunnel.seq_len()
    )
    result = value_manifold([model], episodes_of(tunnel))
    assert (
        list(result["spaces"]) == ["resid_post"]
        and result["spaces"]["resid_post"]["activation"] == "blocks.1.resid_post"
    )


# --- the registered analyses, end to end ---------------------------------------------------

CONFIG = {
    "tunnel": {"name": "bijection", "V": 6},
    "model": {"kind": "transformer", "n_layers": 2, "n_heads": 2, "d_model": 16, "d_mlp": 32},
    "eval": {"n": 64, "batch_size": 32},
}


def test_registered_analyses_average_seeds_and_draw_figures(tmp_path):
    runs = []
    for seed in (0, 1):
        config = run_config_from_mapping(CONFIG, [f"train.seed={seed}"])
        runs.append(Run(tmp_path / f"seed{seed}", config, build_run_model(config).eval(), 0))
    names = ["key_orthogonality", "qk_sharpening", "value_manifold", "linear_probes"]
    written = analyze_runs(runs, tmp_path / "out", only=names)
    assert list(written) == names
    for name in names:
        result = json.loads(written[name].read_text())
        assert result["runs"] == 2
        pixels = image.imread(tmp_path / "out" / f"{name}.png")
        assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.std() > 0
    keys = json.loads(written["key_orthogonality"].read_text())
    assert len(keys["frame_heads"]) == 2 and len(keys["heads_mean_abs_offdiag_cos"]) == 2
    sharpening = json.loads(written["qk_sharpening"].read_text())
    assert [row["layer"] for row in sharpening["layers"]] == [0, 1]
    for row in sharpening["layers"]:  # the categories partition the keys: the masses sum to 1
        assert sum(row["mass"][name]["mean"] for name in sharpening["categories"]) == pytest.approx(1.0, abs=1e-6)
    # These runs are untrained (step 0), so their initial models, rebuilt from the configs,
    # are the models themselves: every random-init number equals the trained one, exactly
    # (the same code on the same weights).
    assert keys["random_init"]["layers"] == keys["layers"]
    for measure in keys["measures"].values():
        assert measure["random_init_heads"] == measure["heads"]
        assert all(row["random_init_best_head"] == row["best_head"] for row in measure["layers"])
    for row in sharpening["layers"]:
        assert row["random_init"] == {"lift": row["lift"], "entropy_bits": row["entropy_bits"]}
    for row in sharpening["authors_query_key_cosine"]["layers"]:
        assert row["random_init_mean_cos"] == row["mean_cos"]
    manifold = json.loads(written["value_manifold"].read_text())
    assert len(manifold["measures"]) == 3  # the bijection has value tokens
    for measure in manifold["measures"].values():
        assert measure["random_init"] == {key: measure[key] for key in ("pc1_variance", "correlation")}


@torch.no_grad()
def test_the_shifted_output_key_measure_keeps_the_layernorm_shift():
    """The variant the authors' later script computes on a norm with a shift: LN(tok_emb) with
    the shift, then W_K. Expected keys from the definition in numpy: (x - mean) / sqrt(var + eps)
    * scale + shift on token t's embedding e_t + e_8, then each head's read-out coordinates."""
    tunnel = BijectionTunnel(V=3)
    model = embedding_key_model(tunnel)
    model.blocks[0].attn.ln.bias.fill_(0.7)
    result = key_orthogonality([model], episodes_of(tunnel, n=16), tunnel)
    shifted, plain = result["measures"]["normalized_output_keys_abs_shifted"], result["measures"]["normalized_output_keys_abs"]
    eps = model.blocks[0].attn.ln.eps
    expected = []
    for coordinates in (list(range(8)), [*range(6), 8]):  # head 0 reads 0..7; head 1 reads 0..5 and 8
        keys = []
        for t in (3, 4, 5):
            x = np.zeros(D_MODEL)
            x[[t, 8]] = 1.0
            normalized = (x - x.mean()) / np.sqrt(x.var() + eps) + float(np.float32(0.7))  # the shift as stored
            keys.append(normalized[coordinates])
        keys = np.array(keys)
        unit = keys / np.linalg.norm(keys, axis=1, keepdims=True)
        cosines = unit @ unit.T
        expected.append(np.abs(cosines[~np.eye(3, dtype=bool)]).mean())
    # float64 arithmetic on the same float32 weights, in another order: 1e-12
    assert shifted["heads"][0][0] == pytest.approx(expected, abs=1e-12)
    assert plain["heads"][0][0] == pytest.approx([1 / 7, 39 / 103], abs=1e-12)  # the shift is left out there
    assert shifted["heads"][0][0] != pytest.approx(plain["heads"][0][0], abs=1e-2)
    assert shifted["tokens"] == [3, 4, 5]
