"""The runs a GPU window trains next: the owed runs of the run group of the first owed run.

    python bench/owed_group.py RESULTS TRAIN_S [--bench STEP_GROUPS_JSON] RUN [RUN ...]

RUN ... is the priority list (bench/gpu_slice.sh's PRIORITY). A run is owed when ``RESULTS``
(the paper-scale folder) does not hold it. The group is the one ``windtunnel.jobs.group_jobs``
forms at the paper scale (a preset's seeds with its twins). Where ``--bench`` gives the group
step's steps/s on this GPU for the group's preset (``bench/step.py --groups``: the measured size
nearest at or above the group's, else the largest, its throughput in runs x steps/s shared by
the group's runs), a group projected not to finish its steps within ``TRAIN_S`` seconds is
passed over (no state travels between windows: a run cut short stays short), and the next
owed group is taken. Prints the runs, space-separated (nothing when no group can finish), and
why each passed-over group was passed over on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from windtunnel.jobs import GroupJob, TrainJob, group_jobs
from windtunnel.reproduce import plan_runs
from windtunnel.studies import SCALES


def projected_s(bench: dict, preset: str, runs: int, steps: int) -> float | None:
    """Seconds a group of ``runs`` runs of ``preset`` takes for ``steps`` steps on the bench's GPU
    (None where the bench did not measure that preset's groups)."""
    entry = bench.get("devices", {}).get("cuda", {}).get(preset, {})
    sizes = sorted(int(key.split("_")[1]) for key in entry if key.startswith("group_"))
    if not sizes:
        return None
    size = next((s for s in sizes if s >= runs), sizes[-1])
    runs_steps_per_s = entry[f"group_{size}"]["runs_steps_per_s"]
    rate = entry[f"group_{size}"]["steps_per_s"] if size >= runs else runs_steps_per_s / runs
    return steps / rate


def owed_runs(results: Path, priority: list[str], train_s: float, bench: dict | None) -> list[str]:
    """The runs to train next (see the module docstring)."""
    jobs = group_jobs(plan_runs(SCALES["paper"], results), lambda config: True)
    members: dict[str, list[TrainJob]] = {}
    for job in jobs:
        group = list(job.members) if isinstance(job, GroupJob) else [job]
        for member in group:
            members[member.name] = group
    owed = {name for name in members if not (results / "runs" / name / "config.json").is_file()}
    tried: set[str] = set()
    for name in (name for name in priority if name in owed):
        group = [m for m in members[name] if m.name in owed]
        if group[0].name in tried:
            continue
        tried.add(group[0].name)
        config = group[0].resolved()
        seconds = projected_s(bench or {}, group[0].preset, len(group), config.train.steps)
        if seconds is not None and seconds > train_s:
            print(f"passed over {' '.join(m.name for m in group)}: projected {seconds:.0f} s for {config.train.steps} steps "
                  f"> {train_s:.0f} s", file=sys.stderr)
            continue
        return [m.name for m in group]
    return []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("train_s", type=float)
    parser.add_argument("priority", nargs="+")
    parser.add_argument("--bench", type=Path, help="bench/step.py --groups JSON measured on this GPU")
    args = parser.parse_args()
    bench = json.loads(args.bench.read_text()) if args.bench and args.bench.is_file() else None
    print(" ".join(owed_runs(args.results, args.priority, args.train_s, bench)))


if __name__ == "__main__":
    main()
