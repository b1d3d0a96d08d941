"""A run's training history: the records of ``metrics.jsonl``, and what is read from them.

A leaf module (json and the file system only), so the report, which reads saved results
and never a model or the trainer, can use it as well as the runs and the benchmarks.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["HMM_PLATEAU_EXIT_MAE_BITS", "METRICS_FILE", "plateau_exit_step", "read_metrics"]

METRICS_FILE = "metrics.jsonl"

#: The HMM transformer first learns to read E but not T and sits on a plateau near 0.105 bits
#: ``mae_bits`` (CPU preset, on every seed and machine measured so far; the settled model is
#: below 0.05); a run has left it at its first held-out evaluation below this.
HMM_PLATEAU_EXIT_MAE_BITS = 0.08


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The run's ``metrics.jsonl`` records, oldest first (none if it has not logged yet)."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plateau_exit_step(records: Sequence[dict[str, Any]], threshold: float = HMM_PLATEAU_EXIT_MAE_BITS) -> int | None:
    """The step of the first held-out evaluation with ``eval_mae_bits < threshold``; None if none is."""
    return next((r["step"] for r in records if "eval_mae_bits" in r and r["eval_mae_bits"] < threshold), None)
