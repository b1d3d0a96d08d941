"""Carry mutmut's outcomes from one machine to the next, so the mutation score accumulates.

A full run of ``make mutate`` takes longer than any one sitting on 2 cores; mutmut keeps its
outcomes in ``mutants/`` (not committed), per source file: each mutant's exit code and each
function's hash. ``save`` writes them to ``results/mutation/outcomes.json``; ``restore`` puts
them back into ``mutants/`` before ``mutmut run``, which keeps the outcome of every mutant whose
function is unchanged (same hash; mutmut's own rule when a source file changes) and runs the
rest. So a run stopped part-way goes on where it stopped on any machine, and a function that
changed is run again.

    python tools/mutation_outcomes.py save     [--file results/mutation/outcomes.json]
    python tools/mutation_outcomes.py restore  [--file results/mutation/outcomes.json]

``restore`` never overwrites an outcome ``mutants/`` already holds for a function with the same
hash, nor one of a function whose hash differs. ``save`` merges the same way into the saved file
(an outcome from ``mutants/`` replaces the saved one; functions ``mutants/`` does not hold keep
theirs), and records the commit, the date, the processor and how many outcomes came from this
machine. A killed mutant stays killed while its function is unchanged: tests are added, not
weakened, between runs (``make mutate ONLY='NAMES'`` reruns any mutant by name).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutation_score import ROOT, provenance  # noqa: E402  (a sibling script, not a package)

OUTCOMES = ROOT / "results" / "mutation" / "outcomes.json"
SUFFIX = ".meta"


def _function_of(mutant: str) -> str:
    """``windtunnel.a.x_f__mutmut_3`` -> ``x_f``: the mangled function a mutant belongs to."""
    return mutant.rsplit(".", 1)[1].rsplit("__mutmut_", 1)[0]


def read_mutants(folder: Path) -> dict[str, dict]:
    """Per source file under ``folder`` (mutmut's ``mutants/``): its function hashes and, per
    function, the exit codes of its mutants by number (None: not run)."""
    files = {}
    for meta in sorted(folder.rglob("*.py" + SUFFIX)):
        data = json.loads(meta.read_text())
        functions: dict[str, dict] = {
            name: {"hash": digest, "codes": {}} for name, digest in data.get("hash_by_function_name", {}).items()}
        for mutant, code in data["exit_code_by_key"].items():
            function = functions.get(_function_of(mutant))
            if function is not None:
                function["codes"][mutant.rsplit("__mutmut_", 1)[1]] = code
        files[meta.relative_to(folder).as_posix()[: -len(SUFFIX)]] = functions
    return files


def _merge(into: dict[str, dict], new: dict[str, dict]) -> int:
    """Put ``new``'s outcomes into ``into`` per function (a run outcome wins over none, a new
    hash replaces the function); returns how many run outcomes ``new`` added or changed."""
    changed = 0
    for path, functions in new.items():
        saved = into.setdefault(path, {})
        for name, function in functions.items():
            old = saved.get(name)
            if old is None or old["hash"] != function["hash"]:
                saved[name] = function
                changed += sum(code is not None for code in function["codes"].values())
                continue
            for number, code in function["codes"].items():
                if code is not None and old["codes"].get(number) != code:
                    old["codes"][number] = code
                    changed += 1
    return changed


def save(folder: Path, file: Path) -> int:
    """Merge the outcomes in ``folder`` into ``file``; returns how many it added or changed."""
    saved = json.loads(file.read_text()) if file.exists() else {"runs": [], "files": {}}
    changed = _merge(saved["files"], read_mutants(folder))
    if changed:
        saved["runs"].append({**provenance("make mutate"), "outcomes": changed})
    file.parent.mkdir(parents=True, exist_ok=True)
    partial = file.with_name(file.name + ".partial")
    partial.write_text(_dump(saved))
    partial.replace(file)  # a killed save leaves the old file whole
    return changed


def _dump(saved: dict) -> str:
    """JSON with one line per function (a reviewable diff, a tenth of the size of indenting it all)."""
    files = ",\n".join(
        f" {json.dumps(path)}: {{\n" + ",\n".join(
            f"  {json.dumps(name)}: {json.dumps(function, sort_keys=True, separators=(',', ':'))}"
            for name, function in sorted(functions.items())) + "\n }"
        for path, functions in sorted(saved["files"].items()) if functions)
    return f'{{"runs": {json.dumps(saved["runs"], indent=1)},\n"files": {{\n{files}\n}}}}\n'


def restore(file: Path, folder: Path) -> int:
    """Write ``file``'s outcomes into ``folder``'s meta files where the function's hash matches
    (or the file has no meta yet); returns how many outcomes it put there."""
    if not file.exists():
        return 0
    put = 0
    for path, functions in json.loads(file.read_text())["files"].items():
        meta = folder / (path + SUFFIX)
        if meta.exists():
            data = json.loads(meta.read_text())
        else:
            data = {"exit_code_by_key": {}, "hash_by_function_name": {}, "type_check_error_by_key": {},
                    "durations_by_key": {}, "estimated_durations_by_key": {}}
        hashes = data["hash_by_function_name"]
        module = path.removeprefix("src/").removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        for name, function in functions.items():
            if hashes.setdefault(name, function["hash"]) != function["hash"]:
                continue  # the function changed since: mutmut runs its mutants again
            for number, code in function["codes"].items():
                key = f"{module}.{name}__mutmut_{number}"
                if code is not None and data["exit_code_by_key"].get(key) is None:
                    data["exit_code_by_key"][key] = code
                    put += 1
        meta.parent.mkdir(parents=True, exist_ok=True)
        meta.write_text(json.dumps(data, indent=4))
    return put


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["save", "restore"])
    parser.add_argument("--file", type=Path, default=OUTCOMES, help="the saved outcomes (default: %(default)s)")
    parser.add_argument("--mutants", type=Path, default=ROOT / "mutants", help="mutmut's folder (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.action == "save":
        if not args.mutants.is_dir():
            print(f"error: no mutmut folder at {args.mutants}; run make mutate first", file=sys.stderr)
            return 2
        print(f"saved: {save(args.mutants, args.file)} outcomes added or changed in {args.file}")
    else:
        print(f"restored: {restore(args.file, args.mutants)} outcomes into {args.mutants}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
