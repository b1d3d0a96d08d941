"""Training runs as Ray tasks: the engine of ``windtunnel sweep/reproduce --engine ray``.

The same runs as :func:`windtunnel.jobs.run_jobs`, with the same semantics, spread over a
Ray cluster (or a local Ray instance) instead of this machine's cores. Each run is one Ray
task that asks for the CPUs the local engine would give the run (this machine's cores over
``parallel``), or for one GPU per process when the run trains on CUDA, and runs the same
``windtunnel train`` command as the local engine in a subprocess on its node. So the run
directory, its resume and its outputs are the local engine's, and the run directories must
be on a file system that every node sees at the same path.

Stopping mirrors the local engine: a Ctrl-C (or SIGTERM) reaches only this process, which
closes a gate every task checks before it starts its run (so no run starts afterwards),
cancels the tasks still queued, and has each running task pass one SIGINT to its training
process, which saves at its next step boundary and exits; then
:class:`~windtunnel.training.TrainingInterrupted` is raised and the same command resumes.
A driver that dies without a word (SIGKILL, a lost login node) takes its Ray job with it:
Ray ends the job's workers, and each training process, whose parent-death signal is SIGINT,
saves and exits as on a Ctrl-C.

    with RayEngine(address=None) as engine:  # None: a local Ray instance
        engine.run_jobs(jobs, parallel=2)
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from windtunnel.exit_codes import EXIT_INTERRUPTED
from windtunnel.config import ConfigError
from windtunnel.jobs import (
    Engine,
    Job,
    JobFailed,
    LocalEngine,
    State,
    TrainJob,
    exit_error,
    status_line,
    stop_signals,
    threads_per_run,
    train_command,
    unfinished,
    worker_env,
)
from windtunnel.training.trainer import TrainingInterrupted

__all__ = ["ENGINES", "RayEngine", "check_engine", "open_engine"]

ENGINES = ("local", "ray")
#: The object store of a local Ray instance: the tasks exchange names and exit codes only.
LOCAL_OBJECT_STORE_BYTES = 100 * 1024**2
#: How often a task looks whether the driver asked the runs to stop, in seconds.
POLL_S = 0.5

T = TypeVar("T")


def check_engine(engine: str, address: str | None) -> None:
    """Refuse ``--address`` without ``--engine ray``, and ``--engine ray`` without Ray installed."""
    if engine not in ENGINES:
        raise ConfigError(f"unknown --engine {engine!r}; choose from: {', '.join(ENGINES)}")
    if address is not None and engine != "ray":
        raise ConfigError("--address attaches to a Ray cluster: it needs --engine ray (the local engine trains on this machine)")
    if engine == "ray":
        try:
            import ray  # noqa: F401
        except ImportError:
            raise ConfigError(
                "--engine ray needs Ray, which is not installed here: pip install 'windtunnel[ray]' (or use --engine local)"
            ) from None


@contextmanager
def open_engine(engine: str, address: str | None = None) -> Iterator[Engine]:
    """The :class:`~windtunnel.jobs.Engine` named (``local`` or ``ray``), for the block of a
    ``with``: Ray is connected (or a local instance started) on entry and shut down on exit."""
    check_engine(engine, address)
    if engine == "ray":
        with RayEngine(address) as ray_engine:
            yield ray_engine
    else:
        yield LocalEngine()


class RayEngine:
    """A connection to a Ray cluster (``address``), or to a local Ray instance it starts
    (``address=None``), for the block of a ``with``; see the module docstring."""

    def __init__(self, address: str | None = None) -> None:
        self.address = address

    def __enter__(self) -> RayEngine:
        import ray

        options: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": False}
        # Workers start `windtunnel train` with their own Python: a PYTHONPATH that makes
        # this process import windtunnel from a source tree has to reach them too.
        if os.environ.get("PYTHONPATH"):
            paths = os.pathsep.join(os.path.abspath(p) for p in os.environ["PYTHONPATH"].split(os.pathsep) if p)
            options["runtime_env"] = {"env_vars": {"PYTHONPATH": paths}}
        if self.address is None:  # "local": a new instance even where RAY_ADDRESS or `ray start` names one
            options.update(address="local", include_dashboard=False, object_store_memory=LOCAL_OBJECT_STORE_BYTES)
        else:
            options["address"] = self.address
        try:
            ray.init(**options)
        except (ConnectionError, ValueError, TimeoutError) as error:
            where = f"the Ray cluster at --address {self.address}" if self.address else "a local Ray instance"
            raise ConfigError(f"cannot reach {where}: {_first_line(error)}") from None
        return self

    def __exit__(self, *exc: object) -> None:
        import ray

        ray.shutdown()

    def measurer(
        self, parallel: int, nproc_per_run: int, measure: Callable[[TrainJob, int, int], T]
    ) -> Callable[[TrainJob, int, int], T]:
        """``measure(job, steps, threads)`` run in a Ray task with ``job``'s resources, so on
        the kind of node (and device) the job will train on: ``reproduce`` times its warm-up there."""
        import ray

        def remote_measure(job: TrainJob, steps: int, threads: int) -> T:
            options = {**self._resources(job, parallel, nproc_per_run), "max_retries": 0}
            return ray.get(ray.remote(measure).options(**options).remote(_absolute(job), steps, threads))

        return remote_measure

    def run_jobs(
        self,
        jobs: Sequence[TrainJob],
        *,
        parallel: int = 1,
        nproc_per_run: int = 1,
        report: Callable[[str], None] | None = None,
        report_every_s: float = 30.0,
    ) -> None:
        """Train every job not yet done (:class:`~windtunnel.jobs.Engine`), as :func:`windtunnel.jobs.run_jobs` does, each in a
        Ray task; as many at a time as the cluster's resources allow (``parallel`` sets the
        CPUs a run asks for: this machine's cores over ``parallel``, as the local engine gives).

        Raises JobFailed naming the job and its log if a run fails (or its node is lost), and
        TrainingInterrupted when the runs were stopped (their state saved).
        """
        import ray

        say = report or (lambda line: print(line, file=sys.stderr, flush=True))
        jobs = [_absolute(job) for job in jobs]  # the workers' working directory is not this one
        states, pending = unfinished(jobs, parallel, nproc_per_run, say)
        total, done = len(jobs), len(jobs) - len(pending)
        if not pending:
            return
        cluster = ray.cluster_resources()
        say(
            f"[train] {done}/{total} runs already done; {len(pending)} to go on Ray "
            f"({int(cluster.get('CPU', 0))} CPUs, {int(cluster.get('GPU', 0))} GPUs in the cluster)"
        )
        gate = ray.remote(StartGate).options(num_cpus=0).remote()
        train_task = ray.remote(train_on_node)
        outstanding: dict[Any, TrainJob] = {}  # ObjectRef -> its job
        started_at: dict[str, float] = {}  # the runs seen started, and when
        last_report = time.monotonic()
        with stop_signals() as stop_requested:
            try:
                for job in pending:  # every run at once: Ray queues those the cluster cannot fit yet
                    if states[job.name] != "done":
                        job.clear_unstarted()
                    threads = self._threads(job, parallel, nproc_per_run)
                    options = {**self._resources(job, parallel, nproc_per_run), "max_retries": 0, "name": f"train {job.name}"}
                    ref = train_task.options(**options).remote(job, states[job.name], nproc_per_run, threads, gate)
                    outstanding[ref] = job
                while outstanding:
                    finished, _ = ray.wait(list(outstanding), num_returns=len(outstanding), timeout=POLL_S)
                    if stop_requested:
                        raise KeyboardInterrupt
                    for name, node in ray.get(gate.started.remote()).items():
                        if name not in started_at:
                            started_at[name] = time.monotonic()
                            say(f"[train] {'resuming' if states[name] == 'partial' else 'starting'} {name} on {node}")
                    for ref in finished:
                        job = outstanding.pop(ref)
                        try:
                            code = ray.get(ref)
                        except ray.exceptions.RayError as error:  # its worker or node died, or the task raised
                            _stop(gate, outstanding)
                            raise JobFailed(f"training {job.name} failed on Ray: {_first_line(error)} (log: {job.log})") from None
                        error = exit_error(job, code)
                        if error is not None:  # stop the others too, so all resume together
                            _stop(gate, outstanding)
                            raise error
                        done += 1
                        say(f"[train] {done}/{total} done: {job.name}")
                    now = time.monotonic()
                    running = [(job, started_at[job.name]) for job in outstanding.values() if job.name in started_at]
                    if running and now - last_report >= report_every_s:
                        last_report = now
                        waiting = [job for job in outstanding.values() if job.name not in started_at]
                        lanes = max(len(running), 1)  # the ETA assumes the cluster keeps running as many at a time
                        say(f"[train] {done}/{total} done; " + status_line(running, waiting, lanes))
            except KeyboardInterrupt:
                _stop(gate, outstanding)
                raise TrainingInterrupted("interrupted; run the same command again to resume") from None

    def _threads(self, job: TrainJob, parallel: int, nproc_per_run: int) -> int:
        """The CPU threads of each of ``job``'s processes (one beside a GPU)."""
        return 1 if self._on_gpu(job) else threads_per_run(parallel, nproc_per_run)

    def _resources(self, job: TrainJob, parallel: int, nproc_per_run: int) -> dict[str, float]:
        """What ``job``'s task asks Ray for: a GPU and a CPU per process on CUDA, else its threads."""
        if self._on_gpu(job):
            return {"num_cpus": nproc_per_run, "num_gpus": nproc_per_run}
        return {"num_cpus": threads_per_run(parallel, nproc_per_run) * nproc_per_run, "num_gpus": 0}

    def _on_gpu(self, job: TrainJob) -> bool:
        """``train.device=cuda``, or ``auto`` (CUDA when present) on a cluster that has GPUs."""
        import ray

        device = job.resolved().train.device
        return device == "cuda" or (device == "auto" and ray.cluster_resources().get("GPU", 0) > 0)


class StartGate:
    """A Ray actor the tasks ask before starting their run; once the driver closes it, no run
    starts. It also tells the driver which runs started, and on which node."""

    def __init__(self) -> None:
        self.runs: dict[str, str] = {}
        self.closed = False

    def enter(self, name: str, node: str) -> bool:
        """Whether run ``name`` may start (recorded as started on ``node`` if so)."""
        if not self.closed:
            self.runs[name] = node
        return not self.closed

    def close(self) -> dict[str, str]:
        """Let no run start from now on; returns the runs that did start."""
        self.closed = True
        return dict(self.runs)

    def is_closed(self) -> bool:
        return self.closed

    def started(self) -> dict[str, str]:
        return dict(self.runs)


def train_on_node(job: TrainJob, state: State, nproc_per_run: int, threads: int, gate: Any) -> int:
    """The body of a run's Ray task: ``windtunnel train`` on this node until it exits, or
    until the gate closes, then the run is stopped as Ctrl-C would. Returns its exit status
    (:data:`EXIT_INTERRUPTED` without starting it if the gate was already closed)."""
    import ray

    if not ray.get(gate.enter.remote(job.name, ray.util.get_node_ip_address())):
        return EXIT_INTERRUPTED
    job.log.parent.mkdir(parents=True, exist_ok=True)
    with job.log.open("a") as log:
        # Its own session, as under the local engine: a signal to this worker's process
        # group does not reach it; this task passes the one SIGINT on.
        process = subprocess.Popen(
            train_command(job, state, nproc_per_run), cwd=job.runs_folder, stdout=log, stderr=subprocess.STDOUT,
            env=worker_env(threads), start_new_session=True,
            preexec_fn=_interrupt_when_orphaned,  # noqa: PLW1509 (two system calls, no locks taken)
        )
    try:
        while True:
            try:
                return process.wait(timeout=POLL_S)
            except subprocess.TimeoutExpired:
                pass
            if ray.get(gate.is_closed.remote()):
                process.send_signal(signal.SIGINT)
                return process.wait()
    finally:
        if process.poll() is None:  # this task was interrupted itself (a cancel): stop the run cleanly all the same
            process.send_signal(signal.SIGINT)
            process.wait()


def _interrupt_when_orphaned() -> None:
    """In the training process before it starts: take SIGINT, and (on Linux) get one when
    its parent, the Ray worker, dies, so a run whose driver or worker was killed saves at its
    step boundary and exits instead of training on unseen (holding its run directory's lock)."""
    # Ray runs tasks in a thread that blocks SIGINT, and a blocked mask survives fork and exec:
    # the trainer would never see its stop request.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    if _LIBC is not None:
        PR_SET_PDEATHSIG = 1
        _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGINT, 0, 0, 0)


# Loaded here, not in the forked child, where only async-signal-safe work belongs.
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def _stop(gate: Any, outstanding: dict[Any, TrainJob]) -> None:
    """Stop every run as Ctrl-C would, and wait: close the gate, cancel the tasks that had not
    started their run, and wait for the others, whose runs save at their next step boundary."""
    import ray

    started = ray.get(gate.close.remote())
    for ref, job in outstanding.items():
        if job.name not in started:
            ray.cancel(ref)
    for ref in outstanding:
        try:
            ray.get(ref)
        except ray.exceptions.RayError:
            pass  # cancelled before it started, or failed: nothing of it to wait for


def _absolute(job: Job) -> Job:
    return job.absolute()


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
