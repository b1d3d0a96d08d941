"""Several training runs, one after another or side by side in worker processes, resumable.

Each :class:`TrainJob` is one ``windtunnel train`` run. :func:`run_jobs` looks at what is
on disk first: a finished run is kept, an interrupted one is resumed from its checkpoint,
a missing one is started. With ``parallel=J`` it keeps J processes busy, each given
``cores // J`` threads (on a small CPU, two single-threaded runs side by side train ~1.4×
the steps per second of one run using both cores: small matrices do not parallelize well
inside one process). It prints which runs are going and an overall ETA: on a terminal as a
tqdm bar over the runs (with each running run's step), elsewhere as a plain line every 30 s.

Workers run in their own sessions, so a Ctrl-C (or SIGTERM) reaches only this process,
which passes one SIGINT to each worker: each saves at its next step boundary and exits,
and :func:`run_jobs` raises :class:`~windtunnel.training.TrainingInterrupted`; running it
again resumes every run where it stopped.

    from windtunnel.jobs import TrainJob, run_jobs
    run_jobs([TrainJob("seed0", Path("cfg.toml"), Path("out/seed0"), ("train.seed=0",)), ...], parallel=2)
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

from tqdm import tqdm

from windtunnel.config import ConfigError
from windtunnel.exit_codes import EXIT_INTERRUPTED
from windtunnel.history import MetricsError, clock_segments, parse_metrics
from windtunnel.progress import is_terminal
from windtunnel.run_config import RunConfig, load_run_config
from windtunnel.run_layout import CONFIG_FILE, LOGS_DIR, METRICS_FILE
from windtunnel.runs import read_run_config, run_end_step
from windtunnel.training.checkpoint import list_snapshots, read_final_weights_step, read_resume_step
from windtunnel.training.trainer import TrainingInterrupted

__all__ = [
    "Engine", "GroupJob", "Job", "JobFailed", "LocalEngine", "TrainJob", "group_jobs", "exit_error", "job_state", "run_jobs", "status_line", "stop_signals", "threads_per_run", "train_command",
    "unfinished", "worker_env",
]

State = Literal["done", "partial", "new"]
T = TypeVar("T")


class JobFailed(RuntimeError):
    """A worker exited with an error; the message names the run and its log."""


@dataclass(frozen=True)
class TrainJob:
    """One training run: ``config`` (a run config file) with ``overrides``, into ``run_dir``.

    ``expected_s`` is a guess of its wall time, used for the ETA until the run reports
    its own speed. ``preset`` names the reproduction preset the run is a seed of (the
    seeds of one preset are analyzed together); empty for a job outside a reproduction.
    """

    name: str
    config: Path
    run_dir: Path
    overrides: tuple[str, ...] = ()
    expected_s: float | None = field(default=None, compare=False)
    preset: str = ""

    def resolved(self) -> RunConfig:
        """The run config this job trains (validated)."""
        return load_run_config(self.config, self.overrides)

    @property
    def runs_folder(self) -> Path:
        """The folder that holds the run directory, where the worker runs (:func:`train_command`)."""
        return self.run_dir.parent

    @property
    def log(self) -> Path:
        """Where the worker's output goes: ``logs/`` beside the run directory (which must
        start empty, and which a glob over the runs should not also match)."""
        return self.run_dir.parent / LOGS_DIR / f"{self.run_dir.name}.log"


    def absolute(self) -> TrainJob:
        """The job with absolute paths (what a worker on another node or folder needs)."""
        return dataclasses.replace(self, config=self.config.absolute(), run_dir=self.run_dir.absolute())

    def clear_unstarted(self) -> None:
        """Remove the folder of a run that stopped before its first checkpoint (its state is
        ``new``): nothing to keep. A run with a checkpoint or finished is left as it is."""
        if self.run_dir.exists() and job_state(self) == "new":
            shutil.rmtree(self.run_dir)


@dataclass(frozen=True)
class GroupJob:
    """Runs trained together as one run group (:mod:`windtunnel.training.group`) in one worker:
    one job to the engines, each member a :class:`TrainJob` with its own run directory (all
    in one runs folder). Its state is its members' (done when all are); its progress, the
    first member's (the members step together)."""

    name: str
    members: tuple[TrainJob, ...]
    expected_s: float | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if len({member.runs_folder for member in self.members}) != 1:
            raise ValueError("the members of a group job share one runs folder")

    @property
    def run_dir(self) -> Path:
        return self.members[0].run_dir

    @property
    def runs_folder(self) -> Path:
        return self.members[0].runs_folder

    @property
    def log(self) -> Path:
        return self.runs_folder / LOGS_DIR / f"{self.name}.log"

    def resolved(self) -> RunConfig:
        return self.members[0].resolved()

    def absolute(self) -> GroupJob:
        return dataclasses.replace(self, members=tuple(member.absolute() for member in self.members))

    def clear_unstarted(self) -> None:
        for member in self.members:
            member.clear_unstarted()


Job = TrainJob | GroupJob


def group_jobs(jobs: Sequence[TrainJob], wanted: Callable[[RunConfig], bool]) -> list[Job]:
    """``jobs`` with the runs that can train as one run group (one runs folder, one family that
    stacks, the same shapes and settings but the seed and the tunnel's variant:
    :func:`windtunnel.training.group.group_key`) and for which ``wanted(config)`` says so
    joined into :class:`GroupJob` s, each where its first member was; the others as they are.
    A group's expected time is its members' summed (an upper bound: what they take alone)."""
    from windtunnel.models.build import model_class
    from windtunnel.training.group import group_key

    keyed: dict[tuple, list[TrainJob]] = {}
    order: list[tuple | TrainJob] = []
    for job in jobs:
        config = job.resolved()
        if model_class(config.model_kind).not_stackable is not None or not wanted(config):
            order.append(job)
            continue
        key = (job.runs_folder, group_key(config))
        if key not in keyed:
            keyed[key] = []
            order.append(key)
        keyed[key].append(job)
    grouped: list[Job] = []
    for entry in order:
        if isinstance(entry, TrainJob):
            grouped.append(entry)
            continue
        members = keyed[entry]
        if len(members) == 1:
            grouped.append(members[0])
            continue
        expected = [m.expected_s for m in members]
        grouped.append(GroupJob(f"{members[0].name}+{len(members) - 1}", tuple(members),
                                expected_s=None if None in expected else sum(expected)))
    return grouped


def job_state(job: Job) -> State:
    """``done`` (the final snapshot written, at its configured steps or where its time limit
    stopped it, or its final weights kept alone: a results folder's run), ``partial`` (a
    checkpoint to resume) or ``new``. A group is done when every member is, new when every
    member is, else partial.

    Raises ConfigError if ``run_dir`` holds a run of a different config: a reproduction
    never silently mixes runs of two protocols (another device or time limit is the same protocol).
    """
    if isinstance(job, GroupJob):
        states = {job_state(member) for member in job.members}
        return states.pop() if len(states) == 1 and states <= {"done", "new"} else "partial"
    if not (job.run_dir / CONFIG_FILE).is_file():
        return "new"
    stored, wanted = read_run_config(job.run_dir), job.resolved()
    if _protocol(stored) != _protocol(wanted):
        raise ConfigError(
            f"{str(job.run_dir)!r} holds a run of another config than {job.name!r} asks for; "
            "use a new output directory (or delete that run)"
        )
    if read_final_weights_step(job.run_dir) is not None:
        return "done"
    if list_snapshots(job.run_dir)[-1:] == [run_end_step(job.run_dir, stored)]:
        return "done"
    return "partial" if read_resume_step(job.run_dir) is not None else "new"


def _protocol(config: RunConfig) -> RunConfig:
    """``config`` without where it trains and its stopping rule (``train.device``,
    ``train.time_limit_s``): a run of the same protocol on another machine is the same run."""
    return dataclasses.replace(config, train=dataclasses.replace(config.train, time_limit_s=0.0, device="auto"))


def train_command(job: TrainJob, state: State, nproc_per_run: int = 1) -> list[str]:
    """The `windtunnel train` command line that starts (``new``) or resumes (``partial``) ``job``
    with the Python running this process, to run in ``job.runs_folder``: it names the run by
    its folder's name, so what the worker prints into its log (the run it trained, how to
    resume it) holds no path of this machine."""
    if isinstance(job, GroupJob):  # one worker trains the group (or each member alone, where resume needs it)
        members = [{"config": str(m.config.absolute()), "run_dir": m.run_dir.name, "overrides": list(m.overrides)} for m in job.members]
        return [sys.executable, "-m", "windtunnel.group_worker", json.dumps(members)]
    base = [sys.executable, "-m", "windtunnel", "train", "--quiet"]
    if nproc_per_run > 1:  # one DDP run over several processes (GPUs), through PyTorch's own launcher
        launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc_per_run}", "-m"]
        base = [sys.executable, *launcher, "windtunnel", "train", "--quiet"]
    if state == "partial":
        return [*base, "--resume", job.run_dir.name]
    return [*base, str(job.config.absolute()), "--out", job.run_dir.name, *(f"--set={o}" for o in job.overrides)]


def _progress(job: TrainJob) -> tuple[int, float]:
    """(last logged step, seconds per step measured by the run), from its metrics log."""
    try:  # the worker appends as we read: a half-written last line is left out, never fatal
        records = parse_metrics(job.run_dir / METRICS_FILE)[0][-40:]
    except (OSError, MetricsError):
        return 0, 0.0
    segments = clock_segments(records)
    records = segments[-1] if segments else []  # this start's records: a resumed run's clock restarts
    if len(records) < 2:
        return (records[-1]["step"] if records else 0), 0.0
    first, last = records[0], records[-1]
    rate = (last["elapsed_s"] - first["elapsed_s"]) / max(last["step"] - first["step"], 1)
    return last["step"], rate


def _format_duration(seconds: float) -> str:
    minutes = int(seconds // 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m{int(seconds % 60):02d}s"


def run_jobs(
    jobs: Sequence[TrainJob],
    *,
    parallel: int = 1,
    nproc_per_run: int = 1,
    report: Callable[[str], None] | None = None,
    report_every_s: float = 30.0,
) -> None:
    """Train every job not yet done, ``parallel`` at a time (see the module docstring).

    ``nproc_per_run > 1`` launches each run under ``torch.distributed.run`` with that many
    processes (DDP; e.g. one per GPU). ``report`` receives one-line progress messages
    (default: printed to stderr, with a bar over the runs when stderr is a terminal).
    Raises JobFailed naming the job and its log if a worker fails.
    """
    say = report or (lambda line: print(line, file=sys.stderr, flush=True))
    states, pending = unfinished(jobs, parallel, nproc_per_run, say)
    total, done = len(jobs), len(jobs) - len(pending)
    if not pending:
        return
    say(f"[train] {done}/{total} runs already done; {len(pending)} to go, {parallel} at a time")
    bar: tqdm | None = None
    if report is None and is_terminal(sys.stderr):
        # Runs finished count whole, running ones by their logged step; the ETA is status_line's
        # (the runs' measured speeds), which a count of finished runs could not give early on.
        bar = tqdm(
            total=total, initial=done, desc="[train]", file=sys.stderr, mininterval=0, miniters=1, dynamic_ncols=True,
            bar_format="{desc} {n:.1f}/{total_fmt} runs |{bar}| {elapsed}{postfix}",
        )
        say = lambda line: bar.write(line, file=sys.stderr)  # noqa: E731 - above the bar, which stays at the bottom
    env = worker_env(threads_per_run(parallel, nproc_per_run))
    running: dict[str, tuple[TrainJob, subprocess.Popen, float]] = {}
    last_report = 0.0
    with stop_signals() as stop_requested:
        try:
            while pending or running:
                while pending and len(running) < parallel and not stop_requested:
                    job = pending.pop(0)
                    state = job_state(job)
                    if state != "done":
                        job.clear_unstarted()
                    job.log.parent.mkdir(parents=True, exist_ok=True)
                    with job.log.open("a") as log:
                        process = subprocess.Popen(
                            train_command(job, state, nproc_per_run), cwd=job.runs_folder, stdout=log, stderr=subprocess.STDOUT,
                            env=env, start_new_session=True,
                        )
                    running[job.name] = (job, process, time.monotonic())
                    say(f"[train] {'resuming' if state == 'partial' else 'starting'} {job.name}")
                time.sleep(0.5)
                if stop_requested:
                    raise KeyboardInterrupt
                for name, (job, process, _) in list(running.items()):
                    code = process.poll()
                    if code is None:
                        continue
                    del running[name]
                    error = exit_error(job, code)
                    if error is not None:  # stop the others too, so all resume together
                        _stop(running)
                        raise error
                    done += 1
                    say(f"[train] {done}/{total} done: {job.name}")
                now = time.monotonic()
                if running and now - last_report >= (1.0 if bar is not None else report_every_s):
                    last_report = now
                    status = status_line([(j, t) for j, _, t in running.values()], pending, parallel)
                    if bar is not None:
                        bar.n = done + sum(min(_progress(job)[0] / job.resolved().train.steps, 1.0) for job, _, _ in running.values())
                        bar.set_postfix_str(status)
                    else:
                        say(f"[train] {done}/{total} done; {status}")
        except KeyboardInterrupt:
            _stop(running)
            raise TrainingInterrupted("interrupted; run the same command again to resume") from None
        finally:
            if bar is not None:
                bar.n = done  # the bar's last state: the runs finished
                bar.close()


class Engine(Protocol):
    """What trains the runs of a sweep or a reproduction: this machine's worker processes
    (:class:`LocalEngine`) or Ray tasks (:class:`~windtunnel.ray_engine.RayEngine`). Callers
    hold one and never ask which; ``windtunnel.ray_engine.open_engine`` gives the one named."""

    def run_jobs(
        self, jobs: Sequence[TrainJob], *, parallel: int = 1, nproc_per_run: int = 1, report: Callable[[str], None] | None = None
    ) -> None:
        """Train every job not yet done (:func:`run_jobs` says how, and what it raises)."""

    def measurer(self, parallel: int, nproc_per_run: int, measure: Callable[[TrainJob, int, int], T]) -> Callable[[TrainJob, int, int], T]:
        """``measure(job, steps, threads)`` made to run where ``job`` will train (its warm-up timing)."""


class LocalEngine:
    """The :class:`Engine` of this machine: :func:`run_jobs`'s worker processes; a measurement
    runs in this process, on the device the runs will use."""

    def run_jobs(
        self, jobs: Sequence[TrainJob], *, parallel: int = 1, nproc_per_run: int = 1, report: Callable[[str], None] | None = None
    ) -> None:
        run_jobs(jobs, parallel=parallel, nproc_per_run=nproc_per_run, report=report)

    def measurer(self, parallel: int, nproc_per_run: int, measure: Callable[[TrainJob, int, int], T]) -> Callable[[TrainJob, int, int], T]:
        return measure


def unfinished(
    jobs: Sequence[TrainJob], parallel: int, nproc_per_run: int, say: Callable[[str], None]
) -> tuple[dict[str, State], list[TrainJob]]:
    """Every job's state on disk, and the jobs not yet done, in order (what both engines
    start from); says so when none is left. Refuses a ``parallel`` or ``nproc_per_run`` below 1."""
    if parallel < 1 or nproc_per_run < 1:
        raise ConfigError(f"--jobs and --nproc-per-run must be at least 1, got {parallel} and {nproc_per_run}")
    states = {job.name: job_state(job) for job in jobs}
    pending = [job for job in jobs if states[job.name] != "done"]
    if not pending:
        say(f"[train] all {len(jobs)} runs already done")
    return states, pending


def exit_error(job: TrainJob, code: int) -> Exception | None:
    """What a worker's exit ``code`` means for the set of runs: None for success,
    TrainingInterrupted for a run stopped from outside (its state saved), else JobFailed
    naming the job, the last line it logged and its log."""
    if code == 0:
        return None
    if code == EXIT_INTERRUPTED:
        return TrainingInterrupted(f"{job.name} was interrupted; run again to resume")
    return JobFailed(f"training {job.name} failed (exit {code}): {last_log_line(job)} (log: {job.log})")


def last_log_line(job: TrainJob) -> str:
    """The last line its worker wrote (what a failed run died of)."""
    try:
        return (job.log.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"])[0]
    except OSError:
        return "(no log)"


def threads_per_run(parallel: int, nproc_per_run: int = 1) -> int:
    """CPU threads each process of a run gets when ``parallel`` runs share this machine's cores."""
    return max(1, (os.cpu_count() or 1) // (parallel * nproc_per_run))


def worker_env(threads: int) -> dict[str, str]:
    """The environment of a ``windtunnel train`` worker: this one, with ``threads`` threads,
    and any ``PYTHONPATH`` made absolute (the worker runs in its runs folder: a relative entry
    would find other code, or none)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    if env.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in env["PYTHONPATH"].split(os.pathsep) if p)
    return env


@contextmanager
def stop_signals() -> Iterator[list[int]]:
    """Ctrl-C and SIGTERM, while in the block, only append to the list it yields, which the
    caller's loop reads between its steps: an exception raised at an arbitrary point (say
    between starting a worker and recording it) could leave a worker that is never told to stop.
    The list is a plain one because a signal handler must not take locks (Event.set does)."""
    requested: list[int] = []
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        # A process started in the background by a non-interactive shell inherits SIGINT
        # ignored, and Python then leaves it ignored: `kill -INT` would do nothing while the
        # workers (whose trainer takes SIGINT itself) ran on. Take it, as the trainer does.
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, lambda signum, _frame: requested.append(signum))
    try:
        yield requested
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _stop(running: dict[str, tuple[TrainJob, subprocess.Popen, float]]) -> None:
    """Ask the workers to stop as Ctrl-C would (save at the step boundary), and wait."""
    for _, process, _ in running.values():
        process.send_signal(signal.SIGINT)
    for _, process, _ in running.values():
        process.wait()


def status_line(running: Iterable[tuple[TrainJob, float]], pending: Sequence[TrainJob], parallel: int) -> str:
    """Each running job's step (``running``: the jobs with the ``time.monotonic()`` each
    started at) and an ETA for all the work left, ``parallel`` runs at a time."""
    parts, remaining_s = [], 0.0
    for job, started in running:
        steps = job.resolved().train.steps
        step, rate = _progress(job)
        parts.append(f"{job.name} {step}/{steps}")
        if rate:
            remaining_s += (steps - step) * rate
        elif job.expected_s:
            remaining_s += max(job.expected_s - (time.monotonic() - started), 0.0)
    remaining_s += sum(job.expected_s or 0.0 for job in pending)
    eta = f"; ETA {_format_duration(remaining_s / parallel)}" if remaining_s else ""
    return "running " + ", ".join(parts) + eta
