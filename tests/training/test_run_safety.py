"""Run directories stay usable: one writer at a time, refusals that change nothing on disk,
and no dead ends (a run that died before its first checkpoint, a half-written metrics line)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import safetensors.torch
import torch

from windtunnel.cli import main
from windtunnel.files import DirectoryInUse, directory_lock
from windtunnel.history import MetricsError, parse_metrics, read_metrics
from windtunnel.run_config import load_run_config
from windtunnel.training import trainer as trainer_module
from windtunnel.training.checkpoint import read_resume_step, snapshot_path
from windtunnel.training.trainer import TrainingDiverged, train
from scopes import once_per_module

@pytest.fixture(scope=once_per_module)
def reference_run(tmp_path_factory, write_config) -> Path:
    folder = tmp_path_factory.mktemp("reference")
    assert main(["train", str(write_config(folder, checkpoint_every=10)), "--out", str(folder / "run"), "--quiet"]) == 0
    return folder / "run"

HOLD = "import sys, time; from pathlib import Path; from windtunnel.files import directory_lock\n" \
       "with directory_lock(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(120)\n"


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_held_lock_refuses_others_and_dies_with_its_process(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(DirectoryInUse, match=f"in use by another windtunnel command \\(pid {holder.pid}\\)"):
            with directory_lock(tmp_path):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)  # no cleanup code runs: the OS alone must release the lock
        holder.wait(timeout=30)
    with directory_lock(tmp_path):  # not stale
        pass
    with directory_lock(tmp_path):  # and released by a normal exit too
        pass


def test_two_trains_started_together_on_one_out_one_wins(tmp_path, write_config):
    config, out = write_config(tmp_path, checkpoint_every=10), tmp_path / "run"
    command = [sys.executable, "-m", "windtunnel", "train", str(config), "--out", str(out), "--quiet"]
    processes = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in processes]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results  # before the lock both exited 0, each step logged twice
    loser = next(err for code, err in results if code == 2)
    assert ("is in use by another windtunnel command" in loser or "is not empty" in loser) and "Traceback" not in loser
    steps = [r["step"] for r in read_metrics(out)]
    assert steps == sorted(set(steps)) and steps[-1] == 30  # each logged step once


def test_eval_and_resume_wait_for_the_writer(reference_run, tmp_path, capsys, write_config):
    run_dir = tmp_path / "run"
    shutil.copytree(reference_run, run_dir)
    before = _tree(run_dir)
    with directory_lock(run_dir):  # as a training run holds it
        for args in (["eval", str(run_dir)], ["train", "--resume", str(run_dir)],
                     ["analyze", str(run_dir), "--only", "calibration"],
                     ["train", str(write_config(tmp_path, checkpoint_every=10)), "--out", str(run_dir)]):
            assert main(args) == 2, args
            err = capsys.readouterr().err
            assert f"pid {os.getpid()}" in err or "is not empty" in err, (args, err)
            assert len(err.strip().splitlines()) == 1
    assert _tree(run_dir) == before


def test_resume_force_with_a_model_the_checkpoint_does_not_fit_changes_nothing(reference_run, tmp_path, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(reference_run, run_dir)
    before = _tree(run_dir)
    code = main(["train", "--resume", str(run_dir), "--force", "--set", "model.d_model=32", "--set", "model.d_mlp=64"])
    assert code == 2 and "does not fit" in capsys.readouterr().err
    assert _tree(run_dir) == before  # it used to rewrite config.json first, leaving the run unloadable
    assert main(["eval", str(run_dir), "--n", "64"]) == 0  # still usable


def test_a_refused_command_leaves_no_trace(reference_run, tmp_path, capsys):
    out = tmp_path / "new" / "reproduction"
    assert main(["reproduce", "--scale", "huge", "--out", str(out)]) == 2
    assert "unknown --scale" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # neither the folder made for the lock nor its parent is left
    # In an existing directory that had no lock file yet, a refusal leaves none either.
    run_dir = tmp_path / "run"
    shutil.copytree(reference_run, run_dir)
    (run_dir / ".lock").unlink()
    before = _tree(run_dir)
    assert main(["eval", str(run_dir), "--horizons", "9"]) == 2
    assert "--horizons=9 is out of range" in capsys.readouterr().err
    assert _tree(run_dir) == before


class _Crash(Exception):
    """Stands for a kill: the run stops after a step, saving nothing more."""


def _crash_at(step: int):
    def on_step(done: int) -> None:
        if done == step:
            raise _Crash

    return on_step


def _final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return safetensors.torch.load_file(str(snapshot_path(run_dir, 30)))


def _assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = _final_weights(a), _final_weights(b)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_a_run_that_died_before_its_first_checkpoint_resumes_from_step_0(reference_run, tmp_path, capsys, write_config):
    run_dir = tmp_path / "run"
    config = load_run_config(write_config(tmp_path, checkpoint_every=10))
    with pytest.raises(_Crash):
        train(config, run_dir, progress=False, on_step=_crash_at(7))  # checkpoints every 10 steps
    assert read_resume_step(run_dir) is None and (run_dir / "config.json").is_file()
    assert main(["train", "--resume", str(run_dir), "--quiet"]) == 0  # it used to say "no resume.safetensors"
    assert "training it from step 0" in capsys.readouterr().err
    _assert_same_weights(run_dir, reference_run)  # the run it would have been
    steps = [r["step"] for r in read_metrics(run_dir)]
    assert steps == sorted(set(steps)) and steps[-1] == 30


def test_a_half_written_last_metrics_line_is_dropped_on_resume(reference_run, tmp_path, capsys, write_config):
    run_dir = tmp_path / "run"
    config = load_run_config(write_config(tmp_path, checkpoint_every=10))
    with pytest.raises(_Crash):
        train(config, run_dir, progress=False, on_step=_crash_at(15))
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write('{"step": 20, "loss": 1.2')  # what a crash mid-append leaves
    assert main(["train", "--resume", str(run_dir), "--quiet"]) == 0  # it used to end in a traceback
    err = capsys.readouterr().err
    assert "dropped the half-written last line" in err and "Traceback" not in err
    _assert_same_weights(run_dir, reference_run)
    steps = [r["step"] for r in read_metrics(run_dir)]
    assert steps == list(range(5, 31, 5))  # log_every 5: each once, none lost


def test_a_bad_metrics_line_before_the_last_is_named_not_dropped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 5}\nnot json\n{"step": 10}\n')
    with pytest.raises(MetricsError, match="line 2 is not a metrics record"):
        parse_metrics(path)
    path.write_text('{"step": 5}\n{"step": 10}\n[1, 2')
    assert parse_metrics(path) == ([{"step": 5}, {"step": 10}], True)
    path.write_text('{"step": 5}\n{"step": 10}\n')
    assert parse_metrics(path) == ([{"step": 5}, {"step": 10}], False)


def test_divergence_before_any_checkpoint_does_not_claim_one(tmp_path, monkeypatch, write_config):
    real_loss = trainer_module._loss
    calls = {"n": 0}

    def loss_that_breaks(*args):
        calls["n"] += 1
        loss = real_loss(*args)
        return loss * float("nan") if calls["n"] == 4 else loss

    monkeypatch.setattr(trainer_module, "_loss", loss_that_breaks)
    config = load_run_config(write_config(tmp_path, checkpoint_every=10))
    with pytest.raises(TrainingDiverged, match="at step 4; no checkpoint was saved yet"):
        train(config, tmp_path / "run", progress=False)
    calls["n"] = 0
    with pytest.raises(TrainingDiverged, match="at step 4; no checkpoint was saved yet"):  # a restart from 0 replays it
        train(config, tmp_path / "run", resume=True, progress=False)
    monkeypatch.setattr(trainer_module, "_loss", real_loss)
    assert train(config, tmp_path / "run", resume=True, progress=False).steps == 30


# --- integrity: checksums and file modes -------------------------------------------------


def test_a_checkpoint_with_a_changed_tensor_byte_is_refused_and_one_without_a_checksum_loads(reference_run, tmp_path):
    from windtunnel.run_config import build_run_model
    from windtunnel.run_layout import RESUME_FILE
    from windtunnel.training.checkpoint import CheckpointError, load_resume

    config = load_run_config(reference_run / "config.json")
    path = reference_run / RESUME_FILE
    tensors = safetensors.torch.load_file(str(path))
    with safetensors.safe_open(str(path), framework="pt") as f:
        header = f.metadata()
    assert len(header["sha256"]) == 64

    # The same tensors, one value changed, under the original header: safetensors accepts it.
    tampered = tmp_path / "tampered"
    shutil.copytree(reference_run, tampered)
    name = sorted(k for k in tensors if k.startswith("model."))[0]
    tensors_changed = {**tensors, name: tensors[name].clone()}
    tensors_changed[name].view(-1)[0] += 1.0
    safetensors.torch.save_file(tensors_changed, str(tampered / RESUME_FILE), metadata=header)
    with pytest.raises(CheckpointError, match="fails its checksum"):
        load_resume(tampered, build_run_model(config))

    # A checkpoint from before checksums existed (no sha256 in its header) still loads.
    legacy = tmp_path / "legacy"
    shutil.copytree(reference_run, legacy)
    safetensors.torch.save_file(tensors, str(legacy / RESUME_FILE), metadata={k: v for k, v in header.items() if k != "sha256"})
    model = build_run_model(config)
    assert load_resume(legacy, model)[0] == read_resume_step(reference_run)
    assert torch.equal(model.state_dict()[name.removeprefix("model.")], tensors[name])


WRITE_RESUME_FOREVER = (
    "import sys, torch; from pathlib import Path; from windtunnel.training.checkpoint import save_resume\n"
    "torch.set_num_threads(1); model = torch.nn.Linear(8, 8); optimizer = torch.optim.AdamW(model.parameters())\n"
    "print('writing', flush=True)\n"
    "for step in range(1, 10**9):\n"
    "    model(torch.randn(4, 8)).sum().backward(); optimizer.step()\n"
    "    save_resume(Path(sys.argv[1]), model, optimizer, step, {})\n"
)


def test_reading_a_resume_state_while_its_writer_replaces_it_sees_one_whole_file(tmp_path):
    # A sweep's progress poll (and `jobs`) reads resume states that a worker replaces every
    # few milliseconds. safetensors.safe_open opens the path once for the header and again
    # for the tensors, so a read could pair one file's checksum with the next one's tensors:
    # on the code before the fix 2% of reads failed "fails its checksum" (about 2,600 of
    # 120,000 in 30 s), so a few seconds of polling fail it with near certainty.
    writer = subprocess.Popen([sys.executable, "-c", WRITE_RESUME_FOREVER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "writing"
        deadline, steps = time.monotonic() + 4.0, []
        while time.monotonic() < deadline:
            step = read_resume_step(tmp_path)  # raises CheckpointError on a torn read
            if step is not None:
                steps.append(step)
    finally:
        writer.kill()
        writer.wait(timeout=30)
    assert len(steps) > 1000 and steps == sorted(steps)  # many reads, each of one whole file, in order


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o002])
def test_atomically_written_files_get_the_umask_mode_as_open_would(tmp_path, umask):
    from windtunnel.files import atomic_write_text

    previous = os.umask(umask)
    try:
        atomic_write_text(tmp_path / "atomic.txt", "x")
        with open(tmp_path / "plain.txt", "w") as f:  # the oracle: what the OS gives a file made with open()
            f.write("x")
    finally:
        os.umask(previous)
    mode = lambda p: (tmp_path / p).stat().st_mode & 0o777  # noqa: E731
    assert mode("atomic.txt") == mode("plain.txt") == 0o666 & ~umask


# --- Ctrl-C at any moment -----------------------------------------------------------------


# From 0.8 s: before windtunnel's first line runs the interpreter itself is starting (runpy's
# own imports: ~0.05 s on an idle machine, 0.3 s and more on a loaded one), and a SIGINT there
# is Python's to report. Importing torch takes the next seconds.
@pytest.mark.parametrize("delay_s", [0.8, 1.5, 3.0, 6.0])
def test_ctrl_c_at_any_moment_of_start_up_or_training_exits_130_with_one_line(tmp_path, write_config, delay_s):
    """SIGINT during the imports of torch, argument checks, model building or training:
    always exit 130, no traceback, and the run directory is either absent or resumable."""
    config = write_config(tmp_path, steps=300_000, checkpoint_every=10)
    out = tmp_path / "run"
    # Started with SIGINT ignored, as a non-interactive shell starts a background job (and as
    # CI may run this suite): the command must take SIGINT anyway.
    process = subprocess.Popen(
        [sys.executable, "-m", "windtunnel", "train", str(config), "--out", str(out), "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    time.sleep(delay_s)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "interrupted" in err
    if out.exists() and any(p.name != ".lock" for p in out.iterdir()):
        assert main(["train", "--resume", str(out), "--quiet", "--set", "train.steps=20", "--force"]) == 0


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv to run as another user")
def test_out_in_a_read_only_directory_is_one_line_for_a_user_without_write_access(write_config):
    """Root may write anywhere, so the command runs as `nobody` (setpriv) in a folder it may read but not write."""
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="windtunnel-ro-"))
    try:
        config = write_config(folder)
        read_only = folder / "shared"
        read_only.mkdir()
        for path in (folder, config, read_only):
            path.chmod(0o755 if path.is_dir() else 0o644)
        read_only.chmod(0o555)
        home = folder / "home"  # where `nobody` may write its caches (matplotlib's)
        home.mkdir(mode=0o777)
        home.chmod(0o777)
        before = sorted(p.name for p in read_only.iterdir())
        as_nobody = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable]
        env = {**os.environ, "HOME": str(home), "MPLCONFIGDIR": str(home)}
        probe = subprocess.run([*as_nobody, "-c", "import windtunnel.cli"], capture_output=True, text=True, timeout=300, env=env)
        if probe.returncode != 0:  # e.g. a checkout or virtual environment only its owner may read
            pytest.skip(f"`nobody` cannot import windtunnel here: {probe.stderr.strip().splitlines()[-1:]}")
        result = subprocess.run(
            [*as_nobody, "-m", "windtunnel", "train", str(config), "--out", str(read_only / "run"), "--quiet"],
            capture_output=True, text=True, timeout=300, env=env,
        )
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip() == f"windtunnel: error: cannot create {str(read_only / 'run')!r}: Permission denied"
        assert sorted(p.name for p in read_only.iterdir()) == before == []
    finally:
        read_only.chmod(0o755)
        shutil.rmtree(folder)
