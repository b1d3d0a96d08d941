"""The interpretability surface: pinned names, recording, scoping, and interventions.

Oracles are hand computations on recorded tensors (a head's output is ``z @ W_O``, a
uniform causal pattern makes ``z`` the running mean of the values, patching the residual
stream reproduces the donor's logits), not the code's own earlier output.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

import windtunnel.models.trace as trace_module
from windtunnel.models import (
    MLPConfig,
    Trace,
    TransformerConfig,
    build_model,
    mlp_control_names,
    run_with_trace,
    transformer_names,
)

VOCAB, CLASSES, MAX_LEN, D = 11, 5, 12, 16
CONFIGS = {
    "transformer": ("transformer", TransformerConfig(n_layers=3, n_heads=2, d_model=D, d_mlp=24)),
    "no_attention": ("transformer", TransformerConfig(3, 2, D, 24, no_attention_layers=(2,))),
    "mlp": ("mlp", MLPConfig(d_model=D, n_blocks=3, d_hidden=20)),
}


def make(name: str = "transformer"):
    kind, config = CONFIGS[name]
    model = build_model(kind, config, vocab_size=VOCAB, num_classes=CLASSES, max_len=MAX_LEN)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():  # std 1: sharp attention, so ablations show
            parameter.copy_(torch.randn(parameter.shape, generator=generator))
    return model.eval()


def tokens(seed: int = 1, batch: int = 3) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, MAX_LEN), generator=torch.Generator().manual_seed(seed))


# --- names ------------------------------------------------------------------------------

ONE_LAYER = [
    "embed",
    "pos_embed",
    "blocks.0.resid_pre",
    "blocks.0.attn_in",
    "blocks.0.attn.q",
    "blocks.0.attn.k",
    "blocks.0.attn.v",
    "blocks.0.attn.scores",
    "blocks.0.attn.pattern",
    "blocks.0.attn.z",
    "blocks.0.attn.head_out",
    "blocks.0.attn_out",
    "blocks.0.resid_mid",
    "blocks.0.mlp_in",
    "blocks.0.mlp.pre",
    "blocks.0.mlp.post",
    "blocks.0.mlp_out",
    "blocks.0.resid_post",
    "ln_final",
    "logits",
]
NO_ATTENTION_LAYER = ["resid_pre", "resid_mid", "mlp_in", "mlp.pre", "mlp.post", "mlp_out", "resid_post"]
MLP_BLOCK = ["resid_pre", "mlp_in", "mlp.pre", "mlp.post", "mlp_out", "resid_post"]


def test_canonical_names_are_pinned():
    assert transformer_names(1) == ONE_LAYER
    two = transformer_names(2, no_attention_layers=[1])
    assert two == ONE_LAYER[:-2] + [f"blocks.1.{n}" for n in NO_ATTENTION_LAYER] + ["ln_final", "logits"]
    assert mlp_control_names(1) == ["embed", "pos_embed", *[f"blocks.0.{n}" for n in MLP_BLOCK], "ln_final", "logits"]
    assert len(transformer_names(6)) == 2 + 6 * 16 + 2
    assert len(transformer_names(9, no_attention_layers=(7, 8))) == 2 + 7 * 16 + 2 * 7 + 2


EXPECTED_SHAPES = {  # B = 3, T = 12, H = 2, d_head = 8, d_model = 16, d_mlp = 24 (20 in the MLP), C = 5
    "attn.q": (3, 2, 12, 8), "attn.k": (3, 2, 12, 8), "attn.v": (3, 2, 12, 8), "attn.z": (3, 2, 12, 8),
    "attn.scores": (3, 2, 12, 12), "attn.pattern": (3, 2, 12, 12), "attn.head_out": (3, 2, 12, 16),
    "mlp.pre": (3, 12, 24), "mlp.post": (3, 12, 24), "logits": (3, 12, 5),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_full_trace_records_every_name_in_order_with_documented_shapes(name):
    model = make(name)
    _, trace = run_with_trace(model, tokens())
    assert list(trace) == model.activation_names
    hidden = 20 if name == "mlp" else 24
    for key, value in trace.activations.items():
        suffix = key.split(".", 2)[-1] if key.startswith("blocks.") else key
        expected = EXPECTED_SHAPES.get(suffix, (3, 12, D))
        if suffix.startswith("mlp."):
            expected = (3, 12, hidden)
        assert tuple(value.shape) == expected, key


def test_names_filter_takes_exact_names_and_globs():
    model = make()
    _, trace = run_with_trace(model, tokens(), ["blocks.1.attn.k", "blocks.*.resid_post"])
    assert list(trace) == ["blocks.0.resid_post", "blocks.1.attn.k", "blocks.1.resid_post", "blocks.2.resid_post"]
    assert trace.stack("blocks.*.resid_post").shape == (3, 3, MAX_LEN, D)
    with pytest.raises(KeyError, match="not recorded"):
        trace["blocks.0.attn.pattern"]
    with pytest.raises(KeyError, match="no recorded activation"):
        trace.stack("blocks.*.mlp_out")


@pytest.mark.parametrize(
    ("name", "options", "match"),
    [
        ("transformer", {"names": ["blocks.0.resid"]}, "did you mean"),
        ("transformer", {"names": ["blocks.*.attention"]}, "matches no activation"),
        ("mlp", {"names": ["blocks.*.attn.pattern"]}, "matches no activation"),
        ("transformer", {"replace": {"blocks.9.resid_post": torch.zeros(1)}}, "not an activation"),
        ("transformer", {"skip_layers": [3]}, "out of range"),
        ("transformer", {"mask_heads": {0: [2]}}, "out of range"),
        ("no_attention", {"mask_heads": {2: [0]}}, "has no attention"),
        ("mlp", {"mask_heads": {0: [0]}}, "has no attention"),
        ("transformer", {"names": (), "replace": {"blocks.0.mlp_out": torch.zeros(2, D)}}, "must broadcast"),
    ],
)
def test_bad_requests_fail_clearly(name, options, match):
    with pytest.raises(ValueError, match=match):
        make(name)(tokens(), trace=Trace(**options))


# --- tracing is observation only ----------------------------------------------------


@pytest.mark.parametrize("name", list(CONFIGS))
def test_tracing_changes_no_output(name):
    model = make(name)
    x = tokens()
    with torch.no_grad():
        plain = model(x)
        # No probabilities asked for: every layer stays on the fused path, bit for bit.
        attention = [] if name == "mlp" else ["*.attn.q", "*.attn.z", "*.attn.head_out"]
        cheap = model(x, trace=Trace(["blocks.*.resid_*", "blocks.*.mlp.*", *attention]))
        assert torch.equal(cheap, plain)
        # Everything recorded: identical to the explicit path with nothing recorded.
        everything = model(x, trace=Trace())
        explicit = model(x, trace=Trace((), explicit_attention=True))
        assert torch.equal(everything, explicit)
        torch.testing.assert_close(everything, plain, atol=1e-5, rtol=1e-5)  # fused vs explicit


def _hook_count(model) -> int:
    per_module = sum(len(v) for m in model.modules() for k, v in vars(m).items() if "hook" in k and isinstance(v, dict))
    module_globals = vars(torch.nn.modules.module)  # nn.Module's process-wide hooks
    per_process = sum(len(v) for k, v in module_globals.items() if k.startswith("_global") and isinstance(v, dict))
    return per_module + per_process


@pytest.mark.parametrize("name", ["transformer", "mlp"])
def test_trace_leaves_nothing_behind(name):
    model = make(name)
    x = tokens()
    attributes = {n: set(vars(m)) for n, m in model.named_modules()}
    hooks = _hook_count(model)
    with torch.no_grad():
        before = model(x)
        trace = Trace(mask_heads={0: [1]} if name == "transformer" else None, skip_layers=[1],
                      replace={"blocks.0.mlp_out": lambda y, _: 2 * y})
        model(x, trace=trace)
        def fail(y, name):
            raise RuntimeError("boom")

        with pytest.raises(RuntimeError, match="boom"):  # an intervention that fails mid-forward
            model(x, trace=Trace(replace={"blocks.1.mlp_out": fail}))
        after = model(x)
    assert torch.equal(after, before)
    assert _hook_count(model) == hooks == 0
    assert {n: set(vars(m)) for n, m in model.named_modules()} == attributes
    reference = weakref.ref(trace)
    del trace
    gc.collect()
    assert reference() is None  # the model kept no reference to the trace


def test_trace_is_reset_by_each_call_and_can_keep_gradients():
    model = make()
    trace = Trace(["blocks.0.resid_post"])
    model(tokens(1), trace=trace)
    first = trace["blocks.0.resid_post"]
    model(tokens(2), trace=trace)
    assert not torch.equal(trace["blocks.0.resid_post"], first) and len(trace) == 1
    assert not first.requires_grad
    _, kept = run_with_trace(model, tokens(), "blocks.0.resid_post", detach=False)
    assert kept["blocks.0.resid_post"].requires_grad


# --- what is recorded is what the weights say ---------------------------------------


def test_patterns_are_causal_distributions():
    _, trace = run_with_trace(make(), tokens(), ["blocks.*.attn.scores", "blocks.*.attn.pattern"])
    above = torch.ones(MAX_LEN, MAX_LEN, dtype=torch.bool).triu(1)
    for layer in range(3):
        pattern = trace[f"blocks.{layer}.attn.pattern"]
        assert (pattern[..., above] == 0).all() and torch.isinf(trace[f"blocks.{layer}.attn.scores"][..., above]).all()
        torch.testing.assert_close(pattern.sum(-1), torch.ones(3, 2, MAX_LEN))


def test_weight_accessors_reproduce_recorded_activations():
    model = make("no_attention")
    x = tokens()
    _, trace = run_with_trace(model, x)
    W_Q, W_K, W_V, W_O = model.W_Q, model.W_K, model.W_V, model.W_O
    assert W_Q.shape == W_K.shape == W_V.shape == (3, 2, D, 8) and W_O.shape == (3, 2, 8, D)
    assert all((w[2] == 0).all() for w in (W_Q, W_K, W_V, W_O))  # layer 2 has no attention: zeros
    close = dict(atol=1e-5, rtol=1e-5)
    for layer in range(2):
        p = f"blocks.{layer}."
        attn_in = trace[p + "attn_in"]
        for head in range(2):
            torch.testing.assert_close(trace[p + "attn.q"][:, head], attn_in @ W_Q[layer, head], **close)
            torch.testing.assert_close(trace[p + "attn.k"][:, head], attn_in @ W_K[layer, head], **close)
            torch.testing.assert_close(trace[p + "attn.v"][:, head], attn_in @ W_V[layer, head], **close)
            head_out = trace[p + "attn.z"][:, head] @ W_O[layer, head]
            torch.testing.assert_close(trace[p + "attn.head_out"][:, head], head_out, **close)
        torch.testing.assert_close(trace[p + "attn.head_out"].sum(1), trace[p + "attn_out"], **close)  # no output bias
    for layer in range(3):
        pre = trace[f"blocks.{layer}.mlp_in"] @ model.W_in[layer] + model.blocks[layer].mlp.fc_in.bias
        torch.testing.assert_close(trace[f"blocks.{layer}.mlp.pre"], pre.detach(), **close)
    torch.testing.assert_close(trace["logits"], trace["ln_final"] @ model.W_U + model.b_U, **close)
    assert torch.equal(trace["embed"], model.W_E[x]) and torch.equal(trace["pos_embed"][0], model.W_pos)
    W_Q[0] = 0  # accessors are copies
    assert (model.W_Q[0] != 0).any()


# --- interventions ------------------------------------------------------------------


def test_head_mask_is_confined_to_that_head():
    model = make()
    x = tokens()
    names = ["blocks.*.resid_pre", "blocks.1.attn.head_out", "blocks.1.attn_out", "blocks.0.resid_post"]
    _, base = run_with_trace(model, x, names)
    _, masked = run_with_trace(model, x, names, mask_heads={1: [0]})
    assert torch.equal(masked["blocks.0.resid_post"], base["blocks.0.resid_post"])  # nothing upstream moves
    assert torch.equal(masked["blocks.1.resid_pre"], base["blocks.1.resid_pre"])
    assert torch.equal(masked["blocks.1.attn.head_out"][:, 1], base["blocks.1.attn.head_out"][:, 1])
    assert (masked["blocks.1.attn.head_out"][:, 0] == 0).all()
    expected = base["blocks.1.attn_out"] - base["blocks.1.attn.head_out"][:, 0]
    torch.testing.assert_close(masked["blocks.1.attn_out"], expected, atol=1e-5, rtol=1e-5)
    assert (masked["blocks.2.resid_pre"] - base["blocks.2.resid_pre"]).abs().max() > 1e-2  # and downstream does


@pytest.mark.parametrize("name", ["transformer", "mlp"])
def test_skipped_layer_is_the_identity_on_the_residual_stream(name):
    _, trace = run_with_trace(make(name), tokens(), "blocks.*", skip_layers=[1])
    assert torch.equal(trace["blocks.1.resid_post"], trace["blocks.1.resid_pre"])
    assert torch.equal(trace["blocks.2.resid_pre"], trace["blocks.0.resid_post"])
    assert not any(key.startswith("blocks.1.") and "resid_p" not in key for key in trace)


def test_replacing_the_residual_stream_patches_in_the_donor_run():
    model = make()
    donor_logits, donor = run_with_trace(model, tokens(seed=2), "blocks.0.resid_post")
    patched = model(tokens(seed=1), trace=Trace((), replace={"blocks.0.resid_post": donor["blocks.0.resid_post"]}))
    assert torch.equal(patched, donor_logits)


def test_replacements_by_function_tensor_and_glob():
    model = make()
    x = tokens()
    with torch.no_grad():
        zero_attention = model(x, trace=Trace((), replace={"blocks.1.attn_out": lambda y, _: torch.zeros_like(y)}))
        all_masked = model(x, trace=Trace((), mask_heads={1: [0, 1]}))
        assert torch.equal(zero_attention, all_masked)
        everywhere = model(x, trace=Trace((), replace={"blocks.*.attn.z": torch.zeros(())}))
        assert torch.equal(everywhere, model(x, trace=Trace((), mask_heads={0: [0, 1], 1: [0, 1], 2: [0, 1]})))
        keep = torch.tensor([0.0, 1.0]).view(1, 2, 1, 1)
        by_head_out = model(x, trace=Trace((), replace={"blocks.1.attn.head_out": lambda h, _: h * keep}))
        torch.testing.assert_close(by_head_out, model(x, trace=Trace((), mask_heads={1: [0]})), atol=1e-5, rtol=1e-5)


def test_replaced_pattern_drives_the_values():
    model = make()
    T = MAX_LEN
    uniform = torch.ones(T, T).tril() / torch.arange(1, T + 1)[:, None]  # [T_q, T_k] running mean
    _, trace = run_with_trace(model, tokens(), ["blocks.0.attn.v", "blocks.0.attn.pattern", "blocks.0.attn.z"],
                              replace={"blocks.0.attn.pattern": uniform})
    v = trace["blocks.0.attn.v"]
    running_mean = v.cumsum(dim=2) / torch.arange(1, T + 1).view(1, 1, T, 1)
    assert torch.equal(trace["blocks.0.attn.pattern"], uniform.expand(3, 2, T, T))
    torch.testing.assert_close(trace["blocks.0.attn.z"], running_mean, atol=1e-5, rtol=1e-5)


def test_untraced_calls_share_only_a_stateless_null_trace():
    null = trace_module.NULL_TRACE
    assert vars(null) == {} and not hasattr(null, "activations")
