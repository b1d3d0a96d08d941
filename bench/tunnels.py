"""Tunnel throughput: batched torch sampling + exact posteriors vs a per-sequence reference.

    python bench/tunnels.py [--batch 1024] [--repeats 5] [--reference-seqs 300]

Prints one JSON object. Both sides produce the same things for each sequence (a fresh
hypothesis, the tokens, the sampled targets and the exact posterior with its entropy),
measured in the same run so the ratio is meaningful on a shared, noisy machine. The
reference is written the way research code usually is: one sequence at a time, a
forward algorithm looping over time and states. A benchmark measures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

from windtunnel.tunnels import BijectionTunnel, HMMTunnel


def reference_bijection(rng: np.random.Generator, V: int, L: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One sequence: a random bijection, L distinct inputs, posterior by tracking used outputs."""
    mapping = rng.permutation(V)
    inputs = rng.permutation(V)[:L]
    tokens = np.zeros(2 * L, dtype=np.int64)
    posterior = np.zeros((L, V))
    entropy = np.zeros(L)
    used = np.zeros(V, dtype=bool)
    for k in range(L):
        y = mapping[inputs[k]]
        tokens[2 * k], tokens[2 * k + 1] = inputs[k], V + y
        free = ~used
        posterior[k] = free / free.sum()
        p = posterior[k][posterior[k] > 0]
        entropy[k] = -np.sum(p * np.log2(p))
        used[y] = True
    return tokens, posterior, entropy


def reference_hmm(rng: np.random.Generator, S: int, M: int, K: int, levels: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One sequence: Dirichlet rows quantized to the grid, a sampled path, the forward filter."""

    def quantize(p: np.ndarray) -> np.ndarray:
        counts = np.floor(p * levels)
        for row in range(p.shape[0]):
            order = np.argsort(-(p[row] * levels - counts[row]), kind="stable")
            counts[row, order[: int(levels - counts[row].sum())]] += 1
        return counts / levels

    T = quantize(rng.dirichlet(np.ones(S), size=S))
    E = quantize(rng.dirichlet(np.ones(M), size=S))
    pi = np.full(S, 1.0 / S)
    states = np.zeros(K, dtype=np.int64)
    observations = np.zeros(K, dtype=np.int64)
    state = rng.choice(S, p=pi)
    for t in range(K):
        states[t] = state
        observations[t] = rng.choice(M, p=E[state])
        state = rng.choice(S, p=T[state])
    tokens = np.concatenate([np.rint(T * levels).ravel(), np.rint(E * levels).ravel(), levels + 1 + observations])
    posterior = np.zeros((K, S))
    for t in range(K):
        for j in range(S):
            prior_j = pi[j] if t == 0 else np.dot(posterior[t - 1], T[:, j])
            posterior[t, j] = prior_j * E[j, observations[t]]
        posterior[t] /= posterior[t].sum()
    entropy = np.array([-np.sum(p[p > 0] * np.log2(p[p > 0])) for p in posterior])
    return tokens.astype(np.int64), posterior, entropy


def seqs_per_second(fn, n_seqs: int, repeats: int) -> float:
    """Median throughput over ``repeats`` timed calls of ``fn`` (after one warm-up call)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return n_seqs / statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--reference-seqs", type=int, default=300)
    args = parser.parse_args()
    generator = torch.Generator().manual_seed(0)
    rng = np.random.default_rng(0)
    n_ref = args.reference_seqs

    result: dict[str, float | int | str] = {"batch": args.batch, "torch_threads": torch.get_num_threads()}
    bijection = BijectionTunnel()
    cases = {
        "bijection": (
            lambda: bijection.sample(args.batch, generator=generator),
            lambda: [reference_bijection(rng, bijection.V, bijection.L) for _ in range(n_ref)],
        )
    }
    hmm = HMMTunnel()
    for K in (20, 50):
        cases[f"hmm_k{K}"] = (
            lambda K=K: hmm.sample(args.batch, generator=generator, horizon=K),
            lambda K=K: [reference_hmm(rng, hmm.S, hmm.M, K, hmm.levels) for _ in range(n_ref)],
        )
    for name, (ours, reference) in cases.items():
        ours_rate = seqs_per_second(ours, args.batch, args.repeats)
        reference_rate = seqs_per_second(reference, n_ref, max(1, args.repeats // 2))
        result[f"{name}_seq_per_s"] = round(ours_rate, 1)
        result[f"{name}_reference_seq_per_s"] = round(reference_rate, 1)
        result[f"{name}_speedup"] = round(ours_rate / reference_rate, 1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
