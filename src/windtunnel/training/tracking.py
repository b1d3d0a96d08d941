"""Experiment tracking: the scalars of ``metrics.jsonl`` mirrored to TensorBoard, W&B or MLflow.

``train.log_to`` names the sinks. Each receives every record the trainer appends to
``metrics.jsonl``, at the same step and with the same keys as tags (``loss``, ``lr``,
``grad_norm``, ``eval_mae_bits``, ...), at the same boundaries: nothing here reads a tensor.
At the end of a run the final evaluation's per-position curves follow (``final_eval/<curve>``,
indexed by position from 1; a W&B table, as W&B steps only go forward).

``metrics.jsonl`` stays the record, and a resumed run never logs a step twice:

- TensorBoard: the trainer has cut ``metrics.jsonl`` back to the checkpoint it resumes
  from; ``RUN_DIR/tensorboard/`` is deleted and written again from those records before
  training goes on, so the event files hold exactly what ``metrics.jsonl`` holds.
- W&B and MLflow (remote services, possibly, that cannot be rewritten): the run is the same
  W&B/MLflow run (its id is kept in ``RUN_DIR/tracking.json``) and only steps past the last
  one it holds are logged. MLflow is asked what it holds; W&B offline cannot be, so the
  last step handed to it is kept in ``tracking.json``. Steps recomputed after a resume are
  bit-identical on CPU to those already sent, so nothing is lost by skipping them.

Only rank 0 tracks (the trainer opens the sinks there alone).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from windtunnel.config import ConfigError
from windtunnel.files import atomic_write_text
from windtunnel.run_layout import TRACKING_FILE

__all__ = ["NO_TRACKING", "TRACKING_FILE", "TENSORBOARD_DIR", "Tracking", "check_installed", "open_tracking"]

TENSORBOARD_DIR = "tensorboard"

#: The module each sink imports, and how to install it.
_PACKAGES = {
    "tensorboard": ("tensorboard", "pip install 'windtunnel[track]'"),
    "wandb": ("wandb", "pip install wandb"),
    "mlflow": ("mlflow", "pip install mlflow"),
}


def check_installed(sinks: Sequence[str]) -> None:
    """Raise ConfigError (one line) if a sink's package is not installed: checked before a
    run writes anything, so a missing package never leaves a half-made run behind."""
    for sink in sinks:
        module, install = _PACKAGES[sink]
        if importlib.util.find_spec(module) is None:
            raise ConfigError(f"train.log_to={list(sinks)} needs the {module} package, which is not installed: {install}")


def _scalars(record: Mapping[str, Any]) -> dict[str, float]:
    return {key: value for key, value in record.items() if key != "step"}


class _TensorBoard:
    """Event files in ``RUN_DIR/tensorboard/``, rebuilt from ``metrics.jsonl`` on every start."""

    def __init__(self, run_dir: Path, records: Sequence[Mapping[str, Any]]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        folder = run_dir / TENSORBOARD_DIR
        if folder.exists():  # the events of steps past the checkpoint would otherwise be written twice
            shutil.rmtree(folder)
        self.writer = SummaryWriter(log_dir=str(folder))
        for record in records:
            self.log(record)
        self.writer.flush()

    def log(self, record: Mapping[str, Any]) -> None:
        for tag, value in _scalars(record).items():
            self.writer.add_scalar(tag, value, record["step"])

    def log_curves(self, step: int, curves: Mapping[str, Sequence[float]]) -> None:
        for name, values in curves.items():
            for position, value in enumerate(values, start=1):
                self.writer.add_scalar(f"final_eval/{name}", value, position)

    def flush(self) -> None:
        self.writer.flush()

    def close(self, finished: bool) -> None:
        self.writer.close()


class _WandB:
    """One W&B run per run directory (offline unless ``WANDB_MODE`` says otherwise)."""

    def __init__(self, run_dir: Path, config: Mapping[str, Any], state: dict[str, Any], save_state) -> None:
        import wandb

        self.state, self.save_state = state, save_state
        state.setdefault("id", os.urandom(6).hex())
        state.setdefault("last_step", 0)
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "windtunnel"),
            name=run_dir.name,
            id=state["id"],
            resume="allow",
            dir=str(run_dir),
            mode=os.environ.get("WANDB_MODE", "offline"),
            config=dict(config),
            # stderr belongs to the progress display; the run's numbers are all W&B needs
            settings=wandb.Settings(console="off", quiet=True, x_disable_stats=True, save_code=False),
        )
        self.pending_curves: dict[str, Any] | None = None
        save_state()

    def log(self, record: Mapping[str, Any]) -> None:
        if record["step"] <= self.state["last_step"]:
            return  # W&B has it from before the resume
        self.run.log(_scalars(record), step=record["step"])
        self.state["last_step"] = record["step"]
        self.save_state()

    def log_curves(self, step: int, curves: Mapping[str, Sequence[float]]) -> None:
        import wandb

        if self.state.get("curves_step") == step:
            return  # sent before the resume
        names = list(curves)
        rows = [[position, *values] for position, values in enumerate(zip(*curves.values()), start=1)]
        # logged with the final step's scalars (W&B keeps one row per step, in order)
        self.run.log({"final_eval/curves": wandb.Table(columns=["position", *names], data=rows)}, step=step)
        self.state["curves_step"] = step
        self.save_state()

    def flush(self) -> None:
        pass  # the W&B process writes as it receives

    def close(self, finished: bool) -> None:
        self.run.finish(exit_code=0 if finished else 1)


class _MLflow:
    """One MLflow run per run directory, in ``RUN_DIR/mlruns/`` unless ``MLFLOW_TRACKING_URI``
    names a tracking store."""

    def __init__(self, run_dir: Path, config: Mapping[str, Any], state: dict[str, Any], save_state) -> None:
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            uri = (run_dir / "mlruns").resolve().as_uri()
            # MLflow 3 keeps its file store behind this switch (it recommends a database);
            # a store in the run directory needs no server and travels with the run.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient

        self.Metric = Metric
        self.client = client = MlflowClient(tracking_uri=uri)
        if "run_id" not in state:
            name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "windtunnel")
            experiment = client.get_experiment_by_name(name)
            experiment_id = experiment.experiment_id if experiment else client.create_experiment(name)
            run_id = client.create_run(experiment_id, run_name=run_dir.name).info.run_id
            params = [Param(key, str(value)[:500]) for key, value in _flatten(config).items()]
            for start in range(0, len(params), 100):  # log_batch takes at most 100 params a call
                client.log_batch(run_id, params=params[start : start + 100])
            state["run_id"] = run_id
            save_state()
        else:
            client.update_run(state["run_id"], status="RUNNING")
        self.run_id = state["run_id"]
        # The store itself says which steps it holds: the largest logged under any key.
        held = client.get_run(self.run_id).data.metrics
        # curves are indexed by position, not step: a run extended by --force keeps its first ones
        self.has_curves = any(key.startswith("final_eval/") for key in held)
        self.last_step = max(
            (m.step for key in held if not key.startswith("final_eval/") for m in client.get_metric_history(self.run_id, key)),
            default=0,
        )
        self.pending: list[Any] = []

    def log(self, record: Mapping[str, Any]) -> None:
        if record["step"] <= self.last_step:
            return
        now = int(time.time() * 1000)
        self.pending += [self.Metric(key, float(value), now, record["step"]) for key, value in _scalars(record).items()]
        self.last_step = record["step"]

    def log_curves(self, step: int, curves: Mapping[str, Sequence[float]]) -> None:
        if self.has_curves:
            return
        self.has_curves = True
        now = int(time.time() * 1000)
        for name, values in curves.items():
            self.pending += [self.Metric(f"final_eval/{name}", float(v), now, p) for p, v in enumerate(values, start=1)]

    def flush(self) -> None:
        for start in range(0, len(self.pending), 1000):  # log_batch takes at most 1000 metrics a call
            self.client.log_batch(self.run_id, metrics=self.pending[start : start + 1000])
        self.pending = []

    def close(self, finished: bool) -> None:
        self.flush()
        self.client.set_terminated(self.run_id, "FINISHED" if finished else "KILLED")


def _flatten(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in mapping.items():
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


class Tracking:
    """The sinks of one run, fed by the trainer at its boundaries (see the module docstring)."""

    def __init__(self, sinks: Sequence[Any]) -> None:
        self.sinks = list(sinks)

    def log(self, record: Mapping[str, Any], curves: Mapping[str, Sequence[float]] | None = None) -> None:
        """One record of ``metrics.jsonl`` (just appended there), and with the final
        evaluation's per-position ``curves``."""
        for sink in self.sinks:
            sink.log(record)
            if curves is not None:
                sink.log_curves(record["step"], curves)

    def flush(self) -> None:
        for sink in self.sinks:
            sink.flush()

    def close(self, finished: bool) -> None:
        for sink in self.sinks:
            sink.close(finished)


#: What a run without ``train.log_to`` (or a rank other than 0) logs to: nothing.
NO_TRACKING = Tracking([])


def open_tracking(
    sinks: Sequence[str], run_dir: Path, config: Mapping[str, Any], records: Sequence[Mapping[str, Any]]
) -> Tracking:
    """Open ``sinks`` for the run in ``run_dir`` whose ``metrics.jsonl`` holds ``records``
    (none for a new run; those kept up to the checkpoint on resume)."""
    check_installed(sinks)
    state_path = run_dir / TRACKING_FILE
    state: dict[str, Any] = json.loads(state_path.read_text()) if state_path.is_file() else {}

    def save_state() -> None:
        atomic_write_text(state_path, json.dumps(state, indent=1))

    opened: list[Any] = []
    for sink in sinks:
        if sink == "tensorboard":
            opened.append(_TensorBoard(run_dir, records))
            continue
        cls = {"wandb": _WandB, "mlflow": _MLflow}[sink]
        opened.append(cls(run_dir, config, state.setdefault(sink, {}), save_state))
        for record in records:  # what a crash kept from the sink (skipped if it has it)
            opened[-1].log(record)
    tracking = Tracking(opened)
    tracking.flush()
    return tracking
