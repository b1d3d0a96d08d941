"""The paper-scale results folder as Markdown tables: each run with where and how it trained,
and the step's cost on each GPU measured, from the saved files alone.

    python bench/paper_table.py [results/paper]

Reads each run's ``provenance.json`` (device, precision, steps/s, wall time, commit),
``metrics.jsonl`` (the last evaluation; where a time limit stopped it) and
``RESULTS/bench/step_<GPU>.json`` (``bench/step.py`` on that GPU). The paper-scale
tables of docs/reproducing.md are this script's output. The fraction of peak is the step's FLOP/s over the H200's
dense bf16 rate measured on this project's machines (about 790 TFLOP/s on an 8192^3 matmul).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from windtunnel.history import read_metrics, stop_record
from windtunnel.provenance import read_provenance

#: Dense bf16 matmul rate measured on the lent H200s (8192^3, random data), the ceiling a step is compared with.
H200_BF16_FLOP_PER_S = 790e12


def main() -> None:
    results = Path(sys.argv[1] if len(sys.argv) > 1 else "results/paper")
    print("| run | steps | device, precision | steps/s | wall | mae_aggregate_bits | mae_bits | kl_bits | commit |")
    print("|---|---|---|---|---|---|---|---|---|")
    for run in sorted(p for p in (results / "runs").iterdir() if (p / "config.json").is_file()):
        config = json.loads((run / "config.json").read_text())
        records = read_metrics(run)
        last = [r for r in records if "eval_mae_bits" in r][-1]
        stopped = stop_record(records)
        steps = f"{stopped['step']:,} of {config['train']['steps']:,} (time limit)" if stopped else f"{config['train']['steps']:,}"
        start = read_provenance(run)[-1]
        print(f"| {run.name} | {steps} | {start['device_name']}, {start['precision']} | {start['steps_per_s_median']:.1f} | "
              f"{start['wall_s'] / 60:.1f} min | {last['eval_mae_aggregate_bits']:.4f} | {last['eval_mae_bits']:.4f} | "
              f"{last['eval_kl_bits']:.4f} | {str(start['commit'])[:7]} |")
    for bench in sorted((results / "bench").glob("step_*.json")):
        data = json.loads(bench.read_text())
        print(f"\n`{bench.relative_to(results.parent.parent) if results.is_absolute() else bench}` ({data['cuda']}, torch {data['torch']}, "
              f"commit {data.get('commit', '?')[:7]}):\n")
        print("| preset | GFLOP a step | variant | steps/s | TFLOP/s | of bf16 peak | 100k steps |")
        print("|---|---|---|---|---|---|---|")
        for preset, entry in data["devices"]["cuda"].items():
            for variant in ("plain", "compile", "bf16", "compile_bf16"):
                if variant in entry:
                    v = entry[variant]
                    print(f"| {preset} | {entry['flops_per_step'] / 1e9:.0f} | {variant} | {v['steps_per_s']:.1f} | "
                          f"{v['flop_per_s'] / 1e12:.1f} | {v['flop_per_s'] / H200_BF16_FLOP_PER_S:.1%} | {v['projected_run_min']:.0f} min |")


if __name__ == "__main__":
    main()
