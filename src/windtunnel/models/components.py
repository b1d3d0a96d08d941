"""The building blocks both model families share: attention, feed-forward, residual blocks.

Every ``forward`` takes the call's trace (:data:`~windtunnel.models.trace.NULL_TRACE`
when untraced) and the layer index, and passes each activation through
``trace.record(name, x)``, which returns ``x`` unchanged unless an intervention
replaces it. Blocks are pre-norm: each sublayer reads ``LayerNorm(resid)`` and adds its
output back to the residual stream.
"""

from __future__ import annotations

import math
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from windtunnel.models.trace import NULL_TRACE, Trace

__all__ = ["Attention", "FeedForward", "MLPBlock", "MixerBlock", "TransformerBlock"]


class Attention(nn.Module):
    """Multi-head causal self-attention sublayer: ``LN -> Q, K, V -> softmax(Q K^T / sqrt(d_head)) V -> W_O``.

    The projections have no biases. Query/key/value biases would be redundant with the
    LayerNorm shift (``ln.bias @ W`` is already a bias), and without an output bias the
    attention output is exactly the sum of the heads' outputs: masking a head removes
    exactly its ``head_out``, masking all heads zeroes the sublayer.

    Two paths compute the same thing: the fused ``scaled_dot_product_attention`` kernel
    (training, and any trace that does not need the probabilities) and an explicit
    softmax that materializes ``scores`` and ``pattern`` for analysis.

    Args:
        d_model: residual width.
        n_heads: number of heads; ``d_head = d_model // n_heads``.
    """

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.ln = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)  # one matmul for W_Q, W_K, W_V
        self.proj = nn.Linear(d_model, d_model, bias=False)  # W_O

    def forward(self, x: Tensor, trace: Trace, layer: int, at: Tensor | None = None) -> Tensor:
        """``[B, T, d_model]`` residual stream -> ``[B, T, d_model]`` attention output.

        ``at`` (``[P]`` positions, untraced calls only): queries at those positions alone,
        keys and values at every position; returns ``[B, P, d_model]``, the rows ``at`` of
        the full output (the same numbers up to float rounding).
        """
        if at is not None:
            return self._at_positions(x, at)
        B, T, d_model = x.shape
        H, d_head = self.n_heads, self.d_head
        p = f"blocks.{layer}"
        h = trace.record(f"{p}.attn_in", self.ln(x))  # [B, T, d_model]
        qkv = self.qkv(h).view(B, T, 3, H, d_head).permute(2, 0, 3, 1, 4)  # [3, B, H, T, d_head]
        q = trace.record(f"{p}.attn.q", qkv[0])  # [B, H, T, d_head]
        k = trace.record(f"{p}.attn.k", qkv[1])  # [B, H, T, d_head]
        v = trace.record(f"{p}.attn.v", qkv[2])  # [B, H, T, d_head]
        if trace.explicit_attention or trace.needs(f"{p}.attn.scores") or trace.needs(f"{p}.attn.pattern"):
            z = self._explicit(q, k, v, trace, p)  # [B, H, T, d_head]
        else:
            z = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, H, T, d_head]
        keep = trace.head_keep(layer, z)  # [H] or None
        if keep is not None:
            z = z * keep.view(1, H, 1, 1)
        z = trace.record(f"{p}.attn.z", z)
        if trace.needs(f"{p}.attn.head_out"):
            W_O = self.proj.weight.view(d_model, H, d_head).permute(1, 2, 0)  # [H, d_head, d_model]
            head_out = trace.record(f"{p}.attn.head_out", torch.einsum("bhtf,hfd->bhtd", z, W_O))  # [B, H, T, d_model]
            if trace.replaces(f"{p}.attn.head_out"):
                # Only then is the per-head sum the computation; otherwise keep the single
                # matmul below so recording head_out leaves the output bit-identical.
                return head_out.sum(dim=1)  # [B, T, d_model]
        return self.proj(z.transpose(1, 2).reshape(B, T, d_model))  # [B, T, d_model]

    def _at_positions(self, x: Tensor, at: Tensor) -> Tensor:
        B, T, d_model = x.shape
        H, d_head = self.n_heads, self.d_head
        h = self.ln(x)  # [B, T, d_model]
        W_Q, W_KV = self.qkv.weight[:d_model], self.qkv.weight[d_model:]  # [d_model, d_model], [2 d_model, d_model]
        q = F.linear(h[:, at], W_Q).view(B, -1, H, d_head).transpose(1, 2)  # [B, H, P, d_head]
        kv = F.linear(h, W_KV).view(B, T, 2, H, d_head).permute(2, 0, 3, 1, 4)  # [2, B, H, T, d_head]
        causal = at.view(-1, 1) >= torch.arange(T, device=x.device)  # [P, T], key <= query
        z = F.scaled_dot_product_attention(q, kv[0], kv[1], attn_mask=causal)  # [B, H, P, d_head]
        return self.proj(z.transpose(1, 2).reshape(B, -1, d_model))  # [B, P, d_model]

    def _explicit(self, q: Tensor, k: Tensor, v: Tensor, trace: Trace, p: str) -> Tensor:
        T = q.shape[2]
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.d_head)  # [B, H, T_q, T_k]
        causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()  # [T_q, T_k], key <= query
        scores = trace.record(f"{p}.attn.scores", scores.masked_fill(~causal, float("-inf")))
        pattern = trace.record(f"{p}.attn.pattern", torch.softmax(scores, dim=-1))  # [B, H, T_q, T_k]
        return pattern @ v  # [B, H, T_q, d_head]


class FeedForward(nn.Module):
    """Feed-forward sublayer: ``LN -> Linear(d_model, d_hidden) -> GELU -> Linear(d_hidden, d_model)``.

    Args:
        d_model: residual width.
        d_hidden: hidden width (``d_mlp`` in a transformer).
    """

    def __init__(self, d_model: int, d_hidden: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d_model)
        self.fc_in = nn.Linear(d_model, d_hidden)
        self.fc_out = nn.Linear(d_hidden, d_model)

    def forward(self, x: Tensor, trace: Trace, layer: int) -> Tensor:
        """``[B, T, d_model]`` residual stream -> ``[B, T, d_model]`` MLP output."""
        p = f"blocks.{layer}"
        h = trace.record(f"{p}.mlp_in", self.ln(x))  # [B, T, d_model]
        pre = trace.record(f"{p}.mlp.pre", self.fc_in(h))  # [B, T, d_hidden]
        post = trace.record(f"{p}.mlp.post", F.gelu(pre))  # [B, T, d_hidden]
        return self.fc_out(post)  # [B, T, d_model]


class TransformerBlock(nn.Module):
    """Pre-norm transformer block: ``x += attn(x); x += mlp(x)``; ``attention=False`` drops the first.

    Args:
        d_model: residual width.
        n_heads: attention heads.
        d_mlp: feed-forward hidden width.
        attention: build the attention sublayer (``False``: the "attention disabled"
            variant, feed-forward and residual kept).
    """

    def __init__(self, d_model: int, n_heads: int, d_mlp: int, *, attention: bool = True) -> None:
        super().__init__()
        self.attn = Attention(d_model, n_heads) if attention else None
        self.mlp = FeedForward(d_model, d_mlp)

    @property
    def mixes_positions(self) -> bool:
        """Whether a position's output reads other positions (only through attention)."""
        return self.attn is not None

    def forward_at(self, x: Tensor, at: Tensor) -> Tensor:
        """Untraced, ``[B, T, d_model]`` -> ``[B, P, d_model]``: the residual stream after the
        block at the positions ``at`` only, computing nothing that other positions alone need
        (called on the last block that mixes positions, so ``attn`` is present)."""
        x = x[:, at] + self.attn(x, NULL_TRACE, 0, at=at)
        return x + self.mlp(x, NULL_TRACE, 0)

    def forward(self, x: Tensor, trace: Trace, layer: int) -> Tensor:
        """``[B, T, d_model]`` -> ``[B, T, d_model]`` residual stream."""
        p = f"blocks.{layer}"
        x = trace.record(f"{p}.resid_pre", x)
        if trace.skips(layer):
            return trace.record(f"{p}.resid_post", x)
        if self.attn is not None:
            x = x + trace.record(f"{p}.attn_out", self.attn(x, trace, layer))
        x = trace.record(f"{p}.resid_mid", x)
        x = x + trace.record(f"{p}.mlp_out", self.mlp(x, trace, layer))
        return trace.record(f"{p}.resid_post", x)


class MLPBlock(nn.Module):
    """Residual MLP block of the attention-free control: ``x += mlp(x)``, position by position.

    Args:
        d_model: residual width.
        d_hidden: hidden width.
    """

    mixes_positions = False

    def __init__(self, d_model: int, d_hidden: int) -> None:
        super().__init__()
        self.mlp = FeedForward(d_model, d_hidden)

    def forward(self, x: Tensor, trace: Trace, layer: int) -> Tensor:
        """``[B, T, d_model]`` -> ``[B, T, d_model]`` residual stream."""
        p = f"blocks.{layer}"
        x = trace.record(f"{p}.resid_pre", x)
        if trace.skips(layer):
            return trace.record(f"{p}.resid_post", x)
        x = x + trace.record(f"{p}.mlp_out", self.mlp(x, trace, layer))
        return trace.record(f"{p}.resid_post", x)


class MixerBlock(nn.Module):
    """Pre-norm residual block around a causal sequence mixer: ``x += mixer(LN(x))``.

    The recurrent controls' block (an LSTM, a Mamba selective-SSM block): the same residual
    stream, trace names and layer skips as the transformer's blocks, so layer ablation,
    probes and the value manifold read them alike.

    Args:
        d_model: residual width.
        mixer: ``[B, T, d_model] -> [B, T, d_model]``; position ``t``'s output may depend on
            positions ``<= t`` only.
    """

    mixes_positions = True

    def __init__(self, d_model: int, mixer: nn.Module) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d_model)
        self.mixer = mixer

    def forward_at(self, x: Tensor, at: Tensor) -> Tensor:
        """``[B, T, d_model]`` -> ``[B, P, d_model]`` at the positions ``at``: a recurrence needs
        every earlier step, so the whole block runs and the rest is dropped after it."""
        return self(x, NULL_TRACE, 0)[:, at]

    def forward(self, x: Tensor, trace: Trace, layer: int) -> Tensor:
        """``[B, T, d_model]`` -> ``[B, T, d_model]`` residual stream."""
        p = f"blocks.{layer}"
        x = trace.record(f"{p}.resid_pre", x)
        if trace.skips(layer):
            return trace.record(f"{p}.resid_post", x)
        h = trace.record(f"{p}.mixer_in", self.ln(x))  # [B, T, d_model]
        x = x + trace.record(f"{p}.mixer_out", self.mixer(h))  # [B, T, d_model]
        return trace.record(f"{p}.resid_post", x)
