"""Evaluation throughput: one batched forward per batch of sequences vs one forward per prefix.

    python bench/eval.py [--n 1024] [--reference-n 24] [--scale cpu|paper] [--device cpu|cuda]

For the transformer presets of both tunnels at a scale (``configs/cpu`` by default, or the
paper's; freshly initialized: speed does not depend on training), scores every supervised
position of every sequence with all three metrics (``mae_aggregate_bits``, ``mae_bits``,
``kl_bits``) as the trainer does: the held-out set moved to the device once, one batched
forward per batch. The reference is how research code usually evaluates a causal model: one
forward pass per prefix per sequence at batch 1, taking the last position's prediction. Both
are measured in the same run and give the same numbers (checked). Also given: what the
preset's own evaluations cost over a whole run (``eval.n`` sequences every
``train.eval_every`` steps). Prints one JSON object; it asserts nothing about time.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from windtunnel.evaluation import EvalSet, evaluate, model_predictor, score
from windtunnel.run_config import load_run_config
from windtunnel.run_config import build_run_model

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@torch.no_grad()
def per_prefix_predictions(model: torch.nn.Module, episode) -> torch.Tensor:
    """``[B, P, C]`` predictions, one forward pass per (sequence, supervised position)."""
    rows = []
    for i in range(episode.batch_size):
        row = []
        for pos in episode.positions.tolist():
            logits = model(episode.tokens[i : i + 1, : pos + 1])[0, -1]  # [C]
            row.append(torch.softmax(logits.double(), dim=-1))
        rows.append(torch.stack(row))
    return torch.stack(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1024, help="sequences for the batched evaluation")
    parser.add_argument("--reference-n", type=int, default=24, help="sequences for the per-prefix reference")
    parser.add_argument("--scale", choices=["cpu", "paper"], default="cpu", help="which presets (default cpu)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where the model runs (default cpu)")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench/eval.py: --device cuda, but torch sees no CUDA device")
    result: dict[str, float | int | str] = {"torch_threads": torch.get_num_threads(), "scale": args.scale, "device": args.device}
    for name in ("bijection", "hmm"):
        config = load_run_config(CONFIGS / args.scale / f"{name}_transformer.toml")
        tunnel = config.tunnel
        model = build_run_model(config).eval().to(args.device)
        eval_set = EvalSet.draw(tunnel, horizon=tunnel.horizon, n=args.n, batch_size=config.eval.batch_size, seed=1).to(args.device)
        predictor = model_predictor(model)
        evaluate(predictor, EvalSet(eval_set.episodes[:1], eval_set.horizon), references=False)  # warm-up
        start = time.perf_counter()
        ours = evaluate(predictor, eval_set, references=False)
        ours_s = time.perf_counter() - start

        subset = tunnel.sample(args.reference_n, generator=torch.Generator().manual_seed(2)).to(args.device)
        start = time.perf_counter()
        reference = score([per_prefix_predictions(model, subset)], [subset])
        reference_s = time.perf_counter() - start
        check = score([predictor(subset)], [subset])
        for metric in ("mae_aggregate_bits", "mae_bits", "kl_bits"):  # same numbers, up to float32 kernels
            assert abs(check[metric] - reference[metric]) < 1e-4, (name, metric, check[metric], reference[metric])

        result[f"{name}_seq_per_s"] = round(ours["n"] / ours_s, 1)
        result[f"{name}_reference_seq_per_s"] = round(args.reference_n / reference_s, 1)
        result[f"{name}_speedup"] = round((ours["n"] / ours_s) / (args.reference_n / reference_s), 1)
        evals = config.train.steps // config.train.eval_every if config.train.eval_every else 1
        result[f"{name}_eval_min_per_run"] = round(evals * config.eval.n / (ours["n"] / ours_s) / 60, 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
