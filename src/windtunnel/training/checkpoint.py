"""Checkpoints that are safe to load and cannot be left half-written.

A run directory holds::

    config.json                       the resolved RunConfig
    metrics.jsonl                     one JSON object per logged step
    resume.safetensors                latest training state: model.* and optim.* tensors,
                                      step and metadata in the header (replaced atomically)
    checkpoints/step_0001000.safetensors + step_0001000.json
                                      permanent weight snapshots (log-spaced + final)

Everything is safetensors or JSON: nothing is ever unpickled. Every file is written to a
temporary name, flushed to disk and renamed over its target, so a crash at any moment
leaves either the old file or the new one. A snapshot counts only once its JSON exists
(written after its weights).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import safetensors.torch
from safetensors.torch import load as tensors_from_safetensors_bytes  # no pickle: the safetensors format only
import torch
from torch import nn

from windtunnel.files import atomic_write_bytes, atomic_write_text
from windtunnel.models import unwrap_model

__all__ = [
    "CheckpointError",
    "RESUME_FILE",
    "list_snapshots",
    "load_resume",
    "load_snapshot",
    "read_resume_step",
    "save_resume",
    "save_snapshot",
    "snapshot_path",
    "snapshot_steps",
    "tensors_checksum",
]

RESUME_FILE = "resume.safetensors"
SNAPSHOT_DIR = "checkpoints"
_FORMAT = "windtunnel-resume-1"
_SNAPSHOT_NAME = re.compile(r"^step_(\d{7,})\.json$")


class CheckpointError(ValueError):
    """A checkpoint or run directory that is missing, truncated, corrupt or of another run (one line)."""


# --- integrity ----------------------------------------------------------------------

_CHECKSUM_KEY = "sha256"


def tensors_checksum(tensors: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 over every tensor's name, dtype, shape and bytes, in name order.

    Stored in each checkpoint's header and verified on load, so bytes overwritten on disk
    (which safetensors, checking only the layout, would load as other numbers) are caught.
    """
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().contiguous().cpu()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _save(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> bytes:
    return safetensors.torch.save(tensors, metadata={**metadata, _CHECKSUM_KEY: tensors_checksum(tensors)})


# --- resume state -------------------------------------------------------------------


def _cpu_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """The unwrapped model's state dict on the CPU (no DDP ``module.`` or compile ``_orig_mod.`` prefixes)."""
    return {k: v.detach().contiguous().cpu() for k, v in unwrap_model(model).state_dict().items()}


def save_resume(run_dir: Path, model: nn.Module, optimizer: torch.optim.Optimizer, step: int, meta: Mapping[str, Any]) -> None:
    """Write the full training state after ``step`` optimizer steps to ``run_dir/resume.safetensors``.

    The optimizer's per-parameter state (AdamW moments and step counts) is stored as
    tensors ``optim.{index}.{name}``; its hyperparameters come from the config on load.
    """
    tensors = {f"model.{k}": v for k, v in _cpu_weights(model).items()}
    for index, state in optimizer.state_dict()["state"].items():
        for name, value in state.items():
            tensors[f"optim.{index}.{name}"] = torch.as_tensor(value).detach().contiguous().cpu()
    header = {"format": _FORMAT, "step": str(step), "meta": json.dumps(dict(meta))}
    atomic_write_bytes(Path(run_dir) / RESUME_FILE, _save(tensors, header))


def _open(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist")
    # One read of the whole file, then everything from those bytes: safetensors.safe_open
    # reads the header and the tensors through separate opens of the path, so a reader
    # racing the writer's atomic replace could pair one file's checksum with the next
    # file's tensors (measured: 2% of reads while a run checkpoints every few ms).
    try:
        data = path.read_bytes()
    except OSError as error:
        raise CheckpointError(f"checkpoint {str(path)!r} cannot be read: {error.strerror or error}") from None
    try:
        tensors = tensors_from_safetensors_bytes(data)
        metadata = _metadata(data)
    except Exception as error:  # safetensors raises its own error types for truncated or foreign files
        raise CheckpointError(f"checkpoint {str(path)!r} is truncated or corrupt ({type(error).__name__}): {error}") from None
    stored = metadata.get(_CHECKSUM_KEY)
    # Checkpoints written before checksums existed carry none: they load as before.
    if stored is not None and stored != tensors_checksum(tensors):
        raise CheckpointError(
            f"checkpoint {str(path)!r} fails its checksum: its bytes changed on disk after it was written "
            "(restore it from a copy, or resume from an earlier snapshot)"
        )
    return tensors, metadata


def _metadata(data: bytes) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors file's bytes: an 8-byte little-endian header
    length, then the JSON header (the format's specification). Hand-read because
    safetensors exposes metadata only through ``safe_open`` of a path, which reopens it."""
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + length])
    metadata = header.get("__metadata__") or {}
    if not isinstance(metadata, dict):
        raise ValueError("__metadata__ is not a mapping")
    return metadata


def read_resume_step(run_dir: Path) -> int | None:
    """The step stored in ``run_dir``'s resume state, or None when there is none."""
    path = Path(run_dir) / RESUME_FILE
    if not path.exists():
        return None
    _, metadata = _open(path)
    return _check_header(path, metadata)


def _check_header(path: Path, metadata: Mapping[str, str]) -> int:
    if metadata.get("format") != _FORMAT or not metadata.get("step", "").isdigit():
        raise CheckpointError(f"checkpoint {str(path)!r} is not a windtunnel resume state (format {metadata.get('format')!r})")
    return int(metadata["step"])


def load_resume(
    run_dir: Path, model: nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> tuple[int, dict[str, Any]]:
    """Restore the model (and the optimizer, if given) from ``run_dir/resume.safetensors``.

    Returns:
        ``(step, meta)``.
    """
    path = Path(run_dir) / RESUME_FILE
    tensors, metadata = _open(path)
    step = _check_header(path, metadata)
    weights = {k.removeprefix("model."): v for k, v in tensors.items() if k.startswith("model.")}
    _load_weights(path, unwrap_model(model), weights)
    if optimizer is None:
        return step, json.loads(metadata.get("meta", "{}"))
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        if key.startswith("optim."):
            _, index, name = key.split(".", 2)
            state.setdefault(int(index), {})[name] = value
    target = optimizer.state_dict()
    n_params = sum(len(group["params"]) for group in target["param_groups"])
    if state and max(state) >= n_params:
        raise CheckpointError(f"checkpoint {str(path)!r} holds optimizer state for another model")
    target["state"] = state
    optimizer.load_state_dict(target)
    return step, json.loads(metadata.get("meta", "{}"))


def _load_weights(path: Path, model: nn.Module, weights: Mapping[str, torch.Tensor]) -> None:
    expected = model.state_dict()
    missing, unexpected = set(expected) - set(weights), set(weights) - set(expected)
    wrong = [k for k in set(expected) & set(weights) if expected[k].shape != weights[k].shape]
    if missing or unexpected or wrong:
        detail = (sorted(missing) or sorted(unexpected) or wrong)[0]
        raise CheckpointError(f"checkpoint {str(path)!r} does not fit this model (first mismatch: {detail})")
    model.load_state_dict(weights)


# --- permanent snapshots ------------------------------------------------------------


def snapshot_steps(total_steps: int, per_decade: int) -> list[int]:
    """Log-spaced steps at which to keep weights: 0, ~10^(i/per_decade) for i >= 0, and the last step."""
    steps = {0, total_steps}
    if per_decade > 0:
        for i in range(int(per_decade * math.log10(max(total_steps, 1))) + 1):
            steps.add(round(10 ** (i / per_decade)))
    return sorted(s for s in steps if s <= total_steps)


def snapshot_path(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / SNAPSHOT_DIR / f"step_{step:07d}.safetensors"


def save_snapshot(run_dir: Path, model: nn.Module, step: int, meta: Mapping[str, Any]) -> None:
    """Keep the weights after ``step`` steps: safetensors first, then the JSON that makes it count."""
    path = snapshot_path(run_dir, step)
    atomic_write_bytes(path, _save(_cpu_weights(model), {"step": str(step)}))
    atomic_write_text(path.with_suffix(".json"), json.dumps({"step": step, **meta}, indent=2))


def list_snapshots(run_dir: Path) -> list[int]:
    """Steps of the complete snapshots in ``run_dir``, ascending."""
    folder = Path(run_dir) / SNAPSHOT_DIR
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for p in folder.iterdir() if (m := _SNAPSHOT_NAME.match(p.name)))


def load_snapshot(run_dir: Path, model: nn.Module, step: int) -> dict[str, Any]:
    """Load the weights of snapshot ``step`` into ``model``; returns its JSON metadata."""
    path = snapshot_path(run_dir, step)
    tensors, _ = _open(path)
    _load_weights(path, unwrap_model(model), tensors)
    try:
        return json.loads(path.with_suffix(".json").read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise CheckpointError(f"snapshot metadata {str(path.with_suffix('.json'))!r} is unreadable: {error}") from None
