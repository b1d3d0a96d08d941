"""The cost of a training step on each GPU measured for the paper-scale folder, as Markdown
tables, from ``RESULTS/bench/step_<GPU>.json`` (``bench/step.py`` on that GPU).

    python bench/paper_table.py [results/paper]

The runs themselves (where and how each trained, what it scored) are on the results page,
docs/results-paper.md, which ``tools/results_pages.py`` renders from the same folder. The
fraction of peak is the step's FLOP/s over the H200's dense bf16 rate measured on this
project's machines (about 790 TFLOP/s on an 8192^3 matmul).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


#: Dense bf16 matmul rate measured on the lent H200s (8192^3, random data), the ceiling a step is compared with.
H200_BF16_FLOP_PER_S = 790e12


def main() -> None:
    results = Path(sys.argv[1] if len(sys.argv) > 1 else "results/paper")
    for bench in sorted((results / "bench").glob("step_*.json")):
        data = json.loads(bench.read_text())
        print(f"`{bench.relative_to(results.parent.parent) if results.is_absolute() else bench}` ({data['cuda']}, torch {data['torch']}, "
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
