"""The command-line reference in docs/cli.md is the parser's, and every command the README
and the docs show is one the parser accepts."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from windtunnel.cli import _parser

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "cli.md"


def test_the_reference_is_the_generated_one():
    # A fresh process: tests that register plug-in tunnels change the parser's help text here.
    generated = subprocess.run([sys.executable, str(ROOT / "tools" / "cli_reference.py")], capture_output=True, text=True, check=True)
    assert generated.stdout == REFERENCE.read_text(), "docs/cli.md is stale: run python tools/cli_reference.py --write"


def _sections(text: str) -> dict[str, str]:
    parts = re.split(r"^## windtunnel (\S+)$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


# Prints argparse's own --help of the program and of each subcommand named on the command line,
# each after a line "=== NAME": one fresh process for all of them (a process per command costs
# a torch import each).
_HELP_TEXTS = """
import contextlib, io, sys
from windtunnel.cli import _parser
for name in sys.argv[1:]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        _parser().parse_args([*([name] if name != "-" else []), "--help"])
    print("=== " + name)
    print(out.getvalue())
"""


def _help_texts(*names: str) -> dict[str, str]:
    printed = subprocess.run([sys.executable, "-c", _HELP_TEXTS, *names], capture_output=True, text=True, check=True).stdout
    parts = re.split(r"^=== (\S+)$", printed, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def test_every_subcommand_and_option_argparse_prints_is_in_the_reference():
    # The oracle is argparse's own --help of each subcommand, read in a fresh process.
    sections = _sections(REFERENCE.read_text())
    listed = _help_texts("-")["-"]
    commands = re.findall(r"^    ([a-z][a-z-]*)(?:\s|$)", listed.split("COMMAND\n", 1)[1].split("\noptions:", 1)[0], flags=re.M)
    assert sorted(sections) == sorted(commands)
    help_texts = _help_texts(*commands)
    assert sorted(help_texts) == sorted(commands)
    for command in commands:
        options = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", help_texts[command].split("options:", 1)[-1])) - {"--help"}
        assert options, command
        missing = [o for o in sorted(options) if f"`{o}" not in sections[command] and f", {o}" not in sections[command]]
        assert not missing, (command, missing)


def _readme_commands() -> list[str]:
    """Every command line in the shell blocks of the README and the docs pages."""
    text = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
    commands = []
    for block in re.findall(r"^```(?:bash|sh|console)\n(.*?)^```", text, flags=re.M | re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip().removeprefix("$ ")
            if line.startswith(("windtunnel ", ".venv/bin/windtunnel ", "make ")):
                commands.append(line)
    return commands


def _make_targets() -> set[str]:
    return set(re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), flags=re.M))


def test_the_readme_shows_windtunnel_and_make_commands():
    commands = _readme_commands()
    assert sum(c.startswith(("windtunnel", ".venv")) for c in commands) >= 10 and any(c.startswith("make ") for c in commands)


def _accepted(line: str) -> bool:
    words = shlex.split(line, comments=True)
    if words[0] == "make":
        targets = [w for w in words[1:] if "=" not in w]
        return bool(targets) and set(targets) <= _make_targets()
    try:
        _parser().parse_args(words[1:])
    except SystemExit:  # argparse's way of refusing
        return False
    return True


def test_the_check_refuses_what_the_parser_or_the_makefile_does_not_know(capsys):
    assert _accepted("windtunnel eval runs/bij --horizons 20 30")
    assert not _accepted("windtunnel eval runs/bij --horizonz 20")  # a misspelt option
    assert not _accepted("windtunnel evaluate runs/bij")  # no such subcommand
    assert not _accepted("windtunnel sample hmm --n 0")  # a value the option refuses
    assert _accepted("make test") and not _accepted("make docs-site")


@pytest.mark.parametrize("line", _readme_commands())
def test_each_command_the_readme_shows_is_one_the_parser_or_the_makefile_accepts(line, capsys):
    assert _accepted(line), line
