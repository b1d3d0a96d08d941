"""``python -m windtunnel`` is the ``windtunnel`` command."""

from windtunnel.cli import main

raise SystemExit(main())
