"""The mutation score per package, from the results mutmut left in ``mutants/`` (``make mutate``).

Prints JSON: for each package, how many mutants were killed, survived, or reached by no test,
how many survivors change only the text of a message or caption or the styling of a figure, how many are listed as
equivalent in ``tools/mutation_equivalent.toml`` (each with its reason), how many survivors that
do change behaviour are left alive with a note there (``[noted]``: scored as survivors), and the
score:

    score = killed / (killed + survived + no tests), over the mutants that change behaviour

where a mutant "changes only text" when its function's syntax tree differs from the original's
in prose string constants alone (strings with a space: messages, captions; a key or a name is
behaviour), each rewritten the way mutmut rewrites text ("XX" around it, or its case changed), or
only in the style keywords of its calls (:data:`STYLE_KEYWORDS`: a font size, a colour, a figure's
size). Such survivors are counted and listed, not scored: a test that pinned every caption's
wording or every font size would test the wording and the look, not the toolkit. A timeout counts as killed (the
mutant made the tests hang), as mutmut itself counts it.

    python tools/mutation_score.py [--survivors] [--markdown] [--save results/mutation/score.json]
                                   [--update results/mutation/score.json]

``--survivors`` lists every scored survivor by name; ``--markdown`` prints the table the
docs/testing.md shows instead of JSON; ``--save`` also writes the scores with their provenance (the
command, the processor, the commit, mutmut's version) for the table in docs/testing.md; ``--update``
replaces there only the rows of the packages this run checked in full, each with its own
provenance (a run that accumulates over several sittings completes one package at a time).
mutmut numbers a function's mutants in the order it
generates them, so an equivalent listed by name stays valid until that function changes.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import importlib.metadata
import json
import math
import platform
import subprocess
import sys
import tomllib
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EQUIVALENT = ROOT / "tools" / "mutation_equivalent.toml"

#: The packages docs/testing.md scores, by the module-name prefix of their mutants (a prefix that
#: is scored on its own row is left out of its parent's). The figures are a row of their own:
#: most of their mutants change how a plot looks (a colour, a font size), not what it shows.
PACKAGES = {
    "report/ criteria (claim*.py)": "windtunnel.report.claim",
    "report/ tables and page": "windtunnel.report.",
    "figures/": "windtunnel.figures.",
    "evaluation.py": "windtunnel.evaluation.",
    "metrics.py": "windtunnel.metrics.",
    "tunnels/": "windtunnel.tunnels.",
    "analysis/": "windtunnel.analysis.",
    "training/ (checkpoints, trainer)": "windtunnel.training.",
}


def package_of(name: str) -> str | None:
    """The row a mutant counts in: the longest prefix it starts with."""
    found = [package for package, prefix in PACKAGES.items() if name.startswith(prefix)]
    return max(found, key=lambda package: len(PACKAGES[package])) if found else None


# mutmut's exit codes (mutmut.stats.status_by_exit_code), folded into what the score needs.
KILLED = {1, 3, 36, -24, 24, 152, 255, 37, -11, -9}
SURVIVED = {0}
NO_TESTS = {5, 33}


def _functions(tree: ast.AST) -> dict[str, ast.AST]:
    return {node.name: node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _text_rewrite(original: object, mutant: object, *, prose: bool) -> bool:
    """A prose string (a message, a caption; not a key or a name) rewritten as mutmut rewrites
    text: "XX" around it or around one of its implicitly joined parts, or its case changed."""
    if not (isinstance(original, str) and isinstance(mutant, str)) or mutant == original or not prose:
        return False
    wrapped = "XX" not in original and mutant.replace("XX", "") == original
    return wrapped or mutant.lower() == original.lower()


def _prose_constants(tree: ast.AST) -> set[int]:
    """ids of the string constants that are prose: those with a space, and every literal part of
    an f-string whose literal parts hold one (``f"x={x} is out of range"``'s ``"x="`` too)."""
    prose = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            parts = [v for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str)]
            if " " in "".join(p.value for p in parts):
                prose |= {id(p) for p in parts}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and " " in node.value:
            prose.add(id(node))
    return prose


def changes_only_text(original: ast.AST, mutant: ast.AST) -> bool:
    """True if the two function trees differ in prose string constants alone, each a text rewrite."""
    a, b = list(ast.walk(original)), list(ast.walk(mutant))
    if len(a) != len(b):
        return False
    prose = _prose_constants(original)
    changed = False
    for x, y in zip(a, b):
        if type(x) is not type(y):
            return False
        if isinstance(x, ast.Constant):
            if x.value != y.value or type(x.value) is not type(y.value):
                if not _text_rewrite(x.value, y.value, prose=id(x) in prose):
                    return False
                changed = True
        elif isinstance(x, ast.FunctionDef):
            continue  # the names differ by construction (__mutmut_orig / __mutmut_N)
        else:
            fields = [f for f in x._fields if not isinstance(getattr(x, f), (ast.AST, list))]
            if any(getattr(x, f) != getattr(y, f) for f in fields):
                return False
    return changed


#: Keyword arguments that set how a figure looks, not what it shows: a survivor that changes only
#: these (a value, or the keyword dropped for its default) is counted like a text rewrite.
STYLE_KEYWORDS = frozenset({
    "fontsize", "alpha", "cmap", "aspect", "figsize", "fraction", "shrink", "ms", "markersize", "lw", "linewidth",
    "color", "colors", "ha", "va", "rotation", "wspace", "hspace",
})


def _normalized(function: ast.AST, *, style: bool = True) -> str:
    """The function's tree as text to compare, without its name (mutmut renames every copy) and,
    with ``style=False``, without its calls' style keywords."""
    tree = ast.parse(ast.unparse(function))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            node.name = "f"
        if isinstance(node, ast.Call) and not style:
            node.keywords = [k for k in node.keywords if k.arg not in STYLE_KEYWORDS]
    return ast.dump(tree)


def changes_only_style(original: ast.AST, mutant: ast.AST) -> bool:
    """True if the two function trees differ only in the style keywords of their calls
    (:data:`STYLE_KEYWORDS`): a font size, a colour, a figure's size."""
    return _normalized(original) != _normalized(mutant) and _normalized(original, style=False) == _normalized(mutant, style=False)


def collect(folders: list[Path]) -> list[dict[str, str]]:
    """Every mutant in mutmut's ``mutants/`` folders: its name, its status, and whether it changes
    only text. A mutant run in a later folder (a rerun of survivors after new tests) replaces its
    result from an earlier one."""
    mutants: dict[str, dict] = {}
    for folder in folders:
        for meta in sorted((folder / "src").rglob("*.py.meta")):
            exit_codes = json.loads(meta.read_text())["exit_code_by_key"]
            source = meta.with_suffix("")  # x.py.meta -> x.py
            functions = _functions(ast.parse(source.read_text()))
            for name, code in exit_codes.items():
                if code is None and name in mutants:
                    continue  # not run here: the earlier folder's result stands
                function = name.rsplit(".", 1)[1]
                original = functions.get(function.rsplit("__mutmut_", 1)[0] + "__mutmut_orig")
                if code in KILLED:
                    status = "killed"
                elif code in SURVIVED:
                    status = "survived"
                elif code in NO_TESTS:
                    status = "no tests"
                elif code is None:
                    status = "not checked"
                else:
                    status = "other"
                text = status in ("survived", "no tests") and original is not None and (
                    changes_only_text(original, functions[function]) or changes_only_style(original, functions[function]))
                mutants[name] = {"name": name, "status": status, "text_only": text}
    return list(mutants.values())


def wilson_interval(killed: int, n: int, z: float = 1.96) -> list[float]:
    """The 95% Wilson interval of a proportion: the score of a random sample of mutants."""
    p = killed / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [round(centre - half, 3), round(centre + half, 3)]


def score(mutants: list[dict[str, str]], equivalent: dict[str, str], noted: dict[str, str] | None = None) -> dict[str, dict]:
    """Per package; ``noted``: survivors that change behaviour and are left alive with a reason
    (scored as survivors all the same); ``unexplained`` lists the survivors with no note."""
    noted = noted or {}
    result = {}
    for package in PACKAGES:
        mine = [m for m in mutants if package_of(m["name"]) == package]
        if not mine:
            continue
        counts = Counter(m["status"] for m in mine)
        scored = [m for m in mine if not m["text_only"] and m["name"] not in equivalent and m["status"] in ("killed", "survived", "no tests")]
        killed = sum(m["status"] == "killed" for m in scored)
        result[package] = {
            "mutants": len(mine),
            "killed": counts["killed"],
            "survived": counts["survived"],
            "no_tests": counts["no tests"],
            "not_checked": counts["not checked"],
            "text_only_survivors": sum(m["text_only"] for m in mine),
            "equivalent": sum(m["name"] in equivalent and m["status"] != "killed" for m in mine),
            "scored": len(scored),
            "score": round(killed / len(scored), 3) if scored else None,
            # Where only a random sample of the mutants ran (make mutate ONLY=...), the score is an estimate.
            "score_interval": wilson_interval(killed, len(scored)) if scored and counts["not checked"] else None,
            "survivors": sorted(m["name"] for m in scored if m["status"] != "killed"),
            "noted": sum(m["name"] in noted for m in scored if m["status"] != "killed"),
            "unexplained": sorted(m["name"] for m in scored if m["status"] != "killed" and m["name"] not in noted),
        }
    return result


def rescore(saved: dict[str, dict], mutants: list[dict[str, str]], equivalent: dict[str, str], noted: dict[str, str]) -> dict[str, dict]:
    """A saved score updated by a rerun of its survivors alone (``make mutate ONLY='<the
    survivors>'`` after new tests): a survivor the rerun killed counts as killed, one listed as
    equivalent since leaves the score; every other count stands as saved. A survivor the rerun
    did not reach stays a survivor."""
    now = {m["name"]: m["status"] for m in mutants}
    result = {}
    for package, r in saved.items():
        killed = [n for n in r["survivors"] if now.get(n) == "killed"]
        alive = [n for n in r["survivors"] if n not in killed]
        newly_equivalent = [n for n in alive if n in equivalent]
        survivors = [n for n in alive if n not in equivalent]
        # Tests were only added, so a survivor no test reaches now was reached by none before;
        # where the rerun missed a survivor, the saved split stands.
        rerun_all = all(now.get(n) not in (None, "not checked") for n in r["survivors"])
        no_tests = sum(now.get(n) == "no tests" for n in alive) if rerun_all else r["no_tests"]
        scored = r["scored"] - len(newly_equivalent)
        r = {**r, "killed": r["killed"] + len(killed), "survived": r["survived"] + r["no_tests"] - len(killed) - no_tests,
             "no_tests": no_tests, "equivalent": r["equivalent"] + len(newly_equivalent), "scored": scored}
        r["score"] = round((scored - len(survivors)) / scored, 3) if scored else None
        if r.get("score_interval"):
            r["score_interval"] = wilson_interval(scored - len(survivors), scored)
        r["survivors"] = sorted(survivors)
        r["noted"] = sum(n in noted for n in survivors)
        r["unexplained"] = sorted(n for n in survivors if n not in noted)
        result[package] = r
    return result


def update(saved: dict, result: dict[str, dict], run_provenance: dict[str, str]) -> dict:
    """``saved`` (a file ``--save`` wrote) with the rows of the packages ``result`` checked in
    full replaced, each carrying ``run_provenance`` (the run that made it); every other row, a
    package this run did not reach or reached in part (fastest mutants first: not a random
    sample), stands as saved."""
    packages = dict(saved["packages"])
    for package, row in result.items():
        if row["not_checked"] == 0:
            packages[package] = {**row, "provenance": run_provenance}
    return {**saved, "packages": packages}


def _processor() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:  # make test runs the tools' tests without mutmut
        return "not installed"


def provenance(command: str) -> dict[str, str]:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False).stdout.strip()
    return {
        "command": command,
        "processor": _processor(),
        "commit": commit or "unknown",
        "mutmut": _version("mutmut"),
        "date": datetime.date.today().isoformat(),
    }


def print_table(result: dict[str, dict]) -> None:
    print("| package | mutants (run) | killed | survived | no tests | text only | equivalent | noted | score |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for package, r in result.items():
        run = r["mutants"] - r["not_checked"]
        pct = "not run" if r["score"] is None else f"{r['score']:.1%}"  # 0.998 is not 100%
        if r.get("score_interval"):
            low, high = r["score_interval"]
            pct += f" (sample; 95% CI {low:.1%}–{high:.1%})"
        print(f"| `{package}` | {r['mutants']} ({run}) | {r['killed']} | {r['survived']} | {r['no_tests']} | "
              f"{r['text_only_survivors']} | {r['equivalent']} | {r.get('noted', 0)} | {pct} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--survivors", action="store_true", help="list every scored survivor by name")
    parser.add_argument("--markdown", action="store_true", help="print docs/testing.md's table instead of JSON")
    parser.add_argument("--save", type=Path, help="also write the scores and their provenance to this JSON file")
    parser.add_argument("--mutants", type=Path, action="append", help="a mutmut mutants/ folder (repeatable; default: ./mutants)")
    parser.add_argument("--command", default="make mutate", help="what produced the results, for the provenance")
    parser.add_argument("--sample", type=Path, help="count only the mutants named in this file (one per line): a random sample's")
    parser.add_argument("--rescore", type=Path, help="update a file --save wrote from a rerun of its survivors (see rescore())")
    parser.add_argument("--table-from", type=Path, help="print docs/testing.md's table from a file --save wrote (no mutmut results needed)")
    parser.add_argument("--update", type=Path, help="replace, in a file --save wrote, the rows of the packages this run checked in full (see update())")
    args = parser.parse_args(argv)
    if args.table_from:
        print_table(json.loads(args.table_from.read_text())["packages"])
        return 0
    folders = args.mutants or [ROOT / "mutants"]
    missing = [str(f) for f in folders if not (f / "src").is_dir()]
    if missing:
        print(f"error: no mutmut results in {', '.join(missing)}: run `make mutate` first", file=sys.stderr)
        return 2
    listed = tomllib.loads(EQUIVALENT.read_text()) if EQUIVALENT.is_file() else {}
    equivalent, noted = listed.get("equivalent", {}), listed.get("noted", {})
    mutants = collect(folders)
    if args.sample:
        named = set(args.sample.read_text().split())
        mutants = [m if m["name"] in named else {**m, "status": "not checked", "text_only": False} for m in mutants]
    if args.rescore:
        result = rescore(json.loads(args.rescore.read_text())["packages"], mutants, equivalent, noted)
    else:
        result = score(mutants, equivalent, noted)
    if args.update:
        updated = update(json.loads(args.update.read_text()), result, provenance(args.command))
        args.update.write_text(json.dumps(updated, indent=1, ensure_ascii=False) + "\n")
    if args.save:
        args.save.parent.mkdir(parents=True, exist_ok=True)
        saved = {"provenance": provenance(args.command), "packages": result}
        args.save.write_text(json.dumps(saved, indent=1, ensure_ascii=False) + "\n")
    if args.markdown:
        print_table(result)
        return 0
    if not args.survivors:
        for r in result.values():
            r["survivors"], r["unexplained"] = len(r["survivors"]), len(r["unexplained"])
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
