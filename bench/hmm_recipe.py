"""What moves the HMM phase change: the CPU HMM transformer under candidate recipes, over seeds.

    python bench/hmm_recipe.py [--recipes baseline lr_5e-3 ...] [--seeds 0 1 2] [--until 5000]
                               [--parallel 2] [--out DIR] [--recipe NAME=KEY=VALUE,KEY=VALUE]

Each (recipe, seed) trains ``configs/cpu/hmm_transformer.toml`` with the recipe's
overrides through :func:`windtunnel.training.trainer.train` itself, one thread per run
(as ``reproduce`` runs it), evaluating on the preset's held-out set every 250 steps. With
``--until`` (a multiple of 250) a run stops there (the learning-rate schedule is still the full run's, so the
numbers are those of the full recipe at that step): ``--until`` = a third of the steps asks
whether a recipe leaves the plateau within the first third of training. Prints one JSON
object: per recipe and seed, the first step at which ``mae_bits`` falls below 0.08 (the
plateau sits near 0.105; ``null``: not yet), ``kl_bits`` / ``mae_bits`` at K = 20, 30, 50
at the last step trained, and per layer how much observation positions attend to the
observations (:func:`history_attention`: what the phase change is); per recipe, the median
over seeds. The timing of the phase change
is chaotic in the seed and the floating-point path, so read the spread, never one seed.
Run directories stay in ``--out``: run the same command again (or with more recipes or
seeds) and finished runs are reused, interrupted ones resumed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import torch

from windtunnel.config import ConfigError
from windtunnel.files import atomic_write_text
from windtunnel.run_config import load_run_config
from windtunnel.history import HMM_PLATEAU_EXIT_MAE_BITS, plateau_exit_step, read_metrics
from windtunnel.runs import evaluate_run, load_run_model, read_run_config
from windtunnel.training.checkpoint import read_resume_step
from windtunnel.training.trainer import train

PRESET = Path(__file__).resolve().parents[1] / "configs" / "cpu" / "hmm_transformer.toml"
EVAL_EVERY = 250
HORIZONS = (20, 30, 50)

#: The CPU preset of the previous stop (4 layers of width 64, GPT-2's init 0.02; lr 5e-3 after
#: 1,000 warm-up steps, 12,000 steps) and the one before it (lr 3e-3 after 200 warm-up steps,
#: 15,000 steps): the recipes measured against them carry them, so each name means what it meant
#: when measured.
PREVIOUS_PRESET = ("model.n_layers=4", "model.d_model=64", "model.d_mlp=256", "model.init_std=0.02")
OLDER_PRESET = (*PREVIOUS_PRESET, "train.lr=3e-3", "train.warmup_steps=200", "train.steps=15000")
_DEPTH6 = ("model.n_layers=6", "model.d_model=48", "model.d_mlp=192")

#: Candidate recipes: overrides of the CPU preset. ``--recipe`` adds more.
RECIPES: dict[str, tuple[str, ...]] = {
    "baseline": (),  # the preset: 6 layers of width 48, init 0.04, lr 5e-3 after 1,000 warm-up steps, 12,000 steps
    "previous_preset": PREVIOUS_PRESET,
    "older_preset": OLDER_PRESET,
    # Measured against the previous preset (docs/benchmarks.md):
    "depth6_d48": (*PREVIOUS_PRESET, *_DEPTH6),  # 175k parameters vs 207k, deeper
    "depth6_d48_init_std_0.04": (*PREVIOUS_PRESET, *_DEPTH6, "model.init_std=0.04"),  # = baseline
    "depth8_d48": (*PREVIOUS_PRESET, "model.n_layers=8", "model.d_model=48", "model.d_mlp=192"),
    # The initial weights' scale: attention logits start 4x larger, the plateau comes in half the steps.
    "init_std_0.04": (*PREVIOUS_PRESET, "model.init_std=0.04"),
    "sharper_emissions_first": (  # E sharper first (T stays at 1): the previous state is nearly observed
        *PREVIOUS_PRESET,
        "tunnel.transition_concentration=1.0",
        "train.curriculum.param=concentration",
        "train.curriculum.start=0.3",
        "train.curriculum.steps=3000",
    ),
    "sticky_first_6000": (  # states persist first, annealed over half of training
        *PREVIOUS_PRESET,
        "train.curriculum.param=stickiness",
        "train.curriculum.start=0.5",
        "train.curriculum.steps=6000",
        "train.curriculum.shape=linear",
    ),
    "beta1_0.98": (*PREVIOUS_PRESET, "train.betas=[0.98, 0.999]"),  # momentum over ~50 steps of a weak signal
    "batch_32_24k": (  # twice the updates for the same sequences
        *PREVIOUS_PRESET, "train.batch_size=32", "train.steps=24000", "train.warmup_steps=2000",
    ),
    "lr_8e-3": ("train.lr=8e-3",),  # on the baseline: its weights are twice as large, each update relatively half
    # Measured against the older preset:
    "lr_5e-3_warmup_1000": (*OLDER_PRESET, "train.lr=5e-3", "train.warmup_steps=1000"),  # the previous preset's recipe
    "lr_8e-3_warmup_1500": (*OLDER_PRESET, "train.lr=8e-3", "train.warmup_steps=1500"),
    "lr_5e-3_batch_32": (*OLDER_PRESET, "train.lr=5e-3", "train.warmup_steps=1000", "train.batch_size=32"),
    "lr_5e-3": (*OLDER_PRESET, "train.lr=5e-3"),
    "warmup_1000": (*OLDER_PRESET, "train.warmup_steps=1000"),
    "batch_32": (*OLDER_PRESET, "train.batch_size=32"),  # half the cost of a step: twice the steps per minute
    "batch_128": (*OLDER_PRESET, "train.batch_size=128"),
    "beta2_0.95": (*OLDER_PRESET, "train.betas=[0.9, 0.95]"),
    "older_depth8_d48": (*OLDER_PRESET, "model.n_layers=8", "model.d_model=48", "model.d_mlp=160"),  # 197k parameters
    "older_depth6_d52": (*OLDER_PRESET, "model.n_layers=6", "model.d_model=52", "model.d_mlp=208"),  # 204k vs 207k, deeper
    "concentration_curriculum": (  # sharper HMMs first: T is worth more to the prediction
        *OLDER_PRESET,
        "train.curriculum.param=concentration",
        "train.curriculum.start=0.3",
        "train.curriculum.steps=3000",
    ),
    "transition_sharp_first": (  # only T sharper first: the past says more about the current state
        *OLDER_PRESET,
        "tunnel.transition_concentration=1.0",
        "train.curriculum.param=transition_concentration",
        "train.curriculum.start=0.2",
        "train.curriculum.steps=3000",
    ),
    "sticky_first": (  # states persist first: reading the earlier observations pays without T
        *OLDER_PRESET,
        "train.curriculum.param=stickiness",
        "train.curriculum.start=0.5",
        "train.curriculum.steps=3000",
        "train.curriculum.shape=linear",
    ),
}


def history_attention(run_dir: Path, n: int = 256) -> list[float]:
    """Per layer, the largest share (over heads) of attention that observation positions
    ``o_2..o_K`` give to observation tokens (themselves and earlier ones), on ``n`` fresh
    sequences of the run's tunnel. On the plateau the model attends almost only to the header
    (shares of about 0.2 at most: its prediction is the stationary distribution of T times the current
    emission column); the phase change is a head that reads the recent observations (share ~1).
    """
    config, model, _ = load_run_model(run_dir)
    tunnel = config.tunnel
    episode = tunnel.sample(n, generator=torch.Generator().manual_seed(2**31 - 1))
    names = [f"blocks.{layer}.attn.pattern" for layer in sorted(model.attention_heads)]
    with torch.no_grad():
        _, trace = model.run_with_trace(episode.tokens, names)
    header = tunnel.header_len
    shares = []
    for name in names:
        pattern = trace[name][:, :, header + 1 :, :]  # [B, H, K - 1, T]: from o_2..o_K
        shares.append(round(pattern[..., header:].sum(-1).mean((0, 2)).max().item(), 3))
    return shares


class _Stop(Exception):
    """Raised from the step callback at ``--until``."""


def run_one(recipe: str, overrides: tuple[str, ...], seed: int, until: int | None, run_dir: str) -> dict:
    """Train one (recipe, seed) to ``until`` and score it; runs in a worker process.

    The result is also written to ``run_dir/result.json``; a run found finished there is
    not trained again, and one found interrupted resumes from its last checkpoint (every
    250 steps), so a long study survives a kill and can grow by recipes and seeds.
    """
    torch.set_num_threads(1)
    run_dir_path = Path(run_dir)
    config = load_run_config(
        PRESET, [*overrides, f"train.seed={seed}", f"train.eval_every={EVAL_EVERY}", f"train.checkpoint_every={EVAL_EVERY}"]
    )
    stop = until if until is not None and until < config.train.steps else None
    identity = {"recipe": recipe, "overrides": list(overrides), "seed": seed, "until": stop}
    result_file = run_dir_path / "result.json"
    if result_file.is_file():
        stored = json.loads(result_file.read_text())
        if {k: stored.get(k) for k in identity} == identity:
            return stored
        shutil.rmtree(run_dir_path)  # a result of another recipe under this name: start over
    resume = run_dir_path.is_dir() and read_resume_step(run_dir_path) is not None and read_run_config(run_dir_path) == config
    if run_dir_path.is_dir() and not resume:
        shutil.rmtree(run_dir_path)  # died before its first checkpoint, or another config: nothing to keep

    def stop_at(step: int) -> None:
        if step == stop:
            raise _Stop

    started = time.perf_counter()
    try:
        train(config, run_dir_path, resume=resume, progress=False, on_step=stop_at)
    except _Stop:
        pass
    wall = time.perf_counter() - started
    records = read_metrics(run_dir_path)
    evals = [(r["step"], r["eval_mae_bits"], r["eval_kl_bits"]) for r in records if "eval_mae_bits" in r]
    exit_step = plateau_exit_step(records)
    scores = evaluate_run(run_dir_path, horizons=HORIZONS, write=False)
    result = {
        **identity,
        "steps_trained": scores["step"],
        "plateau_exit_step": exit_step,
        "kl_bits": {str(h): round(scores["horizons"][str(h)]["kl_bits"], 6) for h in HORIZONS},
        "mae_bits": {str(h): round(scores["horizons"][str(h)]["mae_bits"], 5) for h in HORIZONS},
        "history_attention": history_attention(run_dir_path),
        "eval_curve": [[step, round(mae, 4), round(kl, 5)] for step, mae, kl in evals],
        "train_wall_s_this_call": round(wall, 1),
    }
    atomic_write_text(result_file, json.dumps(result))
    return result


def parse_recipe(text: str) -> tuple[str, tuple[str, ...]]:
    name, eq, rest = text.partition("=")
    if not eq or not name or not rest:
        raise ConfigError(f"--recipe {text!r} is not NAME=KEY=VALUE[,KEY=VALUE...] (e.g. lr_4e-3=train.lr=4e-3)")
    return name, tuple(part for part in rest.split(",") if part)


def summarize(runs: list[dict], total_steps: int) -> dict:
    exits = [r["plateau_exit_step"] for r in runs]
    finite = sorted(e if e is not None else float("inf") for e in exits)
    median_exit = statistics.median(finite) if finite else None
    return {
        "median_plateau_exit_step": None if median_exit in (None, float("inf")) else median_exit,
        "every_seed_exits_by_a_third": all(e is not None and e <= total_steps / 3 for e in exits),
        "median_kl_bits": {str(h): statistics.median(r["kl_bits"][str(h)] for r in runs) for h in HORIZONS},
        "seeds": {r["seed"]: {k: v for k, v in r.items() if k not in ("recipe", "overrides", "seed", "until")} for r in runs},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", nargs="*", default=list(RECIPES), help=f"recipes to run (default all: {', '.join(RECIPES)})")
    parser.add_argument("--recipe", action="append", default=[], help="an extra recipe NAME=KEY=VALUE[,KEY=VALUE...]")
    parser.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2])
    parser.add_argument("--until", type=int, default=None, help="stop every run at this step (default: train to the end)")
    parser.add_argument("--parallel", type=int, default=2, help="runs side by side, one thread each (default 2)")
    parser.add_argument("--out", default=None, help="keep the run directories here (default: a temporary folder)")
    args = parser.parse_args()
    try:
        # Recipes added with --recipe always run, and may also be named in --recipes.
        extra = dict(parse_recipe(text) for text in args.recipe)
        known = {**RECIPES, **extra}
        unknown = [name for name in args.recipes if name not in known]
        if unknown:
            raise ConfigError(f"unknown recipe {unknown[0]!r}; known: {', '.join(known)} (or add one with --recipe)")
        recipes = {name: known[name] for name in args.recipes}
        recipes.update(extra)
        steps = {name: load_run_config(PRESET, overrides).train.steps for name, overrides in recipes.items()}
        if args.until is not None and (args.until < EVAL_EVERY or args.until % EVAL_EVERY):
            raise ConfigError(f"--until {args.until} is out of range: need a positive multiple of {EVAL_EVERY} (the checkpoint interval)")
    except ConfigError as error:
        print(f"hmm_recipe: error: {error}", file=sys.stderr)
        sys.exit(2)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="hmm_recipe_"))
    if out.exists() and not out.is_dir():
        print(f"hmm_recipe: error: --out {str(out)!r} is a file: give a folder (new, or one from an earlier study to extend)", file=sys.stderr)
        sys.exit(2)
    jobs = [(name, overrides, seed) for name, overrides in recipes.items() for seed in args.seeds]
    with ProcessPoolExecutor(max_workers=args.parallel, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(run_one, name, overrides, seed, args.until, str(out / f"{name}_seed{seed}")) for name, overrides, seed in jobs]
        runs = [future.result() for future in futures]
    result = {
        "preset": str(PRESET.name),
        "preset_steps": load_run_config(PRESET).train.steps,
        "until": args.until,
        "plateau_exit_mae_bits": HMM_PLATEAU_EXIT_MAE_BITS,
        "runs_in": str(out),
        "recipes": {
            name: {"overrides": list(overrides), "steps": steps[name], **summarize([r for r in runs if r["recipe"] == name], steps[name])}
            for name, overrides in recipes.items()
        },
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
