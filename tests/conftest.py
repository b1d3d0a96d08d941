"""Shared test fixtures: the tiny training config that the run-directory tests train, and
the processes a test started (to wait for them to exit, or to kill what a failure left)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

TINY = """
[tunnel]
name = "bijection"
V = 6
[model]
kind = "transformer"
n_layers = 2
n_heads = 2
d_model = 16
d_mlp = 32
[train]
steps = {steps}
batch_size = 32
lr = 3e-3
eval_every = 10
checkpoint_every = {checkpoint_every}
log_every = 5
[eval]
n = 128
batch_size = 64
bootstrap = 50
"""


def _write_config(folder: Path, steps: int = 30, checkpoint_every: int = 5) -> Path:
    path = folder / "tiny.toml"
    path.write_text(TINY.format(steps=steps, checkpoint_every=checkpoint_every))
    return path


@pytest.fixture(scope="session")
def write_config() -> Callable[..., Path]:
    """Writes the tiny config (a 2-layer transformer on the V = 6 bijection) into a folder."""
    return _write_config


def _processes_naming(*paths: object) -> list[int]:
    """Pids of the live (not zombie) processes whose command line names one of ``paths``, or
    that run inside one: training workers run in their runs folder (naming the run by its
    name alone), a local Ray instance names its temp directory."""
    folders = [os.path.realpath(str(path)) for path in paths]
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read().decode(errors="replace")
            with open(f"/proc/{entry}/stat") as f:
                zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
            where = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue  # exited meanwhile, or not ours to read
        inside = any(where == folder or where.startswith(folder + os.sep) for folder in folders)
        if not zombie and (inside or any(str(path) in command for path in paths)):
            found.append(int(entry))
    return found


@pytest.fixture(scope="session")
def processes_naming() -> Callable[..., list[int]]:
    """``processes_naming(*paths)``: the pids of live processes whose command line names one of ``paths``."""
    return _processes_naming
