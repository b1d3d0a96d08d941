"""The command line, run as a user would: a subprocess, its stdout, stderr and exit status."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

import windtunnel as windtunnel_package
from windtunnel.tunnels import TUNNELS


def windtunnel(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "windtunnel", *args], capture_output=True, text=True, timeout=120)


def test_sample_bijection_json_lines():
    result = windtunnel("sample", "bijection", "--n", "3", "--seed", "1", "--set", "V=6")
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(records) == 3
    for r in records:
        assert set(r) >= {"tokens", "positions", "targets", "posterior", "entropy_bits", "mapping", "inputs", "outputs"}
        assert len(r["posterior"]) == len(r["positions"]) == len(r["targets"]) == len(r["entropy_bits"]) == 5
        assert all(len(p) == 6 for p in r["posterior"])
        # Independent checks from the printed record alone: outputs are pi(inputs), targets are outputs,
        # and H(k) = log2(V - k + 1) without replacement.
        assert r["outputs"] == [r["mapping"][x] for x in r["inputs"]] == r["targets"]
        assert [round(h, 12) for h in r["entropy_bits"]] == [round(math.log2(6 - k), 12) for k in range(5)]


def test_sample_hmm_json_lines_decode_header():
    result = windtunnel("sample", "hmm", "--n", "2", "--set", "K=4", "--set", "S=3", "--set", "M=2")
    assert result.returncode == 0, result.stderr
    for line in result.stdout.splitlines():
        r = json.loads(line)
        assert len(r["T"]) == 3 and len(r["E"][0]) == 2 and len(r["observations"]) == 4
        assert all(abs(sum(row) - 1) < 1e-12 for row in r["T"] + r["E"])
        assert r["positions"] == list(range(15, 19))
        assert [t - 101 - 0 for t in r["tokens"][15:]] == r["observations"]


def test_same_seed_same_output():
    a = windtunnel("sample", "hmm", "--n", "2", "--seed", "5").stdout
    b = windtunnel("sample", "hmm", "--n", "2", "--seed", "5").stdout
    assert a == b and a


def test_table_format():
    result = windtunnel("sample", "bijection", "--n", "1", "--format", "table")
    assert result.returncode == 0 and "mapping pi:" in result.stdout and "H_bits" in result.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["sample", "nope"], f"unknown tunnel 'nope'; choose one of: {', '.join(sorted(TUNNELS))}"),
        (["sample", "hmm", "--set", "X=1"], "unknown key 'X' for HMMTunnel"),
        (["sample", "hmm", "--set", "K=ten"], "K='ten' has the wrong type: expected int"),
        (["sample", "hmm", "--set", "concentration=0"], "concentration=0.0 is out of range"),
        (["sample", "bijection", "--set", "V=1"], "V=1 is out of range"),
        (["sample", "bijection", "--n", "0"], "argument --n: 0 is out of range"),
        (["sample", "bijection", "--n", "abc"], "argument --n: 'abc' is not an integer: need an integer >= 1"),
        (["sample", "hmm", "--set", "concentration=inf"], "concentration=inf is out of range: need a finite number"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message):
    result = windtunnel(*args)
    assert result.returncode == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1  # one line, no traceback, no usage dump
    assert result.stdout == ""


def test_version_names_the_package_and_torch():
    result = windtunnel("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"windtunnel {windtunnel_package.__version__} (torch {torch.__version__})"


def test_sample_streams_in_chunks_that_continue_one_stream():
    """Past 256 sequences `sample` prints chunk by chunk from one generator: the first 256 lines
    are those of --n 256, and the rest are the draws that follow in the same stream."""
    from windtunnel.tunnels import make_tunnel

    long = windtunnel("sample", "bijection", "--n", "300", "--seed", "3", "--set", "V=4")
    short = windtunnel("sample", "bijection", "--n", "256", "--seed", "3", "--set", "V=4")
    assert long.returncode == short.returncode == 0
    lines = long.stdout.splitlines()
    assert len(lines) == 300 and lines[:256] == short.stdout.splitlines()
    tunnel, generator = make_tunnel("bijection", overrides=["V=4"]), torch.Generator().manual_seed(3)
    tunnel.sample(256, generator=generator)
    rest = tunnel.sample(44, generator=generator)
    assert [json.loads(line)["tokens"] for line in lines[256:]] == rest.tokens.tolist()


def _manifest(**changes) -> dict:
    """A reproduction's manifest (reproduce.json) of one finished run, with ``changes``."""
    run = {"name": "hmm_mlp_seed0", "run_dir": "runs/hmm_mlp_seed0", "preset": "hmm_mlp", "seed": 0}
    return {"scale": "tiny", "stage": "done", "wall_s": 60.0, "command": "windtunnel reproduce --scale tiny --out r",
            "hardware": "any machine", "cuts": ["A smoke test."], "runs": [run], **changes}


@pytest.mark.parametrize(
    "folder, manifest, message",
    [
        ("missing", None, "{dir}' is not a reproduction folder: it does not exist"),
        ("empty", None, "{dir}' is not a reproduction folder: it has no reproduce.json"),
        ("unfinished", _manifest(stage="analyze"), "is an unfinished reproduction (stopped at stage 'analyze'): finish it"),
        ("older", {"scale": "tiny", "stage": "done", "wall_s": 1.0}, "has no valid 'cuts' (damaged, or written by an older"),
        ("no_run", _manifest(), "runs/hmm_mlp_seed0' has no config.json: the run never started"),
    ],
)
def test_report_of_a_folder_that_is_no_finished_reproduction_is_one_line_and_exit_2(tmp_path, folder, manifest, message):
    """`windtunnel report DIR` reads DIR alone: a folder without a manifest, or with one of an
    unfinished (or older, or damaged) reproduction, is named in one line, and nothing is written."""
    out = tmp_path / folder
    if folder != "missing":
        out.mkdir()
    if manifest is not None:
        (out / "reproduce.json").write_text(json.dumps(manifest))
    before = sorted(p.name for p in tmp_path.rglob("*"))
    result = windtunnel("report", str(out))
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and result.stdout == ""
    assert result.stderr.startswith("windtunnel: error: ") and message.format(dir=out) in result.stderr
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # no report/, no lock left behind
