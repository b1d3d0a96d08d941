"""Training dynamics (frame-precision dissociation): its measures on constructed cases with
known answers, checked against scipy, and the analysis end to end on tiny trained runs."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from matplotlib import image
from scipy.spatial.distance import jensenshannon
from scipy.stats import rankdata, spearmanr

from windtunnel.analysis.base import eval_set_for, load_runs
from windtunnel.analysis.dynamics import (
    js_divergence_bits,
    stabilization_index,
    training_dynamics,
    training_dynamics_of_runs,
)
from windtunnel.analysis.stats import average_ranks, pca, spearman
from windtunnel.evaluation import evaluate, model_predictor
from windtunnel.models import run_with_trace
from windtunnel.report.claims import evaluate_claims
from windtunnel.results.dynamics import TrainingDynamics
from windtunnel.figures import FIGURES
from windtunnel.run_config import run_config_from_mapping
from windtunnel.run_config import build_run_model
from windtunnel.training.checkpoint import list_snapshots, load_snapshot, save_snapshot, snapshot_steps
from windtunnel.training.trainer import train
from scopes import once_per_module

TRAIN = {"steps": 12, "batch_size": 32, "eval_every": 0, "checkpoint_every": 0, "log_every": 4}
TRANSFORMER = {
    "tunnel": {"name": "bijection", "V": 6},
    "model": {"kind": "transformer", "n_layers": 2, "n_heads": 2, "d_model": 16, "d_mlp": 32},
    "train": TRAIN,
    "eval": {"n": 64, "batch_size": 64},
}
MLP = {**TRANSFORMER, "model": {"kind": "mlp", "d_model": 16, "n_blocks": 2, "d_hidden": 32}}


# --- the measures -------------------------------------------------------------------


def test_jsd_of_identical_rows_is_zero_and_of_disjoint_rows_one_bit():
    p = torch.tensor([[0.2, 0.3, 0.5, 0.0], [1.0, 0.0, 0.0, 0.0]])
    assert js_divergence_bits(p, p).tolist() == [0.0, 0.0]
    one_hot_a, one_hot_b = torch.tensor([1.0, 0.0, 0.0]), torch.tensor([0.0, 0.0, 1.0])
    assert js_divergence_bits(one_hot_a, one_hot_b).item() == pytest.approx(1.0, abs=1e-15)
    half = torch.tensor([0.5, 0.5, 0.0])  # shares half its mass with one_hot_a
    # m = (0.75, 0.25, 0): KL(a || m) = log2(4/3), KL(half || m) = 0.5 log2(2/3) + 0.5 log2(2).
    expected = 0.5 * math.log2(4 / 3) + 0.5 * (0.5 * math.log2(2 / 3) + 0.5)
    assert js_divergence_bits(one_hot_a, half).item() == pytest.approx(expected, abs=1e-12)


def test_jsd_matches_scipy():
    generator = torch.Generator().manual_seed(0)
    p, q = -torch.rand(2, 50, 7, generator=generator, dtype=torch.float64).log()  # exponentials: [50, 7] each
    p[:10, 4:] = 0  # zeros, as above the diagonal of causal attention rows
    p, q = p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
    ours = js_divergence_bits(p, q).numpy()
    theirs = jensenshannon(p.double().numpy(), q.double().numpy(), base=2, axis=1) ** 2  # scipy gives the distance
    np.testing.assert_allclose(ours, theirs, atol=1e-12)


@pytest.mark.parametrize("ties", [False, True])
def test_ranks_and_spearman_match_scipy(ties):
    generator = torch.Generator().manual_seed(1)
    x = torch.randint(0, 5, (200,), generator=generator).double() if ties else torch.randn(200, generator=generator)
    y = x + torch.randn(200, generator=generator) * 2  # correlated, not monotone
    np.testing.assert_allclose(average_ranks(x).numpy(), rankdata(x.numpy()), atol=0)
    assert spearman(x, y) == pytest.approx(spearmanr(x.numpy(), y.numpy()).statistic, abs=1e-12)
    assert spearman(x, -x) == pytest.approx(-1.0, abs=1e-12)


def test_spearman_of_a_constant_is_nan():
    assert math.isnan(spearman(torch.ones(5), torch.arange(5.0)))


def test_pc1_of_a_known_cloud():
    # Variance 2 along the first axis, 0.5 along the second: PC1 explains 2 / 2.5 = 0.8.
    x = torch.tensor([[2.0, 0.0], [-2.0, 0.0], [0.0, 1.0], [0.0, -1.0]], dtype=torch.float64)
    c, s = math.cos(0.7), math.sin(0.7)
    rotation = torch.tensor([[c, -s], [s, c]], dtype=torch.float64)
    shift = torch.tensor([5.0, -3.0], dtype=torch.float64)
    for cloud in (x, x @ rotation.T + shift):  # rotated and shifted: same answer
        ratio, coordinates = pca(cloud)
        explained, scores = ratio[0].item(), coordinates[:, 0]
        assert explained == pytest.approx(0.8, abs=1e-12)
        assert scores.abs().tolist() == pytest.approx([2.0, 2.0, 0.0, 0.0], abs=1e-12)


@pytest.mark.parametrize(
    "values, index",
    [
        ([0.5, 0.04, 0.1, 0.03, 0.01, 0.0], 3),  # the early dip does not count
        ([0.5, 0.3, 0.2, 0.1, 0.0], 4),  # only the final model is below
        ([0.01, 0.0], 0),  # settled from the start
        ([0.5, 0.05, 0.0], 2),  # 0.05 is not below 0.05
        ([0.5, 0.2], None),  # never settles
    ],
)
def test_stabilization_index(values, index):
    assert stabilization_index(values, 0.05) == index


# --- end to end on tiny trained runs -------------------------------------------------


@pytest.fixture(scope=once_per_module)
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dynamics")
    for name, mapping in (("transformer", TRANSFORMER), ("mlp", MLP)):
        train(run_config_from_mapping(mapping), folder / name, progress=False)
    return folder


def test_transformer_run(trained):
    run_dir = trained / "transformer"
    result = json.loads(json.dumps(training_dynamics(run_dir, n_sequences=32)))
    steps = list_snapshots(run_dir)
    assert result["steps"] == steps and steps[0] == 0 and steps[-1] == 12 and result["reference_step"] == 12
    jsd = result["attention_jsd_bits"]
    assert len(jsd) == len(steps) and jsd[-1] == 0.0 and all(0.0 <= v <= 1.0 for v in jsd)
    assert result["attention_layers"] == [0, 1] and all(len(row) == 2 for row in result["attention_jsd_by_layer_bits"])
    assert result["stabilization_step"] in steps and result["resid_name"] == "blocks.1.resid_post"
    assert result["mae_bits_final"] == result["mae_bits"][-1]

    # JSD at initialization, recomputed independently with scipy from the two snapshots' patterns.
    config = run_config_from_mapping(TRANSFORMER)
    episode = eval_set_for(config, n=32).episodes[0]
    rows = []
    for step in (0, 12):
        model = build_run_model(config)
        load_snapshot(run_dir, model, step)
        _, trace = run_with_trace(model.eval(), episode.tokens, names="blocks.*.attn.pattern")
        patterns = trace.stack("blocks.*.attn.pattern")[:, :, :, episode.positions]  # [layers, B, H, P, T]
        rows.append(patterns.double().reshape(-1, episode.tokens.shape[1]))  # one attention row each
    expected = (jensenshannon(rows[0].numpy(), rows[1].numpy(), base=2, axis=1) ** 2).mean()
    assert jsd[0] == pytest.approx(expected, abs=1e-9)

    # The final mae through the ordinary evaluation path.
    final = load_runs([run_dir])[0]
    scores = evaluate(model_predictor(final.model), eval_set_for(config, n=32), references=False)
    # Two forward paths through a float32 model (the traced one, the predictor's) may order
    # float32 reductions differently on another processor's kernels: a few float32 ulps on the
    # logits (2**-23 = 1.2e-7 relative), about 1e-6 relative on the float64 metric.
    assert result["mae_bits"][-1] == pytest.approx(scores["mae_bits"], rel=1e-6)


def test_model_without_attention_gets_geometry_and_precision_only(trained):
    result = training_dynamics(trained / "mlp", n_sequences=32)
    assert result["attention_jsd_bits"] is None and result["attention_layers"] == []
    assert result["stabilization_step"] is None and result["mae_bits_at_stabilization"] is None
    assert len(result["pc1_variance_explained"]) == len(result["steps"]) == len(result["kl_bits"])
    assert all(0.0 < v <= 1.0 for v in result["pc1_variance_explained"])


@pytest.mark.parametrize("name", ["transformer", "mlp"])
def test_registered_analysis_and_figure(trained, tmp_path, name):
    result = json.loads(json.dumps(training_dynamics_of_runs(load_runs([trained / name]))))
    assert result["run"] == f"{name} seed 0" and result["n_sequences"] == 256  # the default fixed batch
    path = tmp_path / "training_dynamics.png"
    FIGURES["training_dynamics"](result, path)
    pixels = image.imread(path)
    assert pixels.ndim == 3 and pixels.shape[0] > 300 and pixels.std() > 0


# --- the numbers the dissociation claim reads, on constructed snapshots --------------------


def constant_snapshot(config, *, peaked: bool, distribution: list[float], seed: int):
    """A model that predicts ``distribution`` everywhere (head weights zero, its bias log q)
    and whose attention is uniform over the causal keys (W_Q = W_K = 0), or, with ``peaked``,
    sharply peaked (large random W_Q, W_K reading random token embeddings). No block writes
    to the residual stream, so the attention never changes the predictions."""
    model = build_run_model(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.proj.weight.zero_()
            block.mlp.fc_out.weight.zero_()
            block.mlp.fc_out.bias.zero_()
            block.attn.qkv.weight.zero_()
            if peaked:
                d = model.d_model
                block.attn.qkv.weight[: 2 * d] = 8.0 * torch.randn(2 * d, d, generator=generator)
        model.token_embed.weight.copy_(torch.randn(model.token_embed.weight.shape, generator=generator))
        model.head.weight.zero_()
        model.head.bias.copy_(torch.tensor(distribution).log())
    return model


def test_stabilization_fraction_and_the_fall_after_it_against_closed_forms(tmp_path):
    # Log-spaced snapshots (0, 1, 2, 5, 10, 22, 46, 100, 215, 464, 1000): the attention is
    # peaked up to step 100 and uniform from 215 on, as in the final model; the predictions
    # are a sharp constant up to 215 and a broad one at 464 and 1000.
    config = run_config_from_mapping(TRANSFORMER)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(config.to_json())
    steps = snapshot_steps(1000, 3)
    assert steps == [0, 1, 2, 5, 10, 22, 46, 100, 215, 464, 1000]
    sharp, broad = [0.9, 0.04, 0.03, 0.01, 0.01, 0.01], [0.3, 0.2, 0.2, 0.1, 0.1, 0.1]
    for i, step in enumerate(steps):
        model = constant_snapshot(config, peaked=step <= 100, distribution=sharp if step <= 215 else broad, seed=i)
        save_snapshot(run_dir, model, step, {})
    result = training_dynamics(run_dir, n_sequences=64)

    assert result["stabilization_step"] == 215 and result["stabilization_fraction"] == pytest.approx(0.215)
    assert min(result["attention_jsd_bits"][:8]) > result["jsd_threshold_bits"]  # the peaked ones are far from uniform
    assert result["attention_jsd_bits"][8:] == pytest.approx([0.0, 0.0, 0.0], abs=1e-12)

    # Closed forms of a constant predictor q on the same sequences, in numpy.
    posterior = np.concatenate([e.posterior.numpy() for e in eval_set_for(config, n=64).episodes])  # [N, P, C]
    with np.errstate(divide="ignore", invalid="ignore"):
        h_bayes = -np.where(posterior > 0, posterior * np.log2(posterior), 0.0).sum(-1)  # [N, P]

    def errors(q):
        q = np.asarray(q)
        h_q = -(q * np.log2(q)).sum()
        kl = np.where(posterior > 0, posterior * np.log2(np.where(posterior > 0, posterior, 1.0) / q), 0.0).sum(-1)
        return {"mae_aggregate_bits": np.abs(h_q - h_bayes.mean(0)).mean(), "mae_bits": np.abs(h_q - h_bayes).mean(),
                "kl_bits": kl.mean()}

    at, end = errors(sharp), errors(broad)
    for metric in ("mae_aggregate_bits", "mae_bits", "kl_bits"):
        # float32 logits of log q reproduce q to ~1e-7 relative
        assert result["at_stabilization"][metric] == pytest.approx(at[metric], rel=1e-5), metric
        assert result["final"][metric] == pytest.approx(end[metric], rel=1e-5), metric
        assert result["ratio_stabilization_to_final"][metric] == pytest.approx(at[metric] / end[metric], rel=1e-5)
    assert result["mae_ratio_stabilization_to_final"] == result["ratio_stabilization_to_final"]["mae_bits"]

    # The claim reads the bijection's metric, the aggregate error, there and at the end.
    header = {"analysis": "training_dynamics", "run_dirs": [str(run_dir)], "tunnel": config.to_mapping()["tunnel"],
              "task_variant": config.tunnel.describe(), "tunnel_label": config.tunnel.label(), "run": "transformer seed 0"}
    typed = TrainingDynamics.from_json({**header, **json.loads(json.dumps(result))})  # as the report reads it back
    verdict = {v.claim.key: v for v in evaluate_claims({"bijection_transformer": {"training_dynamics": typed}})}
    measured = verdict["dissociation"].measured.values
    assert measured == {"fraction": pytest.approx(0.215), "ratio": pytest.approx(at["mae_aggregate_bits"] / end["mae_aggregate_bits"])}
    # aggregate error 1.22 bits at step 215 against 0.60 at the end (worked out from the exact
    # entropies log2(6..2)): 2.03x lower after settling at 21.5% of training
    assert measured["ratio"] == pytest.approx(2.03, abs=0.005) and verdict["dissociation"].holds is True
