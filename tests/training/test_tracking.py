"""Experiment tracking (``train.log_to``) and progress: TensorBoard's event files, read back with
TensorBoard's own reader, equal metrics.jsonl step for step, also across a crash and resume;
W&B (offline) likewise; a sink that is unknown or not installed is refused before anything is
written; progress is plain lines off a terminal, a bar on one, nothing with --quiet."""

from __future__ import annotations

import hashlib
import io
import json
import math
import re
import struct
import sys
from collections import Counter
from pathlib import Path

import pytest

from windtunnel.cli import main
from windtunnel.config import ConfigError
from windtunnel import progress as progress_module
from windtunnel.progress import TrainingProgress
from windtunnel.run_config import load_run_config
from windtunnel.runs import evaluate_run
from windtunnel.training.tracking import TENSORBOARD_DIR
from windtunnel.training.trainer import train

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader  # noqa: E402
from tensorboard.util.tensor_util import make_ndarray  # noqa: E402
from scopes import once_per_module

# TensorBoard stores a scalar as float32: a float64 from metrics.jsonl comes back rounded to
# the nearest float32, which moves it by at most float32's unit roundoff, 2**-24 relative
# (for normal numbers; every value here is either 0 or far above float32's smallest normal).
# Values of neighbouring steps differ by much more (the loss moves by ~1e-3 a step).
FLOAT32_ROUNDOFF = 2.0**-24


class _Crash(RuntimeError):
    pass


def _crash_at(step: int):
    def on_step(done: int) -> None:
        if done == step:
            raise _Crash

    return on_step


def tensorboard_scalars(run_dir: Path) -> list[tuple[str, int, float]]:
    """Every scalar event under ``run_dir/tensorboard``, as (tag, step, value), read with
    TensorBoard's own loader (no de-duplication: a step written twice is seen twice)."""
    events = []
    for path in sorted((run_dir / TENSORBOARD_DIR).rglob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                events.append((value.tag, event.step, float(make_ndarray(value.tensor))))
    return events


def metrics_scalars(run_dir: Path) -> list[tuple[str, int, float]]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(key, r["step"], value) for r in records for key, value in r.items() if key != "step"]


def mismatches(logged: list[tuple[str, int, float]], expected: list[tuple[str, int, float]]) -> list[str]:
    """What differs between the scalars a sink holds and the expected ones: a (tag, step)
    missing, extra or logged more than once, or a value beyond float32 rounding."""
    problems = []
    counts = Counter((tag, step) for tag, step, _ in logged)
    problems += [f"{key} logged {n} times" for key, n in counts.items() if n > 1]
    wanted = {(tag, step): value for tag, step, value in expected}
    problems += [f"{key} missing" for key in wanted.keys() - counts.keys()]
    problems += [f"{key} not in metrics.jsonl" for key in counts.keys() - wanted.keys()]
    for tag, step, value in logged:
        if (tag, step) in wanted and not math.isclose(value, wanted[tag, step], rel_tol=FLOAT32_ROUNDOFF, abs_tol=0.0):
            problems.append(f"{(tag, step)}: {value} != {wanted[tag, step]}")
    return problems


def training_scalars(events: list[tuple[str, int, float]]) -> list[tuple[str, int, float]]:
    return [e for e in events if not e[0].startswith("final_eval/")]


@pytest.fixture(scope=once_per_module)
def tracked_run(tmp_path_factory, write_config) -> Path:
    """A 20-step run logged to TensorBoard (logs every 5 steps, evaluations every 10)."""
    folder = tmp_path_factory.mktemp("tracked")
    config = load_run_config(write_config(folder, steps=20, checkpoint_every=10), ["train.log_to=tensorboard"])
    train(config, folder / "run", progress=False)
    return folder / "run"


def test_tensorboard_holds_every_scalar_of_metrics_jsonl_once(tracked_run):
    events = tensorboard_scalars(tracked_run)
    expected = metrics_scalars(tracked_run)
    assert {tag for tag, _, _ in expected} >= {"loss", "lr", "grad_norm", "seq_per_s", "elapsed_s", "eval_mae_bits"}
    assert mismatches(training_scalars(events), expected) == []

    # The comparison sees a changed value, a duplicated step and a missing one.
    tag, step, value = expected[0]
    tampered = [(tag, step, value * (1 + 1e-6)), *expected[1:]]
    assert mismatches(training_scalars(events), tampered) == [f"{(tag, step)}: {events[0][2]} != {value * (1 + 1e-6)}"]
    assert mismatches([*training_scalars(events), events[0]], expected) == [f"{(tag, step)} logged 2 times"]
    assert mismatches(training_scalars(events)[1:], expected) == [f"{(tag, step)} missing"]


def test_tensorboard_holds_the_final_evaluation_curves(tracked_run):
    """The curves the final evaluation computed, by position: the same as `windtunnel eval`
    computes from the final weights on the same held-out set."""
    curves = evaluate_run(tracked_run, write=False)["horizons"]["5"]["curves"]  # V = 6: horizon 5
    logged = [e for e in tensorboard_scalars(tracked_run) if e[0].startswith("final_eval/")]
    expected = [(f"final_eval/{name}", p, v) for name, values in curves.items() for p, v in enumerate(values, start=1)]
    assert len(expected) == 4 * 5 and mismatches(logged, expected) == []


def test_a_crash_and_resume_leave_each_step_once(tracked_run, tmp_path, write_config):
    """Crashed at step 17, after the log of step 15 and past the checkpoint of step 10: the
    resumed run recomputes 15, and the event files still hold it once."""
    config = load_run_config(write_config(tmp_path, steps=20, checkpoint_every=10), ["train.log_to=tensorboard"])
    run_dir = tmp_path / "run"
    with pytest.raises(_Crash):
        train(config, run_dir, progress=False, on_step=_crash_at(17))
    assert max(step for _, step, _ in tensorboard_scalars(run_dir)) == 15  # written before the crash
    train(config, run_dir, resume=True, progress=False)
    events = tensorboard_scalars(run_dir)
    assert mismatches(training_scalars(events), metrics_scalars(run_dir)) == []
    assert Counter(tag for tag, _, _ in events)["final_eval/kl_bits"] == 5  # the curves once too
    # On CPU the resumed run is the uninterrupted one: the same numbers reach TensorBoard.
    deterministic = {"loss", "lr", "grad_norm", "eval_mae_bits", "eval_kl_bits", "eval_mae_aggregate_bits"}
    assert sorted(e for e in events if e[0] in deterministic) == sorted(
        e for e in tensorboard_scalars(tracked_run) if e[0] in deterministic
    )


def test_an_unknown_sink_is_refused_with_the_allowed_ones(write_config, tmp_path):
    with pytest.raises(ConfigError, match=r"unknown sink 'comet'; allowed: tensorboard, wandb, mlflow"):
        load_run_config(write_config(tmp_path), ["train.log_to=tensorboard,comet"])
    with pytest.raises(ConfigError, match="names a sink twice"):
        load_run_config(write_config(tmp_path), ["train.log_to=tensorboard,tensorboard"])


def _tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()}


def test_a_sink_not_installed_exits_2_and_writes_nothing(tracked_run, tmp_path, write_config, monkeypatch, capsys):
    """`windtunnel train` with W&B missing (hidden from the import system: a ``None`` entry in
    ``sys.modules`` is how Python marks a module that cannot be imported), for a new run and for
    a resume that would add it: one line, exit 2, nothing written."""
    monkeypatch.setitem(sys.modules, "wandb", None)
    config = write_config(tmp_path)
    before = _tree(tracked_run)
    for args in (
        [str(config), "--out", str(tmp_path / "new"), "--set", "train.log_to=wandb"],
        ["--resume", str(tracked_run), "--set", "train.log_to=tensorboard,wandb", "--force"],
    ):
        capsys.readouterr()
        assert main(["train", *args]) == 2
        assert capsys.readouterr().err.strip().splitlines() == [
            f"windtunnel: error: train.log_to={['wandb'] if '--out' in args else ['tensorboard', 'wandb']} "
            "needs the wandb package, which is not installed: pip install wandb"
        ]
    assert not (tmp_path / "new").exists()
    assert _tree(tracked_run) == before


def _wandb_history(run_dir: Path) -> list[tuple[str, int, float]]:
    """The scalars of every W&B offline run file under ``run_dir/wandb``, read with W&B's own
    record type (``wandb.proto``) from its log format: a 7-byte header, then 32 KiB blocks of
    chunks (crc32 4 bytes, length 2, type 1: full, first, middle, last)."""
    from wandb.proto import wandb_internal_pb2

    scalars = []
    for path in sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb")):
        data, position, block, pending = path.read_bytes(), 7, 32768, b""
        assert data[:4] == b":W&B"
        while position + 7 <= len(data):
            if block - position % block < 7:  # a block's tail too short for a chunk header is padding
                position += block - position % block
                continue
            _, length, kind = struct.unpack("<IHB", data[position : position + 7])
            pending += data[position + 7 : position + 7 + length]
            position += 7 + length
            if kind in (1, 4):  # a whole record, or the last piece of one
                record = wandb_internal_pb2.Record()
                record.ParseFromString(pending)
                pending = b""
                if record.WhichOneof("record_type") == "history":
                    for item in record.history.item:
                        key = item.key or "/".join(item.nested_key)
                        if not key.startswith(("_", "final_eval/")):  # W&B's own (_step, _runtime, ...), the curves' table
                            scalars.append((key, record.history.step.num, json.loads(item.value_json)))
    return scalars


@pytest.mark.slow
def test_wandb_offline_holds_every_scalar_once_across_a_resume(tmp_path, write_config, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    config = load_run_config(write_config(tmp_path, steps=20, checkpoint_every=10), ["train.log_to=wandb"])
    run_dir = tmp_path / "run"
    with pytest.raises(_Crash):
        train(config, run_dir, progress=False, on_step=_crash_at(17))
    wandb.teardown()  # W&B's service writes its file in its own time; at the latest when the process ends
    assert max(step for _, step, _ in _wandb_history(run_dir)) == 15
    train(config, run_dir, resume=True, progress=False)
    wandb.teardown()
    history = _wandb_history(run_dir)
    # W&B keeps float64 (JSON): the values are metrics.jsonl's to the bit, except step 15's
    # throughput and timing, which W&B has from the first session (it skips what it holds).
    expected = metrics_scalars(run_dir)
    assert mismatches(history, expected) == [
        f"{(tag, 15)}: {value} != {dict(((t, s), v) for t, s, v in expected)[tag, 15]}"
        for tag, step, value in history
        if step == 15 and tag in ("seq_per_s", "elapsed_s")
    ]
    assert len({s for _, s, _ in history}) == 4


def _run_with_progress(config, run_dir, capfd, enabled: bool) -> str:
    train(config, run_dir, progress=enabled)
    return capfd.readouterr().err


def test_progress_off_a_terminal_is_plain_lines_and_quiet_is_nothing(tmp_path, write_config, capfd, monkeypatch):
    config = load_run_config(write_config(tmp_path, steps=10, checkpoint_every=0), ["train.eval_every=5"])
    monkeypatch.setattr(progress_module, "PLAIN_EVERY_S", 0.0)  # a line at every step, not every 10 s
    err = _run_with_progress(config, tmp_path / "shown", capfd, True)
    assert "\r" not in err
    lines = err.splitlines()
    assert len(lines) == 10
    pattern = r"step (\d+)/10 \[\d\d:\d\d<\d\d:\d\d, +[\d.]+(step/s|s/step), loss \d+\.\d{4}, mae (-|\d\.\d{4} bits)\]"
    assert [int(re.fullmatch(pattern, line).group(1)) for line in lines] == list(range(1, 11)), err
    assert lines[3].endswith("mae -]") and lines[5].endswith(" bits]")  # the first evaluation is at step 5
    assert _run_with_progress(config, tmp_path / "quiet", capfd, False) == ""


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class _CountedLoss:
    """A stand-in for the loss tensor that counts its reads."""

    def __init__(self) -> None:
        self.reads = 0

    def item(self) -> float:
        self.reads += 1
        return 1.25


def test_progress_reads_the_loss_only_when_it_draws():
    loss, stream = _CountedLoss(), io.StringIO()
    shown = TrainingProgress(total=1000, start=0, enabled=True, stream=stream)
    for step in range(1, 1000):
        shown.update(step, loss, None)  # well within 10 s: no line is due
    assert loss.reads == 0 and stream.getvalue() == ""
    shown.update(1000, loss, 0.5, force=True)
    assert loss.reads == 1 and stream.getvalue().startswith("step 1000/1000 [")


def test_progress_on_a_terminal_is_a_bar_with_eta_loss_and_mae():
    terminal = _Terminal()
    shown = TrainingProgress(total=40, start=10, enabled=True, stream=terminal)
    shown.update(20, _CountedLoss(), 0.123456, force=True)
    shown.close()
    drawn = terminal.getvalue().split("\r")[-2]  # the last state drawn before the bar closed
    assert re.search(r"train:  50%\|.*\| 20/40 \[\d\d:\d\d<\d\d:\d\d, .*step/s, loss 1\.2500, mae 0\.1235 bits\]", drawn), drawn


def test_the_analyses_stage_names_each_analysis_as_it_starts_with_an_eta_from_the_finished_groups():
    from windtunnel.progress import AnalysesProgress

    now = [100.0]
    lines: list[str] = []
    progress = AnalysesProgress(4, lines.append, clock=lambda: now[0])
    progress.start_group("bijection_transformer")
    now[0] = 130.0
    progress.starting("probes", 2, 7, "trained weights")
    assert lines[-1] == "[analyze] group 1/4 bijection_transformer: probes (2/7, trained weights); 00:30 so far, ETA after the first group"
    now[0] = 160.0  # the first group took 60 s: three more at that pace are 180 s
    progress.end_group()
    progress.start_group("hmm_transformer")
    now[0] = 190.0  # 90 s so far over 1 group done: (90 / 1) * 3 left
    progress.starting("layer_ablation", 1, 7, "initial weights")
    assert lines[-1] == "[analyze] group 2/4 hmm_transformer: layer_ablation (1/7, initial weights); 01:30 so far, about 04:30 left"
