"""Compare two folders of analysis results number by number, as JSON: the same run analyzed
on two devices (``windtunnel analyze RUN --device cuda --out A`` and ``--device cpu --out B``).

    python bench/compare_analyses.py A B [--rtol 1e-3] [--atol 1e-4]

For each ``<name>.json`` in both folders: how many numbers, the largest absolute and relative
difference and where it is, and whether every number agrees within ``atol + rtol * |b|``.
Strings (run directories, labels) and the Markdown rendering are not compared; a difference in
structure (a key or a list length) is reported as such. Exit status 0 when every analysis
agrees, 1 otherwise.

The default tolerance: a float32 forward on another device's kernels moves activations by
about 1e-6 relative, and the statistics are smooth in them, so 1e-3 relative leaves three
orders of margin; quantities near 0 (a mean JSD, a p-value) are held to 1e-4 absolute.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

SKIPPED_KEYS = {"run_dirs", "markdown", "run_dir"}


def _leaves(value: Any, path: str = "") -> dict[str, Any]:
    """``{path: leaf}`` of a JSON value; ``path`` like ``layers[2].mass``."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key not in SKIPPED_KEYS:
                out.update(_leaves(item, f"{path}.{key}" if path else str(key)))
        return out
    if isinstance(value, list):
        out = {f"{path}.length": len(value)}
        for index, item in enumerate(value):
            out.update(_leaves(item, f"{path}[{index}]"))
        return out
    return {path: value}


def compare(a: Any, b: Any, *, rtol: float, atol: float) -> dict[str, Any]:
    """The differences between two JSON results (see the module docstring)."""
    left, right = _leaves(a), _leaves(b)
    structure = sorted(set(left) ^ set(right))
    worst_abs, worst_rel, where, n, failures = 0.0, 0.0, None, 0, []
    for path in sorted(set(left) & set(right)):
        x, y = left[path], right[path]
        numeric = isinstance(x, (int, float)) and isinstance(y, (int, float)) and not isinstance(x, bool)
        if not numeric:
            if x != y and not (isinstance(x, str) and isinstance(y, str)):
                failures.append(path)  # None against a number, True against False
            continue
        n += 1
        if math.isnan(x) and math.isnan(y):
            continue
        diff = abs(x - y)
        rel = diff / abs(y) if y else (0.0 if diff == 0 else math.inf)
        if diff > worst_abs:
            worst_abs, where = diff, path
        worst_rel = max(worst_rel, rel)
        if not diff <= atol + rtol * abs(y):
            failures.append(path)
    return {
        "numbers": n,
        "max_abs_difference": worst_abs,
        "max_rel_difference": worst_rel,
        "largest_at": where,
        "structure_differs": structure[:5],
        "outside_tolerance": failures[:5],
        "n_outside_tolerance": len(failures),
        "agree": not structure and not failures,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--rtol", type=float, default=1e-3)
    parser.add_argument("--atol", type=float, default=1e-4)
    args = parser.parse_args(argv)
    for folder in (args.a, args.b):
        if not folder.is_dir():
            print(f"compare_analyses: {str(folder)!r} is not a folder of analysis results", file=sys.stderr)
            return 2
    names = sorted({p.stem for p in args.a.glob("*.json")} & {p.stem for p in args.b.glob("*.json")})
    if not names:
        print("compare_analyses: the two folders share no <name>.json", file=sys.stderr)
        return 2
    report = {
        name: compare(json.loads((args.a / f"{name}.json").read_text()), json.loads((args.b / f"{name}.json").read_text()),
                      rtol=args.rtol, atol=args.atol)
        for name in names
    }
    print(json.dumps({"rtol": args.rtol, "atol": args.atol, "analyses": report}, indent=1))
    return 0 if all(r["agree"] for r in report.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
