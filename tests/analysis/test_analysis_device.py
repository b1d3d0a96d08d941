"""The analyses run their forward passes where the model is, and their statistics on the host.

Without a GPU, two things can still be checked: that :func:`traced` (the one way an analysis
runs a traced forward) sends the tokens to the model's device and hands back host tensors
equal to the plain forward's, and that no analysis module runs a traced forward any other
way. That the numbers on a GPU match the CPU's: ``bench/compare_analyses.py`` on a GPU window's analyses.
"""

from __future__ import annotations

import ast
from pathlib import Path

import torch

import windtunnel.analysis as analysis_package
from windtunnel.analysis import base, load_runs, traced
from windtunnel.models import build_model, run_with_trace
from windtunnel.run_config import run_config_from_mapping
from windtunnel.training.trainer import train

CONFIG = {
    "tunnel": {"name": "bijection", "V": 5},
    "model": {"kind": "transformer", "n_layers": 2, "n_heads": 2, "d_model": 16, "d_mlp": 32},
    "train": {"steps": 4, "batch_size": 8, "eval_every": 0, "checkpoint_every": 0, "log_every": 2},
    "eval": {"n": 16, "batch_size": 16},
}
NAMES = ["blocks.0.attn.pattern", "blocks.1.resid_post"]


def _model():
    config = {"n_layers": 2, "n_heads": 2, "d_model": 16, "d_mlp": 32}
    return build_model("transformer", config, vocab_size=11, num_classes=5, max_len=12).eval()


def test_traced_equals_the_plain_traced_forward_on_the_host():
    model = _model()
    tokens = torch.randint(0, 11, (3, 12), generator=torch.Generator().manual_seed(0))
    logits, activations = traced(model, tokens, NAMES)
    expected_logits, trace = run_with_trace(model, tokens, NAMES)
    assert torch.equal(logits, expected_logits)
    assert activations.keys() == set(NAMES)
    for name in NAMES:
        assert activations[name].device.type == "cpu" and torch.equal(activations[name], trace[name]), name


def test_traced_sends_the_tokens_to_the_models_device(monkeypatch):
    # A model on the meta device stands for one on a GPU: the forward must receive the tokens there.
    model = _model().to("meta")
    seen = []

    def forward(m, tokens, names):  # records where the tokens were sent; returns host results
        seen.append(tokens.device)
        return torch.zeros(*tokens.shape, 5), {name: torch.zeros(1) for name in names}

    monkeypatch.setattr(base, "run_with_trace", forward)
    traced(model, torch.zeros(2, 12, dtype=torch.long), NAMES)
    assert seen == [torch.device("meta")]


def test_load_runs_puts_every_model_on_the_device_asked_for(tmp_path):
    train(run_config_from_mapping(CONFIG), tmp_path / "run", progress=False)
    (run,) = load_runs([tmp_path / "run"], device="cpu")
    assert {p.device.type for p in run.model.parameters()} == {"cpu"}
    assert not run.model.training
    assert base.initial_models_of([run])[0].training is False


def test_no_analysis_runs_a_traced_forward_except_through_traced():
    # run_with_trace leaves its results where the model is; an analysis calling it directly
    # would mix device and host tensors on a GPU. Only base.py (which defines traced) may.
    folder = Path(analysis_package.__file__).parent
    offenders = []
    for path in sorted(folder.glob("*.py")):
        if path.name == "base.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
            if name in ("run_with_trace", "Trace"):
                offenders.append(f"{path.name}:{node.lineno}")
    assert offenders == []
