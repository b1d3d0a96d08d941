"""Where and how a run was trained: the machine, the software, the precision and the speed.

The trainer appends one record per start of a run to ``RUN_DIR/provenance.json`` when that
start ends (finished, stopped by its time limit, or interrupted by Ctrl-C with its state saved), so a result that moves between machines
(a GPU window's run, kept in a results folder) carries what produced it. The report and the
docs read it from there; nothing in prose restates it.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

from windtunnel.files import atomic_write_text
from windtunnel.run_layout import PROVENANCE_FILE

if TYPE_CHECKING:
    import torch

__all__ = ["append_start", "commit", "cpu_model", "device_name", "read_provenance"]


#: The commit of the code, when it runs from a copy without its git history (a GPU machine
#: gets the working tree alone): the caller sets it, e.g. ``WINDTUNNEL_COMMIT=$(git rev-parse HEAD)``.
COMMIT_ENV = "WINDTUNNEL_COMMIT"


def cpu_model() -> str:
    """The processor's name as Linux reports it (``platform`` gives only the architecture)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def device_name(device: torch.device) -> str:
    """The accelerator's name (``NVIDIA H200``), or the processor's for a CPU run."""
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_model()


def commit() -> str | None:
    """The code's commit: ``$WINDTUNNEL_COMMIT``, else ``git rev-parse HEAD`` where the package
    sits in a git checkout (with ``-dirty`` when it has uncommitted changes), else None."""
    if os.environ.get(COMMIT_ENV):
        return os.environ[COMMIT_ENV]
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here, capture_output=True, text=True, timeout=10)
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def read_provenance(run_dir: Path) -> list[dict[str, Any]]:
    """The run's provenance records, one per start that ended, oldest first (none if absent)."""
    path = Path(run_dir) / PROVENANCE_FILE
    if not path.is_file():
        return []
    data = json.loads(path.read_text())
    return list(data.get("starts", [])) if isinstance(data, dict) else []


def append_start(run_dir: Path, record: dict[str, Any]) -> None:
    """Add one start's record to the run's provenance."""
    starts = read_provenance(run_dir)
    atomic_write_text(Path(run_dir) / PROVENANCE_FILE, json.dumps({"starts": [*starts, record]}, indent=1))
