"""Per-step cost of the paper-shape models on each device present: the plain step against every optimization.

    python bench/step.py [--steps 20] [--presets bijection_transformer hmm_transformer]
                         [--variants plain compile ...] [--devices cpu cuda] [--threads N]
                         [--groups 1 3 5] [--configs configs/cpu]

For each device (the CPU, and CUDA where torch sees one) and each preset of
``configs/paper``, the trainer itself (:func:`windtunnel.training.trainer.train`: sampling,
forward, loss, backward, clipping, AdamW, logging) runs ``--steps`` steps in each variant:

- ``plain``: the step in float32, uncompiled (only what the supervised positions need is computed);
- ``full_forward``: every position computed, then the supervised ones taken (the step
  before ``train.supervised_only``), the unoptimized reference;
- ``compile``: the plain step through ``torch.compile`` (static shapes);
- ``bf16`` and ``compile_bf16``: bfloat16 autocast, without and with compilation (the paper
  presets' own setting; measured on CUDA only, where the paper-scale runs train);
- ``host_data``: batches drawn on the host and copied over, as before ``train.data_on_device``
  (CUDA only: on a CPU the host is the device).

Steps/s come from the trainer's own ``metrics.jsonl`` intervals, the first one (compilation,
warm-up) left out; evaluation is cut to 64 sequences at the end, outside the timed intervals.
The FLOPs of one plain step (forward and backward) are counted by PyTorch's own
``torch.utils.flop_counter.FlopCounterMode``; achieved FLOP/s is that count times steps/s.
The data share is the wall time of drawing one batch as the trainer draws it by default (on
the device where that is CUDA; on a CPU, on the host) over the wall time of one plain step; on
CUDA the share of drawing on the host and copying is given beside it.

With ``--groups 1 3 5``, each group size trains that many seeds of the preset as one run
group (:mod:`windtunnel.training.group`, the plain variant) for ``--steps`` steps: the group's
steps/s, its throughput in runs x steps/s, and that throughput's ratio to the plain lone run's
steps/s measured in the same run (above 1: the group pays on that device).

``dispatched_ops_per_step`` counts the aten operations one plain training step dispatches
(a ``TorchDispatchMode`` counter around the trainer's own step, after two warm-up steps), and
with ``--groups`` those of one step of each group: on a GPU each is at least one kernel
launch from the host, so it is the launch count any machine can measure.

Prints one JSON object: per device and preset each variant's steps/s, FLOP/s and projected
minutes for the preset's full step count, and each variant's ratio to ``plain`` measured in
the same run. It measures; it asserts nothing about time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from windtunnel.run_config import RunConfig, load_run_config
from windtunnel.run_config import build_run_model
from windtunnel.training.trainer import train

from windtunnel.provenance import cpu_model

PRESETS = Path(__file__).resolve().parents[1] / "configs" / "paper"
# Each variant names both switches: the paper presets themselves compile and train in bf16.
VARIANTS = {
    "plain": ["train.compile=false", "train.bf16=false"],
    "full_forward": ["train.compile=false", "train.bf16=false", "train.supervised_only=false"],
    "compile": ["train.compile=true", "train.bf16=false"],
    "bf16": ["train.compile=false", "train.bf16=true"],
    "compile_bf16": ["train.compile=true", "train.bf16=true"],
    "host_data": ["train.compile=false", "train.bf16=false", "train.data_on_device=false"],
}
CUDA_ONLY = ("bf16", "compile_bf16", "host_data")


def devices_present() -> list[str]:
    return ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


def steps_per_s(config: RunConfig) -> float:
    """Median steps/s of one short training run's logged intervals after the first."""
    with tempfile.TemporaryDirectory() as folder:
        train(config, Path(folder) / "run", progress=False)
        records = [json.loads(line) for line in (Path(folder) / "run" / "metrics.jsonl").read_text().splitlines()]
    rates = [r["seq_per_s"] / config.train.batch_size for r in records if "seq_per_s" in r][1:]
    if not rates:
        raise SystemExit("bench/step.py: no timed interval after the first: raise --steps (at least 3)")
    return statistics.median(rates)


class _OpCounter(TorchDispatchMode):
    """Counts the aten operations dispatched inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def dispatched_ops_per_step(configs: list[RunConfig], *, group: bool) -> int:
    """Aten ops one training step dispatches (after two warm-up steps): the trainer's lone step
    of ``configs[0]``, or with ``group`` the step of ``configs`` as one run group."""
    from windtunnel.training import trainer
    from windtunnel.training.distributed import pick_device, setup_distributed
    from windtunnel.training.group import _GroupLoop

    device = pick_device(configs[0].train.device)
    dist = setup_distributed(device)
    interrupt = trainer._InterruptFlag()
    try:
        with tempfile.TemporaryDirectory() as folder:
            runs = configs if group else configs[:1]
            sessions = [trainer._set_up(c, Path(folder) / f"run{i}", device, dist, False, interrupt) for i, c in enumerate(runs)]
            step = _GroupLoop(sessions).step if group else (lambda k: trainer._step(sessions[0], k))
            step(0), step(1)
            with _OpCounter() as counter:
                step(2)
            for session in sessions:
                session.tracking.close(False)
            return counter.count
    finally:
        interrupt.restore()
        dist.close()


def group_steps_per_s(configs: list[RunConfig]) -> float:
    """Median steps/s of one short run group's logged intervals after the first (its first member's)."""
    from windtunnel.training.group import train_group

    with tempfile.TemporaryDirectory() as folder:
        train_group(configs, [Path(folder) / f"run{i}" for i in range(len(configs))], progress=False)
        records = [json.loads(line) for line in (Path(folder) / "run0" / "metrics.jsonl").read_text().splitlines()]
    rates = [r["seq_per_s"] / configs[0].train.batch_size for r in records if "seq_per_s" in r][1:]
    if not rates:
        raise SystemExit("bench/step.py: no timed interval after the first: raise --steps (at least 3)")
    return statistics.median(rates)


def step_flops(config: RunConfig, device: str) -> int:
    """FLOPs of one plain training step's forward and backward, counted by FlopCounterMode."""
    model = build_run_model(config).to(device)
    episode = config.training_tunnel(0).sample(config.train.batch_size, generator=torch.Generator().manual_seed(0)).to(device)
    with FlopCounterMode(display=False) as counter:
        logits = model(episode.tokens, at=episode.positions)
        F.cross_entropy(logits.flatten(0, 1), episode.targets.flatten()).backward()
    return counter.get_total_flops()


def data_seconds(config: RunConfig, device: str, repeats: int, *, on_device: bool) -> float:
    """Median wall seconds to draw one training batch on ``device`` (``on_device``) or on the
    host, and have it on ``device``."""
    times = []
    tunnel = config.training_tunnel(0)
    where = device if on_device else "cpu"
    tunnel.sample(config.train.batch_size, generator=torch.Generator(device=where).manual_seed(0))  # warm-up
    for i in range(repeats):
        start = time.perf_counter()
        episode = tunnel.sample(config.train.batch_size, generator=torch.Generator(device=where).manual_seed(i)).to(device)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        del episode
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="steps per measured run (default 20; at least 3)")
    parser.add_argument("--presets", nargs="*", default=["bijection_transformer", "hmm_transformer"])
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--devices", nargs="*", default=devices_present(), choices=["cpu", "cuda"])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch CPU threads (default: all)")
    parser.add_argument("--groups", nargs="*", type=int, default=[], help="run-group sizes to measure (e.g. 1 3 5)")
    parser.add_argument("--configs", type=Path, default=PRESETS, help="the presets' folder (default: configs/paper)")
    args = parser.parse_args()
    if "cuda" in args.devices and not torch.cuda.is_available():
        raise SystemExit("bench/step.py: --devices cuda, but torch sees no CUDA device")
    if "plain" not in args.variants:
        args.variants.insert(0, "plain")  # every ratio is to the plain step of the same run
    torch.set_num_threads(args.threads)
    log_every = max(1, args.steps // 4)

    results: dict[str, dict] = {}
    for device in args.devices:
        for preset in args.presets:
            base = [f"train.device={device}", f"train.steps={args.steps}", f"train.log_every={log_every}", "train.eval_every=0",
                    "train.checkpoint_every=0", "train.snapshots_per_decade=0", "eval.n=64"]
            preset_file = args.configs / f"{preset}.toml"
            config = load_run_config(preset_file, base)
            total_steps = load_run_config(preset_file).train.steps
            flops = step_flops(config, device)
            entry: dict = {"steps": total_steps, "flops_per_step": flops}
            for variant in args.variants:
                if variant in CUDA_ONLY and device != "cuda":
                    continue
                rate = steps_per_s(load_run_config(preset_file, [*base, *VARIANTS[variant]]))
                entry[variant] = {
                    "steps_per_s": round(rate, 3),
                    "flop_per_s": float(f"{flops * rate:.4g}"),
                    "projected_run_min": round(total_steps / rate / 60, 1),
                }
            plain = entry["plain"]["steps_per_s"]
            entry["over_plain"] = {v: round(entry[v]["steps_per_s"] / plain, 3) for v in args.variants if v in entry and v != "plain"}
            plain_config = load_run_config(preset_file, [*base, *VARIANTS["plain"]])
            entry["dispatched_ops_per_step"] = {"lone": dispatched_ops_per_step([plain_config], group=False)}
            for size in args.groups:
                members = [load_run_config(preset_file, [*base, *VARIANTS["plain"], f"train.seed={seed}"]) for seed in range(size)]
                rate = group_steps_per_s(members)
                entry[f"group_{size}"] = {"steps_per_s": round(rate, 3), "runs_steps_per_s": round(size * rate, 3),
                                          "over_plain_lone": round(size * rate / plain, 3)}
                entry["dispatched_ops_per_step"][f"group_{size}"] = dispatched_ops_per_step(members, group=True)
            repeats = max(3, args.steps)
            entry["data_share_of_plain_step"] = round(data_seconds(config, device, repeats, on_device=device == "cuda") * plain, 4)
            if device == "cuda":
                entry["host_data_share_of_plain_step"] = round(data_seconds(config, device, repeats, on_device=False) * plain, 4)
            results.setdefault(device, {})[preset] = entry
    print(json.dumps({"cpu": cpu_model(), "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
                      "torch": torch.__version__, "threads": args.threads, "steps_per_run": args.steps, "devices": results}, indent=2))


if __name__ == "__main__":
    main()
