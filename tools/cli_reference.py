"""The command-line reference, generated from ``windtunnel``'s own argument parser.

    python tools/cli_reference.py            # print it
    python tools/cli_reference.py --write    # write docs/cli.md

Built from the parser's actions (names, metavars, defaults, help), not from argparse's help
text, whose layout changes with the terminal width and the Python version. The test suite
fails when docs/cli.md differs from what this prints (tests/test_cli_reference.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from windtunnel.cli import _parser

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "cli.md"


def _cell(text: object) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _usage(action: argparse.Action) -> str:
    if not action.option_strings:  # a positional argument
        name = action.metavar or action.dest.upper()
        return {"?": f"[{name}]", "+": f"{name} [{name} ...]", "*": f"[{name} ...]"}.get(action.nargs, name)
    flag = ", ".join(action.option_strings)
    if action.nargs == 0:
        return flag
    value = action.metavar or (("{" + ",".join(map(str, action.choices)) + "}") if action.choices else action.dest.upper())
    return f"{flag} {value}" + (f" [{value} ...]" if action.nargs in ("+", "*") else "")


def _default(action: argparse.Action) -> str:
    if action.nargs == 0 or action.default in (None, [], argparse.SUPPRESS) or action.required:
        return ""
    return f"`{action.default}`"


def reference() -> str:
    parser = _parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    subcommands = dict(commands.choices)
    summary = {choice.dest: choice.help for choice in commands._choices_actions}
    lines = [
        "# Command-line reference",
        "",
        "Generated from the parser by `python tools/cli_reference.py --write`; do not edit by hand.",
        "Every command also takes `-h` / `--help`.",
        "",
        _cell(parser.description),
        "",
        "| command | what it does |",
        "|---|---|",
        *(f"| [`windtunnel {name}`](#windtunnel-{name}) | {_cell(summary[name])} |" for name in subcommands),
        "",
    ]
    for name, sub in subcommands.items():
        lines += [f"## windtunnel {name}", "", _cell(sub.description), "",
                  "| argument | required | default | what it is |", "|---|---|---|---|"]
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            required = "yes" if action.required or (not action.option_strings and action.nargs not in ("?", "*")) else ""
            lines.append(f"| `{_cell(_usage(action))}` | {required} | {_default(action)} | {_cell(action.help or '')} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    args.add_argument("--write", action="store_true", help=f"write {REFERENCE.relative_to(ROOT)}")
    if args.parse_args(argv).write:
        REFERENCE.parent.mkdir(exist_ok=True)
        REFERENCE.write_text(reference())
    else:
        sys.stdout.write(reference())
    return 0


if __name__ == "__main__":
    sys.exit(main())
