"""The model registry: build any model family from its name and parameters.

    >>> model = build_model("mlp", {"d_model": 192, "matched_to": {}}, vocab_size=40, num_classes=20, max_len=39)
    >>> type(model).__name__, model.config.n_blocks
    ('MLPControl', 18)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from windtunnel.config import ConfigError, from_mapping
from windtunnel.models.base import SequenceModel
from windtunnel.models.mlp import MLPControl
from windtunnel.models.transformer import Transformer

__all__ = ["MODELS", "build_model", "model_class"]

#: Registry of model families by name; ``MODELS[kind].config_class`` is the parameter class.
MODELS: dict[str, type[SequenceModel]] = {cls.kind: cls for cls in (Transformer, MLPControl)}


def model_class(kind: str) -> type[SequenceModel]:
    """The model class registered as ``kind``; an unknown kind lists the valid ones."""
    try:
        return MODELS[kind]
    except KeyError:
        raise ConfigError(f"model kind {kind!r} is unknown; choose one of: {', '.join(sorted(MODELS))}") from None


def build_model(
    kind: str,
    config: Any,
    *,
    vocab_size: int,
    num_classes: int,
    max_len: int | None = None,
    generator: torch.Generator | None = None,
) -> SequenceModel:
    """Build a freshly initialized model.

    Args:
        kind: a key of :data:`MODELS` ("transformer", "mlp").
        config: the family's config object, a mapping of its fields (checked strictly),
            or None for the defaults.
        vocab_size: the tunnel's number of token ids.
        num_classes: the tunnel's number of output classes.
        max_len: the longest sequence the run will feed; ``config.max_len`` wins when set
            (and must be at least this).
        generator: seeds the initial weights; None uses the global RNG.

    Raises:
        ConfigError: unknown kind, a config of another family, a bad field, or no
            ``max_len`` known.
    """
    cls = model_class(kind)
    config_class = cls.config_class
    if config is None:
        config = config_class()
    elif isinstance(config, Mapping):
        config = from_mapping(config_class, config)
    elif not isinstance(config, config_class):
        raise ConfigError(
            f"config={type(config).__name__} does not fit model kind {kind!r}: expected {config_class.__name__}"
        )
    return cls(config, vocab_size=vocab_size, num_classes=num_classes, max_len=max_len, generator=generator)
