"""Run groups: runs of one model family and shape trained together, as one stacked model.

    from windtunnel.training.group import train_group
    results = train_group([config_seed0, config_seed1, config_seed2], ["runs/s0", "runs/s1", "runs/s2"])

Every parameter gains a leading run axis (``torch.func.stack_module_state``), and one step
runs the family's own forward over that axis (``torch.func.vmap`` of ``functional_call``):
each launched op does every run's work, which is what a GPU step bound by kernel launches
needs. Each run keeps everything it has alone:

- its initial weights (built from its own ``train.seed``, as alone) and the batches it would
  draw alone (the batch of step ``s`` is seeded by ``(train.seed, rank, s)``);
- its own loss (the mean over its own batch; the group backpropagates their sum, and runs
  share no parameter, so each run's gradient is its own), its own gradient-norm clipping (the
  norm of its own gradients) and its own AdamW state (AdamW is elementwise: one optimizer
  over the stacked parameters is each run's optimizer side by side);
- its own divergence check: a run whose loss is not finite ends alone with the message a lone
  run gives, at the next boundary, and the others go on without it;
- its own run folder, written by the same code a lone run's is (``metrics.jsonl``, checkpoints,
  snapshots, evaluation, ``provenance.json``, whose records name the group), so eval, analyze,
  export, the report and resume read it as they read a lone run.

Runs can be grouped when they share everything but their seed and their tunnel's variant
(:func:`group_key`): the model config, the tunnel's shapes (tokens, classes, length,
supervised positions) and the training settings. A resumed group goes on from its members'
common step; members whose checkpoints are at different steps (a kill between two members'
saves) are resumed alone instead.
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from windtunnel.config import ConfigError
from windtunnel.memory import check_fits
from windtunnel.models.build import model_class
from windtunnel.progress import TrainingProgress
from windtunnel.run_config import RunConfig
from windtunnel.training.checkpoint import read_resume_step
from windtunnel.training.distributed import pick_device, setup_distributed
from windtunnel.training.schedule import learning_rate
from windtunnel.training.trainer import (
    TrainingDiverged,
    TrainingInterrupted,
    TrainResult,
    _boundary,
    _due,
    _InterruptFlag,
    _record_start,
    _save_state,
    _Session,
    _set_up,
    _step_bytes,
    data_seed,
    train,
)
from windtunnel.tunnels import Episode
from windtunnel.tunnels.capabilities import value_dim_of

__all__ = ["GroupMember", "check_groupable", "group_key", "groups_by_default", "train_group"]

#: What a run's outcome in a group is: its result, or the divergence that ended it alone.
GroupMember = TrainResult | TrainingDiverged


def group_key(config: RunConfig) -> tuple:
    """What runs must share to train as one group: the model config, the tunnel's shapes and
    every training setting but the seed."""
    tunnel = config.tunnel
    shape = (tunnel.vocab_size, tunnel.num_classes, tunnel.seq_len(), value_dim_of(tunnel))
    return (config.model, shape, dataclasses.replace(config.train, seed=0), config.eval.n, config.eval.batch_size)


def check_groupable(configs: Sequence[RunConfig]) -> None:
    """Refuse a group whose runs differ in more than their seed and their tunnel's variant."""
    if not configs:
        raise ConfigError("a group needs at least one run")
    family = model_class(configs[0].model_kind)
    if family.not_stackable:
        raise ConfigError(f"runs of the {family.kind} family cannot train as one group ({family.not_stackable}); train them alone")
    first = group_key(configs[0])
    parts = ("the model config", "the tunnel's shapes", "the training settings (all but train.seed)", "eval.n", "eval.batch_size")
    for config in configs[1:]:
        for part, a, b in zip(parts, first, group_key(config)):
            if a != b:
                raise ConfigError(f"runs of one group must share {part}; these differ: {a!r} and {b!r}")


def groups_by_default(config: RunConfig) -> bool:
    """Whether runs of ``config`` train as groups when nobody asked: where it pays, on a GPU
    (a step there is bound by kernel launches, which a group shares), for a family that stacks.
    On a CPU the step is bound by arithmetic (docs/benchmarks.md measures both)."""
    return model_class(config.model_kind).not_stackable is None and pick_device(config.train.device).type == "cuda"


def train_group(
    configs: Sequence[RunConfig],
    run_dirs: Sequence[str | Path],
    *,
    resume: bool = False,
    progress: bool = True,
    on_step: Callable[[int], None] | None = None,
) -> list[GroupMember]:
    """Train ``configs`` into ``run_dirs`` as one group; per run, its result or its divergence.

    Raises:
        ConfigError: the runs cannot be grouped (:func:`check_groupable`).
        TrainingInterrupted: Ctrl-C; every member's state after the last complete step was saved.
    """
    check_groupable(configs)
    if len(configs) != len(run_dirs):
        raise ValueError(f"{len(configs)} configs for {len(run_dirs)} run directories")
    run_dirs = [Path(d) for d in run_dirs]
    if resume:
        steps = {read_resume_step(d) or 0 for d in run_dirs}
        if len(steps) > 1:  # a kill between two members' saves: each goes on alone to the end
            return [_alone(config, d, progress, on_step) for config, d in zip(configs, run_dirs)]
    interrupt = _InterruptFlag()
    try:
        t = configs[0].train
        device = pick_device(t.device, 0)
        dist = setup_distributed(device)
        if dist.enabled:
            raise ConfigError("a run group trains in one process; launch its runs alone under torchrun")
        deterministic = torch.are_deterministic_algorithms_enabled()
        if t.compile and device.type == "cpu":
            torch.use_deterministic_algorithms(True)  # as a lone compiled run (trainer._train_on_device says why)
        try:
            # Each member's step is checked by _set_up; the group holds all of theirs at once.
            check_fits(f"a step of a group of {len(configs)} runs of batch {t.batch_size}",
                       len(configs) * _step_bytes(configs[0], t.batch_size), "train fewer runs per group, or lower train.batch_size")
            members = [_set_up(config, d, device, dist, resume, interrupt) for config, d in zip(configs, run_dirs)]
            names = [d.name for d in run_dirs]
            for member in members:
                member.group = {"size": len(members), "runs": names}
            with warnings.catch_warnings():
                # vmap runs CPU attention's fused kernel once per run (it has no batching rule yet) and warns on each step.
                warnings.filterwarnings("ignore", message="There is a performance drop because we have not yet implemented the batching rule")
                return _GroupLoop(members).run(progress, on_step)
        finally:
            torch.use_deterministic_algorithms(deterministic)
            dist.close()
    finally:
        interrupt.restore()


def _alone(config: RunConfig, run_dir: Path, progress: bool, on_step: Callable[[int], None] | None) -> GroupMember:
    try:
        return train(config, run_dir, resume=True, progress=progress, on_step=on_step)
    except TrainingDiverged as error:
        return error


class _GroupLoop:
    """The stacked state of a group's live members and its training loop."""

    def __init__(self, members: list[_Session]) -> None:
        self.members = members  # the live ones, in order
        self.outcomes: dict[int, GroupMember] = {}
        self.index = list(range(len(members)))  # each live member's place in the group as given
        base = members[0].model
        self.base = base
        params, buffers = stack_module_state([m.model for m in members])
        self.params = {name: p.detach().requires_grad_() for name, p in params.items()}  # stacking copied them already
        self.buffers = buffers
        t = members[0].t
        decayed = {name: p.dim() >= 2 and not getattr(p, "_no_weight_decay", False) for name, p in base.named_parameters()}
        self.order = [n for n, _ in base.named_parameters() if decayed[n]] + [n for n, _ in base.named_parameters() if not decayed[n]]
        self.optimizer = torch.optim.AdamW(
            [{"params": [self.params[n] for n in self.order if decayed[n]], "weight_decay": t.weight_decay},
             {"params": [self.params[n] for n in self.order if not decayed[n]], "weight_decay": 0.0}],
            lr=t.lr, betas=tuple(t.betas), eps=1e-8,
            fused=(members[0].device.type == "cuda" if t.fused_adamw is None else t.fused_adamw) or None,
        )
        self._load_optimizer_states()
        self.start = members[0].start
        if any(m.start != self.start for m in members):
            raise ValueError("the members of a group must start at one step")
        self.supervised_only = t.supervised_only
        self._forwards: dict[bool, Callable[..., torch.Tensor]] = {}
        self.first_bad_step = torch.zeros(len(members), dtype=torch.long, device=members[0].device)
        self.first_bad_loss = torch.zeros(len(members), device=members[0].device)

    # --- state between the stack and the members' own modules ------------------------

    def _member_param_order(self, member: _Session) -> list[nn.Parameter]:
        """The member optimizer's parameters in its state_dict order (decayed, then not)."""
        return [p for group in member.optimizer.param_groups for p in group["params"]]

    def _load_optimizer_states(self) -> None:
        """Stack the members' AdamW states (a resumed run's moments) into the group optimizer."""
        states = [m.optimizer.state_dict()["state"] for m in self.members]
        if not states[0]:
            return
        for index, name in enumerate(self.order):
            p = self.params[name]
            first = states[0][index]
            self.optimizer.state[p] = {
                "step": first["step"].clone(),
                "exp_avg": torch.stack([s[index]["exp_avg"] for s in states]).to(p.device),
                "exp_avg_sq": torch.stack([s[index]["exp_avg_sq"] for s in states]).to(p.device),
            }

    @torch.no_grad()
    def _write_back(self, with_optimizer: bool) -> None:
        """Copy each live member's slice of the stack into its own module (and optimizer), for the
        code that evaluates and saves a lone run."""
        for slot, member in enumerate(self.members):
            for name, p in member.model.named_parameters():
                p.copy_(self.params[name][slot])
            if not with_optimizer:
                continue
            for name, p_member in zip(self.order, self._member_param_order(member)):
                state = self.optimizer.state.get(self.params[name])
                if state is None:
                    continue
                member.optimizer.state[p_member] = {
                    "step": state["step"].clone(), "exp_avg": state["exp_avg"][slot].clone(),
                    "exp_avg_sq": state["exp_avg_sq"][slot].clone()}

    def _drop(self, slot: int) -> None:
        """Take a diverged member out of the stack (its parameters and AdamW state)."""
        keep = [i for i in range(len(self.members)) if i != slot]
        index = torch.tensor(keep, device=self.first_bad_step.device)
        old = {name: p for name, p in self.params.items()}
        self.params = {name: p.detach().index_select(0, index).clone().requires_grad_() for name, p in old.items()}
        self.buffers = {name: b.index_select(0, index) for name, b in self.buffers.items()}
        states = {name: self.optimizer.state.get(old[name]) for name in self.order}
        groups = self.optimizer.param_groups
        decayed_names = self.order[: len(groups[0]["params"])]
        groups[0]["params"] = [self.params[n] for n in decayed_names]
        groups[1]["params"] = [self.params[n] for n in self.order[len(decayed_names):]]
        self.optimizer.state.clear()
        for name, state in states.items():
            if state:
                self.optimizer.state[self.params[name]] = {
                    "step": state["step"], "exp_avg": state["exp_avg"].index_select(0, index).clone(),
                    "exp_avg_sq": state["exp_avg_sq"].index_select(0, index).clone()}
        self.first_bad_step = self.first_bad_step.index_select(0, index)
        self.first_bad_loss = self.first_bad_loss.index_select(0, index)
        del self.members[slot], self.index[slot]

    # --- the step --------------------------------------------------------------------

    def _forward_one(self, params: dict, buffers: dict, tokens: torch.Tensor, values: torch.Tensor | None,
                     positions: torch.Tensor) -> torch.Tensor:
        """One run's logits at the supervised positions (``vmap`` maps it over the runs)."""
        kwargs: dict[str, Any] = {} if values is None else {"values": values}
        if self.supervised_only:
            return functional_call(self.base, (params, buffers), (tokens,), {**kwargs, "at": positions})
        return functional_call(self.base, (params, buffers), (tokens,), kwargs)[:, positions]

    def _stacked_forward(self, with_values: bool) -> Callable[..., torch.Tensor]:
        """The forward over the run axis (compiled once where ``train.compile`` asks: static shapes)."""
        if with_values not in self._forwards:
            forward = vmap(self._forward_one, in_dims=(0, 0, 0, 0 if with_values else None, None))
            self._forwards[with_values] = torch.compile(forward, dynamic=False) if self.members[0].t.compile else forward
        return self._forwards[with_values]

    def _batches(self, step: int) -> list[Episode]:
        """Each member's batch of ``step``, drawn exactly as it would be alone."""
        episodes = []
        for member in self.members:
            generator = torch.Generator(device=member.data_device).manual_seed(data_seed(member.t.seed, member.dist.rank, step))
            episodes.append(member.config.training_tunnel(step).sample(member.local_batch, generator=generator).to(member.device))
        positions = episodes[0].positions
        if any(not torch.equal(e.positions, positions) for e in episodes[1:]):
            raise ConfigError("the runs of a group must supervise the same positions")
        self.positions = positions
        return episodes

    def _losses(self, logits: torch.Tensor, episodes: list[Episode]) -> torch.Tensor:
        """``[R]``: each member's loss on its own batch, as ``trainer._loss`` computes it alone."""
        R, C = logits.shape[0], logits.shape[-1]
        if self.members[0].t.target == "hard":
            targets = torch.stack([e.targets for e in episodes]).reshape(-1)
            return F.cross_entropy(logits.reshape(-1, C), targets, reduction="none").view(R, -1).mean(1)
        log_probs = F.log_softmax(logits.float(), dim=-1)
        posterior = torch.stack([e.posterior for e in episodes]).to(log_probs)
        return -(posterior * log_probs).sum(-1).reshape(R, -1).mean(1)

    def step(self, step: int) -> tuple[float, torch.Tensor, torch.Tensor]:
        """One optimizer step of every live member: the learning rate, and per member its loss and
        gradient norm (``[R]``, on the device)."""
        t = self.members[0].t
        lr = learning_rate(step, lr=t.lr, schedule=t.schedule, warmup_steps=t.warmup_steps, total_steps=t.steps, min_lr=t.min_lr)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        episodes = self._batches(step)
        tokens = torch.stack([e.tokens for e in episodes])
        values = None if episodes[0].value_inputs is None else torch.stack([e.value_inputs for e in episodes])
        with self.members[0].autocast:
            logits = self._stacked_forward(values is not None)(self.params, self.buffers, tokens, values, self.positions)
        losses = self._losses(logits, episodes)
        loss_values = losses.detach().float()
        first_bad = (self.first_bad_step == 0) & ~torch.isfinite(loss_values)
        self.first_bad_step = torch.where(first_bad, step + 1, self.first_bad_step)
        self.first_bad_loss = torch.where(first_bad, loss_values, self.first_bad_loss)
        self.optimizer.zero_grad(set_to_none=True)
        losses.sum().backward()
        grad_norms = self._clip(t.grad_clip if t.grad_clip > 0 else math.inf)
        self.optimizer.step()
        return lr, loss_values, grad_norms

    def _clip(self, max_norm: float) -> torch.Tensor:
        """Each member's gradients scaled to at most ``max_norm`` in its own 2-norm, as
        ``torch.nn.utils.clip_grad_norm_`` does for a lone run; returns each one's norm before."""
        grads = [p.grad for p in self.params.values() if p.grad is not None]
        R = len(self.members)
        norms = torch.stack([g.detach().float().reshape(R, -1).norm(2, dim=1) for g in grads]).norm(2, dim=0)  # [R]
        coefficient = (max_norm / (norms + 1e-6)).clamp(max=1.0)
        for g in grads:
            g.mul_(coefficient.view(R, *([1] * (g.dim() - 1))).to(g.dtype))
        return norms

    # --- the loop --------------------------------------------------------------------

    def run(self, progress: bool, on_step: Callable[[int], None] | None) -> list[GroupMember]:
        lead = self.members[0]
        t, step = lead.t, self.start
        total = len(self.members)
        bar = TrainingProgress(t.steps, self.start, progress)
        finished = False
        try:
            while step < t.steps and self.members:
                lr, loss_values, grad_norms = self.step(step)
                step += 1
                for member in self.members:
                    member.interval_steps += 1
                due = _due(self.members[0], step)
                stop = out_of_time = False
                if due.anything:
                    stop, out_of_time, loss_values = self._boundary(step, due, lr, loss_values, grad_norms)
                if self.members:
                    bar.update(step, loss_values[0], self.members[0].last_mae, force=step == t.steps or out_of_time)
                if on_step is not None:
                    on_step(step)
                if out_of_time:
                    break
                if stop and step < t.steps:
                    self._write_back(with_optimizer=True)
                    for member in self.members:
                        _save_state(member, step)
                        _record_start(member, step, stopped="interrupted")
                    raise TrainingInterrupted(
                        f"interrupted after step {step}; state saved: resume the group with --resume")
            finished = True
        finally:
            bar.close()
            for member in self.members:
                member.tracking.close(finished)
        for slot, member in zip(self.index, self.members):
            _record_start(member, step, stopped="time_limit" if step < t.steps else None)
            self.outcomes[slot] = TrainResult(run_dir=member.run_dir, steps=step, final_eval=member.latest or None,
                                              wall_s=time.perf_counter() - member.started, model=member.model)
        return [self.outcomes[i] for i in range(total)]

    def _boundary(self, step: int, due, lr: float, loss_values: torch.Tensor,
                  grad_norms: torch.Tensor) -> tuple[bool, bool, torch.Tensor]:
        """Each live member's boundary work, by the lone run's own code; a member whose loss
        was not finite ends here with its message, its folder as a diverged lone run leaves it."""
        # The members' own modules are read only by an evaluation, a checkpoint or a snapshot
        # (a step past the time limit makes all three); a log line reads the stack's numbers.
        if due.evaluates or due.checkpoints or due.snapshot or due.over_time:
            self._write_back(with_optimizer=due.checkpoints or due.over_time)
        stop = out_of_time = False
        means = []
        for slot in reversed(range(len(self.members))):
            member = self.members[slot]
            member.first_bad_step, member.first_bad_loss = self.first_bad_step[slot], self.first_bad_loss[slot]
            try:
                mean, member_stop, member_out = _boundary(member, step, due, lr, loss_values[slot], grad_norms[slot])
            except TrainingDiverged as error:  # nothing of it written, as a lone run that diverges
                member.tracking.close(False)
                self.outcomes[self.index[slot]] = error
                self._drop(slot)
                loss_values = torch.cat([loss_values[:slot], loss_values[slot + 1:]])
                grad_norms = torch.cat([grad_norms[:slot], grad_norms[slot + 1:]])
                continue
            stop, out_of_time = stop or member_stop, out_of_time or member_out
            means.append(mean)
        return stop, out_of_time, torch.stack(list(reversed(means))) if means else loss_values

