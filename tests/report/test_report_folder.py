"""Reading a reproduction folder for the report: what a manifest may leave out, and the one
line that names the file and the key when it is damaged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from windtunnel.report.folder import Manifest, ReportError, read_json
from windtunnel.run_layout import MANIFEST_FILE


def _manifest(**changes) -> dict:
    data = {"scale": "tiny", "stage": "done", "wall_s": 12.5, "command": "windtunnel reproduce --scale tiny --out x",
            "hardware": "a laptop", "cuts": ["fewer steps"],
            "runs": [{"name": "hmm_transformer_seed0", "run_dir": "runs/hmm_transformer_seed0", "preset": "hmm_transformer", "seed": 0}]}
    data.update(changes)
    return {k: v for k, v in data.items() if v is not None}


def _write(folder, data) -> None:
    folder.mkdir(exist_ok=True)
    (folder / MANIFEST_FILE).write_text(json.dumps(data))


def test_a_manifest_without_a_study_or_a_plan_is_the_claims_study_with_nothing_waiting(tmp_path):
    _write(tmp_path, _manifest())
    manifest = Manifest.read(tmp_path)
    assert (manifest.study, manifest.planned, manifest.scale, manifest.wall_s) == ("claims", (), "tiny", 12.5)
    assert [(r.name, r.run_dir, r.preset, r.seed) for r in manifest.runs] == [
        ("hmm_transformer_seed0", "runs/hmm_transformer_seed0", "hmm_transformer", 0)]


@pytest.mark.parametrize("runs", [[{"name": "a", "run_dir": 3, "preset": "p", "seed": 0}], [{"name": "a", "preset": "p", "seed": 0}]])
def test_a_run_without_a_valid_folder_names_the_manifest_and_the_key(tmp_path, runs):
    _write(tmp_path, _manifest(runs=runs))
    path = tmp_path / MANIFEST_FILE
    with pytest.raises(ReportError) as error:
        Manifest.read(tmp_path)
    assert str(error.value) == f"{str(path)!r} has no valid 'run_dir' (damaged, or written by an older windtunnel)"


def test_a_file_that_is_not_json_names_itself(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    with pytest.raises(ReportError) as error:
        read_json(path)
    assert str(error.value).startswith(f"{str(path)!r} is not valid JSON: ")


def test_a_run_without_its_config_says_it_never_started():
    from windtunnel.report.folder import SavedConfig

    with pytest.raises(ReportError) as error:
        SavedConfig.read(Path("/nowhere/runs/a"))
    assert str(error.value) == ("run directory '/nowhere/runs/a' has no config.json: the run never started "
                                "(finish the reproduction with `windtunnel reproduce --resume`)")


@pytest.mark.parametrize("section, key, damage", [
    (None, "model", None),  # a section missing
    ("tunnel", "name", 3),  # a value of the wrong type
    ("model", "kind", None),
    ("train", "steps", "300"),
    ("train", "batch_size", True),  # JSON's true is no number here
])
def test_a_damaged_run_config_names_the_file_and_the_key(tmp_path, section, key, damage):
    from windtunnel.report.folder import SavedConfig

    config = {"tunnel": {"name": "hmm"}, "model": {"kind": "transformer"}, "train": {"steps": 300, "batch_size": 32}, "eval": {}}
    target = config if section is None else config[section]
    if damage is None:
        del target[key]
    else:
        target[key] = damage
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ReportError) as error:
        SavedConfig.read(tmp_path)
    assert str(error.value) == f"{str(tmp_path / 'config.json')!r} has no valid {key!r} (damaged, or written by an older windtunnel)"
