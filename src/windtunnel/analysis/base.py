"""What every analysis shares: loaded runs, the fixed evaluation batch, and the registry.

An analysis is a function ``compute(runs) -> dict`` registered under a name with
:func:`register`, and its result type in :mod:`windtunnel.results` registered under the
same name; :meth:`Analysis.run` gives the typed result. Its *scope* says which runs it accepts:

- ``"seeds"``: runs of one configuration (same tunnel, model family and variant: a
  :class:`Configuration`), e.g. three seeds whose results are averaged; most analyses
  accept a single run.
- ``"comparison"``: runs of one tunnel with different models (transformer, MLP control,
  late-attention variant, seeds of each), compared side by side.

    from windtunnel.analysis import ANALYSES, load_runs
    runs = load_runs(["runs/bij_seed0", "runs/bij_seed1"])
    result = ANALYSES["layer_ablation"].run(runs)  # a windtunnel.results.ablation.LayerAblation
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor, nn

from windtunnel.config import to_mapping
from windtunnel.evaluation import EvalSet, evaluate, model_predictor
from windtunnel.models import Role, model_class, run_with_trace
from windtunnel.results import RESULT_TYPES, AnalysisResult
from windtunnel.run_config import RunConfig, build_run_model
from windtunnel.runs import load_run_model, recorded_run_dir
from windtunnel.training.distributed import pick_device
from windtunnel.tunnels import Episode

__all__ = ["ANALYSES", "N_DIAGNOSTIC_SEQUENCES", "Analysis", "Configuration", "Run", "RunKey", "by_configuration", "check_same_architecture", "diagnostic_episodes", "eval_set_for", "first_sequences", "head_grid", "initial_models_of", "load_runs", "model_device", "register", "scores_at", "summarize", "traced"]

Scope = Literal["seeds", "comparison"]


@dataclass(frozen=True)
class Configuration:
    """What the seeds of one model share: the tunnel, the model family and its variant.

    Attributes:
        tunnel: the tunnel and its parameters (``"hmm(S=5, M=5, ...)"``).
        family: the registered model kind (``"transformer"``, ``"mlp"``).
        variant: the family's words for how the model departs from its plain one
            (:meth:`~windtunnel.models.SequenceModel.variant`; ``""`` for the plain model).
    """

    tunnel: str
    family: str
    variant: str

    @property
    def name(self) -> str:
        """The model in words, for legends and result keys: ``"transformer"``,
        ``"transformer (no attention in 4,5)"`` (the tunnel is the same across one analysis)."""
        return f"{self.family} ({self.variant})" if self.variant else self.family

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class RunKey:
    """A run's identity among the runs of a study: its :class:`Configuration` and its seed."""

    tunnel: str
    family: str
    variant: str
    seed: int

    @property
    def configuration(self) -> Configuration:
        """The key without the seed: equal for runs that differ only in their seed."""
        return Configuration(self.tunnel, self.family, self.variant)

    @property
    def label(self) -> str:
        """A short name for legends: the model, its variant and the seed (``"transformer seed 0"``)."""
        return f"{self.configuration.name} seed {self.seed}"


def _tunnel_id(config: RunConfig) -> str:
    """The tunnel's name and parameters as one string (tunnels are frozen dataclasses of them)."""
    tunnel = config.tunnel
    return f"{tunnel.name}(" + ", ".join(f"{name}={value!r}" for name, value in to_mapping(tunnel).items()) + ")"


@dataclass(frozen=True, eq=False)
class Run:
    """A trained run: its directory, config, model (eval mode, on the device it was loaded
    to) and the step it was trained to."""

    directory: Path
    config: RunConfig
    model: nn.Module
    step: int

    @property
    def recorded_dir(self) -> str:
        """How a result names the run: :func:`~windtunnel.runs.recorded_run_dir` of its directory."""
        return recorded_run_dir(self.directory)

    @property
    def key(self) -> RunKey:
        """The run's identity, from the typed fields of its config."""
        config = self.config
        family = model_class(config.model_kind)
        return RunKey(_tunnel_id(config), family.kind, family.variant(config.model), config.train.seed)

    @property
    def role(self) -> Role:
        """The part the run's model family plays in a study: ``"subject"`` or ``"control"``."""
        return model_class(self.config.model_kind).role

    @property
    def label(self) -> str:
        """A short name for legends: the model kind, its variant, and the seed."""
        return self.key.label

    @property
    def configuration(self) -> Configuration:
        """Runs with equal ``configuration`` differ only in their seed."""
        return self.key.configuration


def summarize(values: Sequence[float]) -> dict[str, float]:
    """One number over runs: mean and spread (population std), and the median with the
    smallest and largest value (what a claim is decided on where seeds disagree: one HMM
    seed still on its plateau moves the mean, not the median)."""
    t = torch.tensor(values, dtype=torch.float64)
    ordered = t.sort().values
    n = len(ordered)
    median = ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2
    return {
        "mean": t.mean().item(),
        "std": t.std(unbiased=False).item(),
        "median": median.item(),
        "min": ordered[0].item(),
        "max": ordered[-1].item(),
    }


def by_configuration(runs: Sequence[Run]) -> dict[Configuration, list[Run]]:
    """Runs grouped by :attr:`Run.configuration` (seeds together), in first-seen order."""
    groups: dict[Configuration, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.configuration, []).append(run)
    return groups


def load_runs(run_dirs: Sequence[Path | str], *, step: int | None = None, device: str = "auto") -> list[Run]:
    """Load each run's final model (or snapshot ``step``) in eval mode, on ``device``.

    ``device`` is ``auto`` (CUDA when present), ``cpu`` or ``cuda``. The analyses run their
    forward passes where the model is and their statistics on the host, in float64, on
    held-out sets drawn on the host: the same sequences on every device.
    """
    where = pick_device(device, option="device")
    runs = []
    for directory in run_dirs:
        config, model, trained = load_run_model(Path(directory), step=step)
        runs.append(Run(Path(directory), config, model.to(where).eval(), trained))
    return runs


def model_device(model: nn.Module) -> torch.device:
    """Where ``model``'s parameters are (every windtunnel model has some)."""
    return next(model.parameters()).device


@torch.no_grad()
def traced(
    model: nn.Module, tokens: Tensor, names: Sequence[str], values: Tensor | None = None
) -> tuple[Tensor, dict[str, Tensor]]:
    """One traced forward of ``model`` on ``tokens`` ``[B, T]`` (and the ``values`` beside them,
    for a tunnel that has some), where the model is; the ``[B, T, C]`` logits and the
    activations ``names`` (exact names), back on the host.

    The one way the analyses run a traced forward: the forward is the cost and runs on the
    device, the statistics after it run on the host in float64.
    """
    where = model_device(model)
    read = {} if values is None else {"values": values.to(where)}  # a tunnel's observations read as values
    logits, trace = run_with_trace(model, tokens.to(where), list(names), **read)
    return logits.cpu(), {name: trace[name].cpu() for name in names}


#: Sequences the geometric diagnostics and probes read (the start of the fixed eval set):
#: thousands of supervised positions, enough for stable means, and seconds of CPU for a
#: small model.
N_DIAGNOSTIC_SEQUENCES = 512


def first_sequences(eval_set: EvalSet, n: int) -> list[Episode]:
    """The first ``n`` sequences of ``eval_set``, as plain :class:`Episode` batches.

    Batches are cut, not merged; tunnel-specific fields (the bijection's mapping, the
    HMM's states) are dropped, since the diagnostics read only tokens and posteriors.
    """
    episodes, left = [], n
    for e in eval_set.episodes:
        if left <= 0:
            break
        k = min(left, e.batch_size)
        episodes.append(e.head(k))
        left -= k
    return episodes


def diagnostic_episodes(runs: Sequence[Run]) -> list[Episode]:
    """The sequences the geometric diagnostics and probes of ``runs`` read: the first
    :data:`N_DIAGNOSTIC_SEQUENCES` of their configuration's fixed eval set."""
    return first_sequences(eval_set_for(runs[0].config), N_DIAGNOSTIC_SEQUENCES)


def initial_models_of(runs: Sequence[Run]) -> list[nn.Module]:
    """Each run's model at initialization (eval mode): rebuilt from its config's seed,
    identical to the step-0 weights the trainer saved. The geometric analyses read the same
    quantities off them, for the floor a trained number must clear."""
    return [build_run_model(run.config).to(model_device(run.model)).eval() for run in runs]


def check_same_architecture(models: Sequence[nn.Module], what: str) -> None:
    """Results of several runs are averaged per layer and head: refuse models of different shapes."""
    if not models:
        raise ValueError(f"{what} needs at least one model")
    shapes = {(m.n_layers, tuple(sorted(m.attention_heads.items()))) for m in models}
    if len(shapes) != 1:
        raise ValueError(f"{what} averages over runs of one architecture; these models differ in shape")


def head_grid(n_layers: int, per_layer: dict[int, torch.Tensor]) -> list[list[float] | None]:
    """``[layer][head]`` lists of floats, None for layers without attention."""
    return [per_layer[layer].tolist() if layer in per_layer else None for layer in range(n_layers)]


@lru_cache(maxsize=16)
def _eval_set(config: RunConfig, horizon: int, n: int) -> EvalSet:
    return EvalSet.draw(config.tunnel, horizon=horizon, n=n, batch_size=config.eval.batch_size, seed=config.eval.seed)


def eval_set_for(config: RunConfig, *, horizon: int | None = None, n: int | None = None) -> EvalSet:
    """The run's held-out sequences at ``horizon`` (default: the training horizon).

    Fixed by the config's ``eval.seed``: every analysis, checkpoint and model of a tunnel
    sees the same sequences. ``n`` defaults to ``eval.n``.
    """
    return _eval_set(config, horizon or config.tunnel.horizon, n or config.eval.n)


@lru_cache(maxsize=256)
def scores_at(run: Run, horizon: int | None = None) -> dict[str, Any]:
    """:func:`~windtunnel.evaluation.evaluate` of the run's model at ``horizon`` (default:
    the training horizon) on its fixed held-out set, with oracle and prior rows and 95%
    bootstrap intervals. Cached per run object: the analyses that compare the same models
    (length generalization, Table 1, late attention, seeds) evaluate each once."""
    config = run.config
    eval_set = eval_set_for(config, horizon=horizon)
    predictor = model_predictor(run.model)
    return evaluate(predictor, eval_set, tunnel=config.tunnel, bootstrap=config.eval.bootstrap, seed=config.eval.seed)


@dataclass(frozen=True)
class Analysis:
    """A registered analysis (see the module docstring)."""

    name: str
    compute: Callable[[Sequence[Run]], dict[str, Any]]
    scope: Scope
    needs_attention: bool
    description: str
    requires: Callable[[Sequence[Run]], str | None] | None = None

    def applies_to(self, runs: Sequence[Run]) -> str | None:
        """None if the analysis can run on ``runs``, else why not (one line)."""
        if not runs:
            return "no runs given"
        if len({r.config.tunnel for r in runs}) > 1:
            return "the runs differ in tunnel"
        if self.scope == "seeds" and len({r.configuration for r in runs}) > 1:
            return "it averages seeds of one configuration, and these runs differ in model"
        if self.needs_attention and not any(r.model.attention_heads for r in runs):
            return "it needs attention, and these models have none"
        return self.requires(runs) if self.requires else None

    def run(self, runs: Sequence[Run]) -> AnalysisResult:
        """The analysis of ``runs`` as its typed result (:data:`windtunnel.results.RESULT_TYPES`):
        what :attr:`compute` measures, after the header every result starts with (the runs
        read, the tunnel's parameters and its own words for the task variant)."""
        tunnel = runs[0].config.tunnel
        header = {
            "analysis": self.name,
            "run_dirs": [r.recorded_dir for r in runs],
            "tunnel": runs[0].config.to_mapping()["tunnel"],
            "task_variant": tunnel.describe(),
            "tunnel_label": tunnel.label(),
        }
        return RESULT_TYPES[self.name].from_json({**header, **self.compute(runs)})


#: Every analysis by name, in the order ``windtunnel analyze`` runs them.
ANALYSES: dict[str, Analysis] = {}


def register(
    name: str,
    *,
    scope: Scope = "seeds",
    needs_attention: bool = False,
    requires: Callable[[Sequence[Run]], str | None] | None = None,
) -> Callable:
    """Decorator: register ``compute(runs) -> dict`` as analysis ``name``; its docstring's
    first line is the description. ``requires(runs)`` returns why the analysis does not
    apply to ``runs`` (one line), or None."""

    def decorate(compute: Callable[[Sequence[Run]], dict[str, Any]]) -> Callable:
        if name in ANALYSES:
            raise ValueError(f"analysis {name!r} is registered twice")
        if name not in RESULT_TYPES:
            raise ValueError(f"analysis {name!r} has no result type: register one with @result_type({name!r}) in windtunnel.results")
        description = (compute.__doc__ or name).strip().splitlines()[0]
        ANALYSES[name] = Analysis(name, compute, scope, needs_attention, description, requires)
        return compute

    return decorate
