"""Progress on stderr, drawn with tqdm: a bar with an ETA on a terminal; a plain line every
few seconds elsewhere (a log file or a pipe, where a rewritten line is noise); nothing when
turned off (``--quiet``).

    progress = TrainingProgress(total=2000, start=0, enabled=True)
    progress.update(step, loss, mae)   # cheap unless a line is due
    progress.close()
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

import torch
from tqdm import tqdm

__all__ = ["BAR_EVERY_S", "PLAIN_EVERY_S", "PLAIN_FORMAT", "AnalysesProgress", "TrainingProgress", "is_terminal"]

BAR_EVERY_S = 0.2  # a terminal bar is redrawn this often at most
PLAIN_EVERY_S = 10.0  # a plain line is printed this often at most
#: The plain line: ``step 120/2000 [00:12<03:08, 9.98step/s, loss 1.2345, mae 0.0123 bits]``.
PLAIN_FORMAT = "step {n}/{total} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"


def is_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is a terminal (a closed or replaced stream is not)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class TrainingProgress:
    """The training loop's progress: steps, ETA, the loss and the latest held-out MAE.

    ``update`` takes the loss as a tensor and reads it (a device sync) only when it draws,
    so the training step itself reads nothing back from the device. The rate and ETA are
    averaged over this session's steps (``start`` is where a resumed run began).
    """

    def __init__(self, total: int, start: int, enabled: bool, stream: TextIO | None = None) -> None:
        self.enabled = enabled
        self.bar: tqdm | None = None
        if not enabled:
            return
        self.stream = stream if stream is not None else sys.stderr
        self.total, self.start = total, start
        self.terminal = is_terminal(self.stream)
        self.started = self.last_drawn = time.perf_counter()
        if self.terminal:
            # Drawn only when update() says so (mininterval 0, miniters 1); smoothing 0: the
            # rate is the session's average, which a step of evaluation does not throw off.
            self.bar = tqdm(
                total=total, initial=start, desc="train", unit="step", file=self.stream,
                mininterval=0, miniters=1, smoothing=0, dynamic_ncols=True,
            )

    def update(self, step: int, loss: torch.Tensor, mae: float | None, force: bool = False) -> None:
        """Show ``step`` done, if a line is due (or ``force``)."""
        if not self.enabled:
            return
        now = time.perf_counter()
        if not force and now - self.last_drawn < (BAR_EVERY_S if self.terminal else PLAIN_EVERY_S):
            return
        self.last_drawn = now
        postfix = f"loss {loss.item():.4f}, " + (f"mae {mae:.4f} bits" if mae is not None else "mae -")
        if self.bar is not None:
            self.bar.n = step
            self.bar.set_postfix_str(postfix, refresh=True)
            return
        line = tqdm.format_meter(
            step, self.total, now - self.started, initial=self.start, unit="step", postfix=postfix, bar_format=PLAIN_FORMAT
        )
        print(line, file=self.stream, flush=True)

    def close(self) -> None:
        """End the bar (a terminal keeps its last state on its own line)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class AnalysesProgress:
    """The analyses stage's progress: one line as each analysis starts, naming the group, the
    analysis and whose weights it reads, with the time so far and an ETA.

    The ETA is the mean time of the groups finished so far times the groups left (a group's
    analyses differ too much in cost for a per-analysis average); before the first group ends
    there is none. Lines go to ``say`` (plain lines: the stage is minutes per group, not steps
    per second, so a bar would not move between them).
    """

    def __init__(self, groups: int, say: Callable[[str], None], clock: Callable[[], float] = time.monotonic) -> None:
        self.groups, self.say, self.clock = groups, say, clock
        self.started = clock()
        self.done = 0
        self.group = ""

    def start_group(self, name: str) -> None:
        self.group = name

    def end_group(self) -> None:
        self.done += 1

    def eta_s(self) -> float | None:
        """Seconds left by the finished groups' mean, or None before the first has finished."""
        if self.done == 0:
            return None
        return (self.clock() - self.started) / self.done * (self.groups - self.done)

    def starting(self, analysis: str, index: int, count: int, weights: str) -> None:
        """Say that analysis ``index`` of ``count`` in the current group starts on ``weights``."""
        elapsed = tqdm.format_interval(self.clock() - self.started)
        eta = self.eta_s()
        left = "ETA after the first group" if eta is None else f"about {tqdm.format_interval(eta)} left"
        self.say(f"[analyze] group {self.done + 1}/{self.groups} {self.group}: {analysis} "
                 f"({index}/{count}, {weights}); {elapsed} so far, {left}")
