"""The ``windtunnel`` executable (and ``python -m windtunnel``).

Importing the CLI imports torch, numpy and sympy, which takes seconds; a KeyboardInterrupt
raised in the middle of those imports is caught and retried by some of them, and turns into
an ImportError or an AttributeError from a half-imported module. So Ctrl-C is held back
while the CLI is imported and acted on right after: exit 130 with one line, as at any later
moment (where :func:`windtunnel.cli.main` and the trainer handle it).
"""

from __future__ import annotations

import signal
import sys

from windtunnel.exit_codes import EXIT_INTERRUPTED


def run() -> None:
    """Run the command line in ``sys.argv`` and exit with its status."""
    held: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, _frame: held.append(signum))
    try:
        from windtunnel.cli import main
    finally:
        # Then Ctrl-C raises KeyboardInterrupt, even where the process inherited SIGINT ignored
        # (started in the background by a non-interactive shell), as the trainer and the job
        # runner take it too: `kill -INT` must stop any windtunnel command.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        if held:
            raise KeyboardInterrupt
        status = main()
    except KeyboardInterrupt:
        print("windtunnel: interrupted", file=sys.stderr)
        status = EXIT_INTERRUPTED
    raise SystemExit(status)
