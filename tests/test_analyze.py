"""`windtunnel analyze` end to end on a tiny trained run: JSON results and figures drawn from them."""

from __future__ import annotations

import json

import pytest
from matplotlib import image

from windtunnel.cli import main
from windtunnel.run_config import run_config_from_mapping
from windtunnel.training.trainer import train

CONFIG = {
    "tunnel": {"name": "bijection", "V": 6},
    "model": {"kind": "transformer", "n_layers": 2, "n_heads": 2, "d_model": 16, "d_mlp": 32},
    "train": {"steps": 12, "batch_size": 32, "eval_every": 0, "checkpoint_every": 0, "log_every": 4},
    "eval": {"n": 64, "batch_size": 64},
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("runs")
    for seed in (0, 1):
        config = run_config_from_mapping(CONFIG, [f"train.seed={seed}"])
        train(config, folder / f"seed{seed}", progress=False)
    return folder


def test_analyze_one_run_writes_json_and_png(runs, capsys):
    assert main(["analyze", str(runs / "seed0")]) == 0
    written = json.loads(capsys.readouterr().out)
    assert set(written) == {"layer_ablation", "head_ablation"}
    folder = runs / "seed0" / "analysis"
    layers = json.loads((folder / "layer_ablation.json").read_text())
    assert [row["layer"] for row in layers["layers"]] == [0, 1] and layers["runs"] == 1
    heads = json.loads((folder / "head_ablation.json").read_text())
    assert len(heads["heads"]) == 4 and len(heads["mae_ratio"]) == 2
    for name in written:
        pixels = image.imread(folder / f"{name}.png")
        assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.std() > 0  # a drawn figure, not blank


def test_analyze_seeds_together(runs, tmp_path):
    assert main(["analyze", str(runs / "seed0"), str(runs / "seed1"), "--only", "layer_ablation", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "layer_ablation.json").read_text())
    assert result["runs"] == 2 and not (tmp_path / "head_ablation.json").exists()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--only", "nope"], "unknown analysis 'nope'"),
        (["SEED1"], "give --out DIR"),
    ],
)
def test_bad_requests_exit_2(runs, capsys, extra, message):
    extra = [str(runs / "seed1") if arg == "SEED1" else arg for arg in extra]
    assert main(["analyze", str(runs / "seed0"), *extra]) == 2
    assert message in capsys.readouterr().err
