"""Export to TransformerLens: the export computes our function, hook by hook, and the CLI writes it safely.

The oracle is TransformerLens's own forward (``HookedTransformer.__call__`` and
``run_with_cache``), never our code run twice. Models are compared in float64 with every
parameter drawn at random (LayerNorm weights and biases included, so a LayerNorm copied
into the wrong place, or left at its identity initialization, shows), on episodes of the
tunnels the paper trains on.
"""

from __future__ import annotations

import json
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformer_lens  # the test extra installs it: its absence must fail, not skip
from safetensors.torch import load_file

from windtunnel.cli import main
from windtunnel.files import LOCK_FILE, directory_lock
from windtunnel.export import (
    CONFIG_FILE,
    HOOK_MATCHES,
    WEIGHTS_FILE,
    ExportError,
    hook_match,
    hook_table_markdown,
    load_transformer_lens,
    to_hooked_transformer,
    trace_activation,
)
from windtunnel.models import TransformerConfig, build_model, run_with_trace
from windtunnel.runs import load_run_model
from windtunnel.tunnels import make_tunnel
from scopes import once_per_module

pytestmark = pytest.mark.slow  # imports TransformerLens (seconds) and trains one tiny run

# Tolerance of every float64 comparison. Both models compute the same sums in different
# orders (one fused qkv matmul vs three einsums, F.linear vs addmm): each reassociation
# costs ~1e-16 relative, a few hundred of them over the layers leave ~1e-14 on activations
# of size ~10 (measured with these models: at most 3e-15 on logits, 1.1e-14 on any
# activation). 1e-10 is far above that and far below any real difference (a float32
# rounding of the weights alone moves logits by ~1e-7; the perturbation test needs > 1e-6).
ATOL = 1e-10

TUNNELS = {
    "bijection": ("bijection", {"V": 6}, ()),
    "hmm": ("hmm", {"K": 6}, ()),
    # the paper's "late attention disabled" variant, scaled down: the last layer has no attention
    "hmm_late_attention_off": ("hmm", {"K": 6}, (2,)),
}


def scrambled_model(tunnel, no_attention_layers=(), seed=0):
    """A 3-layer float64 transformer for ``tunnel`` with every parameter random (std 0.5:
    sharp attention, logits far from uniform)."""
    config = TransformerConfig(n_layers=3, n_heads=2, d_model=16, d_mlp=24, no_attention_layers=no_attention_layers)
    model = build_model("transformer", config, vocab_size=tunnel.vocab_size, num_classes=tunnel.num_classes,
                        max_len=tunnel.seq_len())
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(0.5 * torch.randn(parameter.shape, generator=generator))
    return model.double().eval()


def episode_tokens(tunnel, batch=4, seed=1):
    return tunnel.sample(batch, generator=torch.Generator().manual_seed(seed)).tokens  # [B, T]


def our_logits(model, tokens):
    """[B, T, C] float64 logits (the forward itself returns float32; the trace records them before)."""
    return run_with_trace(model, tokens, "logits")[1]["logits"]


def max_difference(model, tl_model, tokens):
    with torch.no_grad():
        return (our_logits(model, tokens) - tl_model(tokens)).abs().max().item()


# --- the export computes our function ---------------------------------------------------


@pytest.mark.parametrize("case", TUNNELS)
def test_exported_logits_equal_ours_on_episodes(case):
    name, params, no_attention = TUNNELS[case]
    tunnel = make_tunnel(name, params)
    model = scrambled_model(tunnel, no_attention)
    tl_model = to_hooked_transformer(model)
    tokens = episode_tokens(tunnel)
    with torch.no_grad():
        ours, theirs = our_logits(model, tokens), tl_model(tokens)
    assert theirs.dtype == torch.float64 and theirs.shape == ours.shape == (*tokens.shape, tunnel.num_classes)
    assert ours.std() > 0.5  # not a near-constant function that anything would match
    assert torch.allclose(theirs, ours, rtol=0, atol=ATOL), (theirs - ours).abs().max()
    if no_attention:
        # The layer without attention: TransformerLens's attention (zero weights) adds exactly 0.0.
        _, cache = tl_model.run_with_cache(tokens)
        for layer in no_attention:
            attn_out = cache[f"blocks.{layer}.hook_attn_out"]  # [B, T, d_model]
            assert torch.equal(attn_out, torch.zeros_like(attn_out))
            assert torch.equal(cache[f"blocks.{layer}.hook_resid_mid"], cache[f"blocks.{layer}.hook_resid_pre"])


def test_every_trace_name_equals_its_transformer_lens_hook():
    tunnel = make_tunnel("hmm", {"K": 6})
    model = scrambled_model(tunnel, no_attention_layers=(1,))  # layers 0 and 2 with attention, 1 without
    tl_model = to_hooked_transformer(model)
    tl_model.set_use_attn_result(True)  # hook_result (our head_out) is off by default in TransformerLens
    tokens = episode_tokens(tunnel)
    with torch.no_grad():
        _, trace = run_with_trace(model, tokens)  # every name
        _, cache = tl_model.run_with_cache(tokens)
    checked = set()
    for name in model.activation_names:
        ours, theirs = trace[name], trace_activation(tl_model, cache, name)
        assert theirs.shape == ours.shape, name
        finite = torch.isfinite(ours)  # the scores are -inf above the diagonal in both
        assert torch.equal(finite, torch.isfinite(theirs)), name
        assert torch.allclose(theirs[finite], ours[finite], rtol=0, atol=ATOL), (name, (theirs - ours)[finite].abs().max())
        match = hook_match(name)
        checked.add(re.sub(r"^blocks\.\d+\.", "blocks.{l}.", name))
        if match.layout == "heads":  # the transpose is needed: the cached tensor is [B, T, H, ...]
            assert cache[match.hook].shape[1:3] == (tokens.shape[1], model.n_heads) != ours.shape[1:3]
    assert checked == {m.name for m in HOOK_MATCHES}  # every entry of the table was checked


def test_a_perturbed_weight_breaks_equality():
    tunnel = make_tunnel("bijection", {"V": 6})
    model = scrambled_model(tunnel)
    tokens = episode_tokens(tunnel)
    assert max_difference(model, to_hooked_transformer(model), tokens) <= ATOL
    for parameter in ("blocks.0.attn.W_K", "blocks.1.ln2.b", "blocks.2.mlp.W_out", "pos_embed.W_pos", "unembed.b_U"):
        tl_model = to_hooked_transformer(model)
        with torch.no_grad():
            tl_model.get_parameter(parameter).view(-1)[0] += 1e-3
        assert max_difference(model, tl_model, tokens) > 1e-6, parameter
    # and our side: the export is a copy, so changing our weight afterwards is a difference too
    tl_model = to_hooked_transformer(model)
    with torch.no_grad():
        model.blocks[0].attn.qkv.weight[0, 0] += 1e-3
    assert max_difference(model, tl_model, tokens) > 1e-6


@pytest.mark.parametrize(
    "kind, config",
    [
        ("mlp", {"d_model": 16, "n_blocks": 2, "d_hidden": 8}),
        ("lstm", {"d_model": 16, "n_layers": 1, "d_hidden": 8}),
        ("mamba", {"d_model": 16, "n_layers": 1, "d_inner": 32, "d_state": 4, "d_conv": 2}),
    ],
)
def test_controls_are_refused(kind, config):
    model = build_model(kind, config, vocab_size=12, num_classes=6, max_len=10)
    with pytest.raises(ExportError, match=f"model kind '{kind}' cannot be exported to TransformerLens: only transformers"):
        to_hooked_transformer(model)


def test_the_docs_table_is_the_librarys():
    page = (Path(__file__).parents[1] / "docs" / "export.md").read_text()
    assert hook_table_markdown() in page


# --- the command: a tiny trained run, exported and loaded back -----------------------------


@pytest.fixture(scope=once_per_module)
def runs(tmp_path_factory, write_config):
    """A trained tiny transformer run and an MLP-control run (trained one step: only its kind matters)."""
    root = tmp_path_factory.mktemp("export")
    config = write_config(root, steps=10, checkpoint_every=10)
    common = ["--quiet", "--set", "train.eval_every=0", "--set", "eval.n=8", "--set", "eval.bootstrap=2"]
    assert main(["train", str(config), "--out", str(root / "transformer"), *common]) == 0
    transformer = 'kind = "transformer"\nn_layers = 2\nn_heads = 2\nd_model = 16\nd_mlp = 32\n'
    assert transformer in config.read_text()
    mlp_config = root / "mlp.toml"
    mlp_config.write_text(config.read_text().replace(transformer, 'kind = "mlp"\nd_model = 16\nn_blocks = 1\nd_hidden = 8\n'))
    assert main(["train", str(mlp_config), "--out", str(root / "mlp"), *common, "--set", "train.steps=1"]) == 0
    return root


def files(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file and folder under ``root`` with its bytes and mode."""
    return {
        str(path.relative_to(root)): (path.read_bytes() if path.is_file() else b"<dir>", stat.S_IMODE(path.lstat().st_mode))
        for path in sorted(root.rglob("*"))
    }


@pytest.mark.filterwarnings("ignore:HookedTransformer is deprecated:DeprecationWarning")  # the plain rebuild
def test_cli_export_then_load_gives_the_runs_logits(runs, capsys):
    run_dir, out = runs / "transformer", runs / "exports" / "nested" / "tiny"  # missing parents are made
    assert main(["export", str(run_dir), "--to", "transformer-lens", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["export"] == str(out) and printed["step"] == 10 and printed["max_logit_difference_float64"] <= ATOL
    assert sorted(p.name for p in out.iterdir()) == [LOCK_FILE, CONFIG_FILE, WEIGHTS_FILE]  # the writers' lock, released
    assert (out / LOCK_FILE).read_text() == ""  # no pid of a finished holder
    assert sorted(p.name for p in out.parent.iterdir()) == ["tiny"]  # no staging folder left behind

    _, model, _ = load_run_model(run_dir)
    loaded = load_transformer_lens(out)
    saved = json.loads((out / CONFIG_FILE).read_text())
    assert saved["hooked_transformer_config"]["d_vocab_out"] == model.num_classes == 6
    assert saved["windtunnel"]["step"] == 10 and saved["windtunnel"]["tunnel"] == "bijection"
    for name, value in to_hooked_transformer(model).named_parameters():  # the saved weights are the run's, bit for bit
        assert torch.equal(loaded.get_parameter(name), value), name
    tokens = episode_tokens(make_tunnel("bijection", {"V": 6}), batch=8)
    with torch.no_grad():
        ours, theirs = model(tokens), loaded(tokens)
    # float32 models: the same sums in other orders differ by ~1e-7 relative on logits of size ~1
    assert theirs.dtype == torch.float32 and torch.allclose(theirs, ours, rtol=0, atol=1e-5)

    # the folder alone rebuilds it with TransformerLens, no windtunnel (the recipe in windtunnel.export's docstring)
    cfg = saved["hooked_transformer_config"]
    plain = transformer_lens.HookedTransformer(
        transformer_lens.HookedTransformerConfig(**cfg | {"dtype": getattr(torch, cfg["dtype"])})
    )
    plain.load_state_dict(load_file(out / WEIGHTS_FILE), strict=False)
    with torch.no_grad():
        assert torch.equal(plain(tokens), theirs)

    # --overwrite replaces an earlier export (and only that), leaving nothing else behind
    (out / WEIGHTS_FILE).write_bytes(b"stale")
    assert main(["export", str(run_dir), "--to", "transformer-lens", str(out), "--overwrite"]) == 0
    assert torch.equal(load_transformer_lens(out).get_parameter("unembed.b_U"), loaded.get_parameter("unembed.b_U"))
    assert sorted(p.name for p in out.parent.iterdir()) == ["tiny"]


def test_two_exports_into_one_new_folder_one_succeeds_the_other_is_refused(runs, tmp_path):
    """Both started at once: one takes OUT's writers' lock and exports; the other is refused in
    one line, exit 2 (OUT in use while the first works, or OUT existing once it is done: either
    way nothing of the first is replaced). OUT holds one whole export, and nothing else is left."""
    out = tmp_path / "shared"
    command = [sys.executable, "-m", "windtunnel", "export", str(runs / "transformer"), "--to", "transformer-lens", str(out)]
    processes = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.wait(timeout=180), *p.communicate()) for p in processes]
    assert sorted(code for code, _, _ in results) == [0, 2], results
    (_, winner_out, _), (_, _, loser_err) = sorted(results, key=lambda r: r[0])
    lines = loser_err.strip().splitlines()
    assert len(lines) == 1 and ("is in use by another windtunnel command" in lines[0] or "exists: give a new path" in lines[0])
    assert json.loads(winner_out)["export"] == str(out)
    load_transformer_lens(out)  # whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shared"]  # no staging folder


def test_a_second_writer_is_refused_while_an_export_holds_out(runs, tmp_path, capsys):
    """The lock is the one every writer takes: an export into a folder another command holds is
    refused before any work, and changes nothing."""
    out = tmp_path / "held"
    out.mkdir()
    with directory_lock(out):
        assert main(["export", str(runs / "transformer"), "--to", "transformer-lens", str(out)]) == 2
        assert "is in use by another windtunnel command" in capsys.readouterr().err
        assert [p.name for p in out.iterdir()] == [LOCK_FILE]


def test_export_refuses_a_transformer_lens_that_computes_something_else(runs, monkeypatch, capsys):
    # The export checks itself against our forward before writing: GPT-2's tanh GELU in
    # place of the exact one is a difference of ~1e-4, and nothing may be written.
    from windtunnel import export

    exact = export.hooked_transformer_config
    monkeypatch.setattr(export, "hooked_transformer_config", lambda model: {**exact(model), "act_fn": "gelu_new"})
    before = files(runs)
    assert main(["export", str(runs / "transformer"), "--to", "transformer-lens", str(runs / "wrong")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the TransformerLens export computes different logits" in err[0]
    assert files(runs) == before


def test_a_failed_write_leaves_nothing(runs, monkeypatch, capsys):
    from windtunnel import export

    written = []

    def fail_on_second(path, data):
        if written:
            raise OSError(28, "No space left on device", str(path))
        written.append(path)
        return export_write(path, data)

    export_write = export.atomic_write_bytes
    monkeypatch.setattr(export, "atomic_write_bytes", fail_on_second)
    before = files(runs)
    assert main(["export", str(runs / "transformer"), "--to", "transformer-lens", str(runs / "new" / "out")]) == 2
    assert "No space left on device" in capsys.readouterr().err
    assert written and files(runs) == before  # no OUT, no staging folder, no parent made for it


@pytest.mark.parametrize(
    "argv, fragment",
    [
        ("export {runs}/transformer --to onnx {runs}/x", "argument --to: invalid choice: 'onnx'"),
        ("export {runs}/missing --to transformer-lens {runs}/x", "run directory '{runs}/missing' does not exist"),
        ("export {runs}/mlp --to transformer-lens {runs}/x", "model kind 'mlp' cannot be exported to TransformerLens"),
        ("export {runs}/transformer --to transformer-lens {runs}/mlp", "exists: give a new path, or pass --overwrite"),
        ("export {runs}/transformer --to transformer-lens {runs}/mlp --overwrite", "is not a windtunnel export"),
        ("export {runs}/transformer --to transformer-lens {runs}/mlp/config.json", "exists and is not a directory"),
        ("export {runs}/transformer --to transformer-lens {runs}/x --step 999", "--step 999 is not a snapshot"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(runs, argv, fragment, capsys):
    before = files(runs)
    try:
        code = main([part.format(runs=runs) for part in argv.split()])
    except SystemExit as exit_:  # argparse exits
        code = exit_.code
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert fragment.format(runs=runs) in lines[0]
    assert out == "" and files(runs) == before


def test_missing_transformer_lens_is_one_line_exit_2(runs, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "transformer_lens", None)  # `import transformer_lens` now fails
    before = files(runs)
    assert main(["export", str(runs / "transformer"), "--to", "transformer-lens", str(runs / "x")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "needs the transformer-lens package, which is not installed" in lines[0]
    assert "pip install 'windtunnel[lens]'" in lines[0] and files(runs) == before
