"""Where a paper-shape training step spends its time: PyTorch's profiler over the trainer itself.

    python bench/profile_step.py [--preset bijection_transformer] [--device cuda] [--steps 40] [--rows 25] [--set KEY=VALUE ...]

Runs the trainer (:func:`windtunnel.training.trainer.train`, the preset's own settings: on the
paper presets compiled, bf16) for ``--steps`` steps under ``torch.profiler``, records the last
half (the first half holds compilation and warm-up; the trainer's ``on_step`` advances the
profiler's schedule), and prints one JSON object: the wall time per recorded step, the host
(CPU) time and the device (CUDA kernel) time per step, the share of the wall time the device
was busy, and the operators with the most self host time and the most self device time per
step. A step whose device is idle most of the wall time is bound by the host: launches,
Python, and waits for the device (``cudaStreamSynchronize``, ``aten::item``).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from windtunnel.provenance import cpu_model
from windtunnel.run_config import load_run_config
from windtunnel.training.trainer import train

PRESETS = Path(__file__).resolve().parents[1] / "configs" / "paper"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="bijection_transformer")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    parser.add_argument("--steps", type=int, default=40, help="steps in all; the last half is recorded (default 40)")
    parser.add_argument("--rows", type=int, default=25, help="operators listed per table (default 25)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    if args.steps < 4:
        raise SystemExit("bench/profile_step.py: --steps must be at least 4")
    recorded = args.steps // 2
    config = load_run_config(
        PRESETS / f"{args.preset}.toml",
        [f"train.device={args.device}", f"train.steps={args.steps}", f"train.log_every={args.steps}", "train.eval_every=0",
         "train.checkpoint_every=0", "train.snapshots_per_decade=0", "eval.n=64", *args.overrides],
    )
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
    marks: list[float] = []

    def on_step(step: int) -> None:
        if args.device == "cuda" and step in (args.steps - recorded, args.steps):
            torch.cuda.synchronize()
        if step in (args.steps - recorded, args.steps):
            marks.append(time.perf_counter())
        prof.step()

    with tempfile.TemporaryDirectory() as folder, profile(
        activities=activities, schedule=schedule(wait=0, warmup=args.steps - recorded - 1, active=recorded, repeat=1)
    ) as prof:
        train(config, Path(folder) / "run", progress=False, on_step=on_step)
    events = prof.key_averages()
    device_attr = "self_device_time_total" if hasattr(events[0], "self_device_time_total") else "self_cuda_time_total"
    host_us = sum(e.self_cpu_time_total for e in events)
    device_us = sum(getattr(e, device_attr, 0) for e in events)
    wall_s = (marks[-1] - marks[0]) / recorded if len(marks) == 2 else None

    def table(key: str) -> list[dict]:
        rows = sorted(events, key=lambda e: -getattr(e, key, 0))[: args.rows]
        return [{"op": e.key, "calls_per_step": round(e.count / recorded, 1), "us_per_step": round(getattr(e, key, 0) / recorded, 1)}
                for e in rows if getattr(e, key, 0) > 0]

    print(json.dumps({
        "preset": args.preset, "device": torch.cuda.get_device_name() if args.device == "cuda" else cpu_model(),
        "torch": torch.__version__, "compile": config.train.compile, "bf16": config.train.bf16, "recorded_steps": recorded,
        "wall_ms_per_step": round(wall_s * 1e3, 3) if wall_s else None,
        "host_ms_per_step": round(host_us / recorded / 1e3, 3),
        "device_ms_per_step": round(device_us / recorded / 1e3, 3) if args.device == "cuda" else None,
        "device_busy_share": round(device_us / recorded / 1e6 / wall_s, 3) if args.device == "cuda" and wall_s else None,
        "ops_per_step": round(sum(e.count for e in events) / recorded, 1),
        "top_host": table("self_cpu_time_total"),
        "top_device": table(device_attr) if args.device == "cuda" else [],
    }, indent=1))


if __name__ == "__main__":
    main()
