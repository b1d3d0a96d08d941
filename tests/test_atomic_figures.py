"""Figures are written as every other file is: a failure or a kill while one is drawn leaves the
old PNG whole (or the new one), never a piece of either."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import matplotlib.figure
import matplotlib.pyplot as plt
import pytest

from windtunnel.figures import save

PNG_START, PNG_END = b"\x89PNG\r\n\x1a\n", b"IEND\xaeB`\x82"


def _whole_png(path: Path) -> bool:
    data = path.read_bytes()
    return data.startswith(PNG_START) and data.endswith(PNG_END)


def test_a_figure_whose_drawing_fails_midway_leaves_the_old_file_whole(tmp_path, monkeypatch):
    path = tmp_path / "calibration.png"
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    save(fig, path)
    old = path.read_bytes()
    assert _whole_png(path)

    draw = matplotlib.figure.Figure.savefig

    def half_then_fail(fig, target, **options):  # what a kill midway leaves: part of the bytes
        draw(fig, target, **options)
        if hasattr(target, "truncate"):
            target.truncate(len(target.getvalue()) // 2)
        else:
            Path(target).write_bytes(Path(target).read_bytes()[:100])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", half_then_fail)
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    with pytest.raises(OSError):
        save(fig, path)
    assert path.read_bytes() == old
    assert [p.name for p in tmp_path.iterdir()] == ["calibration.png"]  # no temporary file left


#: Draws a heavy figure into one file again and again until killed.
_WRITER = """
import sys
import matplotlib.pyplot as plt
import numpy as np
from windtunnel.figures import save
rng = np.random.default_rng(0)
while True:
    fig, ax = plt.subplots(figsize=(8, 8))
    ax.imshow(rng.random((600, 600)))
    save(fig, sys.argv[1])
    print("saved", flush=True)
"""


def test_kills_at_random_instants_while_a_figure_is_rewritten_leave_a_whole_png(tmp_path):
    path = tmp_path / "key_orthogonality.png"
    rng = random.Random(0)
    for _ in range(3):
        writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)], stdout=subprocess.PIPE, text=True)
        assert writer.stdout.readline().strip() == "saved"  # one whole figure, then rewrites
        time.sleep(rng.uniform(0.0, 0.6))
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=30)
        assert _whole_png(path)
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")] == [path.name]
