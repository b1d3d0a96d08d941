"""The worker of a run-group job (``windtunnel.jobs.GroupJob``): trains the group's members as
``windtunnel train`` would train each, in one process.

    python -m windtunnel.group_worker MEMBERS_JSON     # run in the members' runs folder

``MEMBERS_JSON`` lists each member's config file, run directory and ``--set`` overrides.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

from windtunnel.cli import run_command
from windtunnel.files import directory_lock
from windtunnel.run_config import load_run_config
from windtunnel.run_layout import CONFIG_FILE
from windtunnel.runs import prepare_new_run, prepare_resume
from windtunnel.training.group import GroupMember, train_group
from windtunnel.training.trainer import TrainingDiverged, TrainResult, train

__all__ = ["main", "train_members"]


def train_members(members: Sequence[tuple[Path, Path, Sequence[str]]], *, progress: bool = False) -> list[GroupMember]:
    """Train a group job's members, each given as (config file, run directory, overrides): as a
    new group where none has started, as a resumed group where all have, else each alone (a new
    one started, a started one resumed), as ``windtunnel train`` would. Holds every member's
    writer lock (``windtunnel.files``), as that command does."""
    started = [(Path(run_dir) / CONFIG_FILE).is_file() for _, run_dir, _ in members]
    with ExitStack() as locks:
        for _, run_dir, _ in members:
            Path(run_dir).mkdir(parents=True, exist_ok=True)
            locks.enter_context(directory_lock(Path(run_dir)))
        if not any(started):
            configs = [load_run_config(config, list(overrides)) for config, _, overrides in members]
            for _, run_dir, _ in members:
                prepare_new_run(Path(run_dir))
            return train_group(configs, [run_dir for _, run_dir, _ in members], progress=progress)
        if all(started):
            configs = [prepare_resume(Path(run_dir)) for _, run_dir, _ in members]
            return train_group(configs, [run_dir for _, run_dir, _ in members], resume=True, progress=progress)
        outcomes: list[GroupMember] = []
        for (config, run_dir, overrides), was_started in zip(members, started):
            run_config = prepare_resume(Path(run_dir)) if was_started else load_run_config(config, list(overrides))
            try:
                outcomes.append(train(run_config, run_dir, resume=was_started, progress=progress))
            except TrainingDiverged as error:
                outcomes.append(error)
        return outcomes


def main(argv: Sequence[str] | None = None) -> int:
    """Exits as ``windtunnel train`` does (``windtunnel.cli.run_command``): 0, 2 for bad input,
    3 when a member diverged (after the others finished), 130 after a Ctrl-C (every member's
    state saved)."""
    args = list(sys.argv[1:] if argv is None else argv)

    def work() -> None:
        members = [(Path(m["config"]), Path(m["run_dir"]), tuple(m["overrides"])) for m in json.loads(args[0])]
        outcomes = train_members(members)
        for (_, run_dir, _), outcome in zip(members, outcomes):
            if isinstance(outcome, TrainResult):
                print(json.dumps({"run_dir": str(run_dir), "steps": outcome.steps, **(outcome.final_eval or {})}))
        diverged = [f"{run_dir}: {outcome}" for (_, run_dir, _), outcome in zip(members, outcomes) if isinstance(outcome, TrainingDiverged)]
        if diverged:
            raise TrainingDiverged("; ".join(diverged))

    return run_command(work)


if __name__ == "__main__":
    raise SystemExit(main())
