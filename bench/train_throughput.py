"""Training throughput of the CPU presets: the trainer as ``reproduce`` runs it, before and after.

    python bench/train_throughput.py [--steps 120] [--rounds 2] [--threads 1] [--presets hmm_transformer ...]

Each preset of ``configs/cpu`` is trained by :func:`windtunnel.training.trainer.train`
itself (sampling, forward, soft or hard loss, backward, clipping, AdamW, logging) for
``--steps`` steps on ``--threads`` threads (``reproduce`` gives each run one thread), in
three variants: ``full_forward`` (every position computed, then the supervised ones taken:
the step before ``train.supervised_only`` existed), ``plain`` (the default: only what the
supervised positions need) and ``compile`` (that, through ``torch.compile``). The variants
are interleaved over ``--rounds`` rounds so that a noisy neighbour slows all alike. Steps/s
is read from the trainer's own ``metrics.jsonl`` intervals, the first interval
(compilation, warm-up) excluded; evaluation is cut to a token 64 sequences at the end and
outside the timed intervals. Prints one JSON object: per preset and variant the median
steps/s, the warm-up seconds, and the projected minutes for the preset's full step count;
per preset each variant's ratio to ``full_forward``. It measures, it asserts nothing about
time.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
from pathlib import Path

import torch

from windtunnel.provenance import cpu_model  # the processor's name, as every benchmark and run records it

from windtunnel.run_config import load_run_config
from windtunnel.training.trainer import train

PRESETS = Path(__file__).resolve().parents[1] / "configs" / "cpu"
VARIANTS = {"full_forward": ["train.supervised_only=false"], "plain": [], "compile": ["train.compile=true"]}


def measure(preset: str, overrides: list[str], steps: int, log_every: int) -> dict:
    """One short training run; steps/s of each logged interval after the first."""
    config = load_run_config(
        PRESETS / f"{preset}.toml",
        [
            f"train.steps={steps}",
            f"train.log_every={log_every}",
            "train.eval_every=0",
            "train.checkpoint_every=0",
            "train.snapshots_per_decade=0",
            "eval.n=64",
            *overrides,
        ],
    )
    with tempfile.TemporaryDirectory() as folder:
        train(config, Path(folder) / "run", progress=False)
        records = [json.loads(line) for line in (Path(folder) / "run" / "metrics.jsonl").read_text().splitlines()]
    intervals = [r for r in records if "seq_per_s" in r]
    rates = [r["seq_per_s"] / config.train.batch_size for r in intervals[1:]]
    first_s = intervals[0]["elapsed_s"]
    return {"steps_per_s": statistics.median(rates), "warmup_s": max(0.0, first_s - log_every / statistics.median(rates))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=120, help="steps per measured run (default 120)")
    parser.add_argument("--log-every", type=int, default=20, help="steps per timed interval (default 20)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default 2)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as reproduce runs each preset)")
    parser.add_argument("--presets", nargs="*", default=sorted(p.stem for p in PRESETS.glob("*.toml")))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    samples: dict[str, dict[str, list[dict]]] = {p: {v: [] for v in VARIANTS} for p in args.presets}
    for _ in range(args.rounds):
        for preset in args.presets:
            for variant, overrides in VARIANTS.items():
                samples[preset][variant].append(measure(preset, overrides, args.steps, args.log_every))

    results = {}
    for preset, by_variant in samples.items():
        total_steps = load_run_config(PRESETS / f"{preset}.toml").train.steps
        entry = {"steps": total_steps}
        for variant, runs in by_variant.items():
            rate = statistics.median(r["steps_per_s"] for r in runs)
            entry[variant] = {
                "steps_per_s": round(rate, 2),
                "steps_per_s_each_round": [round(r["steps_per_s"], 2) for r in runs],
                "warmup_s": round(statistics.median(r["warmup_s"] for r in runs), 1),
                "projected_run_min": round(total_steps / rate / 60, 1),
            }
        before = entry["full_forward"]["steps_per_s"]
        entry["over_full_forward"] = {v: round(entry[v]["steps_per_s"] / before, 3) for v in VARIANTS if v != "full_forward"}
        results[preset] = entry
    print(
        json.dumps(
            {
                "cpu": cpu_model(),
                "torch": torch.__version__,
                "threads": args.threads,
                "steps_per_run": args.steps,
                "rounds": args.rounds,
                "presets": results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
