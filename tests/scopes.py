"""The scope of the fixtures that train or analyze once for a whole test module."""

from __future__ import annotations

import os


def once_per_module(fixture_name: str, config: object) -> str:
    """Once per module, except under mutation testing: mutmut maps each test to the code it runs
    and then runs only those tests for a mutant, and a module's fixture runs inside the first test
    that asks for it, hiding the code it runs from the others. mutmut names the mutant (or
    "stats") in ``MUTANT_UNDER_TEST``; there each test builds its own."""
    return "function" if os.environ.get("MUTANT_UNDER_TEST") else "module"
