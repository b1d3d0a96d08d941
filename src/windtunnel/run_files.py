"""A run directory's files checked before a command reads them.

Every command that reads a finished run (``eval``, ``analyze``, ``export``, ``report``,
``sweep``, ``train --resume``, ``lm-score --beside``) calls :func:`check_run_files` before its
work starts, so a damaged file is named in one line (the file, the line where it has lines,
and what to do) and the command exits 2 having changed nothing, instead of failing with a
traceback minutes into its work::

    from windtunnel.run_files import check_run_files
    check_run_files("runs/bij")   # raises DamagedRunFile naming the first damaged file
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from windtunnel.config import ConfigError
from windtunnel.history import MetricsError, parse_metrics
from windtunnel.run_layout import CONFIG_FILE, EVAL_FILE, METRICS_FILE, PROVENANCE_FILE, WEIGHTS_DIR, WEIGHTS_INDEX

__all__ = ["DamagedRunFile", "check_run_files"]

#: What to do about each file when it is damaged.
REMEDY = {
    CONFIG_FILE: "restore it from a copy of the run: nothing of the run can be read without it",
    METRICS_FILE: "delete that line or restore the file from a copy (each line is one JSON record of a step)",
    PROVENANCE_FILE: "restore it from a copy, or delete it (it records only where each start trained)",
    f"{WEIGHTS_DIR}/{WEIGHTS_INDEX}": "restore the weights folder from a copy of the run",
    EVAL_FILE: "delete it and run `windtunnel eval` on the run again",
}


class DamagedRunFile(ConfigError):
    """A file of a run directory that cannot be read (the message names it and what to do)."""


def _json_object(path: Path, name: str, required: tuple[str, ...] = ()) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except UnicodeDecodeError:
        data = None
    except json.JSONDecodeError as error:
        raise DamagedRunFile(f"{str(path)!r} is damaged (line {error.lineno}: {error.msg}): {REMEDY[name]}") from None
    if not isinstance(data, dict) or any(key not in data for key in required):
        wanted = f" with {', '.join(required)}" if required else ""
        raise DamagedRunFile(f"{str(path)!r} is damaged (not a JSON object{wanted}): {REMEDY[name]}")
    return data


def check_run_files(run_dir: Path | str) -> None:
    """Read every file of the run that a command may read and raise :class:`DamagedRunFile`
    on the first that is damaged. Missing files are the commands' own business (a run that
    never logged, was never evaluated, or keeps no final weights is not damaged); a run
    directory that does not exist is too.

    A last line of ``metrics.jsonl`` cut short is what a crash leaves while appending, and
    is not damage (the readers leave it out); a bad line before it is."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return
    checks = (
        (CONFIG_FILE, ("tunnel", "model", "train")),
        (PROVENANCE_FILE, ("starts",)),
        (f"{WEIGHTS_DIR}/{WEIGHTS_INDEX}", ("metadata", "weight_map")),
        (EVAL_FILE, ()),
    )
    for name, required in checks:
        if (run_dir / name).is_file():
            _json_object(run_dir / name, name, required)
    metrics = run_dir / METRICS_FILE
    if metrics.is_file():
        try:
            parse_metrics(metrics)
        except MetricsError as error:
            raise DamagedRunFile(f"{error}: {REMEDY[METRICS_FILE]}") from None
