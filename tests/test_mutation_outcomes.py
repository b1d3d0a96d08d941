"""tools/mutation_outcomes.py: mutmut's outcomes saved and put back by function hash, read back
by mutmut's own loader."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("mutation_outcomes", Path(__file__).parent.parent / "tools" / "mutation_outcomes.py")
mutation_outcomes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mutation_outcomes)


def _meta(folder: Path, path: str, hashes: dict[str, str], codes: dict[str, int | None]) -> Path:
    meta = folder / (path + ".meta")
    meta.parent.mkdir(parents=True, exist_ok=True)
    meta.write_text(json.dumps({"exit_code_by_key": codes, "hash_by_function_name": hashes, "type_check_error_by_key": {},
                                "durations_by_key": {}, "estimated_durations_by_key": {}}))
    return meta


def _codes(meta: Path) -> dict[str, int | None]:
    return json.loads(meta.read_text())["exit_code_by_key"]


def test_outcomes_go_back_where_they_came_from_and_mutmut_reads_them(tmp_path, monkeypatch):
    ran = tmp_path / "ran" / "mutants"
    _meta(ran, "src/pkg/mod.py", {"x_f": "aa", "xǁCǁm": "bb"},
          {"pkg.mod.x_f__mutmut_1": 1, "pkg.mod.x_f__mutmut_2": 0, "pkg.mod.x_f__mutmut_3": None, "pkg.mod.xǁCǁm__mutmut_1": -9})
    _meta(ran, "src/pkg/__init__.py", {"x_g": "cc"}, {"pkg.x_g__mutmut_1": 33})  # a package's mutants carry no __init__
    saved = tmp_path / "outcomes.json"
    assert mutation_outcomes.save(ran, saved) == 4  # the outcome not run is not one
    assert json.loads(saved.read_text())["runs"][0]["outcomes"] == 4

    fresh = tmp_path / "fresh" / "mutants"
    assert mutation_outcomes.restore(saved, fresh) == 4
    assert _codes(fresh / "src/pkg/mod.py.meta") == {
        "pkg.mod.x_f__mutmut_1": 1, "pkg.mod.x_f__mutmut_2": 0, "pkg.mod.xǁCǁm__mutmut_1": -9}
    assert _codes(fresh / "src/pkg/__init__.py.meta") == {"pkg.x_g__mutmut_1": 33}

    mutmut_data = pytest.importorskip("mutmut.mutation.data")
    monkeypatch.chdir(fresh.parent)  # mutmut finds mutants/ in the working directory
    loaded = mutmut_data.SourceFileMutationData(path=Path("src/pkg/mod.py"))
    loaded.load()
    assert loaded.exit_code_by_key["pkg.mod.x_f__mutmut_2"] == 0 and loaded.hash_by_function_name == {"x_f": "aa", "xǁCǁm": "bb"}


def test_restore_fills_only_what_is_not_run_of_functions_with_the_same_hash(tmp_path):
    saved = tmp_path / "outcomes.json"
    ran = tmp_path / "ran"
    _meta(ran, "src/pkg/mod.py", {"x_f": "aa", "x_h": "old"},
          {"pkg.mod.x_f__mutmut_1": 1, "pkg.mod.x_f__mutmut_2": 1, "pkg.mod.x_h__mutmut_1": 1})
    mutation_outcomes.save(ran, saved)
    here = tmp_path / "here"
    meta = _meta(here, "src/pkg/mod.py", {"x_f": "aa", "x_h": "new"},
                 {"pkg.mod.x_f__mutmut_1": 0, "pkg.mod.x_f__mutmut_2": None, "pkg.mod.x_h__mutmut_1": None})
    assert mutation_outcomes.restore(saved, here) == 1
    # Run here: kept. Not run, same hash: carried. Changed since (x_h): left to run again.
    assert _codes(meta) == {"pkg.mod.x_f__mutmut_1": 0, "pkg.mod.x_f__mutmut_2": 1, "pkg.mod.x_h__mutmut_1": None}
    assert mutation_outcomes.restore(tmp_path / "none.json", here) == 0


def test_save_merges_a_later_run_into_the_saved_outcomes(tmp_path):
    saved = tmp_path / "outcomes.json"
    first = tmp_path / "first"
    _meta(first, "src/pkg/a.py", {"x_f": "aa", "x_h": "h1"}, {"pkg.a.x_f__mutmut_1": 0, "pkg.a.x_h__mutmut_1": 1, "pkg.a.x_h__mutmut_2": 1})
    _meta(first, "src/pkg/b.py", {"x_k": "kk"}, {"pkg.b.x_k__mutmut_1": 1})
    assert mutation_outcomes.save(first, saved) == 4
    second = tmp_path / "second"  # a.py alone: x_f's survivor killed by a new test, x_h rewritten (one mutant, not run)
    _meta(second, "src/pkg/a.py", {"x_f": "aa", "x_h": "h2"}, {"pkg.a.x_f__mutmut_1": 1, "pkg.a.x_h__mutmut_1": None})
    assert mutation_outcomes.save(second, saved) == 1
    files = json.loads(saved.read_text())["files"]
    assert files["src/pkg/a.py"] == {"x_f": {"hash": "aa", "codes": {"1": 1}}, "x_h": {"hash": "h2", "codes": {"1": None}}}
    assert files["src/pkg/b.py"] == {"x_k": {"hash": "kk", "codes": {"1": 1}}}  # not in the second folder: kept
    assert [run["outcomes"] for run in json.loads(saved.read_text())["runs"]] == [4, 1]
    assert not saved.with_name(saved.name + ".partial").exists()


def test_save_without_a_mutmut_folder_is_refused(tmp_path, capsys):
    assert mutation_outcomes.main(["save", "--mutants", str(tmp_path / "nothing"), "--file", str(tmp_path / "o.json")]) == 2
    assert "no mutmut folder" in capsys.readouterr().err and not (tmp_path / "o.json").exists()
