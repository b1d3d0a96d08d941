"""The recurrent controls (LSTM, Mamba): each mixer against a plain recurrence written here,
capacity matching within 1%, causality, the at= path, the trace surface and seeded init."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from windtunnel.cli import main
from windtunnel.models import LSTMConfig, LSTMControl, MambaConfig, MambaControl, TransformerConfig, build_model, count_params, run_with_trace
from windtunnel.models.names import mixer_control_names

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
SHAPE = dict(vocab_size=11, num_classes=4, max_len=24)


def small(kind: str):
    if kind == "lstm":
        return LSTMControl(LSTMConfig(d_model=16, n_layers=2, d_hidden=12), **SHAPE, generator=torch.Generator().manual_seed(0))
    return MambaControl(MambaConfig(d_model=16, n_layers=2, d_inner=24, d_state=4), **SHAPE, generator=torch.Generator().manual_seed(0))


@torch.no_grad()
def test_the_mamba_block_equals_a_sequential_selective_scan():
    model = small("mamba").double()
    block = model.blocks[0].mixer
    x = torch.randn(3, 13, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    # The published block, written out step by step (Gu and Dao 2023, Fig 3 and Alg 2).
    d_inner, N = block.A_log.shape
    xz = x @ block.in_proj.weight.T  # [B, T, 2 d_inner]
    u, z = xz[..., :d_inner], xz[..., d_inner:]
    K = block.conv1d.kernel_size[0]
    padded = F.pad(u, (0, 0, K - 1, 0))  # causal: position t sees t-K+1 .. t
    w = block.conv1d.weight[:, 0, :]  # [d_inner, K]
    conv = torch.stack([(padded[:, t : t + K, :] * w.T).sum(1) for t in range(13)], dim=1) + block.conv1d.bias
    u = F.silu(conv)  # [B, T, d_inner]
    rank = block.dt_proj.in_features
    projected = u @ block.x_proj.weight.T  # [B, T, rank + 2N]
    delta = F.softplus(projected[..., :rank] @ block.dt_proj.weight.T + block.dt_proj.bias)  # [B, T, d_inner]
    B_t, C_t = projected[..., rank : rank + N], projected[..., rank + N :]  # [B, T, N]
    A = -torch.exp(block.A_log)  # [d_inner, N]
    h = torch.zeros(3, d_inner, N, dtype=torch.float64)
    ys = []
    for t in range(13):
        h = torch.exp(delta[:, t, :, None] * A) * h + delta[:, t, :, None] * B_t[:, t, None, :] * u[:, t, :, None]
        ys.append((h * C_t[:, t, None, :]).sum(-1) + block.D * u[:, t])
    y = torch.stack(ys, dim=1) * F.silu(z)
    expected = y @ block.out_proj.weight.T
    # float64 throughout; the parallel scan reassociates the products: agreement to ~1e-12
    torch.testing.assert_close(block(x), expected, rtol=1e-9, atol=1e-12)


@torch.no_grad()
def test_the_lstm_mixer_equals_the_lstm_recurrence():
    model = small("lstm").double()
    mixer = model.blocks[1].mixer
    x = torch.randn(2, 9, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    lstm = mixer.lstm
    H = lstm.hidden_size
    h = c = torch.zeros(2, H, dtype=torch.float64)
    outputs = []
    for t in range(9):
        gates = x[:, t] @ lstm.weight_ih_l0.T + lstm.bias_ih_l0 + h @ lstm.weight_hh_l0.T + lstm.bias_hh_l0
        i, f, g, o = gates.split(H, dim=1)  # PyTorch's gate order
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        outputs.append(h)
    expected = torch.stack(outputs, dim=1) @ mixer.proj.weight.T
    torch.testing.assert_close(mixer(x), expected, rtol=1e-10, atol=1e-12)  # float64, same operations


@pytest.mark.parametrize("kind", ["lstm", "mamba"])
@torch.no_grad()
def test_causal_at_path_and_trace_surface(kind):
    model = small(kind).eval()
    tokens = torch.randint(0, 11, (4, 20), generator=torch.Generator().manual_seed(3))
    logits = model(tokens)
    changed = tokens.clone()
    changed[:, 12:] = (changed[:, 12:] + 1) % 11
    # position t depends on tokens[:, :t+1] only
    torch.testing.assert_close(model(changed)[:, :12], logits[:, :12], rtol=0, atol=0)
    at = torch.tensor([3, 7, 19])
    torch.testing.assert_close(model(tokens, at=at), logits[:, at], rtol=1e-5, atol=1e-6)  # float32: same ops, another order
    out, trace = run_with_trace(model, tokens)
    assert list(trace) == mixer_control_names(2) == model.activation_names
    torch.testing.assert_close(out, logits)
    _, skipped = run_with_trace(model, tokens, "blocks.1.*", skip_layers=[1])
    assert torch.equal(skipped["blocks.1.resid_post"], skipped["blocks.1.resid_pre"])


@pytest.mark.parametrize("kind", ["lstm", "mamba"])
def test_initialization_is_the_generator_s_alone(kind):
    torch.manual_seed(123)
    a = small(kind).state_dict()
    torch.manual_seed(999)  # the global RNG must not matter
    b = small(kind).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    if kind == "mamba":
        mixer = small(kind).blocks[0].mixer
        dt = F.softplus(mixer.dt_proj.bias)
        assert 1e-3 <= dt.min() and dt.max() <= 0.1 + 1e-6  # the published step-size range
        assert torch.equal(-torch.exp(mixer.A_log[0]), -torch.arange(1.0, 5.0))


@pytest.mark.parametrize("kind, cls", [("lstm", LSTMControl), ("mamba", MambaControl)])
def test_matched_within_one_percent_of_each_transformer(kind, cls):
    for transformer, shape in [
        (TransformerConfig(6, 4, 48, 192), dict(vocab_size=27, num_classes=5, max_len=100)),
        (TransformerConfig(4, 4, 64, 256), dict(vocab_size=40, num_classes=20, max_len=38)),
    ]:
        model = build_model(kind, {"d_model": transformer.d_model, "matched_to": vars(transformer) | {}}, **shape)
        target = count_params(build_model("transformer", transformer, **shape))
        assert abs(count_params(model) - target) <= 0.01 * target
        assert model.config.n_layers == transformer.n_layers  # the transformer's depth where it fits
        # the resolved config rebuilds the same shape without sizing again
        again = cls(model.config, **shape)
        assert count_params(again) == count_params(model)


def test_a_config_without_sizes_or_a_transformer_is_refused():
    from windtunnel.config import ConfigError

    with pytest.raises(ConfigError, match="undetermined"):
        LSTMConfig(d_model=16, n_layers=2)
    with pytest.raises(ConfigError, match="differs from matched_to.d_model"):
        MambaConfig(d_model=16, matched_to=TransformerConfig(2, 2, 32, 64))


@pytest.mark.parametrize("preset", sorted(p.relative_to(CONFIGS).as_posix() for p in CONFIGS.glob("*/*_*.toml") if p.stem.endswith(("_lstm", "_mamba"))))
def test_info_shows_every_control_preset_matched_within_one_percent(preset, capsys):
    assert main(["info", str(CONFIGS / preset), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert abs(info["mismatch"]) < 0.01 and abs(info["params"] - info["target_params"]) <= 0.01 * info["target_params"]


@pytest.mark.parametrize("kind, width", [("lstm", "d_hidden"), ("mamba", "d_inner")])
def test_a_control_trains_evaluates_and_is_analyzed_like_the_transformer(kind, width, tmp_path, capsys):
    from windtunnel.run_config import run_config_from_mapping
    from windtunnel.training.trainer import train

    config = run_config_from_mapping(
        {
            "tunnel": {"name": "hmm", "S": 2, "M": 2, "K": 6, "grid": 0.25},
            "model": {"kind": kind, "d_model": 16, "n_layers": 2, width: 16},
            "train": {"steps": 8, "batch_size": 16, "eval_every": 4, "checkpoint_every": 4, "log_every": 4},
            "eval": {"n": 64, "batch_size": 64, "bootstrap": 10, "horizons": [6, 9]},
        }
    )
    whole = train(config, tmp_path / "run", progress=False).model.state_dict()

    class Stop(Exception):
        pass

    def stop_after_five(step: int) -> None:
        if step == 5:
            raise Stop  # dies between checkpoints (the last one at step 4)

    with pytest.raises(Stop):
        train(config, tmp_path / "cut", progress=False, on_step=stop_after_five)
    resumed = train(config, tmp_path / "cut", resume=True, progress=False).model.state_dict()
    assert all(torch.equal(whole[name], resumed[name]) for name in whole)  # exact resume, as the transformer's
    assert main(["eval", str(tmp_path / "run"), "--relabel"]) == 0
    capsys.readouterr()
    assert main(["analyze", str(tmp_path / "run")]) == 0
    captured = capsys.readouterr()
    written = json.loads(captured.out)
    assert {"layer_ablation", "linear_probes", "value_manifold", "relabeling", "length_generalization"} <= set(written)
    skipped = [line for line in captured.err.splitlines() if line.startswith("[analyze] skipped ")]
    assert any(line.startswith("[analyze] skipped head_ablation: ") and "attention" in line for line in skipped)
