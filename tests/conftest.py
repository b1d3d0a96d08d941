"""Shared test fixtures: the tiny training config that the run-directory tests train."""

from __future__ import annotations

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
