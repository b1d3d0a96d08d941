"""`windtunnel analyze` end to end on a tiny trained run: JSON results and figures drawn from them."""

from __future__ import annotations

import json

import pytest
import torch
from matplotlib import image

from windtunnel.analysis.runner import ANALYSES
from windtunnel.cli import main
from windtunnel.run_config import run_config_from_mapping
from windtunnel.training.trainer import train
from scopes import once_per_module

CONFIG = {
    "tunnel": {"name": "bijection", "V": 6},
    "model": {"kind": "transformer", "n_layers": 2, "n_heads": 2, "d_model": 16, "d_mlp": 32},
    "train": {"steps": 12, "batch_size": 32, "eval_every": 0, "checkpoint_every": 0, "log_every": 4},
    "eval": {"n": 64, "batch_size": 64},
}


@pytest.fixture(scope=once_per_module)
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("runs")
    for seed in (0, 1):
        config = run_config_from_mapping(CONFIG, [f"train.seed={seed}"])
        train(config, folder / f"seed{seed}", progress=False)
    return folder


def test_analyze_one_run_writes_json_and_png(runs, capsys):
    assert main(["analyze", str(runs / "seed0")]) == 0
    captured = capsys.readouterr()
    written = json.loads(captured.out)
    # stderr says, as it goes, what was written and what was skipped and why
    progress = captured.err.splitlines()
    assert {line.split(":")[0] for line in progress if line.startswith("[analyze] wrote ")} == {
        f"[analyze] wrote {name}" for name in written
    }
    skipped = [line for line in progress if line.startswith("[analyze] skipped ")]
    assert any(line.startswith("[analyze] skipped relabeling: ") for line in skipped)
    assert len(written) + len(skipped) == len(ANALYSES) and len(progress) == len(ANALYSES)
    # Everything that applies to one bijection run; comparisons need several models, and
    # relabeling permutes hidden states, which the bijection has not.
    assert {"layer_ablation", "head_ablation", "length_generalization"} <= set(written)
    assert not {"model_comparison", "late_attention", "seeds", "relabeling"} & set(written)
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
    assert result["run_dirs"] == ["seed0", "seed1"]  # outside a reproduction, by name: no path of this machine


def test_sweep_trains_each_seed_and_keeps_finished_runs(tmp_path, capsys):
    config = tmp_path / "tiny.toml"
    config.write_text(
        '[tunnel]\nname = "bijection"\nV = 5\n[model]\nkind = "transformer"\nn_layers = 1\nn_heads = 1\n'
        "d_model = 8\nd_mlp = 16\n[train]\nsteps = 6\nbatch_size = 8\neval_every = 0\nlog_every = 2\n[eval]\nn = 16\n"
    )
    out = tmp_path / "sweep"
    assert main(["sweep", str(config), "--seeds", "2", "--out", str(out), "--jobs", "2", "--set", "train.seed=5"]) == 0
    assert json.loads(capsys.readouterr().out)["runs"] == [str(out / "seed_5"), str(out / "seed_6")]
    seeds = [json.loads((out / f"seed_{s}" / "config.json").read_text())["train"]["seed"] for s in (5, 6)]
    assert seeds == [5, 6]
    finished = (out / "seed_5" / "resume.safetensors").stat().st_mtime_ns
    assert main(["sweep", str(config), "--seeds", "2", "--out", str(out), "--set", "train.seed=5"]) == 0
    assert "all 2 runs already done" in capsys.readouterr().err
    assert (out / "seed_5" / "resume.safetensors").stat().st_mtime_ns == finished  # not retrained
    # Asking for another protocol in the same directory is refused, not mixed in.
    assert main(["sweep", str(config), "--seeds", "2", "--out", str(out), "--set", "train.seed=5", "--set", "train.steps=7"]) == 2
    assert "holds a run of another config" in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--only", "nope"], "unknown analysis 'nope'"),
        (["SEED1"], "give --out DIR"),
        (["--only", "model_comparison"], "does not apply to these runs: it compares models"),
    ],
)
def test_bad_requests_exit_2(runs, capsys, extra, message):
    extra = [str(runs / "seed1") if arg == "SEED1" else arg for arg in extra]
    assert main(["analyze", str(runs / "seed0"), *extra]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "device, message",
    [
        ("tpu", "device must be one of auto, cpu, cuda; got 'tpu'"),
        pytest.param(
            "cuda",
            "device=cuda but no CUDA device is available here",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA"),
        ),
    ],
)
def test_a_device_this_machine_lacks_exits_2_and_writes_nothing(runs, tmp_path, capsys, device, message):
    out = tmp_path / "out"
    assert main(["analyze", str(runs / "seed0"), str(runs / "seed1"), "--out", str(out), "--device", device]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()  # the folder made for the lock is removed again
