"""Checkpoints that are safe to load and cannot be left half-written.

A run directory holds::

    config.json                       the resolved RunConfig
    metrics.jsonl                     one JSON object per logged step
    resume.safetensors                latest training state: model.* and optim.* tensors,
                                      step and metadata in the header (replaced atomically)
    checkpoints/step_0001000.safetensors + step_0001000.json
                                      permanent weight snapshots (log-spaced + final)
    weights/model-00001-of-00002.safetensors ... + model.safetensors.index.json
                                      a kept run's final weights alone, float32, in shards of
                                      a bounded size (``save_final_weights``): what a results
                                      folder keeps of a run instead of the two above

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
from windtunnel.run_layout import RESUME_FILE, SNAPSHOT_DIR, WEIGHTS_DIR, WEIGHTS_INDEX

__all__ = [
    "CheckpointError",
    "MAX_SHARD_BYTES",
    "load_final_weights",
    "read_final_weights_step",
    "save_final_weights",
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


# --- final weights, sharded -----------------------------------------------------------

_WEIGHTS_FORMAT = "windtunnel-weights-1"
#: Shards of at most 15 MiB: a GPU machine's results come back as files of at most 16 MiB.
MAX_SHARD_BYTES = 15 * 2**20


def save_final_weights(run_dir: Path, model: nn.Module, step: int, max_shard_bytes: int = MAX_SHARD_BYTES) -> list[Path]:
    """Keep the model's weights after ``step`` steps in ``run_dir/weights/``: float32, no
    optimizer state, as safetensors shards of at most ``max_shard_bytes`` each (a single tensor
    larger than that gets a shard of its own), each with its checksum, and the index, written
    last (it makes them count). Returns the shard paths."""
    from huggingface_hub import split_torch_state_dict_into_shards  # the sharded-safetensors layout, as HF writes it

    weights = {k: (v.float() if v.is_floating_point() else v) for k, v in _cpu_weights(model).items()}
    split = split_torch_state_dict_into_shards(weights, max_shard_size=max_shard_bytes, filename_pattern="model{suffix}.safetensors")
    folder = Path(run_dir) / WEIGHTS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for filename, names in split.filename_to_tensors.items():
        path = folder / filename
        atomic_write_bytes(path, _save({name: weights[name] for name in names}, {"format": _WEIGHTS_FORMAT, "step": str(step)}))
        paths.append(path)
    index = {
        "metadata": {"format": _WEIGHTS_FORMAT, "step": step, "total_size": sum(t.numel() * t.element_size() for t in weights.values())},
        "weight_map": dict(sorted(split.tensor_to_filename.items())),
    }
    atomic_write_text(folder / WEIGHTS_INDEX, json.dumps(index, indent=1))
    return paths


def _weights_index(run_dir: Path) -> tuple[Path, dict[str, Any]] | None:
    path = Path(run_dir) / WEIGHTS_DIR / WEIGHTS_INDEX
    if not path.is_file():
        return None
    try:
        index = json.loads(path.read_text())
        step = index["metadata"]["step"]
        weight_map = index["weight_map"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as error:
        raise CheckpointError(f"weights index {str(path)!r} is unreadable ({type(error).__name__}: {error})") from None
    if not isinstance(step, int) or not isinstance(weight_map, dict):
        raise CheckpointError(f"weights index {str(path)!r} has no valid step or weight_map")
    return path, index


def read_final_weights_step(run_dir: Path) -> int | None:
    """The step of the final weights kept in ``run_dir/weights/``, or None when there are none."""
    found = _weights_index(run_dir)
    return None if found is None else found[1]["metadata"]["step"]


def load_final_weights(run_dir: Path, model: nn.Module) -> int:
    """Load the final weights kept in ``run_dir/weights/`` into ``model`` (every shard's
    checksum verified); returns their step."""
    found = _weights_index(run_dir)
    if found is None:
        raise CheckpointError(f"{str(run_dir)!r} keeps no final weights ({WEIGHTS_DIR}/{WEIGHTS_INDEX})")
    path, index = found
    weights: dict[str, torch.Tensor] = {}
    for filename in sorted(set(index["weight_map"].values())):
        tensors, _ = _open(path.parent / filename)
        weights.update(tensors)
    if set(weights) != set(index["weight_map"]):
        raise CheckpointError(f"the shards in {str(path.parent)!r} do not hold the tensors their index lists")
    _load_weights(path, unwrap_model(model), weights)
    return index["metadata"]["step"]
