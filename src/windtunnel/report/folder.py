"""A reproduction's folder as saved on disk: its manifest, its runs' configs, its analyses.

``windtunnel reproduce`` writes ``DIR/reproduce.json`` (:class:`Manifest`: the study, the
scale, its cuts, the runs) at every stage and resumes from it; each run directory holds its
``config.json``; the analyses are ``DIR/analysis/<group>/<name>.json``. The report reads
everything through this module, so it is built from the folder alone: nothing here imports
the reproduction's plan, the tunnels or the models. Every reader raises :class:`ReportError`
with one line naming the file and what is wrong.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from windtunnel.results import RESULT_TYPES, AnalysisResult, ResultError
from windtunnel.run_layout import ANALYSIS_DIR, CONFIG_FILE, MANIFEST_FILE

__all__ = [
    "Manifest",
    "ManifestRun",
    "ReportError",
    "RunRecord",
    "SavedConfig",
    "SavedRun",
    "SavedTraining",
    "load_results",
    "read_json",
]


#: The studies a report can be built for (``studies.STUDIES``; the report imports no plan).
STUDY_NAMES = ("claims", "architectures", "future_work", "model_selection", "phases")
#: The stages of a reproduction whose analyses are all written: its report can be built.
REPORTABLE_STAGES = ("report", "done")


class ReportError(ValueError):
    """A folder is not a finished reproduction, or a file it saved is unreadable; the message
    is one line naming the folder or file and what is wrong."""


def read_json(path: Path) -> Any:
    """The JSON value in ``path``; a file that cannot be read or parsed is a :class:`ReportError`."""
    try:
        return json.loads(Path(path).read_text())
    except OSError as error:
        raise ReportError(f"{str(path)!r} cannot be read: {error.strerror or error}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ReportError(f"{str(path)!r} is not valid JSON: {error}") from None


def _field(data: Any, key: str, kind: type | tuple[type, ...], where: Path) -> Any:
    """``data[key]`` if ``data`` is an object holding a value of type ``kind`` there (no field
    read is a bool, and JSON's true is no number here); otherwise a :class:`ReportError`
    naming the file and the key."""
    value = data.get(key) if isinstance(data, dict) else None
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ReportError(f"{str(where)!r} has no valid {key!r} (damaged, or written by an older windtunnel)")
    return value


@dataclass(frozen=True)
class ManifestRun:
    """One training run of a reproduction, as its manifest lists it.

    Attributes:
        name: the run's name, ``<preset>_seed<seed>``.
        run_dir: its run directory, relative to the reproduction's folder (POSIX separators).
        preset: the preset it trains (``studies.PRESETS``).
        seed: its ``train.seed``.
    """

    name: str
    run_dir: str
    preset: str
    seed: int


@dataclass(frozen=True)
class Manifest:
    """What a reproduction's folder says about itself (``reproduce.json``): everything the
    report needs besides the runs' and the analyses' own files.

    Attributes:
        scale: the scale's name (``tiny``, ``cpu``, ``paper``).
        stage: the stage reached: ``train``, ``analyze``, ``report`` or ``done``.
        wall_s: wall seconds spent on it, summed over its sessions (a resume adds its own).
        command: the command that made it.
        hardware: what the scale expects.
        cuts: what the scale cuts relative to the paper's protocol, one paragraph each.
        runs: its training runs, in plan order.
        study: what it reproduces (``studies.STUDIES``): ``claims``, the paper's claims, or
            ``architectures``, the primitives table (a manifest without one is of the claims).
        planned: every run of the scale's plan by name, in plan order; ``runs`` are those in
            the folder. A folder that slices fill (``reproduce --only-runs``) lists the rest
            here, and the report says they are not yet run (empty: every planned run is there).
        meaning: what the scale's verdicts mean, said beside the claim table (empty in a
            manifest written without one).
    """

    scale: str
    stage: str
    wall_s: float
    command: str
    hardware: str
    cuts: tuple[str, ...]
    runs: tuple[ManifestRun, ...]
    study: str = "claims"
    planned: tuple[str, ...] = ()
    meaning: str = ""

    @property
    def not_yet_run(self) -> tuple[str, ...]:
        """The planned runs not in the folder, in plan order."""
        present = {run.name for run in self.runs}
        return tuple(name for name in self.planned if name not in present)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1)

    @classmethod
    def read(cls, out: Path) -> Manifest:
        """The manifest of the reproduction in folder ``out``.

        Raises:
            ReportError: ``out`` is not a folder, has no manifest, or its manifest is unreadable
                or incomplete.
        """
        out = Path(out)
        if not out.is_dir():
            what = "it is a file" if out.exists() else "it does not exist"
            raise ReportError(f"{str(out)!r} is not a reproduction folder: {what}")
        path = out / MANIFEST_FILE
        if not path.is_file():
            raise ReportError(
                f"{str(out)!r} is not a reproduction folder: it has no {MANIFEST_FILE} "
                "(give the folder `windtunnel reproduce --out` wrote)"
            )
        data = read_json(path)
        cuts = _field(data, "cuts", list, path)
        runs = _field(data, "runs", list, path)
        if not all(isinstance(cut, str) for cut in cuts):
            raise ReportError(f"{str(path)!r} has no valid 'cuts' (damaged, or written by an older windtunnel)")
        study = data.get("study", "claims") if isinstance(data, dict) else None
        planned = data.get("planned", []) if isinstance(data, dict) else None
        if not isinstance(planned, list) or not all(isinstance(name, str) for name in planned):
            raise ReportError(f"{str(path)!r} has no valid 'planned' (damaged, or written by a newer windtunnel)")
        if study not in STUDY_NAMES:
            raise ReportError(f"{str(path)!r} has no valid 'study' (one of {', '.join(STUDY_NAMES)}; damaged, or written by a newer windtunnel)")
        meaning = data.get("meaning", "")
        if not isinstance(meaning, str):
            raise ReportError(f"{str(path)!r} has no valid 'meaning' (a text; damaged, or written by a newer windtunnel)")
        return cls(
            study=study,
            planned=tuple(planned),
            meaning=meaning,
            scale=_field(data, "scale", str, path),
            stage=_field(data, "stage", str, path),
            wall_s=float(_field(data, "wall_s", (int, float), path)),
            command=_field(data, "command", str, path),
            hardware=_field(data, "hardware", str, path),
            cuts=tuple(cuts),
            runs=tuple(
                ManifestRun(
                    _field(run, "name", str, path), _field(run, "run_dir", str, path),
                    _field(run, "preset", str, path), _field(run, "seed", int, path),
                )
                for run in runs
            ),
        )


@dataclass(frozen=True)
class SavedTraining:
    """What the report reads of a run's ``train`` section: its steps and batch size."""

    steps: int
    batch_size: int


@dataclass(frozen=True)
class SavedConfig:
    """What the report reads of a run's resolved config, as its ``config.json`` saved it: the
    model family and the training length (read where a ``RunConfig`` has them, without
    building one: that would need the tunnels and the models)."""

    model_kind: str
    train: SavedTraining

    @classmethod
    def read(cls, run_dir: Path) -> SavedConfig:
        """The config saved in ``run_dir``; a :class:`ReportError` if it is missing or not a run config."""
        path = Path(run_dir) / CONFIG_FILE
        if not path.is_file():
            raise ReportError(f"run directory {str(run_dir)!r} has no {CONFIG_FILE}: the run never started "
                              "(finish the reproduction with `windtunnel reproduce --resume`)")
        data = read_json(path)
        sections = {name: _field(data, name, dict, path) for name in ("tunnel", "model", "train", "eval")}
        _field(sections["tunnel"], "name", str, path)
        train = sections["train"]
        return cls(
            _field(sections["model"], "kind", str, path),
            SavedTraining(_field(train, "steps", int, path), _field(train, "batch_size", int, path)),
        )


class RunRecord(Protocol):
    """What the runs table reads of a run: its name, the preset it seeds, its directory (for
    ``metrics.jsonl``) and its resolved config. A :class:`SavedRun` is one; so is a planned run
    (``jobs.TrainJob``)."""

    @property
    def name(self) -> str: ...

    @property
    def preset(self) -> str: ...

    @property
    def run_dir(self) -> Path: ...

    def resolved(self) -> Any: ...


@dataclass(frozen=True)
class SavedRun:
    """A training run of a reproduction as the report reads it from disk.

    Attributes:
        name: the run's name (``<preset>_seed<seed>``).
        run_dir: its run directory.
        config: its resolved config, as saved there.
        preset: the preset it seeds.
    """

    name: str
    run_dir: Path
    config: SavedConfig
    preset: str = ""

    @classmethod
    def read(cls, out: Path, run: ManifestRun) -> SavedRun:
        """The run the manifest of the reproduction in ``out`` lists as ``run``."""
        run_dir = Path(out) / run.run_dir
        return cls(run.name, run_dir, SavedConfig.read(run_dir), run.preset)

    def resolved(self) -> SavedConfig:
        """Its resolved config (what a planned run's ``resolved()`` gives, read back from disk)."""
        return self.config


def load_results(out: Path, folder: str = ANALYSIS_DIR) -> dict[str, dict[str, AnalysisResult]]:
    """``{group: {analysis: typed result}}`` from ``out/<folder>/*/*.json``; a file that does
    not fit its analysis's result type is a :class:`ReportError` naming it and the bad value."""
    results: dict[str, dict[str, AnalysisResult]] = {}
    for path in sorted((Path(out) / folder).glob("*/*.json")):
        result_type = RESULT_TYPES.get(path.stem)
        if result_type is None:
            raise ReportError(f"{str(path)!r} is no analysis this windtunnel knows (one of: {', '.join(RESULT_TYPES)})")
        try:
            results.setdefault(path.parent.name, {})[path.stem] = result_type.from_json(read_json(path))
        except ResultError as error:
            raise ReportError(f"{str(path)!r} does not hold a {path.stem} result: {error}") from None
    return results
