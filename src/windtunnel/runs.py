"""Run directories: create, resume, load the trained model, evaluate it.

A run directory is what ``windtunnel train`` writes (see
:mod:`windtunnel.training.checkpoint` for the files) plus ``eval.json`` from
``windtunnel eval``. Everything here is callable from Python; the CLI only parses.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from windtunnel.config import ConfigError
from windtunnel.evaluation import EvalSet, evaluate, model_predictor, score_relabeling
from windtunnel.files import atomic_write_text, has_content, portable_path
from windtunnel.history import end_step, read_metrics
from windtunnel.run_config import RunConfig, build_run_model, load_run_config, run_config_from_mapping
from windtunnel.run_files import check_run_files
from windtunnel.training.tracking import check_installed
from windtunnel.training.checkpoint import (
    MAX_SHARD_BYTES,
    RESUME_FILE,
    SNAPSHOT_DIR,
    CheckpointError,
    list_snapshots,
    load_final_weights,
    load_resume,
    load_snapshot,
    read_final_weights_step,
    read_resume_step,
    save_final_weights,
)
from windtunnel.tunnels import TUNNELS
from windtunnel.tunnels.capabilities import Relabeling, declares, lacks
from windtunnel.run_layout import CONFIG_FILE, EVAL_FILE, MANIFEST_FILE, RUNS_DIR

__all__ = [
    "evaluate_run",
    "format_table",
    "keep_final_weights",
    "load_run_model",
    "prepare_new_run",
    "prepare_resume",
    "read_run_config",
    "recorded_run_dir",
    "run_end_step",
]


def recorded_run_dir(run_dir: Path | str) -> str:
    """How a result file names the run in ``run_dir``: relative to the reproduction folder
    that holds it (``runs/<run>``, as its manifest names it), else the run folder's name.
    Never a path of this machine, so a result reads the same wherever it is copied; readers
    take its last part, the run's name, which a result holding the path as given has too."""
    run_dir = Path(os.path.abspath(run_dir))
    reproduction = run_dir.parent.parent
    if run_dir.parent.name == RUNS_DIR and (reproduction / MANIFEST_FILE).is_file():
        return portable_path(run_dir, reproduction)
    return run_dir.name


def read_run_config(run_dir: Path) -> RunConfig:
    """The resolved config of the run in ``run_dir``."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise CheckpointError(f"{str(run_dir)!r} is not a run directory: it is a file (give the directory `train --out` made)")
    if not run_dir.is_dir():
        raise CheckpointError(f"run directory {str(run_dir)!r} does not exist")
    path = run_dir / CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(f"{str(run_dir)!r} is not a run directory: it has no {CONFIG_FILE}")
    try:
        return load_run_config(path)
    except ConfigError as error:  # a hand-edited or damaged config.json: say which file
        if str(path) in str(error):
            raise
        raise ConfigError(f"{str(path)!r} is not a valid run config: {error}") from None


def prepare_new_run(run_dir: Path) -> None:
    """Refuse to start a run where one already is (nothing is ever overwritten)."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"--out {str(run_dir)!r} is a file: give a new or empty directory")
    if run_dir.is_dir() and has_content(run_dir):
        raise ConfigError(
            f"--out {str(run_dir)!r} is not empty: continue its run with --resume {run_dir} or choose a new directory"
        )


def prepare_resume(run_dir: Path, overrides: Sequence[str] = (), *, force: bool = False) -> RunConfig:
    """The config to resume ``run_dir`` with: its own, unless ``overrides`` change it (then ``force`` is needed).

    A run that saved no checkpoint yet resumes from step 0 (the trainer starts it again in place).
    """
    run_dir = Path(run_dir)
    check_run_files(run_dir)  # before anything is written: a refused resume changes nothing
    stored = read_run_config(run_dir)
    config = run_config_from_mapping(stored.to_mapping(), overrides) if overrides else stored
    check_installed(config.train.log_to)  # before config.json is rewritten
    if config != stored:
        changes = _differences(stored.to_mapping(), config.to_mapping())
        if not force:
            raise ConfigError(f"resuming with a changed config is refused ({'; '.join(changes)}); pass --force to accept")
        if read_resume_step(run_dir) is not None:  # the checkpoint must fit the changed config before it is recorded
            load_resume(run_dir, build_run_model(config))
        atomic_write_text(run_dir / CONFIG_FILE, config.to_json())
    return config


def _differences(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    changes = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            changes += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            changes.append(f"{prefix}{key}: {a} -> {b}")
    return changes


def run_end_step(run_dir: Path, config: RunConfig) -> int:
    """The step the run in ``run_dir`` ends at: its configured steps, or the step its time
    limit stopped it at (``train.time_limit_s``; ``history.end_step``)."""
    return end_step(read_metrics(run_dir), config.train.steps)


def load_run_model(run_dir: Path, *, step: int | None = None) -> tuple[RunConfig, nn.Module, int]:
    """The run's config and model with trained weights: snapshot ``step``, else the final
    weights (the snapshot at the step the run ends at, or those a results folder keeps in
    ``weights/``), else the latest resume state. Returns ``(config, model, step)``.

    ``step=0`` of a run that kept no step-0 snapshot (a results folder's) is the model rebuilt
    from its config's seed: the trainer builds the initial weights the same way, on the CPU."""
    run_dir = Path(run_dir)
    check_run_files(run_dir)
    config = read_run_config(run_dir)
    model = build_run_model(config)
    snapshots = list_snapshots(run_dir)
    if step is not None:
        if step == 0 and 0 not in snapshots:
            return config, model, 0
        if step not in snapshots:
            raise CheckpointError(f"--step {step} is not a snapshot of {str(run_dir)!r}; snapshots: {snapshots}")
        load_snapshot(run_dir, model, step)
        return config, model, step
    if snapshots and snapshots[-1] == run_end_step(run_dir, config):
        load_snapshot(run_dir, model, snapshots[-1])
        return config, model, snapshots[-1]
    if read_final_weights_step(run_dir) is not None:
        return config, model, load_final_weights(run_dir, model)
    if read_resume_step(run_dir) is None:
        raise CheckpointError(f"{str(run_dir)!r} holds no trained weights yet")
    trained, _ = load_resume(run_dir, model)
    return config, model, trained


def keep_final_weights(run_dir: Path, max_shard_bytes: int = MAX_SHARD_BYTES) -> int:
    """Reduce a finished (or time-limited) run to what a results folder keeps: its final
    weights in float32 shards of at most ``max_shard_bytes`` (``weights/``), without the
    training state (``resume.safetensors``) or the snapshots, which a GPU machine's run
    leaves behind. Config, history, evaluation and logs stay. Returns the weights' step."""
    run_dir = Path(run_dir)
    config, model, step = load_run_model(run_dir)
    if step != run_end_step(run_dir, config):
        raise CheckpointError(f"{str(run_dir)!r} is unfinished (weights of step {step}, ends at {run_end_step(run_dir, config)}): "
                              "finish it before keeping it")
    if read_final_weights_step(run_dir) != step:
        save_final_weights(run_dir, model, step, max_shard_bytes)
    (run_dir / RESUME_FILE).unlink(missing_ok=True)
    shutil.rmtree(run_dir / SNAPSHOT_DIR, ignore_errors=True)
    return step


def evaluate_run(
    run_dir: Path,
    *,
    horizons: Sequence[int] | None = None,
    n: int | None = None,
    step: int | None = None,
    relabel: bool = False,
    write: bool = True,
) -> dict[str, Any]:
    """Evaluate the run's model at each horizon (with oracle and prior rows); write ``eval.json``."""
    run_dir = Path(run_dir)
    config, model, trained = load_run_model(run_dir, step=step)
    tunnel, e = config.tunnel, config.eval
    horizons = tuple(horizons or config.horizons)
    for h in horizons:
        tunnel.check_horizon(h, name="--horizons")
        if tunnel.seq_len(h) > model.max_len:
            raise ConfigError(
                f"--horizons {h} is out of range: sequences of {tunnel.seq_len(h)} tokens exceed the model's position "
                f"table ({model.max_len}); the longest horizon this run supports is set by its eval.horizons"
            )
    if relabel and not declares(tunnel, Relabeling):
        able = [name for name, cls in TUNNELS.items() if declares(cls, Relabeling)]
        raise ConfigError(f"--relabel applies to tunnels with hidden states to relabel ({', '.join(able)}), not {tunnel.name!r}")
    if relabel and (reason := lacks(tunnel, Relabeling)):
        raise ConfigError(f"--relabel does not apply: {reason}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(device)
    predictor = model_predictor(model, device=device)
    result: dict[str, Any] = {"run_dir": recorded_run_dir(run_dir), "step": trained, "model": config.model_kind, "n": n or e.n, "horizons": {}}
    for h in horizons:
        eval_set = EvalSet.draw(tunnel, horizon=h, n=n or e.n, batch_size=e.batch_size, seed=e.seed)
        scores = evaluate(predictor, eval_set, tunnel=tunnel, bootstrap=e.bootstrap, seed=e.seed)
        if relabel:
            scores["relabel"] = score_relabeling(predictor, eval_set, tunnel, seed=e.seed, bootstrap=e.bootstrap)
        result["horizons"][str(h)] = scores
    if write:
        atomic_write_text(run_dir / EVAL_FILE, json.dumps(result, indent=1))
    return result


def format_table(result: dict[str, Any]) -> str:
    """The scalar metrics of :func:`evaluate_run` as a table (model, oracle, prior per horizon, and
    the tunnel's own references where it has them: the position-wise floor, the permutation reference)."""
    lines = [f"{result['run_dir']} ({result['model']}, step {result['step']})"]
    lines.append(f"{'horizon':>7} {'row':<13} {'mae_aggregate_bits':>26} {'mae_bits':>26} {'kl_bits':>26}")
    for h, scores in result["horizons"].items():
        references = [(name, scores[name]) for name in ("oracle", "prior", "position_wise", "permutation") if name in scores]
        for row, values in (("model", scores), *references):
            cells = []
            for metric in ("mae_aggregate_bits", "mae_bits", "kl_bits"):
                ci = values.get(f"{metric}_ci")
                cells.append(f"{values[metric]:.5f}" + (f" [{ci[0]:.5f}, {ci[1]:.5f}]" if ci else ""))
            lines.append(f"{h:>7} {row:<13} " + " ".join(f"{c:>26}" for c in cells))
        if "loss_gap_bits" in scores:  # a tunnel whose hidden parameters give a predictive of their own
            lines.append(
                f"{h:>7} loss gap over the oracle that knows the parameters, bits: model {scores['loss_gap_bits']:.5f}, "
                f"exact posterior {scores['oracle']['loss_gap_bits']:.5f}, prior {scores['prior']['loss_gap_bits']:.5f}"
            )
        if "relabel" in scores:
            r = scores["relabel"]
            lines.append(
                f"{h:>7} relabel  mae_bits {r['mae_bits_before']:.5f} -> {r['mae_bits_after']:.5f}, "
                f"delta {r['delta_mae_bits']:+.5f} [{r['delta_mae_bits_ci'][0]:+.5f}, {r['delta_mae_bits_ci'][1]:+.5f}]"
            )
    if result.get("n") == 1:
        lines.append("(one sequence per horizon: a bootstrap over one sequence has zero-width intervals; use --n 2 or more)")
    return "\n".join(lines)
