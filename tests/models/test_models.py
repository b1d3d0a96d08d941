"""Model truth: causality, both attention paths against an independent manual forward,
ablations against hand computations, parameter counts against closed forms, capacity
matching, checkpoint round trips, config validation, the family registry (a toy family
registered from here) and the run identity analyses group by.

The oracle (:func:`manual_forward`) is written here from the raw ``state_dict`` in
float64, one head at a time with an explicit softmax, and shares no code with the models.
"""

from __future__ import annotations

import dataclasses
import io
import math
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
import torch.nn.functional as F

from windtunnel.analysis import ANALYSES, Run
from windtunnel.analysis.base import Configuration, RunKey, by_configuration
from windtunnel.config import ConfigError, check_field_types
from windtunnel.models import (
    MODELS,
    PARTS,
    MLPConfig,
    MLPControl,
    Role,
    SequenceModel,
    Trace,
    Transformer,
    TransformerConfig,
    build_model,
    count_params,
    match_transformer,
    mlp_param_count,
    model_class,
    params_by_part,
    register_model,
    run_with_trace,
    size_mlp,
)
from windtunnel.models.config import resolve_max_len
from windtunnel.run_config import run_config_from_mapping
from windtunnel.run_config import build_run_model

VOCAB, CLASSES, MAX_LEN = 11, 5, 12
TINY = TransformerConfig(n_layers=3, n_heads=2, d_model=16, d_mlp=24)
TINY_NO_ATTN = TransformerConfig(n_layers=3, n_heads=2, d_model=16, d_mlp=24, no_attention_layers=(2,))
TINY_MLP = MLPConfig(d_model=16, n_blocks=3, d_hidden=20)
KINDS = {
    "transformer": ("transformer", TINY),
    "no_attention": ("transformer", TINY_NO_ATTN),
    "mlp": ("mlp", TINY_MLP),
}

# float32 model vs float64 oracle: float32 rounds each op at ~6e-8 relative; through
# three blocks the accumulated error stays ~1e-6 relative (observed: 6e-6 absolute on
# logits up to 13), while any real mistake (a wrong mask, a missing bias) is O(0.1).
ORACLE_TOL = dict(atol=2e-5, rtol=2e-5)


def make(name: str, seed: int = 0):
    """A model with weights drawn large enough (std 1) that attention is far from uniform."""
    kind, config = KINDS[name]
    model = build_model(kind, config, vocab_size=VOCAB, num_classes=CLASSES, max_len=MAX_LEN)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator))
    return model.eval()


def tokens(batch: int = 3, length: int = MAX_LEN, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def manual_forward(model, x: torch.Tensor, *, skip=(), zero_attention=()) -> torch.Tensor:
    """Logits computed by hand (float64) from the state dict; ``zero_attention`` layers add no attention output."""
    sd = {k: v.double() for k, v in model.state_dict().items()}
    d = model.d_model
    T = x.shape[1]
    resid = sd["token_embed.weight"][x] + sd["pos_embed.weight"][:T]
    for layer in range(model.n_layers):
        p = f"blocks.{layer}."
        if layer in skip:
            continue
        if p + "attn.qkv.weight" in sd and layer not in zero_attention:
            h = F.layer_norm(resid, (d,), sd[p + "attn.ln.weight"], sd[p + "attn.ln.bias"])
            W_q, W_k, W_v = sd[p + "attn.qkv.weight"].split(d)  # each [d_out, d_in]
            n_heads = model.n_heads
            d_head = d // n_heads
            out = torch.zeros_like(resid)
            for head in range(n_heads):
                cols = slice(head * d_head, (head + 1) * d_head)
                q, k, v = h @ W_q[cols].T, h @ W_k[cols].T, h @ W_v[cols].T  # [B, T, d_head]
                scores = q @ k.transpose(1, 2) / math.sqrt(d_head)
                scores = scores + torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)
                weights = torch.exp(scores - scores.amax(-1, keepdim=True))
                weights = weights / weights.sum(-1, keepdim=True)
                out = out + (weights @ v) @ sd[p + "attn.proj.weight"][:, cols].T
            resid = resid + out
        h = F.layer_norm(resid, (d,), sd[p + "mlp.ln.weight"], sd[p + "mlp.ln.bias"])
        hidden = h @ sd[p + "mlp.fc_in.weight"].T + sd[p + "mlp.fc_in.bias"]
        hidden = 0.5 * hidden * (1 + torch.erf(hidden / math.sqrt(2)))  # exact GELU
        resid = resid + hidden @ sd[p + "mlp.fc_out.weight"].T + sd[p + "mlp.fc_out.bias"]
    h = F.layer_norm(resid, (d,), sd["ln_final.weight"], sd["ln_final.bias"])
    return h @ sd["head.weight"].T + sd["head.bias"]


# --- forward, causality, the two attention paths -------------------------------------


@pytest.mark.parametrize("name", list(KINDS))
def test_forward_shape_and_dtype(name):
    logits = make(name)(tokens(length=7))
    assert logits.shape == (3, 7, CLASSES) and logits.dtype == torch.float32


@pytest.mark.parametrize("explicit", [False, True], ids=["fused", "explicit"])
@pytest.mark.parametrize("name", list(KINDS))
def test_causality(name, explicit):
    model = make(name)
    x = tokens()
    t = 6
    y = x.clone()
    y[:, t:] = (y[:, t:] + 1 + torch.arange(MAX_LEN - t)) % VOCAB  # change every token from t on
    run = (lambda z: model(z, trace=Trace((), explicit_attention=True))) if explicit else model
    before, after = run(x), run(y)
    torch.testing.assert_close(after[:, :t], before[:, :t], atol=1e-6, rtol=0)
    assert (after[:, t] - before[:, t]).abs().max() > 1e-3  # the test can see a change


@pytest.mark.parametrize("name", list(KINDS))
def test_fused_path_matches_manual_forward(name):
    model = make(name)
    x = tokens()
    with torch.no_grad():
        torch.testing.assert_close(model(x).double(), manual_forward(model, x), **ORACLE_TOL)


@pytest.mark.parametrize("name", ["transformer", "no_attention"])
def test_explicit_path_matches_manual_forward(name):
    model = make(name)
    x = tokens()
    with torch.no_grad():
        logits = model(x, trace=Trace((), explicit_attention=True))
        torch.testing.assert_close(logits.double(), manual_forward(model, x), **ORACLE_TOL)


AT_POSITIONS = [[MAX_LEN - 1], [0, 3, 4, 9, 11], list(range(MAX_LEN))]


@pytest.mark.parametrize("at", AT_POSITIONS, ids=["last", "scattered", "all"])
@pytest.mark.parametrize("name", list(KINDS))
def test_forward_at_positions_matches_manual_forward(name, at):
    # The untraced ``at`` path drops the other positions early (the MLP control at the
    # embedding, "no_attention" after its last attention layer, the transformer inside its
    # last one); the oracle computes every position and is then indexed.
    model = make(name)
    x = tokens()
    with torch.no_grad():
        logits = model(x, at=torch.tensor(at))
        assert logits.shape == (3, len(at), CLASSES)
        torch.testing.assert_close(logits.double(), manual_forward(model, x)[:, at], **ORACLE_TOL)


@pytest.mark.parametrize("name", list(KINDS))
def test_forward_at_positions_trains_like_the_full_forward(name):
    # The gradient the trainer takes through the ``at`` path is the full forward's: same
    # function, so autograd agrees up to float32 rounding (sums of <= 12 terms per entry).
    at = torch.tensor([2, 5, 6, 11])
    x = tokens()
    grads = []
    for fast in (False, True):
        model = make(name).train()
        logits = model(x, at=at) if fast else model(x)[:, at]
        torch.log_softmax(logits, -1)[..., 0].sum().backward()
        grads.append({k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for key in grads[0]:
        torch.testing.assert_close(grads[1][key], grads[0][key], atol=1e-4, rtol=1e-4, msg=key)


def test_traced_forward_at_positions_records_every_position():
    model = make("transformer")
    x = tokens()
    at = torch.tensor([1, 7])
    logits = model(x, trace=Trace(["blocks.2.resid_post"]), at=at)
    full, trace = model.run_with_trace(x, ["blocks.2.resid_post"])
    torch.testing.assert_close(logits, full[:, at], atol=0, rtol=0)
    assert trace["blocks.2.resid_post"].shape == (3, MAX_LEN, 16)


def test_fused_equals_explicit_attention():
    # Both paths sum the same <= 12 terms per score row in float32 but in different
    # orders, and the fused kernel rescales an online softmax; each op then differs by a
    # few ulps (eps = 1.2e-7), ~3e-7 relative after three blocks (observed: 3e-6 absolute
    # on logits up to 13). 1e-5 absolute + 1e-5 relative leaves a 10x margin; a real
    # difference (a mask off by one position, a wrong scale) is O(0.1).
    model = make("transformer")
    x = tokens(batch=4)
    with torch.no_grad():
        fused = model(x)
        explicit = model(x, trace=Trace((), explicit_attention=True))
    torch.testing.assert_close(explicit, fused, atol=1e-5, rtol=1e-5)


# --- ablations against the manual forward -------------------------------------------


@pytest.mark.parametrize("layer", [0, 1])
def test_masking_all_heads_equals_zeroed_attention(layer):
    model = make("transformer")
    x = tokens()
    with torch.no_grad():
        masked = model(x, trace=Trace((), mask_heads={layer: range(TINY.n_heads)}))
        expected = manual_forward(model, x, zero_attention={layer})
        torch.testing.assert_close(masked.double(), expected, **ORACLE_TOL)
        assert (masked.double() - manual_forward(model, x)).abs().max() > 1e-3  # and it did ablate


@pytest.mark.parametrize(
    ("name", "skip"), [("transformer", {1}), ("transformer", {0, 2}), ("no_attention", {2}), ("mlp", {0})]
)
def test_skipping_layers_equals_manual_forward_without_them(name, skip):
    model = make(name)
    x = tokens()
    with torch.no_grad():
        skipped = model(x, trace=Trace((), skip_layers=skip))
        torch.testing.assert_close(skipped.double(), manual_forward(model, x, skip=skip), **ORACLE_TOL)


# --- parameter counts -----------------------------------------------------------------


def transformer_formula(n_layers, n_heads, d_model, d_mlp, vocab, classes, max_len, n_attention=None):
    """Closed form: embeddings; per block LN + bias-free QKV/O, LN + biased MLP; final LN; head."""
    n_attention = n_layers if n_attention is None else n_attention
    attention = 2 * d_model + 4 * d_model * d_model
    mlp = 2 * d_model + 2 * d_model * d_mlp + d_mlp + d_model
    final = 2 * d_model + d_model * classes + classes  # ln_final, head
    return (vocab + max_len) * d_model + n_attention * attention + n_layers * mlp + final


def mlp_formula(n_blocks, d_model, d_hidden, vocab, classes, max_len):
    block = 2 * d_model + 2 * d_model * d_hidden + d_hidden + d_model
    return (vocab + max_len) * d_model + n_blocks * block + 2 * d_model + d_model * classes + classes


def test_parameter_counts_match_closed_forms():
    assert count_params(make("transformer")) == transformer_formula(3, 2, 16, 24, VOCAB, CLASSES, MAX_LEN)
    no_attention = transformer_formula(3, 2, 16, 24, VOCAB, CLASSES, MAX_LEN, n_attention=2)
    assert count_params(make("no_attention")) == no_attention
    assert count_params(make("mlp")) == mlp_formula(3, 16, 20, VOCAB, CLASSES, MAX_LEN)
    shape = dict(vocab_size=VOCAB, num_classes=CLASSES, max_len=MAX_LEN)
    assert mlp_param_count(d_model=16, n_blocks=3, d_hidden=20, **shape) == mlp_formula(3, 16, 20, VOCAB, CLASSES, MAX_LEN)


@pytest.mark.parametrize(
    ("config", "vocab", "classes", "max_len", "expected"),
    [
        (TransformerConfig(6, 6, 192, 768), 40, 20, 39, 2_683_988),  # bijection, V = 20 with a query
        (TransformerConfig(9, 8, 256, 1024), 106, 5, 100, 7_153_157),  # HMM, positions up to K = 50
        (TransformerConfig(9, 8, 256, 1024, no_attention_layers=(7, 8)), 106, 5, 100, 6_627_845),
    ],
    ids=["bijection", "hmm", "hmm_late_attention_off"],
)
def test_paper_transformer_sizes(config, vocab, classes, max_len, expected):
    with torch.device("meta"):  # counts only; no memory, no init cost
        model = Transformer(config, vocab_size=vocab, num_classes=classes, max_len=max_len)
    n_attention = config.n_layers - len(config.no_attention_layers)
    args = (config.n_layers, config.n_heads, config.d_model, config.d_mlp, vocab, classes, max_len, n_attention)
    assert count_params(model) == transformer_formula(*args) == expected


@pytest.mark.parametrize("name", list(KINDS))
def test_params_by_part_partitions_the_count(name):
    model = make(name)
    parts = params_by_part(model)
    assert list(parts) == list(PARTS) and sum(parts.values()) == count_params(model)
    assert parts["embed"] == VOCAB * 16 and parts["pos_embed"] == MAX_LEN * 16
    assert parts["head"] == 16 * CLASSES + CLASSES
    n_layernorms = {"transformer": 7, "no_attention": 6, "mlp": 4}[name]
    assert parts["norms"] == n_layernorms * 2 * 16
    assert parts["blocks/attention"] == {"transformer": 3, "no_attention": 2, "mlp": 0}[name] * 4 * 16 * 16


# --- capacity matching --------------------------------------------------------------


@pytest.mark.parametrize(
    ("transformer", "vocab", "classes", "max_len"),
    [(TransformerConfig(6, 6, 192, 768), 40, 20, 39), (TransformerConfig(9, 8, 256, 1024), 106, 5, 100)],
    ids=["bijection", "hmm"],
)
def test_mlp_sizing_matches_paper_transformers_within_one_percent(transformer, vocab, classes, max_len):
    config = MLPConfig(d_model=transformer.d_model, matched_to=transformer)
    sizing = match_transformer(config, vocab_size=vocab, num_classes=classes, max_len=max_len)
    t = transformer
    target = transformer_formula(t.n_layers, t.n_heads, t.d_model, t.d_mlp, vocab, classes, max_len)
    assert sizing.target_params == target
    assert 18 <= sizing.n_blocks <= 20 and abs(sizing.mismatch) < 0.01
    assert sizing.params == mlp_formula(sizing.n_blocks, transformer.d_model, sizing.d_hidden, vocab, classes, max_len)
    assert sizing.mismatch == pytest.approx((sizing.params - target) / target)
    if transformer.d_model == 192:
        assert 384 <= sizing.d_hidden <= 400  # the paper's width for the bijection control


def test_built_mlp_control_has_the_sized_shape():
    matched_to = TransformerConfig(2, 2, 16, 64)
    config = MLPConfig(d_model=16, n_blocks=2, matched_to=matched_to)  # width sized; tiny targets need few blocks
    model = MLPControl(config, vocab_size=VOCAB, num_classes=CLASSES, max_len=MAX_LEN)
    assert abs(model.sizing.mismatch) < 0.01 and model.config.n_blocks == 2
    assert (model.config.n_blocks, model.config.d_hidden) == (model.sizing.n_blocks, model.sizing.d_hidden)
    assert model.n_layers == model.sizing.n_blocks and count_params(model) == model.sizing.params
    rebuilt = MLPControl(model.config, vocab_size=VOCAB, num_classes=CLASSES)  # resolved config: same shape
    assert rebuilt.config == model.config


def test_size_mlp_with_a_fixed_size():
    common = dict(d_model=192, vocab_size=40, num_classes=20, max_len=39)
    by_width = size_mlp(2_683_988, n_blocks=10, **common)
    assert by_width.n_blocks == 10 and abs(by_width.mismatch) < 0.01 and by_width.d_hidden % 16 == 0
    by_depth = size_mlp(2_683_988, d_hidden=384, **common)
    assert by_depth.d_hidden == 384 and abs(by_depth.mismatch) < 0.01
    with pytest.raises(ConfigError, match="within 1%"):
        size_mlp(2_683_988, n_blocks=1, d_hidden=None, multiple_of=4096, **common)


# --- checkpoints and seeding --------------------------------------------------------


@pytest.mark.parametrize("name", list(KINDS))
def test_state_dict_round_trip_gives_identical_logits(name):
    model = make(name, seed=0)
    state = model.state_dict()
    # What safetensors.save_file needs: parameters only (no buffers), one contiguous,
    # unshared storage each.
    assert set(state) == {n for n, _ in model.named_parameters()}
    assert all(t.is_contiguous() for t in state.values())
    pointers = [t.untyped_storage().data_ptr() for t in state.values()]
    assert len(set(pointers)) == len(pointers)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded = make(name, seed=1)
    loaded.load_state_dict(torch.load(buffer, weights_only=True))
    x = tokens()
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))


def test_generator_fixes_the_initial_weights():
    def build(seed):
        return build_model("transformer", TINY, vocab_size=VOCAB, num_classes=CLASSES, max_len=MAX_LEN,
                           generator=torch.Generator().manual_seed(seed))

    a, b, c = build(3).state_dict(), build(3).state_dict(), build(4).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["blocks.0.attn.qkv.weight"], c["blocks.0.attn.qkv.weight"])
    assert torch.equal(a["blocks.0.attn.ln.weight"], torch.ones(16))
    assert torch.equal(a["head.bias"], torch.zeros(CLASSES))


def test_init_std_sets_the_scale_of_the_initial_weights():
    """The same generator at twice ``init_std`` draws the same normals, each doubled (exactly:
    scaling by 2 is exact in floating point); biases and LayerNorms do not move. The
    default's sample std is 0.02, and 0.02 / sqrt(4) for the projections into the residual
    stream (2 layers, each written twice: attention and MLP)."""
    def build(**scale):
        return build_model("transformer", TransformerConfig(2, 2, 64, 128, **scale), vocab_size=VOCAB,
                           num_classes=CLASSES, max_len=MAX_LEN, generator=torch.Generator().manual_seed(5))

    default, doubled = build().state_dict(), build(init_std=0.04).state_dict()
    explicit = build(init_std=0.02).state_dict()  # the default is GPT-2's 0.02
    assert all(torch.equal(explicit[k], default[k]) for k in default)
    for name, weight in default.items():
        if name.endswith("weight") and ".ln" not in name and "ln_final" not in name:
            assert torch.equal(doubled[name], 2 * weight), name
        else:
            assert torch.equal(doubled[name], weight), name
    # 8,192 and 16,384 draws: the sample std is within 3% of sigma with probability > 0.999
    # (its relative standard error is 1/sqrt(2n) < 0.8%).
    assert default["blocks.0.attn.qkv.weight"].std().item() == pytest.approx(0.02, rel=0.03)
    assert default["blocks.0.mlp.fc_out.weight"].std().item() == pytest.approx(0.02 / math.sqrt(4), rel=0.03)


# --- building and validation --------------------------------------------------------


def test_registry_and_max_len_resolution():
    assert {"transformer", "mlp"} <= set(MODELS)  # the subject and its control; plug-ins may add more
    shape = {"n_layers": 1, "n_heads": 2, "d_model": 8, "d_mlp": 8}
    model = build_model("transformer", shape, vocab_size=5, num_classes=2, max_len=7)
    assert model.max_len == 7 and model.config.max_len == 7
    wins = build_model("transformer", TransformerConfig(1, 2, 8, 8, max_len=9), vocab_size=5, num_classes=2, max_len=7)
    assert wins.max_len == 9 and wins.W_pos.shape == (9, 8)
    with pytest.raises(ValueError, match="exceeds the position table"):
        wins(torch.zeros(1, 10, dtype=torch.long))


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: TransformerConfig(n_heads=5), "n_heads=5"),
        (lambda: TransformerConfig(n_layers=0), "n_layers=0"),
        (lambda: TransformerConfig(d_mlp=-1), "d_mlp=-1"),
        (lambda: TransformerConfig(init_std=0.0), "init_std=0.0 is out of range: need init_std > 0"),
        (lambda: TransformerConfig(init_std=float("nan")), "init_std=nan is out of range: need a finite number"),
        (lambda: TransformerConfig(n_layers="6"), "n_layers='6'"),
        (lambda: TransformerConfig(no_attention_layers=(6,)), "no_attention_layers"),
        (lambda: TransformerConfig(no_attention_layers=(1, 1)), "no_attention_layers"),
        (lambda: MLPConfig(), "matched_to=None"),
        (lambda: MLPConfig(d_model=192, n_blocks=18), "matched_to=None"),
        (lambda: MLPConfig(d_model=128, matched_to=TransformerConfig()), "d_model=128"),
        (lambda: MLPConfig(d_hidden=0, n_blocks=2), "d_hidden=0"),
        (lambda: build_model("no_such_kind", None, vocab_size=5, num_classes=2, max_len=4), ", ".join(sorted(MODELS))),
        (lambda: build_model("transformer", None, vocab_size=5, num_classes=2), "max_len=None"),
        (lambda: build_model("transformer", TransformerConfig(max_len=8), vocab_size=5, num_classes=2, max_len=9),
         "max_len=8"),
        (lambda: build_model("transformer", TINY_MLP, vocab_size=5, num_classes=2, max_len=4), "MLPConfig"),
        (lambda: build_model("mlp", {"width": 3}, vocab_size=5, num_classes=2, max_len=4), "width"),
        (lambda: build_model("transformer", TINY, vocab_size=0, num_classes=2, max_len=4), "vocab_size=0"),
    ],
)
def test_bad_configs_raise_one_line_config_errors(build, match):
    with pytest.raises(ConfigError, match=match) as error:
        build()
    assert "\n" not in str(error.value)


# --- model families: what each declares, the registry, a toy family from outside ------


def test_families_declare_themselves():
    assert (Transformer.role, MLPControl.role) == ("subject", "control")
    assert Transformer.variant(TINY) == "" and Transformer.variant(TINY_NO_ATTN) == "no attention in 2"
    assert Transformer.variant(TransformerConfig(no_attention_layers=(4, 5))) == "no attention in 4,5"
    assert MLPControl.variant(TINY_MLP) == ""
    shape = dict(vocab_size=VOCAB, num_classes=CLASSES, max_len=MAX_LEN)
    assert Transformer.sizing_info(TINY, **shape) == {}
    assert MLPControl.sizing_info(TINY_MLP, **shape) == {"n_blocks": 3, "d_hidden": 20}  # given sizes, no target
    for name in KINDS:
        model = make(name)
        assert type(model).activation_names_for(model.config) == model.activation_names, name
    # the hook reports the shape the constructor builds, and the matched transformer's count
    matched = MLPConfig(d_model=16, n_blocks=2, d_hidden=20, matched_to=TINY)  # given sizes, compared
    info = MLPControl.sizing_info(matched, **shape)
    control = MLPControl(matched, **shape)
    target = count_params(Transformer(TINY, **shape))
    assert (info["n_blocks"], info["d_hidden"], info["target_params"]) == (
        control.config.n_blocks, control.config.d_hidden, target)
    assert info["mismatch"] == pytest.approx((count_params(control) - target) / target, abs=1e-6)


@dataclasses.dataclass(frozen=True)
class ToyConfig:
    """The toy family's shape: embedding width and position table."""

    d_model: int = 8
    max_len: int | None = None

    def __post_init__(self) -> None:
        check_field_types(self)


class ToyFamily(SequenceModel):
    """Per position: token + position embedding -> LayerNorm -> head (no blocks at all)."""

    kind: ClassVar[str] = "toy"
    config_class: ClassVar[type] = ToyConfig
    role: ClassVar[Role] = "control"

    def __init__(self, config: ToyConfig | None = None, *, vocab_size: int, num_classes: int,
                 max_len: int | None = None, generator: torch.Generator | None = None) -> None:
        config = ToyConfig() if config is None else config
        max_len = resolve_max_len(config.max_len, max_len)
        super().__init__([], d_model=config.d_model, vocab_size=vocab_size, num_classes=num_classes, max_len=max_len)
        self.config = dataclasses.replace(config, max_len=max_len)
        self.reset_parameters(generator)

    @property
    def n_residual_writes(self) -> int:
        return 1  # nothing writes into the residual stream; 1 leaves the init scale as is

    @classmethod
    def activation_names_for(cls, config: ToyConfig) -> list[str]:
        return ["embed", "pos_embed", "ln_final", "logits"]

    @classmethod
    def variant(cls, config: ToyConfig) -> str:
        return "" if config.d_model == 8 else f"width {config.d_model}"

    @classmethod
    def sizing_info(cls, config: Any, *, vocab_size: int, num_classes: int, max_len: int | None) -> dict[str, Any]:
        return {"width": config.d_model}


@pytest.fixture
def toy_family():
    """:class:`ToyFamily` registered as "toy" for one test, and removed after it."""
    register_model(ToyFamily)
    try:
        yield ToyFamily
    finally:
        MODELS.pop(ToyFamily.kind)


TOY_RUN = {"tunnel": {"name": "bijection", "V": 5}, "model": {"kind": "toy", "d_model": 6}, "eval": {"n": 16}}


def test_a_family_registered_from_outside_builds_and_round_trips(toy_family):
    model = build_model("toy", {"d_model": 6}, vocab_size=VOCAB, num_classes=CLASSES, max_len=MAX_LEN)
    assert type(model) is toy_family and model.config == ToyConfig(6, MAX_LEN) and model_class("toy") is toy_family
    x = tokens()
    logits, trace = run_with_trace(model, x, "*")
    assert logits.shape == (3, MAX_LEN, CLASSES) and list(trace) == model.activation_names
    torch.testing.assert_close(model(x, at=torch.tensor([2, 5])), logits[:, [2, 5]])
    # the [model] section parses through the family's config class, and round-trips
    config = run_config_from_mapping(TOY_RUN, ["model.d_model=4"])
    assert config.model == ToyConfig(4) and config.model_kind == "toy"
    assert config.to_mapping()["model"] == {"kind": "toy", "d_model": 4, "max_len": None}
    assert run_config_from_mapping(config.to_mapping()) == config
    with pytest.raises(ConfigError, match="depth"):
        run_config_from_mapping({**TOY_RUN, "model": {"kind": "toy", "depth": 2}})
    # and a run of it has an identity like any other
    run = Run(Path("/toy"), config, build_run_model(config).eval(), 0)
    assert isinstance(run.model, toy_family) and run.role == "control"
    assert (run.key.family, run.key.variant, run.label) == ("toy", "width 4", "toy (width 4) seed 0")


def test_register_model_refuses_a_second_family_of_one_kind(toy_family):
    with pytest.raises(ValueError, match="model kind 'toy' is registered already"):
        register_model(toy_family)
    with pytest.raises(ValueError, match="model kind 'transformer' is registered already"):
        register_model(type("Impostor", (toy_family,), {"kind": "transformer", "config_class": MLPConfig}))
    with pytest.raises(ValueError, match="config_class=ToyConfig is registered already"):
        register_model(type("Twin", (toy_family,), {"kind": "toy2"}))
    with pytest.raises(ValueError, match="role='baseline'"):
        register_model(type("Odd", (toy_family,), {"kind": "toy3", "role": "baseline"}))
    assert not {"toy2", "toy3"} & set(MODELS) and "toy" in MODELS  # none of the refused ones stayed
    with pytest.raises(ConfigError, match=f"choose one of: {', '.join(sorted(MODELS))}$"):
        model_class("no_such_kind")


# --- run identity: what the analyses group seeds by ----------------------------------

RUN = {
    "tunnel": {"name": "bijection", "V": 5},
    "model": {"kind": "transformer", "n_layers": 2, "n_heads": 2, "d_model": 8, "d_mlp": 16},
    "eval": {"n": 16},
}


def run_of(*overrides: str, base: dict = RUN) -> Run:
    config = run_config_from_mapping(base, overrides)
    return Run(Path("/constructed"), config, build_run_model(config).eval(), 0)


def test_seeds_of_one_configuration_share_it_and_a_variant_does_not():
    seed0, seed1 = run_of("train.seed=0"), run_of("train.seed=1")
    late = run_of("train.seed=0", "model.no_attention_layers=[1]")
    late1 = run_of("train.seed=1", "model.no_attention_layers=[1]")
    assert seed0.key != seed1.key and seed0.configuration == seed1.configuration
    assert seed1.key == RunKey(seed0.key.tunnel, "transformer", "", 1)
    assert seed0.configuration == Configuration(seed0.key.tunnel, "transformer", "")
    assert late.configuration != seed0.configuration and late.configuration == late1.configuration
    assert late.key.variant == "no attention in 1" and late.configuration.name == "transformer (no attention in 1)"
    # the legend text is derived from the key, unchanged
    assert [r.label for r in (seed0, seed1, late)] == [
        "transformer seed 0", "transformer seed 1", "transformer (no attention in 1) seed 0"]
    assert run_of("train.seed=2", base={**RUN, "model": {"kind": "mlp", "d_model": 8, "n_blocks": 2, "d_hidden": 8}}).label == "mlp seed 2"
    # the tunnel's parameters are part of the configuration, not only its name
    assert run_of("tunnel.V=6").configuration != seed0.configuration
    groups = by_configuration([seed0, late, seed1, late1])
    assert list(groups) == [seed0.configuration, late.configuration]
    assert [len(g) for g in groups.values()] == [2, 2]
    seeds_scope = ANALYSES["length_generalization"]
    assert seeds_scope.scope == "seeds" and seeds_scope.applies_to([seed0, seed1]) is None
    assert "differ in model" in seeds_scope.applies_to([seed0, late])
