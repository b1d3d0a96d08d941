"""Atomic file writes, and one writer per directory.

Atomic writes: a reader (or a crash) sees the old file or the whole new one, never half.
Used for everything a run, an analysis or a report writes, so an interrupted command
never leaves a truncated checkpoint, JSON result or page behind.

The writer lock: a command that writes into a run directory (or a reproduction's or a
sweep's output) holds an exclusive ``flock`` on ``DIR/.lock`` while it works, so two
commands started on the same directory cannot both write there; the second is refused
with the first's pid. The operating system releases the lock when its process dies, so
a killed command never leaves a stale lock behind.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["LOCK_FILE", "DirectoryInUse", "atomic_write_bytes", "atomic_write_text", "directory_lock", "has_content", "portable_path"]

LOCK_FILE = ".lock"


class DirectoryInUse(Exception):
    """Another process holds the directory's writer lock."""


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes it 0600; a plain open() would honour the umask
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as error:
        Path(tmp).unlink(missing_ok=True)
        if error.filename is None:  # a failed write names no file ("No space left on device"): name it
            raise OSError(error.errno, error.strerror or str(error), str(path)) from error
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    """The process's umask (reading it means setting it: set it straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_text(path: Path, text: str) -> None:
    """:func:`atomic_write_bytes` of ``text`` in UTF-8."""
    atomic_write_bytes(path, text.encode())


def portable_path(path: Path | str, *bases: Path | str) -> str:
    """``path`` as a file that travels between machines records it: relative to the first of
    ``bases`` that holds it (POSIX separators), else its name alone. A path of this machine
    (``/tmp/...``, a home folder) would mean nothing to a reader of a committed result."""
    where = Path(os.path.abspath(path))
    for base in bases:
        try:
            return where.relative_to(os.path.abspath(base)).as_posix()
        except ValueError:
            continue
    return where.name


def has_content(directory: Path) -> bool:
    """Whether ``directory`` holds anything besides its writer lock."""
    return any(entry.name != LOCK_FILE for entry in Path(directory).iterdir())


@contextmanager
def directory_lock(directory: Path) -> Iterator[None]:
    """Hold ``directory``'s writer lock for the block (``directory`` must exist).

    Raises:
        DirectoryInUse: another process holds it (the message names that process's pid).
    """
    path = Path(directory) / LOCK_FILE
    created = not path.exists()
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise DirectoryInUse(
                f"{str(directory)!r} is in use by another windtunnel command (pid {holder}); "
                "wait for it to finish or stop it, then run this again"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:
            yield
        except BaseException:
            if created:  # a failed command leaves the directory as it found it
                path.unlink(missing_ok=True)
            raise
        finally:
            os.ftruncate(fd, 0)  # no pid of a finished holder is left to mislead
    finally:
        os.close(fd)  # releases the lock
