"""A reproduction filled slice by slice (the paper scale's GPU windows): a run's time limit,
its final weights kept in bounded shards, `reproduce --only-runs`, the report of a folder with
runs missing, and the GPU window's script run dry on the CPU with its unpacking."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import safetensors.torch
import torch

from windtunnel.cli import main
from windtunnel.history import read_metrics, stop_record
from windtunnel.jobs import TrainJob, job_state
from windtunnel.report.folder import Manifest
from windtunnel.run_config import load_run_config
from windtunnel.runs import keep_final_weights, load_run_model
from windtunnel.training.checkpoint import (
    RESUME_FILE,
    CheckpointError,
    list_snapshots,
    load_resume,
    read_final_weights_step,
    snapshot_path,
)
from windtunnel.training.trainer import train

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def test_a_time_limit_ends_the_run_at_a_log_boundary_with_everything_a_last_step_writes(tmp_path, write_config, monkeypatch):
    path = write_config(tmp_path, steps=400, checkpoint_every=100)
    # A clock that advances one second per read: the limit of 7.5 s passes after a known number
    # of reads, so the step it stops at does not depend on this machine's speed.
    ticks = iter(range(10**6))
    monkeypatch.setattr("windtunnel.training.trainer.time.perf_counter", lambda: float(next(ticks)))
    config = load_run_config(path, ["train.time_limit_s=7.5", "train.log_every=5"])
    result = train(config, tmp_path / "run", progress=False)
    stopped = stop_record(read_metrics(tmp_path / "run"))
    assert stopped is not None and stopped["stopped"] == "time_limit" and stopped["time_limit_s"] == 7.5
    step = stopped["step"]
    assert 0 < step < 400 and step % 5 == 0 and result.steps == step
    assert "eval_mae_bits" in stopped  # the final evaluation, as at a last step
    assert list_snapshots(tmp_path / "run")[-1] == step
    # The snapshot, the resume state and what loads as the final model are the same weights.
    _, model, loaded = load_run_model(tmp_path / "run")
    assert loaded == step
    resumed = load_run_model(tmp_path / "run", step=0)[1]
    assert load_resume(tmp_path / "run", resumed)[0] == step
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, resumed.state_dict()[name]), name
    provenance = json.loads((tmp_path / "run" / "provenance.json").read_text())["starts"][-1]
    assert provenance["stopped"] == "time_limit" and provenance["end_step"] == step and provenance["configured_steps"] == 400
    # The run ended by its own rule: done, and the same protocol under another limit or device.
    job = TrainJob("run", path, tmp_path / "run", ("train.time_limit_s=60", "train.log_every=5", "train.device=cpu"))
    assert job_state(job) == "done"


def test_kept_weights_are_the_final_snapshot_in_shards_under_the_cap(tmp_path, write_config):
    path = write_config(tmp_path, steps=20, checkpoint_every=10)
    train(load_run_config(path), tmp_path / "run", progress=False)
    snapshot = safetensors.torch.load_file(str(snapshot_path(tmp_path / "run", 20)))
    total = sum(t.numel() * t.element_size() for t in snapshot.values())
    cap = total // 4  # bytes: the model then needs at least four shards
    assert keep_final_weights(tmp_path / "run", max_shard_bytes=cap) == 20
    shards = sorted((tmp_path / "run" / "weights").glob("*.safetensors"))
    assert len(shards) >= 4
    for shard in shards:
        tensors = safetensors.torch.load_file(str(shard))
        # A shard exceeds the cap only when it holds one tensor larger than the cap.
        assert sum(t.numel() * t.element_size() for t in tensors.values()) <= cap or len(tensors) == 1
    index = json.loads((tmp_path / "run" / "weights" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(snapshot) and index["metadata"]["step"] == 20
    assert not (tmp_path / "run" / RESUME_FILE).exists() and list_snapshots(tmp_path / "run") == []
    _, model, step = load_run_model(tmp_path / "run")
    assert step == 20 and read_final_weights_step(tmp_path / "run") == 20
    for name, tensor in snapshot.items():  # the oracle: the snapshot file read by safetensors itself
        assert torch.equal(model.state_dict()[name], tensor), name
    # A shard whose bytes change on disk is refused by its checksum.
    data = bytearray(shards[0].read_bytes())
    data[-1] ^= 0xFF
    shards[0].write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum"):
        load_run_model(tmp_path / "run")


def _manifest(out: Path) -> Manifest:
    return Manifest.read(out)


def test_slices_fill_a_folder_and_the_report_says_what_is_not_yet_run(tmp_path, capsys):
    out = tmp_path / "repro"
    seeds = ["bijection_transformer_seed0", "bijection_transformer_seed1"]
    # The preset's two seeds as one run group (--group: on a CPU runs train alone by default).
    assert main(["reproduce", "--scale", "tiny", "--out", str(out), "--only-runs", *seeds, "--group"]) == 0
    assert "[reproduce] scale tiny, claims: 2 runs (2 in 1 run group)" in capsys.readouterr().err
    manifest = _manifest(out)
    assert [run.name for run in manifest.runs] == seeds and manifest.command.endswith(" --group")
    assert "bijection_mlp_seed0" in manifest.not_yet_run and len(manifest.planned) == len(manifest.not_yet_run) + 2
    assert sorted(p.name for p in (out / "runs").iterdir() if p.name != "logs") == seeds
    for seed in seeds:
        starts = json.loads((out / "runs" / seed / "provenance.json").read_text())["starts"]
        assert [start["group"] for start in starts] == [{"size": 2, "runs": seeds}]
    # One model of the comparison group: its per-position analysis stands in for Table 1.
    assert (out / "analysis" / "bijection" / "length_generalization.json").is_file()
    report = (out / "report" / "report.md").read_text()
    rows = {line.split(" | ")[0].lstrip("| "): line for line in report.splitlines() if line.startswith("| ")}
    assert "| not yet run |" in rows["Bijection: the MLP control fails"]
    assert "| not yet run |" not in rows["Bijection: the transformer's entropy matches Bayes"]
    assert "| hmm\\_transformer\\_seed0 | not yet run |" in report  # Markdown escapes the underscores

    kept = {p.name: p.stat().st_mtime_ns for p in (out / "analysis" / "bijection_transformer").glob("*.json")}
    assert main(["reproduce", "--scale", "tiny", "--out", str(out), "--resume", "--only-runs", "bijection_mlp_seed0"]) == 0
    assert [run.name for run in _manifest(out).runs] == [*seeds, "bijection_mlp_seed0"]
    # The comparison is made now, and the single model's curves it replaces are gone.
    assert (out / "analysis" / "bijection" / "model_comparison.json").is_file()
    assert not (out / "analysis" / "bijection" / "length_generalization.json").exists()
    compared = json.loads((out / "analysis" / "bijection" / "model_comparison.json").read_text())
    assert sorted(Path(d).name for d in compared["run_dirs"]) == ["bijection_mlp_seed0", *seeds]
    # The transformer's own group did not change: its results were kept, not recomputed.
    assert {p.name: p.stat().st_mtime_ns for p in (out / "analysis" / "bijection_transformer").glob("*.json")} == kept
    rows = {line.split(" | ")[0].lstrip("| "): line for line in (out / "report" / "report.md").read_text().splitlines()
            if line.startswith("| ")}
    assert "not yet run" not in rows["Bijection: the MLP control fails"].split(" | ")[1]

    # Shown beside another scale's folder, the claim table gains that scale's column.
    assert main(["report", str(out), "--beside", str(out)]) == 0
    assert "holds at tiny scale?" in (out / "report" / "report.md").read_text()


def test_an_unknown_run_is_refused_and_nothing_is_written(tmp_path, capsys):
    out = tmp_path / "repro"
    assert main(["reproduce", "--scale", "tiny", "--out", str(out), "--only-runs", "bijection_transformer_seed9"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "bijection_transformer_seed9" in error[0] and "bijection_transformer_seed0" in error[0]
    assert not out.exists() or not any(out.iterdir())
    with pytest.raises(SystemExit) as exit_:  # argparse's own refusal of a bad value: exit 2, one line
        main(["reproduce", "--scale", "tiny", "--out", str(out), "--time-limit=-3"])
    assert exit_.value.code == 2 and "--time-limit" in capsys.readouterr().err


def test_the_gpu_window_script_runs_dry_and_its_parts_unpack_to_the_same_folder(tmp_path):
    """bench/gpu_slice.sh on the CPU at a tiny size (what a GPU window runs, at the paper
    scale's settings otherwise), then bench/unpack_slice.sh into another folder."""
    env = {**os.environ, "DRY_RUN": "1", "OUT": str(tmp_path / "out"), "RESULTS": str(tmp_path / "results"), "PY": "python"}
    env["PATH"] = f"{Path(os.sys.executable).parent}:{env['PATH']}"
    run = subprocess.run(["bash", "bench/gpu_slice.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = tmp_path / "results"
    kept = results / "runs" / "bijection_transformer_seed0"
    assert (kept / "weights" / "model.safetensors.index.json").is_file() and not (kept / RESUME_FILE).exists()
    assert json.loads((kept / "provenance.json").read_text())["starts"][-1]["precision"] == "bf16 autocast, float32 weights"
    # The slice is the first owed run's run group: the bijection transformer's seeds and its with-replacement twin.
    group = ["bijection_transformer_seed0", "bijection_transformer_seed1", "bijection_transformer_seed2",
             "bijection_replacement_transformer_seed0"]
    assert sorted(p.name for p in (results / "runs").iterdir() if p.name != "logs") == sorted(group)
    for name in group:
        assert json.loads((results / "runs" / name / "provenance.json").read_text())["starts"][-1]["group"] == {"size": 4, "runs": group}
    parts = sorted((tmp_path / "out").glob("results.tar.part*"))
    assert parts and all(p.stat().st_size <= 15 * 2**20 for p in parts)
    profile = json.loads((tmp_path / "out" / "profile_bijection.json").read_text())
    assert profile["recorded_steps"] == 20 and profile["top_host"]

    copy = tmp_path / "copy"
    (copy / "stale").mkdir(parents=True)
    (copy / "stale" / "old.json").write_text("{}")  # a file the slice's folder no longer holds
    unpack = subprocess.run(["bash", "bench/unpack_slice.sh", str(tmp_path / "out"), str(copy)], cwd=ROOT, capture_output=True, text=True)
    assert unpack.returncode == 0, unpack.stderr
    assert not (copy / "stale").exists()
    mine = sorted(p.relative_to(results) for p in results.rglob("*") if p.is_file())
    theirs = sorted(p.relative_to(copy) for p in copy.rglob("*") if p.is_file())
    assert mine == theirs
    for rel in mine:
        assert (results / rel).read_bytes() == (copy / rel).read_bytes(), rel
    # Parts that do not make a whole tar change nothing.
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "results.tar.part00").write_bytes(parts[0].read_bytes()[:5000])
    before = sorted(p.relative_to(copy) for p in copy.rglob("*"))
    assert subprocess.run(["bash", "bench/unpack_slice.sh", str(broken), str(copy)], cwd=ROOT, capture_output=True).returncode == 2
    assert sorted(p.relative_to(copy) for p in copy.rglob("*")) == before
