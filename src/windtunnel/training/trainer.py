"""The training loop: fresh episodes every step, AdamW, schedule, clipping, evaluation,
atomic checkpoints, exact resume, and DDP when launched by ``torchrun``.

    from windtunnel.run_config import load_run_config
    from windtunnel.training.trainer import train
    result = train(load_run_config("configs/cpu/bijection_transformer.toml"), "runs/bij")

Reproducibility: the weights are initialized from ``train.seed`` and the batch of step
``s`` on rank ``r`` is drawn from a generator seeded by ``(train.seed, r, s)`` alone. So the
data needs no saved RNG state, ranks draw disjoint data, and a run resumed from any
checkpoint replays exactly the steps it lost: on CPU its final weights are bit-identical
to an uninterrupted run's.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import signal
import sys
import threading
import time
from collections.abc import Callable
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from windtunnel import __version__
from windtunnel.config import ConfigError
from windtunnel.evaluation import EvalSet, evaluate, model_predictor
from windtunnel.files import atomic_write_text
from windtunnel.history import MetricsError, parse_metrics
from windtunnel.memory import check_fits
from windtunnel.models import count_params
from windtunnel.progress import TrainingProgress
from windtunnel.provenance import append_start, commit, cpu_model, device_name
from windtunnel.run_config import RunConfig, TrainConfig, build_run_model
from windtunnel.run_layout import CONFIG_FILE, METRICS_FILE
from windtunnel.training.checkpoint import (
    CheckpointError,
    load_resume,
    read_resume_step,
    save_resume,
    save_snapshot,
    snapshot_steps,
)
from windtunnel.training.distributed import Distributed, pick_device, setup_distributed
from windtunnel.training.schedule import learning_rate
from windtunnel.training.tracking import NO_TRACKING, Tracking, check_installed, open_tracking
from windtunnel.tunnels import Episode

__all__ = ["TrainResult", "TrainingDiverged", "TrainingInterrupted", "data_seed", "train"]


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite; the last checkpoint (if any) is kept."""


class TrainingInterrupted(RuntimeError):
    """Ctrl-C: the state was saved and the run can be resumed."""


@dataclass(frozen=True)
class TrainResult:
    """What :func:`train` returns (on every rank).

    Attributes:
        run_dir: the run directory.
        steps: completed optimizer steps.
        final_eval: the last evaluation on the held-out set (rank 0; None elsewhere).
        wall_s: wall time of this call.
        model: the trained model (unwrapped from DDP), on its training device.
    """

    run_dir: Path
    steps: int
    final_eval: dict[str, Any] | None
    wall_s: float
    model: nn.Module


def data_seed(seed: int, rank: int, step: int) -> int:
    """The seed of the batch of ``step`` on ``rank``: a hash, so streams never overlap in practice."""
    digest = hashlib.sha256(f"windtunnel-train:{seed}:{rank}:{step}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1  # non-negative int64


def data_device_for(t: TrainConfig, device: torch.device) -> torch.device:
    """Where the training batches are drawn: the training device when ``train.data_on_device``
    says so (None: on CUDA), else the host. A CPU run draws on the CPU either way."""
    on_device = device.type == "cuda" if t.data_on_device is None else t.data_on_device
    return device if on_device else torch.device("cpu")


def _optimizer(model: nn.Module, config: RunConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices and embeddings, none on biases and LayerNorm gains,
    nor on a parameter its module marks ``_no_weight_decay`` (Mamba's A_log: the published
    recipe keeps the state decay rates out of weight decay)."""
    decayed = [p.dim() >= 2 and not getattr(p, "_no_weight_decay", False) for p in model.parameters()]
    decay = [p for p, d in zip(model.parameters(), decayed) if d]
    no_decay = [p for p, d in zip(model.parameters(), decayed) if not d]
    t = config.train
    groups = [{"params": decay, "weight_decay": t.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    fused = device.type == "cuda" if t.fused_adamw is None else t.fused_adamw
    return torch.optim.AdamW(groups, lr=t.lr, betas=tuple(t.betas), eps=1e-8, fused=fused or None)


def _loss(logits: torch.Tensor, episode: Episode, target: str) -> torch.Tensor:
    """Cross-entropy at the supervised positions: ``logits`` ``[B, P, C]``."""
    C = logits.shape[-1]
    if target == "hard":
        return F.cross_entropy(logits.reshape(-1, C), episode.targets.reshape(-1))
    log_probs = F.log_softmax(logits.float(), dim=-1)
    return -(episode.posterior.to(log_probs) * log_probs).sum(-1).mean()


class _InterruptFlag:
    """Turns the first Ctrl-C into a request to stop at the next step boundary (a step is
    never cut in half: its optimizer update is all or nothing); a second Ctrl-C aborts."""

    def __init__(self) -> None:
        self.requested = False
        self.previous = None
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def restore(self) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


def _append_metrics(run_dir: Path, record: dict[str, Any]) -> None:
    with open(run_dir / METRICS_FILE, "a") as f:
        f.write(json.dumps(record) + "\n")


def _truncate_metrics(run_dir: Path, step: int) -> list[dict[str, Any]]:
    """Drop metric lines past ``step`` (they will be recomputed by the resumed run), and a
    last line that a crash left half written (with a warning). Returns the records kept."""
    path = run_dir / METRICS_FILE
    kept: list[dict[str, Any]] = []
    if path.exists():
        try:
            records, cut = parse_metrics(path)
        except MetricsError as error:
            raise CheckpointError(f"{error}; repair or remove that line, then resume again") from None
        if cut:
            print(f"windtunnel: warning: dropped the half-written last line of {str(path)!r}", file=sys.stderr)
        kept = [record for record in records if record["step"] <= step]
        atomic_write_text(path, "".join(json.dumps(record) + "\n" for record in kept))
    return kept


def train(
    config: RunConfig,
    run_dir: str | Path,
    *,
    resume: bool = False,
    progress: bool = True,
    on_step: Callable[[int], None] | None = None,
) -> TrainResult:
    """Train the model ``config`` describes, writing everything into ``run_dir``.

    Args:
        config: the run.
        run_dir: the run directory; created for a new run, read for ``resume``.
        resume: continue from ``run_dir/resume.safetensors``.
        progress: show progress on stderr (rank 0): a bar on a terminal, else a line every ~10 s.
        on_step: called with the number of completed steps after each step (tests use it).

    Raises:
        TrainingDiverged: the loss became NaN/inf (nothing of that step was saved).
        TrainingInterrupted: Ctrl-C; the state after the last complete step was saved.
    """
    run_dir = Path(run_dir)
    check_installed(config.train.log_to)  # before anything is written
    # Ctrl-C is a request to stop from here on, not an exception: set-up lazily imports
    # torch's compiler stack (building the optimizer does), and a KeyboardInterrupt in the
    # middle of an import leaves half-imported modules behind. The loop acts on the request.
    interrupt = _InterruptFlag()
    try:
        return _train_on_device(config, run_dir, resume, progress, on_step, interrupt)
    finally:
        interrupt.restore()


def _train_on_device(
    config: RunConfig,
    run_dir: Path,
    resume: bool,
    progress: bool,
    on_step: Callable[[int], None] | None,
    interrupt: _InterruptFlag,
) -> TrainResult:
    t = config.train
    device = pick_device(t.device, int(os.environ.get("LOCAL_RANK", "0")))
    dist = setup_distributed(device)
    # Compiled CPU kernels parallelize some reductions (the embedding gradient's scatter-add)
    # with atomic adds, so on more than one thread two identical runs differ in the last bits;
    # deterministic algorithms make inductor generate the ordered kernels instead.
    deterministic = torch.are_deterministic_algorithms_enabled()
    if t.compile and device.type == "cpu":
        torch.use_deterministic_algorithms(True)
    try:
        return _train(_set_up(config, run_dir, device, dist, resume, interrupt), progress, on_step)
    finally:
        torch.use_deterministic_algorithms(deterministic)
        dist.close()


def _provenance(t: TrainConfig, device: torch.device, start: int, end: int, wall_s: float, rates: list[float], *, stopped: str | None) -> dict[str, Any]:
    """What this start of the run ran on and how fast (``windtunnel.provenance``); ``stopped``:
    None for a start that trained to the configured steps, ``"time_limit"`` or ``"interrupted"``
    (Ctrl-C, its state saved) for one that ended before."""
    timed = sorted(rates[1:] or rates)  # the first interval holds compilation and warm-up
    return {
        "device": device.type, "device_name": device_name(device), "cpu": cpu_model(), "torch": torch.__version__,
        "cuda": torch.version.cuda, "python": platform.python_version(), "windtunnel": __version__, "commit": commit(),
        "precision": "bf16 autocast, float32 weights" if t.bf16 else "float32", "compile": t.compile,
        "start_step": start, "end_step": end, "configured_steps": t.steps, "stopped": stopped,
        "wall_s": round(wall_s, 1), "steps_per_s_median": round(timed[len(timed) // 2], 3) if timed else None,
    }


def _step_bytes(config: RunConfig, batch: int) -> int:
    """A lower bound on a training step's memory: its batch of data, and the float32
    activations kept for the backward pass (a few per layer and position, attention
    scores per head, the logits and their gradient)."""
    model, tunnel = config.model, config.tunnel
    length, classes = tunnel.seq_len(), tunnel.num_classes
    depth = getattr(model, "n_layers", None) or getattr(model, "n_blocks", None) or 1
    width = getattr(model, "d_mlp", None) or getattr(model, "d_hidden", None) or 4 * model.d_model
    heads = getattr(model, "n_heads", 0)
    per_sequence = length * (depth * (4 * model.d_model + width) + 2 * classes) + depth * heads * length * length
    return tunnel.sample_bytes(batch) + 4 * batch * per_sequence


@dataclass
class _Session:
    """One start of a run: what it trains with, set up once, and the state its loop carries."""

    config: RunConfig
    run_dir: Path
    device: torch.device
    dist: Distributed
    interrupt: _InterruptFlag
    model: nn.Module
    optimizer: torch.optim.AdamW
    forward: nn.Module  # the model, under DDP and torch.compile where asked
    autocast: Any
    data_device: torch.device
    local_batch: int
    eval_set: EvalSet | None  # rank 0's held-out set, on the device
    snapshots: set[int]
    meta_base: dict[str, Any]
    tracking: Tracking
    start: int
    # The step reads nothing back from the device: whether a loss was not finite is kept there
    # (the first such step, 0 for none) and read at the next boundary (a log, an evaluation, a
    # checkpoint, a snapshot, the end), before anything is written, so a diverged model is never
    # saved and the message still names the first bad step.
    first_bad_step: torch.Tensor
    first_bad_loss: torch.Tensor
    started: float
    interval_start: float
    interval_steps: int = 0
    rates: list[float] = dataclasses.field(default_factory=list)  # steps/s of each logged interval (the first holds compilation)
    latest: dict[str, Any] = dataclasses.field(default_factory=dict)  # the last evaluation's numbers
    last_mae: float | None = None
    group: dict[str, Any] | None = None  # the run group it trains in (windtunnel.training.group): its size and runs

    @property
    def t(self) -> TrainConfig:
        return self.config.train


@dataclass(frozen=True)
class _Due:
    """The boundary work due after a step."""

    logs: bool
    over_time: bool
    evaluates: bool
    checkpoints: bool
    snapshot: bool
    asked_to_stop: bool

    @property
    def anything(self) -> bool:
        return self.logs or self.evaluates or self.checkpoints or self.snapshot or self.asked_to_stop


def _train(s: _Session, progress: bool, on_step: Callable[[int], None] | None) -> TrainResult:
    """The loop: a step, then whatever boundary work is due; a Ctrl-C or the time limit ends it
    at a boundary with the state saved."""
    t, step = s.t, s.start
    bar = TrainingProgress(t.steps, s.start, progress and s.dist.is_main)
    finished = False
    try:
        while step < t.steps:
            lr, loss_value, grad_norm = _step(s, step)
            step += 1
            s.interval_steps += 1
            due, stop, out_of_time = _due(s, step), False, False
            if due.anything:
                loss_value, stop, out_of_time = _boundary(s, step, due, lr, loss_value, grad_norm)  # the mean over ranks
            bar.update(step, loss_value, s.last_mae, force=step == t.steps or out_of_time)
            if on_step is not None:
                on_step(step)
            if out_of_time:
                break
            if stop and step < t.steps:
                _save_state(s, step)
                # The steps this start trained are in the saved state: its record belongs in the provenance.
                _record_start(s, step, stopped="interrupted")
                raise TrainingInterrupted(f"interrupted after step {step}; state saved: resume with `windtunnel train --resume {s.run_dir}`")
        finished = True
    finally:
        bar.close()
        s.tracking.close(finished)
    _record_start(s, step, stopped="time_limit" if step < t.steps else None)
    s.dist.barrier()
    return TrainResult(run_dir=s.run_dir, steps=step, final_eval=s.latest or None, wall_s=time.perf_counter() - s.started, model=s.model)


def _record_start(s: _Session, step: int, *, stopped: str | None) -> None:
    """Append this start's provenance record (the main rank writes it)."""
    if s.dist.is_main:
        record = _provenance(s.t, s.device, s.start, step, time.perf_counter() - s.started, s.rates, stopped=stopped)
        append_start(s.run_dir, record if s.group is None else {**record, "group": s.group})


def _set_up(config: RunConfig, run_dir: Path, device: torch.device, dist: Distributed, resume: bool,
            interrupt: _InterruptFlag) -> _Session:
    """Check the step fits, draw the held-out set, build (or resume) the model and optimizer on
    the device, write the run's config, take the step-0 snapshot and open tracking."""
    t, tunnel = config.train, config.tunnel
    if t.batch_size % dist.world_size:
        raise ConfigError(f"train.batch_size={t.batch_size} is not divisible by the {dist.world_size} processes")
    local_batch = t.batch_size // dist.world_size
    check_fits(
        f"a training step of batch {local_batch}", _step_bytes(config, local_batch), "lower train.batch_size or the tunnel's sizes"
    )
    # Drawn (and its size checked) before anything is written: a set too large for memory is
    # refused while the run directory is still as the command found it.
    eval_set = EvalSet.draw(tunnel, horizon=tunnel.horizon, n=config.eval.n, batch_size=config.eval.batch_size, seed=config.eval.seed) if dist.is_main else None

    model = build_run_model(config)
    optimizer = _optimizer(model, config, device)
    start = 0
    kept_records: list[dict[str, Any]] = []
    if resume:
        # A run that died before its first checkpoint starts again from step 0 in place: its
        # batches depend on (seed, rank, step) alone, so that is the run it would have been.
        if read_resume_step(run_dir) is not None:
            start, _ = load_resume(run_dir, model, optimizer)
        if dist.is_main:
            kept_records = _truncate_metrics(run_dir, start)
    elif dist.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(run_dir / CONFIG_FILE, config.to_json())
    model.to(device)
    # Optimizer state follows its parameters onto the device.
    for state in optimizer.state.values():
        for key, value in state.items():
            if torch.is_tensor(value) and key != "step":
                state[key] = value.to(device)
    forward: nn.Module = model
    if dist.enabled:
        forward = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if t.compile:
        # Static shapes: every training batch has the same shape, so one graph serves the run.
        forward = torch.compile(forward, dynamic=False)

    snapshots = set(snapshot_steps(t.steps, t.snapshots_per_decade))
    meta_base = {"version": __version__, "torch": torch.__version__, "params": count_params(model), "config": config.to_mapping()}
    if eval_set is not None:
        eval_set = eval_set.to(device)  # once: an evaluation then copies only its [N, P] numbers back
    if dist.is_main and start == 0 and 0 in snapshots:
        save_snapshot(run_dir, model, 0, {**meta_base, "metrics": {}})
    # Rank 0 tracks. A finished run that is resumed has nothing to add (and its sinks hold its
    # final curves, which metrics.jsonl does not): they are left as they are.
    tracking: Tracking = NO_TRACKING
    if dist.is_main and t.log_to and start < t.steps:
        tracking = open_tracking(t.log_to, run_dir, config.to_mapping(), kept_records)
    now = time.perf_counter()
    return _Session(
        config=config, run_dir=run_dir, device=device, dist=dist, interrupt=interrupt, model=model, optimizer=optimizer,
        forward=forward,
        # bf16 autocast on either device: a CPU run of a bf16 preset computes what a CUDA one does
        # (tests/training/test_training.py holds it to the float32 run).
        autocast=torch.autocast(device.type, dtype=torch.bfloat16, enabled=t.bf16),
        data_device=data_device_for(t, device), local_batch=local_batch, eval_set=eval_set, snapshots=snapshots,
        meta_base=meta_base, tracking=tracking, start=start,
        first_bad_step=torch.zeros((), dtype=torch.long, device=device), first_bad_loss=torch.zeros((), device=device),
        started=now, interval_start=now,
    )


def _step(s: _Session, step: int) -> tuple[float, torch.Tensor, torch.Tensor]:
    """One optimizer step on a fresh batch: its learning rate, its loss and gradient norm (on the device)."""
    t = s.t
    lr = learning_rate(step, lr=t.lr, schedule=t.schedule, warmup_steps=t.warmup_steps, total_steps=t.steps, min_lr=t.min_lr)
    for group in s.optimizer.param_groups:
        group["lr"] = lr
    generator = torch.Generator(device=s.data_device).manual_seed(data_seed(t.seed, s.dist.rank, step))
    episode = s.config.training_tunnel(step).sample(s.local_batch, generator=generator).to(s.device)  # a no-op when drawn there
    values = {} if episode.value_inputs is None else {"values": episode.value_inputs}  # a tunnel's observations read as values
    with s.autocast:
        if t.supervised_only:
            logits = s.forward(episode.tokens, at=episode.positions, **values)  # [B, P, C]: only what those positions need
        else:
            logits = s.forward(episode.tokens, **values)[:, episode.positions]  # [B, P, C]
    loss = _loss(logits, episode, t.target)
    loss_value = loss.detach().float()
    first_bad = (s.first_bad_step == 0) & ~torch.isfinite(loss_value)
    s.first_bad_step = torch.where(first_bad, step + 1, s.first_bad_step)
    s.first_bad_loss = torch.where(first_bad, loss_value, s.first_bad_loss)
    s.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = nn.utils.clip_grad_norm_(s.model.parameters(), t.grad_clip if t.grad_clip > 0 else math.inf)
    s.optimizer.step()
    return lr, loss_value, grad_norm


def _due(s: _Session, step: int) -> _Due:
    """Which boundary work follows ``step``. Every rank reaches the same boundaries (the
    collective in ``_read_back`` needs them all)."""
    t = s.t
    logs = step % t.log_every == 0 or step == t.steps
    return _Due(
        logs=logs,
        # The time limit is looked at on log boundaries only (a host clock read, no sync).
        over_time=bool(logs and t.time_limit_s and step < t.steps and time.perf_counter() - s.started >= t.time_limit_s),
        evaluates=bool(t.eval_every and step % t.eval_every == 0) or step == t.steps,
        checkpoints=bool(t.checkpoint_every and step % t.checkpoint_every == 0) or step == t.steps,
        snapshot=step in s.snapshots,
        # Without DDP a Ctrl-C is a host flag, acted on after this step; under DDP the ranks
        # agree on it at the next boundary.
        asked_to_stop=s.interrupt.requested and not s.dist.enabled,
    )


def _read_back(s: _Session, step: int, loss_value: torch.Tensor, over_time: bool) -> tuple[torch.Tensor, bool, bool]:
    """At a boundary: the loss (the mean over ranks), whether to stop, and whether the time
    limit is reached; raises on a non-finite loss since the last boundary. The one place the
    loop waits for the device."""
    # One collective carries the loss, any pending Ctrl-C, the time limit and any divergence,
    # so every rank agrees on the step at which to stop.
    device = s.device
    flags = torch.stack([
        loss_value, torch.tensor(float(s.interrupt.requested), device=device), (s.first_bad_step > 0).float(),
        torch.tensor(float(over_time), device=device),
    ])
    mean_loss, stop, diverged, out_of_time = s.dist.mean(flags).tolist()
    if diverged > 0:
        # Under DDP another rank may have diverged first: this rank then names the boundary.
        bad, value = int(s.first_bad_step.item()), s.first_bad_loss.item()
        saved = read_resume_step(s.run_dir)
        kept = f"the checkpoint of step {saved} is kept" if saved is not None else "no checkpoint was saved yet"
        raise TrainingDiverged(
            f"loss became {value if bad else mean_loss} at step {bad or step}; {kept} "
            "(lower train.lr or keep train.grad_clip > 0)"
        )
    return torch.tensor(mean_loss), stop > 0, out_of_time > 0


def _save_state(s: _Session, step: int) -> None:
    if s.dist.is_main:
        save_resume(s.run_dir, s.model, s.optimizer, step, {**s.meta_base, "metrics": s.latest})


def _boundary(s: _Session, step: int, due: _Due, lr: float, loss_value: torch.Tensor,
              grad_norm: torch.Tensor) -> tuple[torch.Tensor, bool, bool]:
    """The work due after ``step``, in order: read back, log, evaluate, append the metrics
    record and track it, checkpoint, snapshot. Returns the loss (the mean over ranks), whether
    to stop (a Ctrl-C) and whether the time limit made this step the run's last."""
    t, dist = s.t, s.dist
    mean_loss, stop, out_of_time = _read_back(s, step, loss_value, due.over_time)
    # Out of time: this step becomes the run's last, with everything a last step writes.
    last = step == t.steps or out_of_time
    evaluates, checkpoints = due.evaluates or out_of_time, due.checkpoints or out_of_time
    record: dict[str, Any] | None = None
    final_curves: dict[str, list[float]] | None = None
    if due.logs:
        now = time.perf_counter()
        record = {
            "step": step,
            "loss": mean_loss.item(),
            "lr": lr,
            "grad_norm": grad_norm.item(),
            "seq_per_s": s.interval_steps * t.batch_size / max(now - s.interval_start, 1e-9),
            "elapsed_s": now - s.started,
        }
        s.rates.append(s.interval_steps / max(now - s.interval_start, 1e-9))
        s.interval_start, s.interval_steps = now, 0
    if evaluates and dist.is_main:
        scores = evaluate(model_predictor(s.model, device=s.device), s.eval_set, references=False)
        s.last_mae = scores["mae_bits"]
        s.latest = {f"eval_{k}": scores[k] for k in ("mae_aggregate_bits", "mae_bits", "kl_bits")}
        record = {**(record or {"step": step, "loss": mean_loss.item(), "lr": lr}), **s.latest}
        if last:
            final_curves = scores["curves"]
    if out_of_time and record is not None:
        record = {**record, "stopped": "time_limit", "time_limit_s": t.time_limit_s}
    if dist.is_main and record is not None:
        _append_metrics(s.run_dir, record)  # the record first: the sinks follow it
        s.tracking.log(record, curves=final_curves)
    if checkpoints:
        s.tracking.flush()  # a checkpoint never runs ahead of what the sinks hold on disk
        _save_state(s, step)
    if dist.is_main and (due.snapshot or out_of_time):
        save_snapshot(s.run_dir, s.model, step, {**s.meta_base, "metrics": s.latest})
    return mean_loss, stop, out_of_time
