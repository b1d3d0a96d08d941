"""``python -m windtunnel`` is the ``windtunnel`` command."""

from windtunnel.command import run

run()
