"""Pack a trained run for the trip back from a GPU machine: what the results folder keeps.

    python bench/pack_run.py RUN_DIR OUT_DIR [--provenance JSON] [--snapshots N] [--part-mib 15] [--max-parts 4]

Writes ``OUT_DIR/<run>.tar.partNN``: one tar of the run's config, metrics, evaluation,
analyses (JSON, PNG, MD), the final weights as ``weights.safetensors`` (fp32, the model's
tensors of the resume state, without the optimizer's moments) and up to ``N`` intermediate
weight snapshots, log-spread (the earliest dropped first when the parts would overflow),
cut into parts of at most ``--part-mib`` MiB: the device tool brings back at most 8 files of
16 MiB each. Reassemble with ``cat <run>.tar.part* | tar x``.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import sys
import tarfile
from pathlib import Path

from safetensors.torch import load_file, save

KEEP_SUFFIXES = {".json", ".jsonl", ".png", ".md", ".toml", ".txt", ".log"}


def final_weights(run_dir: Path) -> tuple[bytes, int]:
    """The model's tensors of the run's resume state, as safetensors bytes in float32, and its step."""
    tensors = load_file(str(run_dir / "resume.safetensors"))
    model = {name[len("model."):]: t.float().contiguous() for name, t in tensors.items() if name.startswith("model.")}
    with open(run_dir / "resume.safetensors", "rb") as handle:
        header_len = int.from_bytes(handle.read(8), "little")
        header = json.loads(handle.read(header_len))
    step = int(header.get("__metadata__", {}).get("step", -1))
    return save(model, metadata={"step": str(step), "dtype": "float32"}), step


def spread(steps: list[int], n: int) -> list[int]:
    """``n`` of ``steps`` spread evenly in log(step + 1)."""
    if n <= 0 or not steps:
        return []
    if len(steps) <= n:
        return steps
    logs = [math.log(s + 1) for s in steps]
    targets = [logs[0] + (logs[-1] - logs[0]) * (i + 0.5) / n for i in range(n)]
    return sorted({min(steps, key=lambda s: abs(math.log(s + 1) - t)) for t in targets})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--provenance", help="a JSON object stored as provenance.json in the run")
    parser.add_argument("--snapshots", type=int, default=3)
    parser.add_argument("--part-mib", type=int, default=15)
    parser.add_argument("--max-parts", type=int, default=4)
    args = parser.parse_args()
    run = args.run_dir
    budget = args.part_mib * args.max_parts * 2**20
    weights, step = final_weights(run)
    members: dict[str, bytes] = {"weights.safetensors": weights}
    for path in sorted(run.rglob("*")):
        rel = path.relative_to(run).as_posix()
        if path.is_file() and path.suffix in KEEP_SUFFIXES:
            members[rel] = path.read_bytes()
    provenance = json.loads(args.provenance) if args.provenance else {}
    members["provenance.json"] = json.dumps({**provenance, "final_step": step}, indent=1).encode()
    snapshot_dir = run / "checkpoints"
    available = sorted(int(p.stem.split("_")[1]) for p in snapshot_dir.glob("step_*.safetensors")) if snapshot_dir.exists() else []
    chosen = spread([s for s in available if 0 < s < step], args.snapshots)
    used = sum(len(b) for b in members.values())
    for s in reversed(chosen):  # the latest first: they say most about the end of training
        data = (snapshot_dir / f"step_{s:07d}.safetensors").read_bytes()
        if used + len(data) + 2**20 > budget:
            print(f"pack: snapshot {s} left out (the parts would exceed {budget / 2**20:.0f} MiB)", file=sys.stderr)
            continue
        members[f"checkpoints/step_{s:07d}.safetensors"] = data
        used += len(data)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in sorted(members.items()):
            info = tarfile.TarInfo(f"{run.name}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    blob = buffer.getvalue()
    part = args.part_mib * 2**20
    args.out_dir.mkdir(parents=True, exist_ok=True)
    n_parts = math.ceil(len(blob) / part)
    for i in range(n_parts):
        (args.out_dir / f"{run.name}.tar.part{i:02d}").write_bytes(blob[i * part : (i + 1) * part])
    print(json.dumps({"run": run.name, "final_step": step, "bytes": len(blob), "parts": n_parts, "snapshots": sorted(
        int(n.split("_")[1].split(".")[0]) for n in members if n.startswith("checkpoints/step_") and n.endswith(".safetensors"))}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
