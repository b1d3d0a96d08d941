"""The Ray engine of ``windtunnel sweep``: stopped by a Ctrl-C, then by a lost driver, and
resumed, a sweep ends with the local engine's weights bit for bit; bad input changes nothing."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest
from safetensors.torch import load_file

from windtunnel.cli import main
from windtunnel.training.checkpoint import read_resume_step, snapshot_path

STEPS = 240
# A large batch makes each step of the tiny model take long enough (tens of milliseconds)
# for a stop to land mid-run: the driver and the tasks look for it every half second. The
# step count leaves each stop seconds of work to land in: a lost driver reaches its runs
# only once Ray notices it gone, which on a loaded machine took longer than the last
# 80-step run had left.
SWEEP_SETTINGS = ("--seeds", "2", "--jobs", "2", "--set", "train.batch_size=768")


def _sweep(config, out, *engine, env=None):
    command = [sys.executable, "-m", "windtunnel", "sweep", str(config), "--out", str(out), *SWEEP_SETTINGS, *engine]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _wait_for(condition, what, seconds=180):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _steps(out):
    return [read_resume_step(out / f"seed_{s}") if (out / f"seed_{s}" / "config.json").exists() else None for s in (0, 1)]


@pytest.mark.slow
def test_a_ray_sweep_stopped_twice_and_resumed_ends_bit_identical_to_a_local_one(tmp_path, write_config, processes_naming):
    pytest.importorskip("ray")
    config = write_config(tmp_path, steps=STEPS, checkpoint_every=2)
    out, reference = tmp_path / "ray", tmp_path / "local"
    # A private, short temp directory for the local Ray instance (its sockets' paths are
    # limited to ~100 characters); every Ray process of this test names it.
    ray_tmp = tempfile.mkdtemp(prefix="wt-ray-", dir="/tmp")
    env = {**os.environ, "RAY_TMPDIR": ray_tmp}
    ray_engine = ("--engine", "ray")
    try:
        # 1. Ctrl-C to the driver alone: every run saves at a step boundary, Ray shuts down.
        # Sent once both runs have a checkpoint: the later one (its Ray worker may start
        # seconds after the first, which can finish meanwhile) is then mid-run.
        sweep = _sweep(config, out, *ray_engine, env=env)
        _wait_for(lambda: all(_steps(out)) or sweep.poll() is not None, "both runs' first checkpoints")
        os.kill(sweep.pid, signal.SIGINT)
        _, err = sweep.communicate(timeout=120)
        assert sweep.returncode == 130, err
        assert "run the same command again to resume" in err
        stopped = _steps(out)
        assert all(step is not None and 0 < step <= STEPS for step in stopped) and min(stopped) < STEPS, stopped
        _wait_for(lambda: not processes_naming(out, ray_tmp), "the runs and Ray to exit", seconds=30)
        assert _steps(out) == stopped

        # 2. The driver killed outright (a lost login node): Ray ends the job's workers, and
        # each run, sent SIGINT as its parent dies, saves at its step boundary too.
        rerun = _sweep(config, out, *ray_engine, env=env)
        _wait_for(lambda: any(now > before for now, before in zip(_steps(out), stopped)), "a resumed run to checkpoint")
        rerun.kill()
        rerun.communicate(timeout=60)
        _wait_for(lambda: not processes_naming(out, ray_tmp), "the runs and Ray to exit after the driver was killed", seconds=60)
        killed = _steps(out)
        assert all(step is not None for step in killed) and min(killed) < STEPS and killed != stopped, (stopped, killed)

        # 3. The same command finishes both runs from their checkpoints.
        final = _sweep(config, out, *ray_engine, env=env)
        _, err = final.communicate(timeout=300)
        assert final.returncode == 0, err
        assert all(f"resuming seed_{seed}" in err for seed, step in enumerate(killed) if step < STEPS), err
        assert not processes_naming(out, ray_tmp)

        # 4. The same sweep, never interrupted, on the local engine.
        local = _sweep(config, reference)
        _, err = local.communicate(timeout=300)
        assert local.returncode == 0, err
    finally:
        for pid in processes_naming(out, reference, ray_tmp):  # a failed assertion leaves nothing running
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(ray_tmp, ignore_errors=True)
    for seed in (0, 1):
        resumed = load_file(snapshot_path(out / f"seed_{seed}", STEPS))
        uninterrupted = load_file(snapshot_path(reference / f"seed_{seed}", STEPS))
        assert resumed.keys() == uninterrupted.keys()
        for name, tensor in uninterrupted.items():
            assert resumed[name].equal(tensor), f"seed_{seed}: {name} differs"


@pytest.mark.parametrize(
    "command, ray_missing, message",
    [
        ("sweep {cfg} --seeds 2 --out {out} --address 127.0.0.1:6379", False, "--address attaches to a Ray cluster: it needs --engine ray"),
        ("sweep {cfg} --seeds 2 --out {out} --engine local --address auto", False, "it needs --engine ray"),
        ("sweep {cfg} --seeds 2 --out {out} --engine ray", True, "--engine ray needs Ray, which is not installed here"),
        ("reproduce --scale tiny --out {out} --address auto", False, "it needs --engine ray"),
        ("reproduce --scale tiny --out {out} --engine ray", True, "pip install 'windtunnel[ray]'"),
    ],
)
def test_bad_engine_input_is_one_line_exit_2_and_writes_nothing(tmp_path, write_config, capsys, monkeypatch, command, ray_missing, message):
    config = write_config(tmp_path)
    out = tmp_path / "out"
    if ray_missing:
        monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError, as where it is not installed
    argv = command.format(cfg=config, out=out).split()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not out.exists()


def test_an_unknown_engine_is_a_usage_error(tmp_path, write_config, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["sweep", str(write_config(tmp_path)), "--seeds", "2", "--out", str(tmp_path / "out"), "--engine", "dask"])
    assert exit_.value.code == 2
    assert "argument --engine: invalid choice: 'dask'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
