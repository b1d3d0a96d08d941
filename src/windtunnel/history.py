"""A run's training history: the records of ``metrics.jsonl``, and what is read from them.

A leaf module (json and the file system only), so the report, which reads saved results
and never a model or the trainer, can use it as well as the runs and the benchmarks.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from windtunnel.run_layout import METRICS_FILE

__all__ = [
    "HMM_PLATEAU_EXIT_MAE_BITS", "MetricsError", "clock_segments", "end_step", "parse_metrics",
    "plateau_exit_step", "read_metrics", "stop_record", "training_seconds",
]


#: The HMM transformer first learns to read E but not T and sits on a plateau near 0.105 bits
#: ``mae_bits`` (CPU preset, on every seed and machine measured so far; the settled model is
#: below 0.05); a run has left it at its first held-out evaluation below this.
HMM_PLATEAU_EXIT_MAE_BITS = 0.08


class MetricsError(ValueError):
    """A line of ``metrics.jsonl`` before the last is not a JSON record."""


def parse_metrics(path: Path) -> tuple[list[dict[str, Any]], bool]:
    """The records of the metrics file at ``path``, and whether its last line was cut short.

    Lines are appended as a run goes, so a crash can leave the last one half written:
    that line is dropped (and reported in the second value). A bad line anywhere else is
    not a crash's doing and raises :class:`MetricsError` naming the file and line.
    """
    lines = [line for line in Path(path).read_text(errors="replace").splitlines() if line.strip()]
    records = []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if not isinstance(record, dict) or "step" not in record:
            if number == len(lines):
                return records, True
            raise MetricsError(f"{str(path)!r} line {number} is not a metrics record: {line[:60]!r}")
        records.append(record)
    return records, False


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The run's ``metrics.jsonl`` records, oldest first (none if it has not logged yet; a
    last line cut short by a crash is left out)."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []
    return parse_metrics(path)[0]


def plateau_exit_step(records: Sequence[dict[str, Any]], threshold: float = HMM_PLATEAU_EXIT_MAE_BITS) -> int | None:
    """The step of the first held-out evaluation with ``eval_mae_bits < threshold``; None if none is."""
    return next((r["step"] for r in records if "eval_mae_bits" in r and r["eval_mae_bits"] < threshold), None)


def clock_segments(records: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The timed records (those with ``elapsed_s``) split where the clock starts again.

    ``elapsed_s`` is the seconds since the training process started, so a resumed run's
    clock restarts: one segment per start, oldest first. A rate or a duration taken across
    two segments is meaningless (it can come out negative).
    """
    segments: list[list[dict[str, Any]]] = []
    for record in records:
        if "elapsed_s" not in record:
            continue
        if not segments or record["elapsed_s"] < segments[-1][-1]["elapsed_s"]:
            segments.append([])
        segments[-1].append(record)
    return segments


def training_seconds(records: Sequence[dict[str, Any]]) -> float:
    """The run's training time over all its starts: each start's last logged ``elapsed_s``,
    summed (the time between a start's last record and its interruption is not logged)."""
    return sum(segment[-1]["elapsed_s"] for segment in clock_segments(records))


def stop_record(records: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The record of a run that ended before its configured steps (``train.time_limit_s``:
    ``{"step": N, "stopped": "time_limit", ...}``), if its last start ended so; else None.
    A later start that trains on supersedes it (its records follow)."""
    last = records[-1] if records else None
    return last if last is not None and "stopped" in last else None


def end_step(records: Sequence[dict[str, Any]], configured_steps: int) -> int:
    """The step a run ends at: where it stopped early (:func:`stop_record`), else its configured steps."""
    stopped = stop_record(records)
    return int(stopped["step"]) if stopped is not None else configured_steps
