"""Layer and head ablation on constructed models whose answers are known."""

from __future__ import annotations

import pytest
import torch

from windtunnel.analysis.ablation import head_ablation, layer_ablation
from windtunnel.evaluation import EvalSet
from windtunnel.models import build_model
from windtunnel.tunnels import BijectionTunnel

TUNNEL = BijectionTunnel(V=6)
EVAL_SET = EvalSet.draw(TUNNEL, horizon=5, n=64, batch_size=64, seed=0)


def tiny(seed: int):
    return build_model(
        "transformer",
        {"n_layers": 3, "n_heads": 2, "d_model": 16, "d_mlp": 32},
        vocab_size=TUNNEL.vocab_size,
        num_classes=TUNNEL.num_classes,
        max_len=TUNNEL.seq_len(),
        generator=torch.Generator().manual_seed(seed),
    )


@torch.no_grad()
def silence_layer(model, layer: int) -> None:
    """Zero everything the block writes into the residual stream: the block becomes the identity."""
    block = model.blocks[layer]
    block.attn.proj.weight.zero_()
    block.mlp.fc_out.weight.zero_()
    block.mlp.fc_out.bias.zero_()


@torch.no_grad()
def silence_heads(model, layer: int, heads: list[int]) -> None:
    """Zero the W_O columns that read these heads' z: their contribution is exactly 0."""
    d_head = model.blocks[layer].attn.proj.weight.shape[1] // 2
    for head in heads:
        model.blocks[layer].attn.proj.weight[:, head * d_head : (head + 1) * d_head] = 0


def test_removing_an_identity_layer_changes_nothing():
    model = tiny(0)
    silence_layer(model, 1)
    result = layer_ablation([model], EVAL_SET)
    ratios = [row["mae_ratio"] for row in result["layers"]]
    assert ratios[1] == 1.0 and result["layers"][1]["kl_ratio"] == 1.0
    assert ratios[0] != 1.0 and ratios[2] != 1.0  # real layers do move the predictions


def test_the_only_live_head_is_the_most_destructive():
    model = tiny(1)
    for layer in range(3):
        silence_heads(model, layer, [0, 1])
    with torch.no_grad():  # revive one head, with a large W_O so its removal matters
        model.blocks[2].attn.proj.weight[:, 8:16] = torch.randn(16, 8, generator=torch.Generator().manual_seed(2))
    result = head_ablation([model], EVAL_SET)
    assert result["most_destructive"]["layer"] == 2 and result["most_destructive"]["head"] == 1
    grid = result["mae_ratio"]
    assert len(grid) == 3 and all(len(row) == 2 for row in grid)
    assert grid[2][1] == result["most_destructive"]["mae_ratio"] > 1.0
    for row in result["heads"]:
        if (row["layer"], row["head"]) != (2, 1):
            assert row["mae_ratio"] == pytest.approx(1.0, abs=1e-12)  # a silent head's removal is a no-op


def test_ratios_average_per_run():
    models = [tiny(3), tiny(4)]
    together = layer_ablation(models, EVAL_SET)
    alone = [layer_ablation([m], EVAL_SET) for m in models]
    assert together["runs"] == 2
    for layer in range(3):
        expected = (alone[0]["layers"][layer]["mae_ratio"] + alone[1]["layers"][layer]["mae_ratio"]) / 2
        assert together["layers"][layer]["mae_ratio"] == pytest.approx(expected, rel=1e-12)
        spread = abs(alone[0]["layers"][layer]["mae_bits"]["mean"] - alone[1]["layers"][layer]["mae_bits"]["mean"]) / 2
        assert together["layers"][layer]["mae_bits"]["std"] == pytest.approx(spread, rel=1e-9)


def test_mismatched_runs_are_refused():
    other = build_model(
        "transformer", {"n_layers": 2, "n_heads": 2, "d_model": 16, "d_mlp": 32},
        vocab_size=TUNNEL.vocab_size, num_classes=TUNNEL.num_classes, max_len=TUNNEL.seq_len(),
    )
    with pytest.raises(ValueError, match="differ in shape"):
        layer_ablation([tiny(0), other], EVAL_SET)
