"""``windtunnel reproduce``: every run a study needs, every analysis, and the report.

What is reproduced (the studies, their presets, scales and analysis groups) is data in
:mod:`windtunnel.studies`; this module plans the runs of one study at one scale, times a
warm-up of each preset where the scale asks for it, trains the runs (on this machine, or on
Ray), analyzes them and builds the report, in three resumable stages.

Layout of ``--out DIR``::

    DIR/reproduce.json          the manifest: the scale (its cuts, what it expects), the stage
                                reached, the wall time spent so far and the runs; the report
                                reads it (``report.build.Manifest``)
    DIR/runs/<preset>_seed<s>/  one training run each (``windtunnel train``)
    DIR/runs/logs/              each run's output
    DIR/analysis/<group>/       ``<name>.json``, ``.png`` (and ``.md``) per analysis
    DIR/analysis_at_init/<group>/   the same analyses of every run's initial weights (step 0)
    DIR/report/index.html       the report (self-contained), and report.md beside it

Everything already complete in DIR is reused, so ``--resume`` after an interruption
continues where it stopped: finished runs are kept, interrupted runs resume from their
checkpoints, finished analyses are not recomputed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from windtunnel.config import ConfigError
from windtunnel.files import atomic_write_text, has_content, portable_path
from windtunnel.jobs import Engine, GroupJob, TrainJob, group_jobs, job_state, threads_per_run
from windtunnel.progress import AnalysesProgress
from windtunnel.run_files import check_run_files
from windtunnel.run_layout import ANALYSIS_DIR, CONFIG_FILE, INIT_DIR, MANIFEST_FILE, RUNS_DIR
from windtunnel.runs import keep_final_weights
from windtunnel.training.group import groups_by_default
from windtunnel.ray_engine import check_engine, open_engine
from windtunnel.report.build import build_report
from windtunnel.report.folder import (
    Manifest,
    ManifestRun,
    ReportError,
)
from windtunnel.studies import (
    GROUPS,
    HISTORY_ANALYSES,
    PRESETS,
    SCALES,
    STUDIES,
    AnalysisGroup,
    Preset,
    Scale,
    Study,
    configs_folder,
)

__all__ = ["measure_steps_per_s", "plan_analyses", "plan_runs", "project_from_warmup", "reproduce"]



def plan_runs(scale: Scale, out: Path, presets: Sequence[Preset] = PRESETS) -> list[TrainJob]:
    """The training runs of ``presets`` (default: the paper's claims) at ``scale`` in
    ``out/runs``, longest first (for packing)."""
    jobs = []
    for preset in presets:
        for seed in range(scale.seeds.get(preset.name, 1)):
            expected = scale.expected_s.get(preset.name) or scale.expected_s.get(preset.name.split("_")[0])
            jobs.append(
                TrainJob(
                    f"{preset.name}_seed{seed}",
                    configs_folder(scale) / f"{preset.config}.toml",
                    out / RUNS_DIR / f"{preset.name}_seed{seed}",
                    (*preset.overrides, *scale.overrides_for(preset.name), f"train.seed={seed}"),
                    expected_s=expected,
                    preset=preset.name,
                )
            )
    return sorted(jobs, key=lambda job: -(job.expected_s or 0.0))


def measure_steps_per_s(job: TrainJob, steps: int, threads: int) -> tuple[float, str]:
    """Steps/s of ``job``'s training step on the device it will train on: ``steps`` steps of
    the trainer itself in a scratch folder on ``threads`` CPU threads (as the run will get),
    the median of the per-step intervals after the first (compilation and warm-up); and the
    device's name."""
    import tempfile

    import torch

    from windtunnel.run_config import load_run_config
    from windtunnel.training.distributed import pick_device
    from windtunnel.training.trainer import train

    if steps < 3:
        raise ValueError(f"a warm-up needs at least 3 steps (one is left out), got {steps}")
    scratch = ("train.log_every=1", "train.eval_every=0", "train.checkpoint_every=0", "train.snapshots_per_decade=0", "eval.n=16")
    config = load_run_config(job.config, (*job.overrides, f"train.steps={steps}", *scratch))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with tempfile.TemporaryDirectory() as folder:
            train(config, Path(folder) / "run", progress=False)
            records = [json.loads(line) for line in (Path(folder) / "run" / "metrics.jsonl").read_text().splitlines()]
    finally:
        torch.set_num_threads(before)
    intervals = [r["seq_per_s"] / config.train.batch_size for r in records if "seq_per_s" in r][1:]
    return statistics.median(intervals), pick_device(config.train.device).type


def project_from_warmup(
    jobs: Sequence[TrainJob],
    steps: int,
    threads: int,
    say: Callable[[str], None],
    measure: Callable[[TrainJob, int, int], tuple[float, str]] | None = None,
) -> list[TrainJob]:
    """``jobs`` with each ``expected_s`` replaced by its steps over the steps/s measured on a
    warm-up of ``steps`` steps (one per preset: its seeds share a shape), said per preset,
    longest first again. Jobs already done keep theirs. ``measure`` times the warm-up
    (default :func:`measure_steps_per_s`, here)."""
    measure = measure or measure_steps_per_s
    measured: dict[str, float] = {}  # steps/s per preset
    projected = []
    for job in jobs:
        if job_state(job) == "done":
            projected.append(job)
            continue
        if job.preset not in measured:
            measured[job.preset], device = measure(job, steps, threads)
            total = job.resolved().train.steps
            say(
                f"[reproduce] measured {job.preset}: {measured[job.preset]:.2f} steps/s on {device} "
                f"({threads} CPU thread{'s' if threads > 1 else ''}); projected {total / measured[job.preset] / 3600:.2f} h "
                f"for its {total:,} steps"
            )
        projected.append(dataclasses.replace(job, expected_s=job.resolved().train.steps / measured[job.preset]))
    return sorted(projected, key=lambda job: -(job.expected_s or 0.0))


@contextmanager
def _training_engine(engine: str, address: str | None, jobs: Sequence[TrainJob]) -> Iterator[Engine]:
    """The engine named for the block (Ray connected before anything is written: a cluster it
    cannot reach changes nothing); this machine's when every run is done already."""
    check_engine(engine, address)
    left = any(job_state(job) != "done" for job in jobs)
    with open_engine(engine if left else "local", address if left else None) as opened:
        yield opened


def plan_analyses(
    jobs: Sequence[TrainJob], groups: Sequence[AnalysisGroup] | None = None
) -> list[tuple[AnalysisGroup, list[Path]]]:
    """Each analysis group (default: the paper's claims, :data:`GROUPS`) with the run
    directories it reads; groups none of whose presets the scale trains (see its cuts) are
    left out."""
    by_preset: dict[str, list[Path]] = {}
    for job in jobs:
        by_preset.setdefault(job.preset, []).append(job.run_dir)
    for dirs in by_preset.values():
        dirs.sort()
    planned = [(group, [d for preset in group.presets for d in by_preset.get(preset, [])]) for group in groups or GROUPS]
    return [(group, run_dirs) for group, run_dirs in planned if run_dirs]


def _slice(planned: Sequence[TrainJob], only_runs: Sequence[str], time_limit_s: float) -> list[TrainJob]:
    """The runs of ``planned`` that ``only_runs`` names (all when empty), each with the time
    limit, if any, among its overrides."""
    names = [job.name for job in planned]
    unknown = [name for name in only_runs if name not in names]
    if unknown:
        raise ConfigError(f"--only-runs {unknown[0]!r} is not a run of this plan; choose from: {', '.join(names)}")
    if time_limit_s < 0:
        raise ConfigError(f"--time-limit {time_limit_s:g} is out of range: need seconds >= 0")
    chosen = [job for job in planned if not only_runs or job.name in only_runs]
    if time_limit_s:
        chosen = [dataclasses.replace(job, overrides=(*job.overrides, f"train.time_limit_s={time_limit_s}")) for job in chosen]
    return chosen


def _drop_stale(folder: Path, runs: Sequence[Any], only: Sequence[str]) -> None:
    """Remove the results in ``folder`` of analyses in ``only`` that were computed over other
    runs than ``runs`` (an earlier slice's), so that those that apply are computed again over
    these (and those that no longer apply, a single model's curves once its group compares
    two, are gone). A training-history analysis is kept as it was: it reads snapshots, which
    the runs of a results folder no longer have, and its result says which runs it covers."""
    from windtunnel.analysis import ANALYSES

    names = sorted(run.directory.name for run in runs)
    for name in only or ANALYSES:
        path = folder / f"{name}.json"
        if not path.is_file() or name in HISTORY_ANALYSES:
            continue
        covered = sorted(Path(d).name for d in json.loads(path.read_text()).get("run_dirs", []))
        if covered != names:
            for stale in folder.glob(f"{name}.*"):
                stale.unlink()


def _manifest_run(job: TrainJob, out: Path) -> ManifestRun:
    """The manifest's entry of ``job``, a run of the plan in ``out`` (its config is resolved,
    and so checked, on the way)."""
    seed = job.resolved().train.seed
    return ManifestRun(job.name, job.run_dir.relative_to(out).as_posix(), job.preset, seed)


def _read_state(out: Path) -> dict[str, Any]:
    try:
        return json.loads((out / MANIFEST_FILE).read_text())
    except FileNotFoundError:
        return {}
    except (OSError, json.JSONDecodeError) as error:
        raise ConfigError(f"{str(out / MANIFEST_FILE)!r} is unreadable ({error}); it is not a reproduction directory") from None


def reproduce(
    scale_name: str = "cpu",
    out: Path | str = "reproduction",
    *,
    only: str = "claims",
    resume: bool = False,
    parallel: int | None = None,
    nproc_per_run: int = 1,
    report: Callable[[str], None] | None = None,
    engine: str = "local",
    address: str | None = None,
    only_runs: Sequence[str] = (),
    time_limit_s: float = 0.0,
    overrides: Sequence[str] = (),
    group: bool | None = None,
) -> Path:
    """Train, analyze and report at ``scale_name`` into ``out``; returns the report's index.html.

    ``only`` names the study (:data:`STUDIES`): ``claims`` (the paper's claims, the default)
    or ``architectures`` (the primitives table of the paper's later versions).
    A directory that already holds a reproduction needs ``resume=True`` (and the same scale and study).
    ``parallel`` runs train side by side (default: the scale's); ``nproc_per_run > 1``
    trains each run with DDP over that many processes (``torch.distributed.run``; one per GPU).
    ``engine="ray"`` trains each run as a Ray task (:mod:`windtunnel.ray_engine`), on a local
    Ray instance or on the cluster at ``address``, and times the warm-up there too.

    ``only_runs`` names a slice of the plan (``bijection_transformer_seed0``): only those runs
    are trained; the runs an earlier slice left in ``out`` stay, and every analysis group is
    computed over the group's runs present (a result computed over other runs is recomputed).
    ``time_limit_s`` gives each run trained now a wall-clock budget (``train.time_limit_s``):
    a run that reaches it ends there, and the report says so. At a scale that keeps final
    weights only (``paper``), each run is reduced to its final weights once analyzed.
    ``overrides`` (``--set``) change every run's config (trials: a dry run at a tiny size).
    ``group``: train the runs of the plan that can stack as run groups (:func:`~windtunnel.jobs.group_jobs`;
    None: where that pays, on a GPU), or each alone (False).
    """
    study, scale = _study_and_scale(only, scale_name)
    out = Path(out)
    say = report or (lambda line: print(line, file=sys.stderr, flush=True))
    state = _read_state(out)
    _check_folder(out, state, study, scale, resume)
    planned = [dataclasses.replace(job, overrides=(*job.overrides, *overrides)) for job in plan_runs(scale, out, study.presets)]
    jobs = _slice(planned, only_runs, time_limit_s)
    for job in planned:  # a run trained before is resumed, analyzed and reported: its files must be readable
        check_run_files(job.run_dir)
    present = [job for job in planned if job.name in {j.name for j in jobs} or (job.run_dir / CONFIG_FILE).is_file()]
    groups = plan_analyses(present, study.groups)
    # --out relative to the working folder, else its name: the manifest travels with the results
    where = portable_path(out, Path.cwd())
    command = f"windtunnel reproduce --scale {scale.name}" + (f" --only {study.name}" if study.name != "claims" else "") + f" --out {where}"
    if only_runs:
        command += f" --only-runs {' '.join(only_runs)}"
    command += "".join(f" --set {override}" for override in overrides)
    command += {True: " --group", False: " --no-group", None: ""}[group]
    folder = _Folder(
        out, study, scale, command,
        runs=tuple(_manifest_run(job, out) for job in present),  # every config valid before anything starts
        planned=tuple(job.name for job in planned),
        spent_s=float(state.get("wall_s", 0.0)),
    )
    out.mkdir(parents=True, exist_ok=True)
    lanes = parallel or min(scale.parallel, os.cpu_count() or 1)
    with _training_engine(engine, address, jobs) as training_engine:
        _train(folder, jobs, len(groups), training_engine, lanes, nproc_per_run, time_limit_s, report, say, group)
    _analyze(folder, groups, say)
    if scale.keep_final_weights_only:
        for job in present:
            keep_final_weights(job.run_dir)
    return _report(folder, say)


def _study_and_scale(only: str, scale_name: str) -> tuple[Study, Scale]:
    """The study ``only`` names and its scale ``scale_name``, or a ConfigError naming the choices."""
    if only not in STUDIES:
        raise ConfigError(f"unknown --only {only!r}; choose from: {', '.join(STUDIES)}")
    study = STUDIES[only]
    if scale_name not in SCALES:
        raise ConfigError(f"unknown --scale {scale_name!r}; choose from: {', '.join(SCALES)}")
    if scale_name not in study.scales:
        raise ConfigError(
            f"--only {study.name} has no --scale {scale_name} ({study.why_not}); choose from: {', '.join(study.scales)}"
        )
    return study, study.scales[scale_name]


def _check_folder(out: Path, state: dict[str, Any], study: Study, scale: Scale, resume: bool) -> None:
    """Refuse an ``out`` that holds something else: files without ``resume``, or a
    reproduction at another scale or of another study."""
    if out.exists() and has_content(out) and not resume:
        raise ConfigError(f"--out {str(out)!r} is not empty: continue that reproduction with --resume, or choose a new directory")
    if state and state.get("scale") != scale.name:
        raise ConfigError(f"{str(out)!r} holds a reproduction at --scale {state.get('scale')}, not {scale.name}: use another --out")
    if state and state.get("study", "claims") != study.name:
        raise ConfigError(f"{str(out)!r} holds a reproduction of --only {state.get('study', 'claims')}, not {study.name}: use another --out")


@dataclass
class _Folder:
    """The reproduction being made in ``out``: what its manifest says, and the wall clock
    (``spent_s`` by earlier sessions, plus this one's since it was made)."""

    out: Path
    study: Study
    scale: Scale
    command: str
    runs: tuple[ManifestRun, ...]
    planned: tuple[str, ...]
    spent_s: float
    started: float = field(default_factory=time.monotonic)

    def wall_s(self) -> float:
        return round(self.spent_s + time.monotonic() - self.started, 1)

    def save(self, stage: str, wall: float | None = None) -> None:
        """Rewrite the manifest at ``stage``, with the wall time spent (``wall``, else until now)."""
        scale = self.scale
        manifest = Manifest(
            scale.name, stage, self.wall_s() if wall is None else wall, self.command, scale.hardware, scale.cuts, self.runs,
            self.study.name, self.planned, scale.meaning,
        )
        atomic_write_text(self.out / MANIFEST_FILE, manifest.to_json())


def _train(
    folder: _Folder,
    jobs: Sequence[TrainJob],
    n_groups: int,
    engine: Engine,
    lanes: int,
    nproc_per_run: int,
    time_limit_s: float,
    report: Callable[[str], None] | None,
    say: Callable[[str], None],
    group: bool | None = None,
) -> None:
    """Stage 1: the ETA (projected from a warm-up on this device where the scale asks), then
    every run not yet done, ``lanes`` at a time (a run group counts as one)."""
    scale = folder.scale
    folder.save("train")
    if scale.warmup_steps and not time_limit_s:  # the projection from a measurement on this device, before anything trains
        measure = engine.measurer(lanes, nproc_per_run, measure_steps_per_s)
        jobs = project_from_warmup(jobs, scale.warmup_steps, threads_per_run(lanes, nproc_per_run), say, measure)
    if time_limit_s:
        jobs = [dataclasses.replace(job, expected_s=min(job.expected_s or time_limit_s, time_limit_s)) for job in jobs]
    if group is not False:
        jobs = group_jobs(jobs, (lambda config: True) if group else groups_by_default)
    remaining = sum(job.expected_s or 0.0 for job in jobs if job_state(job) != "done")
    say(
        f"[reproduce] scale {scale.name}, {folder.study.name}: {_count_runs(jobs)}, {n_groups} analysis groups; expects {scale.hardware}"
        + (f"; training ETA ~{remaining / lanes / 60:.0f} min" if remaining else "")
    )
    say("[reproduce] stage 1/3: training")
    try:
        # report None: the local engine's own display, a bar on a terminal
        engine.run_jobs(jobs, parallel=lanes, nproc_per_run=nproc_per_run, report=report)
    finally:
        folder.save("train")  # an interrupted reproduction still counts the time it trained


def _count_runs(jobs: Sequence[TrainJob | GroupJob]) -> str:
    """``"9 runs"``, or ``"9 runs (5 in 1 run group)"`` where some train as groups."""
    groups = [job for job in jobs if isinstance(job, GroupJob)]
    runs = sum(len(job.members) if isinstance(job, GroupJob) else 1 for job in jobs)
    if not groups:
        return f"{runs} runs"
    grouped = sum(len(job.members) for job in groups)
    return f"{runs} runs ({grouped} in {len(groups)} run group{'s' if len(groups) > 1 else ''})"


def _analyze(folder: _Folder, groups: Sequence[tuple[AnalysisGroup, list[Path]]], say: Callable[[str], None]) -> None:
    """Stage 2: each group's analyses of the trained weights and of the initial ones (those
    already saved over the same runs are kept)."""
    folder.save("analyze")
    say("[reproduce] stage 2/3: analyses")
    from windtunnel.analysis import (  # heavy imports only once training is done
        ANALYSES,
        load_runs,
    )
    from windtunnel.analysis.runner import analyze_runs

    out = folder.out
    per_configuration = tuple(name for name, analysis in ANALYSES.items() if analysis.scope == "seeds")
    progress = AnalysesProgress(len(groups), say)
    for group, run_dirs in groups:
        t0 = time.monotonic()
        progress.start_group(group.name)
        only = group.only or per_configuration
        trained = load_runs(run_dirs)
        _drop_stale(out / ANALYSIS_DIR / group.name, trained, only)
        written = analyze_runs(trained, out / ANALYSIS_DIR / group.name, only=only, skip_existing=True, applicable=True,
                               starting=lambda name, i, n: progress.starting(name, i, n, "trained weights"))
        at_init = tuple(name for name in only if name not in HISTORY_ANALYSES)
        written_init = {}
        if at_init:  # a group of history analyses alone has nothing to read at initialization (and `only=()` means all)
            initial = load_runs(run_dirs, step=0)
            _drop_stale(out / INIT_DIR / group.name, initial, at_init)
            written_init = analyze_runs(initial, out / INIT_DIR / group.name, only=at_init, skip_existing=True, applicable=True,
                                        starting=lambda name, i, n: progress.starting(name, i, n, "initial weights"))
        progress.end_group()
        say(
            f"[analyze] {group.name}: {', '.join(written) or 'nothing applies'}; at initialization "
            f"{len(written_init)} ({time.monotonic() - t0:.0f} s)"
        )
        folder.save("analyze")


def _report(folder: _Folder, say: Callable[[str], None]) -> Path:
    """Stage 3: the report, built from the folder alone (as `windtunnel report` rebuilds it)."""
    say("[reproduce] stage 3/3: report")
    reported = folder.wall_s()
    folder.save("report", reported)
    try:
        index = build_report(folder.out)
    except ReportError as error:  # a saved file damaged since it was written: one line, as for bad input
        raise ConfigError(str(error)) from None
    # "done" keeps the wall time the report states, so a report rebuilt from the folder states the same.
    folder.save("done", reported)
    say(f"[reproduce] done in {(time.monotonic() - folder.started) / 60:.1f} min this session; report: {index}")
    return index
