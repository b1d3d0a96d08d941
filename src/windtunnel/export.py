"""Export a trained windtunnel transformer to TransformerLens, and load the export back.

:func:`to_hooked_transformer` builds a ``transformer_lens.HookedTransformer`` that computes
the same function as a :class:`~windtunnel.models.Transformer`: same weights, same
pre-norm blocks, the task's classes as TransformerLens's output vocabulary
(``d_vocab_out``). :func:`export_run` writes it for a run directory (``windtunnel export
RUN_DIR --to transformer-lens OUT``) and :func:`load_transformer_lens` rebuilds it from
that folder alone:

    OUT/config.json          {"format", "hooked_transformer_config": {...}, "windtunnel": {source run}}
    OUT/model.safetensors    the HookedTransformer's parameters, under its own names

Reading it needs no windtunnel either: ``cfg = config["hooked_transformer_config"]``,
``HookedTransformer(HookedTransformerConfig(**cfg | {"dtype": getattr(torch, cfg["dtype"])}))``
(JSON holds the dtype as a string), then ``load_state_dict(safetensors.torch.load_file(...),
strict=False)`` (the keys left out are TransformerLens's causal-mask buffers).

:data:`HOOK_MATCHES` maps each of our trace names (:mod:`windtunnel.models.names`) to the
TransformerLens hook that caches the same activation, and says how to turn the cached
tensor into ours; :func:`trace_activation` applies it. TransformerLens is an optional
dependency (``pip install 'windtunnel[lens]'``), imported only when a function needs it.
Example::

    tl_model = to_hooked_transformer(model)                # model: a windtunnel Transformer
    logits, cache = tl_model.run_with_cache(tokens)        # [B, T, C], TransformerLens's cache
    trace_activation(tl_model, cache, "blocks.0.attn.k")   # [B, H, T, d_head], as a Trace records it
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors.torch import load_file, save
from torch import Tensor, nn

from windtunnel import __version__
from windtunnel.config import ConfigError
from windtunnel.files import LOCK_FILE, atomic_write_bytes, has_content
from windtunnel.models import Transformer, model_class, unwrap_model
from windtunnel.run_files import check_run_files
from windtunnel.runs import load_run_model, read_run_config, recorded_run_dir

__all__ = [
    "FORMATS",
    "check_out",
    "HOOK_MATCHES",
    "ExportError",
    "HookMatch",
    "export_run",
    "hook_match",
    "hook_table_markdown",
    "hooked_transformer_config",
    "load_transformer_lens",
    "to_hooked_transformer",
    "trace_activation",
]

#: What ``windtunnel export --to`` can write.
FORMATS: tuple[str, ...] = ("transformer-lens",)

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
#: The ``format`` field of an export's config.json: what marks a folder as one (and the only
#: kind of folder ``--overwrite`` replaces).
FORMAT_TAG = "windtunnel/transformer-lens"

#: The TransformerLens releases the export is built for: 4.0 removed ``HookedTransformer``.
TL_REQUIREMENT = "transformer-lens>=3.9,<4"


class ExportError(ConfigError):
    """An export that cannot be made: a model that is not a transformer, TransformerLens
    missing, or an output folder in the way (one line, exit 2 from the CLI)."""


# --- the name table --------------------------------------------------------------------


@dataclass(frozen=True)
class HookMatch:
    """Where TransformerLens caches one of our trace activations, and how the two differ.

    Args:
        name: our trace name; ``{l}`` stands for the layer.
        hook: the TransformerLens hook name (``run_with_cache`` key); ``{l}`` as above.
        layout: ``"same"``: the cached tensor is ours as is; ``"heads"``: TransformerLens
            puts positions before heads (``[B, T, H, ...]``), we put heads first
            (``[B, H, T, ...]``), so ours is ``cached.transpose(1, 2)``.
        affine: the TransformerLens LayerNorm (module path, ``{l}`` as above) whose
            ``hook_normalized`` is read: it caches the normalized stream before the
            LayerNorm's weight and bias, ours is after them, so ours is
            ``cached * ln.w + ln.b``. ``None`` for every other entry.
        note: what else the hook needs, if anything.
    """

    name: str
    hook: str
    layout: Literal["same", "heads"] = "same"
    affine: str | None = None
    note: str = ""


#: Every trace name of a transformer (:func:`windtunnel.models.names.transformer_names`),
#: in forward order, with its TransformerLens hook. Layers built without attention have
#: the attention hooks in the export (its attention is there, with zero weights) but no
#: ``attn*`` trace names.
HOOK_MATCHES: tuple[HookMatch, ...] = (
    HookMatch("embed", "hook_embed"),
    HookMatch("pos_embed", "hook_pos_embed"),
    HookMatch("blocks.{l}.resid_pre", "blocks.{l}.hook_resid_pre"),
    HookMatch("blocks.{l}.attn_in", "blocks.{l}.ln1.hook_normalized", affine="blocks.{l}.ln1"),
    HookMatch("blocks.{l}.attn.q", "blocks.{l}.attn.hook_q", "heads"),
    HookMatch("blocks.{l}.attn.k", "blocks.{l}.attn.hook_k", "heads"),
    HookMatch("blocks.{l}.attn.v", "blocks.{l}.attn.hook_v", "heads"),
    HookMatch("blocks.{l}.attn.scores", "blocks.{l}.attn.hook_attn_scores"),
    HookMatch("blocks.{l}.attn.pattern", "blocks.{l}.attn.hook_pattern"),
    HookMatch("blocks.{l}.attn.z", "blocks.{l}.attn.hook_z", "heads"),
    HookMatch(
        "blocks.{l}.attn.head_out", "blocks.{l}.attn.hook_result", "heads", note="needs `tl_model.set_use_attn_result(True)`"
    ),
    HookMatch("blocks.{l}.attn_out", "blocks.{l}.hook_attn_out"),
    HookMatch("blocks.{l}.resid_mid", "blocks.{l}.hook_resid_mid"),
    HookMatch("blocks.{l}.mlp_in", "blocks.{l}.ln2.hook_normalized", affine="blocks.{l}.ln2"),
    HookMatch("blocks.{l}.mlp.pre", "blocks.{l}.mlp.hook_pre"),
    HookMatch("blocks.{l}.mlp.post", "blocks.{l}.mlp.hook_post"),
    HookMatch("blocks.{l}.mlp_out", "blocks.{l}.hook_mlp_out"),
    HookMatch("blocks.{l}.resid_post", "blocks.{l}.hook_resid_post"),
    HookMatch("ln_final", "unembed.hook_in"),
    HookMatch("logits", "unembed.hook_out"),
)

_BY_NAME = {match.name: match for match in HOOK_MATCHES}
_LAYER_NAME = re.compile(r"blocks\.(\d+)\.(.+)")


def hook_match(name: str) -> HookMatch:
    """The entry of :data:`HOOK_MATCHES` for the trace name ``name``, with its layer filled in.

        >>> hook_match("blocks.3.attn.k").hook
        'blocks.3.attn.hook_k'

    Raises:
        KeyError: ``name`` is not a transformer's trace name.
    """
    layered = _LAYER_NAME.fullmatch(name)
    layer, template = (layered.group(1), f"blocks.{{l}}.{layered.group(2)}") if layered else (None, name)
    if template not in _BY_NAME:
        raise KeyError(f"{name!r} is not a trace name of a transformer; see windtunnel.models.names")
    match = _BY_NAME[template]
    if layer is None:
        return match
    fill = {"l": layer}
    return HookMatch(
        name, match.hook.format(**fill), match.layout, match.affine and match.affine.format(**fill), match.note
    )


def trace_activation(tl_model: nn.Module, cache: Any, name: str) -> Tensor:
    """Our trace activation ``name`` from a TransformerLens ``run_with_cache`` cache of the export.

    Args:
        tl_model: the exported ``HookedTransformer`` (its LayerNorm weights, for ``affine`` entries).
        cache: ``tl_model.run_with_cache(tokens)[1]`` (an ``ActivationCache`` or a dict).
        name: one of our trace names, e.g. ``"blocks.0.attn.k"``.

    Returns:
        The tensor in our layout: what ``run_with_trace(model, tokens, name)`` records.
    """
    match = hook_match(name)
    value = cache[match.hook]
    if match.layout == "heads":
        value = value.transpose(1, 2)  # [B, T, H, ...] -> [B, H, T, ...]
    if match.affine is not None:
        norm = tl_model.get_submodule(match.affine)
        value = value * norm.w + norm.b
    return value


def hook_table_markdown() -> str:
    """:data:`HOOK_MATCHES` as the Markdown table of docs/export.md."""
    lines = ["| windtunnel trace name | TransformerLens hook | from the hook to ours |", "|---|---|---|"]
    for match in HOOK_MATCHES:
        how = {"same": "as is", "heads": "`.transpose(1, 2)`: `[B, T, H, …]` → `[B, H, T, …]`"}[match.layout]
        if match.affine is not None:
            how = f"`* {match.affine}.w + {match.affine}.b` (TL caches the LayerNorm before its weight and bias)"
        if match.note:
            how += f"; {match.note}"
        lines.append(f"| `{match.name}` | `{match.hook}` | {how} |")
    return "\n".join(lines)


# --- building the HookedTransformer ------------------------------------------------------


def _transformer_lens() -> Any:
    """The ``transformer_lens`` module, or a one-line :class:`ExportError` saying how to get it."""
    try:
        import transformer_lens
    except ImportError:
        raise ExportError(
            f"--to transformer-lens needs the transformer-lens package, which is not installed: "
            f"pip install 'windtunnel[lens]' (or '{TL_REQUIREMENT}')"
        ) from None
    try:
        transformer_lens.HookedTransformer  # noqa: B018 (4.0 removed it: its module raises ImportError)
    except (ImportError, AttributeError):
        raise ExportError(
            f"the installed transformer-lens has no HookedTransformer (4.0 removed it): "
            f"pip install '{TL_REQUIREMENT}'"
        ) from None
    return transformer_lens


def _not_a_transformer(kind: str) -> ExportError:
    return ExportError(
        f"model kind {kind!r} cannot be exported to TransformerLens: only transformers can "
        f"(model kind 'transformer'); the controls (LSTM, Mamba, MLP) have no TransformerLens counterpart"
    )


def _as_transformer(model: nn.Module) -> Transformer:
    model = unwrap_model(model)
    if not isinstance(model, Transformer):
        raise _not_a_transformer(getattr(model, "kind", type(model).__name__))
    if model.value_read_in is not None:
        raise ExportError("the model reads values beside its tokens (its tunnel's observations are values): "
                          "a HookedTransformer embeds token ids only")
    return model


def hooked_transformer_config(model: Transformer) -> dict[str, Any]:
    """The ``HookedTransformerConfig`` arguments (JSON-able) of the export of ``model``.

    Pre-norm LayerNorm blocks (``eps`` read from the model), exact-erf GELU (``"gelu"``,
    not GPT-2's tanh ``"gelu_new"``), learned absolute positions (``"standard"``), scores
    scaled by ``1/sqrt(d_head)``, the classes as the output vocabulary. The dtype is the
    model's, as a string (``"float32"``).
    """
    model = _as_transformer(model)
    config = model.config
    eps = {module.eps for module in model.modules() if isinstance(module, nn.LayerNorm)}
    if len(eps) != 1:
        raise ExportError(f"the model's LayerNorms use different eps {sorted(eps)}: TransformerLens has one eps")
    return {
        "n_layers": config.n_layers,
        "d_model": config.d_model,
        "n_heads": config.n_heads,
        "d_head": config.d_head,
        "d_mlp": config.d_mlp,
        "n_ctx": model.max_len,
        "d_vocab": model.vocab_size,
        "d_vocab_out": model.num_classes,
        "act_fn": "gelu",
        "normalization_type": "LN",
        "positional_embedding_type": "standard",
        "eps": eps.pop(),
        "model_name": "windtunnel-transformer",
        "dtype": str(model.W_E.dtype).removeprefix("torch."),
    }


def _build(config: dict[str, Any], device: str | torch.device = "cpu") -> nn.Module:
    """An uninitialized ``HookedTransformer`` from :func:`hooked_transformer_config`'s arguments."""
    tl = _transformer_lens()
    arguments = {**config, "dtype": getattr(torch, config["dtype"]), "device": str(device), "init_weights": False}
    with warnings.catch_warnings():
        # 3.x deprecates HookedTransformer in favour of TransformerBridge, which wraps a
        # Hugging Face model; ours is not one, and HookedTransformer is what the export targets.
        warnings.filterwarnings("ignore", message="HookedTransformer is deprecated", category=DeprecationWarning)
        return tl.HookedTransformer(tl.HookedTransformerConfig(**arguments), move_to_device=True)


def _tl_parameters(model: Transformer) -> dict[str, Tensor]:
    """Our weights under the HookedTransformer's parameter names.

    Layers built without attention get zero W_Q, W_K, W_V, W_O and biases (and an identity
    LayerNorm): their attention then adds exactly 0.0 to the residual stream, which is what
    our layer without the sublayer does.
    """
    d_model, H, d_head = model.d_model, model.n_heads, model.d_head
    W_Q, W_K, W_V, W_O = model.W_Q, model.W_K, model.W_V, model.W_O  # [L, H, d_model, d_head], W_O [L, H, d_head, d_model]
    zeros = W_Q.new_zeros
    params = {
        "embed.W_E": model.W_E,  # [d_vocab, d_model]
        "pos_embed.W_pos": model.W_pos,  # [n_ctx, d_model]
        "ln_final.w": model.ln_final.weight,
        "ln_final.b": model.ln_final.bias,
        "unembed.W_U": model.W_U,  # [d_model, C]
        "unembed.b_U": model.b_U,  # [C]
    }
    for layer, block in enumerate(model.blocks):
        p = f"blocks.{layer}"
        attn_ln = block.attn.ln if block.attn is not None else None
        params |= {
            f"{p}.ln1.w": attn_ln.weight if attn_ln is not None else W_Q.new_ones(d_model),
            f"{p}.ln1.b": attn_ln.bias if attn_ln is not None else zeros(d_model),
            f"{p}.attn.W_Q": W_Q[layer],
            f"{p}.attn.W_K": W_K[layer],
            f"{p}.attn.W_V": W_V[layer],
            f"{p}.attn.W_O": W_O[layer],
            # ours has no attention biases (see windtunnel.models.components.Attention)
            f"{p}.attn.b_Q": zeros(H, d_head),
            f"{p}.attn.b_K": zeros(H, d_head),
            f"{p}.attn.b_V": zeros(H, d_head),
            f"{p}.attn.b_O": zeros(d_model),
            f"{p}.ln2.w": block.mlp.ln.weight,
            f"{p}.ln2.b": block.mlp.ln.bias,
            f"{p}.mlp.W_in": block.mlp.fc_in.weight.t(),  # [d_model, d_mlp]
            f"{p}.mlp.b_in": block.mlp.fc_in.bias,
            f"{p}.mlp.W_out": block.mlp.fc_out.weight.t(),  # [d_mlp, d_model]
            f"{p}.mlp.b_out": block.mlp.fc_out.bias,
        }
    return {name: value.detach().clone().contiguous() for name, value in params.items()}


def _load_parameters(tl_model: nn.Module, params: dict[str, Tensor]) -> None:
    """Load ``params`` into ``tl_model``: every parameter, and nothing but parameters (the
    state dict's other keys are TransformerLens's own buffers, which it fills itself)."""
    expected = {name for name, _ in tl_model.named_parameters()}
    if set(params) != expected:
        missing, unknown = sorted(expected - set(params)), sorted(set(params) - expected)
        raise ExportError(
            f"the weights do not fit this TransformerLens model (missing {missing[:4]}, unknown {unknown[:4]}); "
            f"install '{TL_REQUIREMENT}'"
        )
    tl_model.load_state_dict(params, strict=False)


def to_hooked_transformer(model: nn.Module, *, device: str | torch.device = "cpu") -> nn.Module:
    """A ``transformer_lens.HookedTransformer`` computing the same function as ``model``.

    Args:
        model: a windtunnel :class:`~windtunnel.models.Transformer` (any variant, e.g.
            with ``no_attention_layers``), in any dtype: the export has the same.
        device: where the export lives.

    Returns:
        The export in eval mode; ``tl_model(tokens)`` is ``[B, T, C]`` logits equal to
        ours up to float reassociation (``tests/test_export.py``). Its weights are copies:
        editing one model never changes the other.

    Raises:
        ExportError: ``model`` is not a transformer (the LSTM, Mamba and MLP controls),
            or TransformerLens is missing or too new.
    """
    model = _as_transformer(model)
    tl_model = _build(hooked_transformer_config(model), device)
    _load_parameters(tl_model, {name: value.to(device) for name, value in _tl_parameters(model).items()})
    return tl_model.eval()


# --- the files -------------------------------------------------------------------------


def check_out(out: Path, *, overwrite: bool) -> None:
    """Refuse an output path that holds something, unless ``overwrite`` and it is an earlier export."""
    if not out.exists() and not out.is_symlink():
        return
    if not out.is_dir() or out.is_symlink():
        raise ExportError(f"OUT {str(out)!r} exists and is not a directory: give a new path")
    if not has_content(out):
        return  # an empty folder is taken, as `train --out` takes one (its writers' lock aside)
    if not overwrite:
        raise ExportError(f"OUT {str(out)!r} exists: give a new path, or pass --overwrite to replace an earlier export")
    if not _is_export(out):
        raise ExportError(
            f"OUT {str(out)!r} is not a windtunnel export (no {CONFIG_FILE} with format {FORMAT_TAG!r}): "
            "--overwrite replaces only an earlier export; give a new path"
        )


def _is_export(folder: Path) -> bool:
    try:
        return json.loads((folder / CONFIG_FILE).read_text()).get("format") == FORMAT_TAG
    except (OSError, ValueError, AttributeError):
        return False


def _check_same_function(model: Transformer, batch: int = 4) -> float:
    """Largest |logit difference| between ``model`` and its export in float64 on random
    tokens; refuses the export when it is beyond float64 rounding.

    Guards against a TransformerLens release that computes something else than the one
    ``tests/test_export.py`` checked (a changed default, a different GELU): better no
    export than a subtly different one.
    """
    model64 = copy.deepcopy(model).to(device="cpu", dtype=torch.float64).eval()
    tokens = torch.randint(0, model.vocab_size, (batch, model.max_len), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = model64.run_with_trace(tokens, "logits")[1]["logits"]  # [B, T, C], float64 (forward returns float32)
        theirs = to_hooked_transformer(model64)(tokens)  # [B, T, C]
    difference = (ours - theirs).abs().max().item()
    # float64 reassociation error is ~1e-16 relative per operation; 1e-9 relative leaves
    # room for depth and still catches any real difference (a float32 cast alone is 1e-7).
    if not difference <= 1e-9 * (1.0 + ours.abs().max().item()):
        raise ExportError(
            f"the TransformerLens export computes different logits (max difference {difference:.3g}); "
            f"install '{TL_REQUIREMENT}'"
        )
    return difference


def export_run(
    run_dir: Path,
    out: Path,
    *,
    to: str = "transformer-lens",
    step: int | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Export the trained transformer of ``run_dir`` into the new folder ``out``.

    Atomic: the files are written into a temporary folder beside ``out`` that is renamed
    to ``out`` at the end, so a failed export leaves nothing (and an overwritten export
    stays whole until the new one is complete).

    Args:
        run_dir: a run directory (``windtunnel train --out``).
        out: the folder to create (an empty one is taken too).
        to: the format, one of :data:`FORMATS`.
        step: export this snapshot instead of the final weights.
        overwrite: replace ``out`` when it is an earlier export (never anything else).

    Returns:
        What was written: ``{"export", "format", "run_dir", "step", "max_logit_difference_float64"}``
        (the self-check's largest |logit difference| between the export and our forward).

    Raises:
        ExportError: an unknown format, ``out`` in the way, a model that is not a
            transformer, TransformerLens missing.
        CheckpointError: ``run_dir`` is not a trained run, or ``step`` not a snapshot.
    """
    run_dir, out = Path(run_dir), Path(out)
    if to not in FORMATS:
        raise ExportError(f"--to {to!r} is not a format windtunnel exports to; choose one of: {', '.join(FORMATS)}")
    # The cheap checks first: the output path and the run's config say most refusals
    # before TransformerLens (seconds to import) or the weights are read.
    check_out(out, overwrite=overwrite)
    check_run_files(run_dir)
    kind = read_run_config(run_dir).model_kind
    if not issubclass(model_class(kind), Transformer):
        raise _not_a_transformer(kind)
    _transformer_lens()
    config, model, trained = load_run_model(run_dir, step=step)
    model = _as_transformer(model).eval()
    difference = _check_same_function(model)
    tl_model = to_hooked_transformer(model)
    document = {
        "format": FORMAT_TAG,
        "hooked_transformer_config": hooked_transformer_config(model),
        "windtunnel": {
            "version": __version__,
            "run_dir": recorded_run_dir(run_dir),
            "step": trained,
            "tunnel": config.tunnel.name,
            "model": config.model_kind,
            "variant": type(model).variant(model.config),
            "no_attention_layers": list(model.config.no_attention_layers),
            "max_logit_difference_float64": difference,
        },
    }
    weights = save({name: value.detach().cpu().contiguous() for name, value in tl_model.named_parameters()})
    _write_folder(out, {WEIGHTS_FILE: weights, CONFIG_FILE: (json.dumps(document, indent=1) + "\n").encode()})
    return {"export": str(out), "format": to, "run_dir": str(run_dir), "step": trained, "max_logit_difference_float64": difference}


def _write_folder(out: Path, files: dict[str, bytes]) -> None:
    """Create ``out`` holding ``files``, all at once (one rename), or not at all.

    Missing parents are made, and removed again if the export fails. An existing ``out``
    (checked by the caller: empty, or an export to overwrite) is moved aside first and
    only deleted once the new folder is in place. Where ``out`` holds the writers' lock
    (``windtunnel export`` takes it, as every command that writes a folder does), the lock
    file moves into the new folder with it: the same file, so the lock stays held throughout.
    """
    out = out.absolute()
    made = [folder for folder in (out.parent, *out.parent.parents) if not folder.exists()][::-1]  # outermost first
    for folder in made:
        folder.mkdir()
    aside: Path | None = None
    lock_moved = False
    staging = out.parent / f".{out.name}.{uuid.uuid4().hex}.tmp"  # hidden; a plain mkdir, so the umask applies
    try:
        staging.mkdir()
        for name, data in files.items():
            atomic_write_bytes(staging / name, data)
        if out.is_dir() and has_content(out):
            aside = out.parent / f".{out.name}.{uuid.uuid4().hex}.old"
            os.replace(out, aside)  # the lock goes with it: moved back below
            lock = aside / LOCK_FILE
        else:
            lock = out / LOCK_FILE
        if lock.exists():
            os.replace(lock, staging / LOCK_FILE)
            lock_moved = True
        os.replace(staging, out)  # onto nothing, or an empty folder
    except BaseException:
        if lock_moved and (staging / LOCK_FILE).exists():
            os.replace(staging / LOCK_FILE, (aside or out) / LOCK_FILE)
        shutil.rmtree(staging, ignore_errors=True)
        if aside is not None and not out.exists():
            os.replace(aside, out)
        for folder in reversed(made):
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        raise
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def load_transformer_lens(path: Path, *, device: str | torch.device = "cpu") -> nn.Module:
    """The ``HookedTransformer`` that :func:`export_run` wrote into ``path``, in eval mode.

    Needs only the folder (not the run directory it came from).

    Raises:
        ExportError: ``path`` is not an export, or TransformerLens is missing.
    """
    path = Path(path)
    if not _is_export(path):
        raise ExportError(f"{str(path)!r} is not a windtunnel TransformerLens export (no {CONFIG_FILE} with format {FORMAT_TAG!r})")
    config = json.loads((path / CONFIG_FILE).read_text())["hooked_transformer_config"]
    tl_model = _build(config, device)
    _load_parameters(tl_model, load_file(path / WEIGHTS_FILE, device=str(device)))
    return tl_model.eval()
