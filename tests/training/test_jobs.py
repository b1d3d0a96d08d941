"""Training jobs side by side: an interrupted sweep stops every worker cleanly and resumes."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from windtunnel.jobs import TrainJob, run_jobs
from windtunnel.training.checkpoint import list_snapshots, read_resume_step

pytestmark = pytest.mark.slow

CONFIG = """
[tunnel]
name = "bijection"
V = 5
[model]
kind = "transformer"
n_layers = 1
n_heads = 1
d_model = 8
d_mlp = 16
[train]
steps = 300_000  # never reached: both runs are always interrupted, so no machine is fast enough to finish them before the SIGINT lands
batch_size = 8
eval_every = 0
checkpoint_every = 10
log_every = 10
[eval]
n = 16
"""


def _sweep(config, out, *extra):
    command = [sys.executable, "-m", "windtunnel", "sweep", str(config), "--seeds", "2", "--out", str(out), "--jobs", "2", *extra]
    # Started with SIGINT ignored, as a non-interactive shell starts a background job (and as
    # CI may run this suite): the sweep must take SIGINT anyway.
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )


# Generous: under a loaded CI machine two workers need a while to import torch and step.
def _wait_for(condition, sweep, seconds=300):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline and sweep.poll() is None, "the workers never got there"
        time.sleep(0.2)


def test_sigint_to_the_sweep_alone_stops_every_worker_and_a_rerun_resumes(tmp_path, processes_naming):
    config = tmp_path / "tiny.toml"
    config.write_text(CONFIG)
    out = tmp_path / "sweep"

    def steps():
        return [read_resume_step(out / f"seed_{s}") if (out / f"seed_{s}" / "config.json").exists() else None for s in (0, 1)]

    try:
        sweep = _sweep(config, out)
        _wait_for(lambda: all(steps()), sweep)
        # Only the parent gets the signal (workers run in their own sessions): it must pass it on.
        os.kill(sweep.pid, signal.SIGINT)
        _, err = sweep.communicate(timeout=180)
        assert sweep.returncode == 130, err
        assert "run the same command again to resume" in err
        stopped = steps()
        assert all(0 < step < 300_000 for step in stopped), stopped
        time.sleep(1.0)  # a worker still alive would keep checkpointing every few milliseconds
        assert steps() == stopped
        for s in (0, 1):
            assert json.loads((out / f"seed_{s}" / "config.json").read_text())["train"]["seed"] == s

        # The same command continues both runs from their checkpoints.
        rerun = _sweep(config, out)
        _wait_for(lambda: all(now > before for now, before in zip(steps(), stopped)), rerun)
        os.kill(rerun.pid, signal.SIGINT)
        _, err = rerun.communicate(timeout=180)
        assert rerun.returncode == 130 and "resuming seed_0" in err and "resuming seed_1" in err
    finally:
        # A failed assertion must not leave 300k-step runs behind to slow every later test.
        for pid in processes_naming(out):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert all(list_snapshots(out / f"seed_{s}")[0] == 0 for s in (0, 1))  # the step-0 snapshot of the first start survives


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_runs_are_a_bar_and_the_messages_print_above_it(tmp_path, monkeypatch):
    config = tmp_path / "tiny.toml"
    config.write_text(CONFIG.replace("steps = 300_000", "steps = 4"))
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    run_jobs([TrainJob("only", config, tmp_path / "runs" / "only")], parallel=1)
    shown = terminal.getvalue()
    assert "[train] 0/1 runs already done; 1 to go, 1 at a time\n" in shown
    assert "[train] 1/1 done: only" in shown
    drawn = shown.split("\r")[-1]  # the bar's last state, left on its own line
    assert re.match(r"\[train\] 1\.0/1 runs \|.+\| \d\d:\d\d", drawn), drawn


def test_the_local_engine_trains_what_run_jobs_trains_and_both_engines_keep_one_interface(tmp_path):
    import inspect

    from windtunnel.jobs import Engine, LocalEngine
    from windtunnel.ray_engine import RayEngine, open_engine

    config = tmp_path / "tiny.toml"
    config.write_text(CONFIG.replace("steps = 300_000", "steps = 4"))
    lines: list[str] = []
    with open_engine("local") as engine:
        assert isinstance(engine, LocalEngine)
        engine.run_jobs([TrainJob("only", config, tmp_path / "runs" / "only")], parallel=1, report=lines.append)
        measure = lambda job, steps, threads: (1.0, "cpu")  # noqa: E731
        assert engine.measurer(1, 1, measure) is measure  # measured here, in this process
    assert lines[-1] == "[train] 1/1 done: only" and list_snapshots(tmp_path / "runs" / "only")[-1] == 4
    # What a caller holding an Engine may pass, each engine takes (RayEngine adds report_every_s, defaulted).
    for method in ("run_jobs", "measurer"):
        wanted = list(inspect.signature(getattr(Engine, method)).parameters)
        for cls in (LocalEngine, RayEngine):
            assert list(inspect.signature(getattr(cls, method)).parameters)[:len(wanted)] == wanted, (cls, method)
