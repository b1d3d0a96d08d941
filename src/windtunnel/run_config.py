"""A run's whole configuration: which tunnel, which model, how to train, how to evaluate.

Run configs are TOML files with four sections; every key is checked against the
dataclass that declares it (unknown keys, wrong types and out-of-range values are
errors), and the resolved config is written to the run directory as JSON::

    [tunnel]                 # `name` picks the tunnel; the other keys are its parameters
    name = "bijection"
    V = 20

    [model]                  # `kind` picks the model family; the other keys are its config
    kind = "transformer"
    n_layers = 6

    [train]                  # TrainConfig
    steps = 100_000

    [eval]                   # EvalConfig
    horizons = [20, 30, 50]

Overrides use dotted keys typed by the same dataclasses: ``train.lr=3e-4``,
``tunnel.K=30``, ``model.matched_to.d_mlp=512``, ``eval.horizons=20,50``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from windtunnel.config import ConfigError, apply_overrides, check_field_types, from_mapping, to_mapping
from windtunnel.models import MODELS, ModelConfig, build_model, model_class
from windtunnel.tunnels import Tunnel, tunnel_class
from windtunnel.tunnels.capabilities import value_dim_of

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["TRACKING_SINKS", "CurriculumConfig", "EvalConfig", "RunConfig", "TrainConfig", "build_run_model", "load_run_config", "run_config_from_mapping"]


CURRICULUM_SHAPES = ("geometric", "linear")

#: The experiment trackers ``train.log_to`` may name (:mod:`windtunnel.training.tracking`).
TRACKING_SINKS = ("tensorboard", "wandb", "mlflow")


@dataclass(frozen=True)
class CurriculumConfig:
    """One tunnel parameter annealed into the tunnel's own value over the first steps of training.

    The batch of step ``s`` is drawn from the tunnel with ``param`` set to
    ``start * (end / start) ** (s / steps)`` for ``s < steps`` with ``shape = "geometric"``
    (the default: parameters such as a Dirichlet concentration are scales), or to
    ``start + (end - start) * s / steps`` with ``shape = "linear"`` (for rates, which may
    end at 0), and from the tunnel itself after; ``end`` is the value in ``[tunnel]``.
    Evaluation always uses the tunnel itself. The value is a function of the step alone,
    so resume stays exact.

    Args:
        param: a float parameter of the tunnel (``""``: no curriculum).
        start: its value at step 0 (finite; > 0 for the geometric shape; the tunnel must accept it).
        steps: steps over which it reaches the tunnel's own value.
        shape: ``geometric`` or ``linear``.
    """

    param: str = ""
    start: float = 1.0
    steps: int = 0
    shape: str = "geometric"

    def __post_init__(self) -> None:
        check_field_types(self)
        if self.shape not in CURRICULUM_SHAPES:
            raise ConfigError(f"shape={self.shape!r} is not a curriculum shape; allowed: {', '.join(CURRICULUM_SHAPES)}")
        if self.param and not math.isfinite(self.start):
            raise ConfigError(f"start={self.start} is out of range: need a finite value")
        if self.param and self.shape == "geometric" and not self.start > 0:
            raise ConfigError(f"start={self.start} is out of range: a geometric curriculum needs a value > 0")
        if self.steps < 0:
            raise ConfigError(f"steps={self.steps} is out of range: need steps >= 0 (0: no curriculum)")
        if self.param and self.steps < 1:
            raise ConfigError(f"steps={self.steps} is out of range: a curriculum needs steps >= 1")

    def value(self, step: int, end: float) -> float:
        """The parameter at ``step``, annealing from ``start`` to ``end``."""
        if not self.param or step >= self.steps:
            return end
        if self.shape == "linear":
            return self.start + (end - self.start) * (step / self.steps)
        return self.start * (end / self.start) ** (step / self.steps)


@dataclass(frozen=True)
class TrainConfig:
    """How a model is trained (docs/protocol.md §5 gives the paper's values; these defaults are the bijection's).

    Args:
        steps: optimizer steps; every step draws a fresh batch.
        batch_size: sequences per step (across all processes under DDP).
        lr: peak learning rate.
        schedule: ``constant``, or ``cosine`` (linear warm-up, then cosine decay to ``min_lr``).
        warmup_steps: linear warm-up steps (both schedules).
        min_lr: learning rate at the end of the cosine decay.
        weight_decay: AdamW decoupled weight decay.
        betas: AdamW ``(beta1, beta2)``.
        grad_clip: maximum global gradient norm (0 disables clipping).
        target: ``hard`` (cross-entropy with the sampled label) or ``soft`` (with the exact posterior).
        seed: seeds the initial weights and the training data stream.
        eval_every: steps between evaluations on the fixed held-out set (0: only at the end).
        checkpoint_every: steps between resumable checkpoints (0: only at the end).
        log_every: steps between lines of ``metrics.jsonl``.
        snapshots_per_decade: permanent weight snapshots per factor of 10 in steps (log-spaced,
            for the training-dynamics analyses), plus step 0 and the last step.
        device: ``auto`` (CUDA if present), ``cpu`` or ``cuda``.
        bf16: bfloat16 autocast of the forward pass (matrix products in bfloat16, the weights,
            the optimizer's state and the loss in float32), on CUDA and on a CPU alike.
        time_limit_s: a wall-clock budget for one start of the run, in seconds (0: none). At
            the first log boundary past it the run ends there as if that were its last step:
            final evaluation, final snapshot and checkpoint, and a ``metrics.jsonl`` record
            ``"stopped": "time_limit"``, so a run cut short says so (``history.stop_record``).
            It is a stopping rule, not part of the protocol: a run resumed with another limit
            is the same run.
        fused_adamw: AdamW's fused kernel (one kernel for every parameter) instead of its
            ``foreach`` implementation; None (default): fused on CUDA, foreach elsewhere, so a
            CPU run's trajectory is unchanged. The same update up to float rounding.
        data_on_device: draw each batch on the training device, from a generator there
            (sampling, quantization and the exact posterior as tensor operations on it),
            instead of on the host followed by a copy. None (default): on CUDA, yes; on a CPU
            the two are the same thing. The batch of a step is still a function of
            ``(seed, rank, step)`` alone, so resume stays exact; a CUDA generator's stream
            differs from the CPU's, so the batches (not their distribution) change with it.
        compile: run the training forward and backward through ``torch.compile`` (static
            shapes). Resume stays exact to the step and bit-identical among compiled runs;
            a compiled run's floating-point path differs from an uncompiled one's, so its
            trajectory is close to, not equal to, the plain run's (``bench/train_throughput.py``
            measures what it buys on this machine).
        supervised_only: compute only what the supervised positions need (``model(tokens,
            at=positions)``: the MLP control drops the other positions at the embedding, the
            transformer after the keys and values of its last attention layer). The same
            function up to float rounding, so a run's trajectory is close to, not equal to,
            one with ``false`` (every position computed, as before this switch existed);
            ``bench/train_throughput.py`` measures what it buys.
        curriculum: a tunnel parameter annealed over the first steps (:class:`CurriculumConfig`).
        log_to: experiment trackers that receive the scalars of ``metrics.jsonl`` as they are
            written, and the final evaluation's per-position curves: any of ``tensorboard``
            (event files in ``RUN_DIR/tensorboard/``), ``wandb`` (offline unless ``WANDB_MODE``
            says otherwise; ``RUN_DIR/wandb/``) and ``mlflow`` (a file store in
            ``RUN_DIR/mlruns/`` unless ``MLFLOW_TRACKING_URI`` names another). Empty: none.
            ``metrics.jsonl`` stays the record (:mod:`windtunnel.training.tracking`).
    """

    steps: int = 2000
    batch_size: int = 128
    lr: float = 1e-3
    schedule: Literal["constant", "cosine"] = "constant"
    warmup_steps: int = 0
    min_lr: float = 0.0
    weight_decay: float = 0.01
    betas: tuple[float, ...] = (0.9, 0.999)
    grad_clip: float = 1.0
    target: Literal["hard", "soft"] = "hard"
    seed: int = 0
    eval_every: int = 500
    checkpoint_every: int = 500
    log_every: int = 50
    snapshots_per_decade: int = 4
    device: Literal["auto", "cpu", "cuda"] = "auto"
    bf16: bool = False
    time_limit_s: float = 0.0
    fused_adamw: bool | None = None
    data_on_device: bool | None = None
    compile: bool = False
    supervised_only: bool = True
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)
    log_to: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_field_types(self)
        for sink in self.log_to:
            if sink not in TRACKING_SINKS:
                raise ConfigError(f"log_to={list(self.log_to)}: unknown sink {sink!r}; allowed: {', '.join(TRACKING_SINKS)}")
        if len(set(self.log_to)) < len(self.log_to):
            raise ConfigError(f"log_to={list(self.log_to)} names a sink twice: name each at most once")
        for name in ("steps", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)} is out of range: need >= 1")
        for name in ("warmup_steps", "eval_every", "checkpoint_every", "weight_decay", "grad_clip", "min_lr", "snapshots_per_decade", "time_limit_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}={getattr(self, name)} is out of range: need >= 0")
        if self.log_every < 1:
            raise ConfigError(f"log_every={self.log_every} is out of range: need >= 1")
        if not self.lr > 0:
            raise ConfigError(f"lr={self.lr} is out of range: need > 0")
        if self.min_lr > self.lr:
            raise ConfigError(f"min_lr={self.min_lr} is out of range: need min_lr <= lr={self.lr}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ConfigError(f"betas={list(self.betas)} is out of range: need two numbers in [0, 1)")
        _check_seed("seed", self.seed)  # named in full by the loader: train.seed


#: torch.Generator.manual_seed takes any 64-bit pattern; seeds are kept to the non-negative half
#: so that every seed reads the same as a number everywhere (JSON, the run labels, the hash).
MAX_SEED = 2**63 - 1


def _check_seed(name: str, seed: int) -> None:
    if not 0 <= seed <= MAX_SEED:
        raise ConfigError(f"{name}={seed} is out of range: need an integer in [0, 2**63 - 1]")


@dataclass(frozen=True)
class EvalConfig:
    """How a model is evaluated against the exact posterior.

    Args:
        n: held-out sequences per horizon (a fixed set, drawn from ``seed``).
        batch_size: sequences per forward pass.
        horizons: horizons to evaluate at; empty means the tunnel's training horizon.
            The model's position table is sized for the longest.
        seed: seed of the held-out set, separate from every training stream.
        bootstrap: bootstrap resamples for the 95% intervals.
    """

    n: int = 2048
    batch_size: int = 512
    horizons: tuple[int, ...] = ()
    seed: int = 10_000_019
    bootstrap: int = 1000

    def __post_init__(self) -> None:
        check_field_types(self)
        for name in ("n", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)} is out of range: need >= 1")
        if self.bootstrap < 0:
            raise ConfigError(f"bootstrap={self.bootstrap} is out of range: need >= 0")
        if any(h < 1 for h in self.horizons):
            raise ConfigError(f"horizons={list(self.horizons)} is out of range: every horizon must be >= 1")
        _check_seed("seed", self.seed)  # named in full by the loader: eval.seed


@dataclass(frozen=True)
class RunConfig:
    """Tunnel + model + training + evaluation, checked against each other.

    Attributes:
        tunnel: the tunnel object (its parameters are its fields).
        model: the config of any registered model family (``model_kind`` names the
            family; ``[model]`` is parsed through ``model_class(kind).config_class``).
    """

    tunnel: Tunnel
    model: ModelConfig
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def __post_init__(self) -> None:
        for horizon in self.horizons:
            self.tunnel.check_horizon(horizon, name="eval.horizons")
        self._check_curriculum()
        if self.model.max_len is not None and self.model.max_len < self.max_len:
            raise ConfigError(
                f"model.max_len={self.model.max_len} is out of range: the longest evaluated sequence "
                f"(horizon {max(self.horizons)}) has {self.max_len} tokens; need model.max_len >= {self.max_len}"
            )

    def _check_curriculum(self) -> None:
        curriculum = self.train.curriculum
        if not curriculum.param:
            return
        fields = dataclasses.fields(self.tunnel)
        floats = [f.name for f in fields if isinstance(getattr(self.tunnel, f.name), float)]
        # an optional float left unset has no value to anneal into until the config gives it one
        unset = [f.name for f in fields if getattr(self.tunnel, f.name) is None and "float" in str(f.type)]
        if curriculum.param in unset:
            raise ConfigError(
                f"train.curriculum.param={curriculum.param!r} anneals into the tunnel's own {curriculum.param}, "
                f"which is unset: give tunnel.{curriculum.param} a value"
            )
        if curriculum.param not in floats:
            allowed = [*floats, *(f"{name} (once set)" for name in unset)]
            raise ConfigError(
                f"train.curriculum.param={curriculum.param!r} is not a float parameter of the {self.tunnel.name} tunnel; "
                f"allowed: {', '.join(allowed) or 'none'}"
            )
        end = getattr(self.tunnel, curriculum.param)
        if curriculum.shape == "geometric" and not end > 0:
            raise ConfigError(
                f"train.curriculum.shape='geometric' cannot anneal into {self.tunnel.name} {curriculum.param}={end}: "
                'a geometric curriculum ends at a value > 0; use shape = "linear"'
            )
        try:
            self.training_tunnel(0)
        except ConfigError as error:
            raise ConfigError(f"train.curriculum.start={curriculum.start}: the tunnel refuses it: {error}") from None

    def training_tunnel(self, step: int) -> Tunnel:
        """The tunnel the batch of ``step`` is drawn from (the tunnel itself without a curriculum)."""
        curriculum = self.train.curriculum
        if not curriculum.param or step >= curriculum.steps:
            return self.tunnel
        value = curriculum.value(step, getattr(self.tunnel, curriculum.param))
        return dataclasses.replace(self.tunnel, **{curriculum.param: value})

    @property
    def model_kind(self) -> str:
        """The registered family whose config ``model`` is."""
        for kind, cls in MODELS.items():
            if isinstance(self.model, cls.config_class):
                return kind
        raise ConfigError(f"model={type(self.model).__name__} is the config of no registered model family")

    @property
    def horizons(self) -> tuple[int, ...]:
        """Evaluation horizons (the training horizon when none are configured)."""
        return self.eval.horizons or (self.tunnel.horizon,)

    @property
    def max_len(self) -> int:
        """The position table the model needs: the longest of training and evaluation sequences."""
        return max(self.tunnel.seq_len(h) for h in (*self.horizons, self.tunnel.horizon))

    def to_mapping(self) -> dict[str, Any]:
        """Plain nested dict (JSON/TOML-able); :func:`run_config_from_mapping` inverts it."""
        return {
            "tunnel": {"name": self.tunnel.name, **to_mapping(self.tunnel)},
            "model": {"kind": self.model_kind, **to_mapping(self.model)},
            "train": to_mapping(self.train),
            "eval": to_mapping(self.eval),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_mapping(), indent=2, sort_keys=False)


_SECTIONS = ("tunnel", "model", "train", "eval")


def _section_class(section: str, data: Mapping[str, Any]) -> type:
    if section == "tunnel":
        return tunnel_class(_required(data, "tunnel", "name"))
    if section == "model":
        return model_class(_required(data, "model", "kind")).config_class
    return {"train": TrainConfig, "eval": EvalConfig}[section]


def _required(data: Mapping[str, Any], section: str, key: str) -> str:
    value = data.get(section, {}).get(key)
    if not isinstance(value, str):
        raise ConfigError(f"{section}.{key}={value!r} is missing or not a string: every run config names its {section} {key}")
    return value


_SELECTORS = {"tunnel": "name", "model": "kind"}


def run_config_from_mapping(data: Mapping[str, Any], overrides: Sequence[str] = ()) -> RunConfig:
    """Build a :class:`RunConfig` from a nested mapping and ``section.key=value`` overrides."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"a run config must be a table of sections ({', '.join(_SECTIONS)}), not a {type(data).__name__}")
    for section in _SECTIONS:
        if not isinstance(data.get(section, {}), Mapping):
            raise ConfigError(f"[{section}] must be a table of keys, not {data[section]!r}")
    unknown = set(data) - set(_SECTIONS)
    if unknown:
        raise ConfigError(f"unknown section {sorted(unknown)[0]!r} in run config; allowed sections: {', '.join(_SECTIONS)}")
    data = {section: dict(data.get(section, {})) for section in _SECTIONS}
    by_section: dict[str, list[str]] = {section: [] for section in _SECTIONS}
    for assignment in overrides:
        section, dot, rest = assignment.partition(".")
        if section not in _SECTIONS or not dot:
            raise ConfigError(
                f"override {assignment!r} does not start with a section: use one of "
                f"{', '.join(s + '.KEY=VALUE' for s in _SECTIONS)}"
            )
        selector = _SELECTORS.get(section)
        if selector and rest.partition("=")[0].strip() == selector:  # switching tunnel or model family
            data[section][selector] = rest.partition("=")[2].strip()
        else:
            by_section[section].append(rest)
    built = {}
    for section in _SECTIONS:
        params = dict(data[section])
        selector = _SELECTORS.get(section)
        cls = _section_class(section, data)
        if selector:
            params.pop(selector)
        params = apply_overrides(cls, params, by_section[section], prefix=f"{section}.")
        built[section] = from_mapping(cls, params, prefix=f"{section}.")
    return RunConfig(**built)


def load_run_config(path: str | Path, overrides: Sequence[str] = ()) -> RunConfig:
    """Read a TOML run config (or a resolved ``config.json``) and apply overrides."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"config file {str(path)!r} is a directory, not a config file: give the path of a .toml run config")
    if not path.exists():
        raise ConfigError(f"config file {str(path)!r} does not exist: give the path of a .toml run config")
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} is not a regular file: give the path of a .toml run config")
    try:
        text = path.read_text(encoding="utf-8-sig")  # a byte-order mark, as some editors write, is not TOML: skipped
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except OSError as error:
        raise ConfigError(f"config file {str(path)!r} cannot be read: {error.strerror}") from None
    except (UnicodeDecodeError, json.JSONDecodeError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"config file {str(path)!r} is not valid {'JSON' if path.suffix == '.json' else 'TOML'}: {error}") from None
    return run_config_from_mapping(data, overrides)


def build_run_model(config: RunConfig) -> nn.Module:
    """The model a run config describes, freshly initialized from ``train.seed`` (on CPU)."""
    tunnel = config.tunnel
    return build_model(
        config.model_kind,
        config.model,
        vocab_size=tunnel.vocab_size,
        num_classes=tunnel.num_classes,
        max_len=config.max_len,
        generator=torch.Generator().manual_seed(config.train.seed),
        value_dim=value_dim_of(tunnel),
    )
