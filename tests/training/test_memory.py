"""The memory estimates that refuse what cannot fit: lower bounds of what is really held,
and a refusal exactly when the bound exceeds what is available."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from windtunnel.config import ConfigError
from windtunnel.memory import check_fits, format_bytes
from windtunnel.tunnels import make_tunnel


def _tensors(episode) -> list[torch.Tensor]:
    return [v for f in dataclasses.fields(episode) if torch.is_tensor(v := getattr(episode, f.name))]


def _held_bytes(episode) -> int:
    """The oracle: bytes of every tensor the returned episode holds (what a draw must keep)."""
    return sum(v.nbytes for v in _tensors(episode))


@pytest.mark.parametrize(
    "name, overrides, batch, horizon",
    [
        ("bijection", ["V=20"], 64, None),
        ("bijection", ["V=50", "with_replacement=true", "L=120"], 16, None),
        ("bijection", ["V=10", "query=true"], 32, 7),
        ("hmm", [], 64, None),
        ("hmm", ["S=8", "M=3", "K=40"], 16, 90),
        ("assoc_recall", [], 64, None),
        ("assoc_recall", ["n_pairs=3", "key_vocab=5", "value_vocab=9", "n_queries=6", "n_filler=2"], 16, 2),
    ],
)
def test_a_draw_holds_at_least_the_estimate_and_not_far_more(name, overrides, batch, horizon):
    tunnel = make_tunnel(name, overrides=overrides)
    held = _held_bytes(tunnel.sample(batch, generator=torch.Generator().manual_seed(0), horizon=horizon))
    estimate = tunnel.sample_bytes(batch, horizon)
    # A lower bound of the peak (the episode returned is held at the end; working copies come
    # on top), and a tight one: the few small tensors it leaves out (positions, padding of
    # the query) are under 10% of the total at these sizes.
    assert 0.9 * held <= estimate <= held, (estimate, held)


def test_check_fits_refuses_exactly_beyond_what_is_available():
    check_fits("a draw", 1000, "lower it", available=1000)  # equal fits
    with pytest.raises(ConfigError, match=r"^a draw needs at least 1001 B of memory but 1000 B is available: lower it$"):
        check_fits("a draw", 1001, "lower it", available=1000)


def test_format_bytes():
    assert [format_bytes(n) for n in (0, 1023, 1024, 1536 * 1024, 3 * 1024**4)] == ["0 B", "1023 B", "1.0 KiB", "1.5 MiB", "3.0 TiB"]


@pytest.mark.parametrize(
    "name, overrides, horizon",
    [
        ("bijection", ["V=20"], None),
        ("bijection", ["V=10", "query=true"], 7),
        ("bijection", ["V=12", "with_replacement=true", "L=30"], None),
        ("hmm", ["S=4", "M=3", "K=12"], None),
        ("hmm", ["S=8", "M=3", "K=40"], 9),
        ("assoc_recall", [], None),
        ("assoc_recall", ["n_pairs=3", "key_vocab=5", "value_vocab=9", "n_queries=6", "n_filler=2"], 2),
    ],
)
def test_the_estimate_is_exactly_the_bytes_each_sequence_holds(name, overrides, horizon):
    # The oracle: every tensor of the episode whose first axis is the batch (13 sequences, a
    # size no other axis has here), counted byte by byte. The few batch-free tensors (the
    # query positions) are what the lower bound above leaves out.
    tunnel = make_tunnel(name, overrides=overrides)
    batch = 13
    episode = tunnel.sample(batch, generator=torch.Generator().manual_seed(1), horizon=horizon)
    tensors = _tensors(episode)
    assert all(v.dim() == 0 or v.shape[0] != batch or batch not in v.shape[1:] for v in tensors)
    per_batch = sum(v.nbytes for v in tensors if v.dim() > 0 and v.shape[0] == batch)
    assert tunnel.sample_bytes(batch, horizon) == per_batch


@pytest.mark.parametrize("length", [5, 3])
def test_a_training_steps_estimate_holds_one_float32_attention_matrix_per_sequence_layer_and_head(tmp_path, write_config, length):
    """The trainer's step estimate (``_step_bytes``) counts the attention scores the backward
    pass keeps: a T x T float32 matrix (4 bytes an entry) per sequence, layer and head. Two
    configs that differ in their heads alone (same width, so nothing else changes) differ by
    exactly 4 * batch * layers * (extra heads) * T * T bytes; batch 3, 5 layers, heads 4 vs 2
    and T read off a drawn episode (10 or 6 tokens) make every factor count."""
    from windtunnel.run_config import load_run_config
    from windtunnel.training.trainer import _step_bytes

    path = write_config(tmp_path)
    common = ["model.n_layers=5", "model.d_model=16", f"tunnel.L={length}"]
    two, four = (load_run_config(path, [*common, f"model.n_heads={heads}"]) for heads in (2, 4))
    T = two.tunnel.sample(1, generator=torch.Generator().manual_seed(0)).tokens.shape[1]  # the oracle for T: what the model reads
    assert T == 2 * length  # a bijection episode: each of its L pairs is two tokens
    batch = 3
    assert _step_bytes(four, batch) - _step_bytes(two, batch) == 4 * batch * 5 * (4 - 2) * T * T
    # And the term is in the estimate, not beside it: a batch of 3 holds 3 times the activations of 1 on top of the data.
    assert _step_bytes(four, 3) - four.tunnel.sample_bytes(3) == 3 * (_step_bytes(four, 1) - four.tunnel.sample_bytes(1))
