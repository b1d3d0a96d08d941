"""`bench/compare_analyses.py`: two folders of analysis JSON agree where they should, and
the comparison names what differs where they do not (the GPU check's analyses against the CPU's)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

COMPARE = Path(__file__).resolve().parents[1] / "bench" / "compare_analyses.py"
RESULT = {
    "analysis": "value_manifold",
    "run_dirs": ["/gpu/run"],
    "layers": [{"pc1": 0.8125, "spearman": -0.9731, "p_value": 1e-12}, {"pc1": 0.5, "spearman": None, "p_value": 0.03}],
    "holds": True,
    "markdown": "| a |",
}


def _compare(tmp_path: Path, a: dict, b: dict) -> tuple[int, dict]:
    for folder, result in (("a", a), ("b", b)):
        (tmp_path / folder).mkdir(exist_ok=True)
        (tmp_path / folder / "value_manifold.json").write_text(json.dumps(result))
    done = subprocess.run([sys.executable, str(COMPARE), str(tmp_path / "a"), str(tmp_path / "b")], capture_output=True, text=True)
    return done.returncode, json.loads(done.stdout)["analyses"]["value_manifold"] if done.stdout else {}


def test_the_same_numbers_on_another_device_agree(tmp_path):
    other = copy.deepcopy(RESULT)
    other["run_dirs"] = ["/cpu/run"]  # strings are not compared
    other["markdown"] = "| b |"
    other["layers"][0]["pc1"] *= 1 + 2e-4  # within rtol 1e-3
    other["layers"][1]["p_value"] += 5e-5  # within atol 1e-4
    rc, report = _compare(tmp_path, RESULT, other)
    assert rc == 0 and report["agree"] and report["numbers"] == 6  # 5 numbers and the list's length (None and booleans are compared as equal or not)
    assert report["largest_at"] == "layers[0].pc1"


@pytest.mark.parametrize(
    "change, where",
    [
        (lambda r: r["layers"][0].__setitem__("spearman", -0.96), "layers[0].spearman"),
        (lambda r: r["layers"][1].__setitem__("spearman", 0.1), "layers[1].spearman"),  # None against a number
        (lambda r: r.__setitem__("holds", False), "holds"),
        (lambda r: r["layers"].pop(), "layers.length"),
    ],
)
def test_a_difference_is_caught_and_named(tmp_path, change, where):
    other = copy.deepcopy(RESULT)
    change(other)
    rc, report = _compare(tmp_path, RESULT, other)
    assert rc == 1 and not report["agree"]
    assert where in report["outside_tolerance"] + report["structure_differs"]


def test_a_missing_folder_is_one_line_and_exit_2(tmp_path):
    done = subprocess.run([sys.executable, str(COMPARE), str(tmp_path / "nope"), str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and "not a folder" in done.stderr
