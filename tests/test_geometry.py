"""Key orthogonality, QK sharpening and the value manifold on constructed cases with known answers.

The models here are built by hand: embeddings on chosen basis directions, projections
that read chosen coordinates, and blocks whose writes are zeroed so the residual stream
stays what was put in. Every expected number is then worked out on paper.
"""

from __future__ import annotations

import json
import math

import pytest
import scipy.stats
import torch
from matplotlib import image

from windtunnel.analysis import probes  # noqa: F401  (registers linear_probes for the end-to-end test)
from windtunnel.analysis.base import Run
from windtunnel.analysis.stats import average_ranks, pca, spearman
from windtunnel.analysis.attention import attention_categories, qk_sharpening
from windtunnel.analysis.geometry import key_orthogonality, value_manifold
from windtunnel.analysis.runner import analyze_runs
from windtunnel.evaluation import EvalSet
from windtunnel.models import build_model
from windtunnel.run_config import run_config_from_mapping
from windtunnel.runs import build_run_model
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


def test_hmm_keys_are_compared_over_observation_symbols():
    tunnel = HMMTunnel(S=2, M=3, K=4, grid=0.25)
    result = key_orthogonality([transformer(tunnel)], episodes_of(tunnel), tunnel)
    assert result["token_values"] == [5, 6, 7]  # symbol o is token N + 1 + o with N = 1/grid = 4
    assert len(result["frame_head_cos"]) == 3 and len(result["layers"]) == 2


# --- QK sharpening -------------------------------------------------------------------------


def test_bijection_key_categories_of_a_written_out_sequence():
    # V = 4; pairs (1 -> 2), (3 -> 0), then x=1 again: tokens x=1 y=2 x=3 y=0 x=1 y=2.
    tokens = torch.tensor([[1, 6, 3, 4, 1, 6]])
    episode = Episode(
        tokens, torch.tensor([0, 2, 4]), torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 3, 4), torch.zeros(1, 3)
    )
    categories = {
        name: mask[0].nonzero().tolist() for name, mask in attention_categories(BijectionTunnel(V=4), episode).items()
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
    categories = attention_categories(tunnel, episode)
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
    assert result["anchor"]["met"]
    scatter = resid["scatter"]
    assert len(scatter["pc1"]) == len(scatter["entropy_bits"]) == result["n_points"] == 64 * 5
    # Oriented: PC1 rises with the entropy.
    assert scipy.stats.spearmanr(scatter["pc1"], scatter["entropy_bits"]).statistic > 0.99


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
