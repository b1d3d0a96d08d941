"""`windtunnel info` on the paper presets: counts against closed forms written here."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

PAPER = Path(__file__).resolve().parents[2] / "configs" / "paper"


def transformer_params(L: int, d: int, d_mlp: int, vocab: int, classes: int, max_len: int, attention_layers: int) -> int:
    """Embeddings + per block (2 LayerNorms, bias-free QKV/O, MLP with biases) + final LN + head."""
    attention = 4 * d * d  # W_Q, W_K, W_V, W_O (no biases)
    mlp = d * d_mlp + d_mlp + d_mlp * d + d
    norms_per_block = 2 * 2 * d
    blocks = L * (mlp + norms_per_block) + attention_layers * attention - (L - attention_layers) * 2 * d
    return (vocab + max_len) * d + blocks + 2 * d + d * classes + classes


@functools.lru_cache(maxsize=None)
def info(name: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-m", "windtunnel", "info", str(PAPER / name), "--json"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize(
    "name, expected",
    [
        ("bijection_transformer.toml", transformer_params(6, 192, 768, 40, 20, 38, 6)),
        ("hmm_transformer.toml", transformer_params(9, 256, 1024, 106, 5, 100, 9)),
        ("hmm_late_attention_off.toml", transformer_params(9, 256, 1024, 106, 5, 100, 7)),
    ],
)
def test_transformer_counts(name, expected):
    result = info(name)
    assert result["params"] == expected == sum(result["params_by_part"].values())


def test_paper_sizes():
    assert round(info("bijection_transformer.toml")["params"] / 1e6, 2) == 2.68
    assert round(info("hmm_transformer.toml")["params"] / 1e6, 1) == 7.2  # 7.15M: the paper's "2.68M" is not these shapes


@pytest.mark.parametrize("name, transformer", [("bijection_mlp.toml", "bijection_transformer.toml"), ("hmm_mlp.toml", "hmm_transformer.toml")])
def test_mlp_controls_match_within_one_percent(name, transformer):
    mlp, target = info(name), info(transformer)
    assert mlp["target_params"] == target["params"]
    assert abs(mlp["params"] - target["params"]) / target["params"] < 0.01
    assert mlp["mismatch"] == pytest.approx((mlp["params"] - target["params"]) / target["params"], abs=1e-6)
    assert 18 <= mlp["n_blocks"] <= 20 and mlp["params_by_part"]["blocks/attention"] == 0
    d, h, n = 192 if "bij" in name else 256, mlp["d_hidden"], mlp["n_blocks"]
    vocab, classes, max_len = (40, 20, 38) if "bij" in name else (106, 5, 100)
    assert mlp["params"] == (vocab + max_len) * d + n * (2 * d + d * h + h + h * d + d) + 2 * d + d * classes + classes


def test_info_prints_a_table_of_the_same_counts_without_json():
    result = subprocess.run(
        [sys.executable, "-m", "windtunnel", "info", str(PAPER / "hmm_mlp.toml")], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    rows = dict(line.strip().rsplit(None, 1) for line in lines)
    rows = {name.strip(): value for name, value in rows.items()}
    parts = {line.strip().rsplit(None, 1)[0].strip() for line in lines if line.startswith("  ")}
    counts = info("hmm_mlp.toml")
    assert rows["parameters"] == f"{counts['params']:,}"
    assert {part: rows[part] for part in parts} == {part: f"{count:,}" for part, count in counts["params_by_part"].items()}
    assert rows["mismatch"] == f"{counts['mismatch']:+.4%}"
