"""Training-step throughput of the paper's two transformers on this machine's CPU.

Times one full step (forward, cross-entropy backward, gradient clipping at 1.0, AdamW)
at the paper's shapes and batch sizes, converts it to achieved GFLOP/s, and compares it
with (a) this machine's fp32 matmul rate, measured in the same run, and (b) a naive
reference: the same weights run the textbook way, each head's softmax attention in a
Python loop. Prints one JSON object; it measures, it asserts nothing about time.

    python bench/models.py

FLOPs count matmuls only (2 per multiply-add): Q/K/V/O projections, attention scores
and value mixing over the full ``T x T`` grid (the usual convention, though a causal
kernel may skip the upper half), both MLP matmuls and the head; a training step is
3x the forward (the backward pass costs two forward matmuls per matmul).
"""

from __future__ import annotations

import copy
import json
import math
import statistics
import time

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from windtunnel.models import Transformer, TransformerConfig

SHAPES = {
    # name: (config, vocab_size, num_classes, batch, seq_len, max_len)
    "bijection": (TransformerConfig(6, 6, 192, 768), 40, 20, 128, 39, 39),
    "hmm": (TransformerConfig(9, 8, 256, 1024), 106, 5, 64, 70, 100),
}
WARMUP, STEPS, REFERENCE_STEPS = 1, 4, 2


class NaiveReference(nn.Module):
    """The same transformer computed naively: per-head explicit softmax attention in a Python loop."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: Tensor) -> Tensor:
        m = self.model
        B, T = tokens.shape
        d_model, n_heads, d_head = m.d_model, m.n_heads, m.d_head
        x = m.token_embed(tokens) + m.pos_embed(torch.arange(T))  # [B, T, d_model]
        mask = torch.full((T, T), float("-inf")).triu(1)  # [T, T], -inf where the key is in the future
        for block in m.blocks:
            h = block.attn.ln(x)
            q, k, v = block.attn.qkv(h).split(d_model, dim=-1)  # each [B, T, d_model]
            heads = []
            for head in range(n_heads):
                cols = slice(head * d_head, (head + 1) * d_head)
                scores = q[..., cols] @ k[..., cols].transpose(1, 2) / math.sqrt(d_head) + mask  # [B, T, T]
                heads.append(torch.softmax(scores, dim=-1) @ v[..., cols])  # [B, T, d_head]
            x = x + block.attn.proj(torch.cat(heads, dim=-1))
            x = x + block.mlp.fc_out(F.gelu(block.mlp.fc_in(block.mlp.ln(x))))
        return m.head(m.ln_final(x))  # [B, T, C]


def forward_matmul_flops(config: TransformerConfig, batch: int, seq_len: int, num_classes: int) -> int:
    """Matmul FLOPs of one forward pass (see the module docstring for the convention)."""
    d, T = config.d_model, seq_len
    attention = 2 * T * d * 3 * d + 2 * T * d * d + 2 * (2 * T * T * d)  # QKV, O, scores, mixing
    mlp = 2 * (2 * T * d * config.d_mlp)
    n_attention = config.n_layers - len(config.no_attention_layers)
    return batch * (n_attention * attention + config.n_layers * mlp + 2 * T * d * num_classes)


def time_steps(model: nn.Module, tokens: Tensor, targets: Tensor, n_steps: int) -> float:
    """Median seconds of a full training step, after ``WARMUP`` untimed steps."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), weight_decay=0.01)
    times = []
    for step in range(WARMUP + n_steps):
        start = time.perf_counter()
        logits = model(tokens)  # [B, T, C]
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step >= WARMUP:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def matmul_gflops(n: int = 2048, repeats: int = 8) -> float:
    """The machine's fp32 ``torch.mm`` rate on ``n x n`` matrices: the best of ``repeats``.

    The best, not the median: this is the machine's capability, and contention from
    other processes (or a clock still ramping up) only ever makes a run slower.
    """
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, n, generator=generator), torch.randn(n, n, generator=generator)
    for _ in range(2):  # warm-up: thread pool, caches, clocks
        torch.mm(a, b)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - start)
    return 2 * n**3 / min(times) / 1e9


def main() -> None:
    torch.manual_seed(0)
    peak = matmul_gflops()
    result: dict[str, float | int | str] = {}
    steps: dict[str, tuple[float, float, int]] = {}
    for name, (config, vocab, classes, batch, seq_len, max_len) in SHAPES.items():
        generator = torch.Generator().manual_seed(0)
        model = Transformer(config, vocab_size=vocab, num_classes=classes, max_len=max_len, generator=generator)
        reference = NaiveReference(copy.deepcopy(model))
        tokens = torch.randint(0, vocab, (batch, seq_len), generator=generator)
        targets = torch.randint(0, classes, (batch, seq_len), generator=generator)
        with torch.no_grad():  # the reference is the same function, or the comparison means nothing
            difference = (reference(tokens) - model(tokens)).abs().max().item()
        assert difference < 1e-4, f"naive reference disagrees with the model by {difference}"
        step = time_steps(model, tokens, targets, STEPS)
        reference_step = time_steps(reference, tokens, targets, REFERENCE_STEPS)
        steps[name] = (step, reference_step, 3 * forward_matmul_flops(config, batch, seq_len, classes))
    peak = max(peak, matmul_gflops())  # measured before and after the steps, under the same load
    result["matmul_gflops"] = round(peak, 2)
    for name, (step, reference_step, flops) in steps.items():
        gflops = flops / step / 1e9
        result |= {
            f"{name}_step_s": round(step, 4),
            f"{name}_gflops": round(gflops, 2),
            f"{name}_fraction_of_matmul": round(gflops / peak, 3),
            f"{name}_reference_step_s": round(reference_step, 4),
            f"{name}_speedup": round(reference_step / step, 2),
        }
    result |= {"torch_threads": torch.get_num_threads(), "torch_version": torch.__version__}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
