"""The class-posterior analysis: its read-out against the exact class posterior (an oracle
predictor, the mixture itself), its simplex projection against scipy's constrained
minimizer, and the analysis end to end on a trained model-selection run."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from windtunnel.analysis.classes import class_posterior_mae, project_to_simplex, read_class_posterior
from windtunnel.tunnels.model_selection import ModelSelectionTunnel


@pytest.mark.parametrize("classes", [("involution", "three_cycles"), ("involution", "three_cycles", "rotation", "bijection")])
@pytest.mark.parametrize("symbols", ["integer", "opaque"])
def test_the_exact_posterior_reads_out_as_the_exact_class_posterior(classes, symbols):
    tunnel = ModelSelectionTunnel(n=6, classes=classes, L=6, symbols=symbols)
    episode = tunnel.sample(200, generator=torch.Generator().manual_seed(0))
    q = tunnel.class_predictives(episode)
    # the tunnel's answer posterior is the class-posterior mixture of the classes' predictives
    torch.testing.assert_close(torch.einsum("bpk,bpkc->bpc", episode.class_posterior, q), episode.posterior,
                               rtol=0, atol=1e-12)
    weights, informative = read_class_posterior(episode.posterior.flatten(0, 1), q.flatten(0, 1))
    exact = episode.class_posterior.flatten(0, 1)
    assert informative.any() and not informative.all()  # the first answer says nothing of the class
    # least squares on an exactly consistent system: float64 rounding only
    torch.testing.assert_close(weights[informative], exact[informative], rtol=0, atol=1e-9)
    # a model that answers as one class alone reads out as that class wherever informative
    one = read_class_posterior(q[:, :, 0].flatten(0, 1), q.flatten(0, 1))[0]
    assert torch.allclose(one[informative, 0], torch.ones(int(informative.sum()), dtype=torch.float64), atol=1e-9)


def test_a_ruled_out_class_reads_as_zero_and_one_class_left_says_nothing():
    tunnel = ModelSelectionTunnel(n=6, classes=("involution", "three_cycles", "rotation", "bijection"), L=6)
    episode = tunnel.sample(300, generator=torch.Generator().manual_seed(1))
    q, exact = tunnel.class_predictives(episode).flatten(0, 1), episode.class_posterior.flatten(0, 1)
    possible = exact > 0
    weights, informative = read_class_posterior(episode.posterior.flatten(0, 1), q, possible)
    some_out = (~possible).any(-1) & (possible.sum(-1) >= 2)
    assert (informative & some_out).any()  # the case: read among the classes left
    # least squares on an exactly consistent system: float64 rounding only
    torch.testing.assert_close(weights[informative], exact[informative], rtol=0, atol=1e-9)
    assert (weights[~possible] == 0).all()
    assert not informative[possible.sum(-1) == 1].any()
    # an answer far from every mixture still gives no weight to a ruled-out class
    uniform = torch.full_like(episode.posterior.flatten(0, 1), 1 / 6)
    assert (read_class_posterior(uniform, q, possible)[0][~possible] == 0).all()


def test_the_simplex_projection_is_scipys_constrained_minimum():
    rng = np.random.default_rng(0)
    for _ in range(20):
        v = rng.normal(0, 1.5, size=4)
        result = minimize(lambda w: np.sum((w - v) ** 2), np.full(4, 0.25), method="SLSQP", bounds=[(0, 1)] * 4,
                          constraints=[{"type": "eq", "fun": lambda w: w.sum() - 1}], options={"ftol": 1e-14})
        ours = project_to_simplex(torch.tensor(v)).numpy()
        np.testing.assert_allclose(ours, result.x, atol=1e-6)  # SLSQP's own tolerance, not ours
    inside = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    assert torch.equal(project_to_simplex(inside), inside)
    assert class_posterior_mae(torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.5])).item() == 0.5


def test_the_analysis_reads_a_trained_run(tmp_path):
    from windtunnel.analysis.runner import analyze
    from windtunnel.results import RESULT_TYPES
    from windtunnel.run_config import run_config_from_mapping
    from windtunnel.training.trainer import train

    config = run_config_from_mapping({
        "tunnel": {"name": "model_selection", "n": 6, "L": 6},
        "model": {"kind": "transformer", "n_layers": 2, "n_heads": 2, "d_model": 16, "d_mlp": 32},
        "train": {"steps": 100, "batch_size": 64, "lr": 3e-3, "eval_every": 0, "checkpoint_every": 0, "log_every": 50},
        "eval": {"n": 256, "batch_size": 128, "bootstrap": 20, "horizons": [6]},
    })
    train(config, tmp_path / "run", progress=False)
    written = analyze([tmp_path / "run"], only=["class_posterior"], say=lambda line: None)
    data = json.loads(written["class_posterior"].read_text())
    result = RESULT_TYPES["class_posterior"].from_json(data)
    assert result.to_json() == data and result.classes == ("involution", "three_cycles")
    assert (result.n_train_sequences, result.n_test_sequences) == (192, 64)
    run = result.runs[0]
    assert run.informative_share_by_position[0] == 0.0 and max(run.informative_share_by_position) > 0
    assert 0.0 <= run.readout_mae <= 1.0 and len(run.readout_mae_by_position) == len(run.readout_positions)
    assert [layer.name for layer in run.probe_layers] == ["input", "block 0", "block 1", "ln_final"]
    assert 0.0 < result.prior_mae < 0.5  # the uniform prior against a posterior that moves


def test_a_tunnel_without_classes_says_why_the_analysis_skips():
    from windtunnel.analysis import ANALYSES
    from windtunnel.analysis.base import Run
    from windtunnel.run_config import run_config_from_mapping

    def run_of(tunnel):
        config = run_config_from_mapping({"tunnel": tunnel, "model": {"kind": "transformer"}})
        return Run(None, config, None, None)

    assert "does not declare HypothesisClasses" in ANALYSES["class_posterior"].applies_to([run_of({"name": "hmm"})])
    one = run_of({"name": "model_selection", "classes": ["involution"]})
    assert "compares one class" in ANALYSES["class_posterior"].applies_to([one])
