"""The model registry: build any model family from its name and parameters.

A family is one :class:`~windtunnel.models.base.SequenceModel` subclass that declares
everything about itself (see :mod:`windtunnel.models.base`), registered here by its
``kind`` with :func:`register_model`: the two built-in families below, and any other
(a test's toy family, a new architecture) from outside the package. Its ``[model]``
section of a run config then parses through ``config_class``.

    >>> model = build_model("mlp", {"d_model": 192, "matched_to": {}}, vocab_size=40, num_classes=20, max_len=39)
    >>> type(model).__name__, model.config.n_blocks
    ('MLPControl', 18)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from windtunnel.config import ConfigError, from_mapping
from windtunnel.models.base import ROLES, SequenceModel
from windtunnel.models.lstm import LSTMControl
from windtunnel.models.mamba import MambaControl
from windtunnel.models.mlp import MLPControl
from windtunnel.models.transformer import Transformer

__all__ = ["MODELS", "build_model", "model_class", "register_model"]

#: Registry of model families by name; ``MODELS[kind].config_class`` is the parameter class.
#: Filled by :func:`register_model` only.
MODELS: dict[str, type[SequenceModel]] = {}


def register_model(cls: type[SequenceModel]) -> type[SequenceModel]:
    """Register the family ``cls`` under ``cls.kind``; return ``cls`` (so it also decorates).

    Raises:
        ValueError: ``cls`` is not a :class:`SequenceModel` subclass, leaves ``kind``,
            ``config_class`` or ``role`` undeclared or invalid, or its kind or config class
            is registered already (a run config names its family by kind, and
            ``RunConfig.model_kind`` finds it by config class: both must be unique).
    """
    if not (isinstance(cls, type) and issubclass(cls, SequenceModel)):
        raise ValueError(f"register_model({cls!r}): a model family is a SequenceModel subclass")
    name = cls.__name__
    kind = getattr(cls, "kind", None)
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"{name}.kind={kind!r}: a model family declares its registry name as a non-empty string")
    config_class = getattr(cls, "config_class", None)
    fields = {f.name for f in dataclasses.fields(config_class)} if dataclasses.is_dataclass(config_class) else set()
    if not isinstance(config_class, type) or "max_len" not in fields:
        raise ValueError(f"{name}.config_class={config_class!r}: a model family's config is a dataclass with a max_len field")
    role = getattr(cls, "role", None)
    if role not in ROLES:
        raise ValueError(f"{name}.role={role!r}: a model family's role is one of {', '.join(ROLES)}")
    if kind in MODELS:
        raise ValueError(f"model kind {kind!r} is registered already (by {MODELS[kind].__name__}); choose another kind")
    for other in MODELS.values():
        if other.config_class is config_class:
            raise ValueError(
                f"{name}.config_class={config_class.__name__} is registered already (by model kind {other.kind!r}); "
                "each family has its own config class"
            )
    MODELS[kind] = cls
    return cls


for _family in (Transformer, MLPControl, LSTMControl, MambaControl):
    register_model(_family)


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
    value_dim: int = 0,
) -> SequenceModel:
    """Build a freshly initialized model.

    Args:
        kind: a key of :data:`MODELS` ("transformer", "mlp", or a registered family).
        config: the family's config object, a mapping of its fields (checked strictly),
            or None for the defaults.
        vocab_size: the tunnel's number of token ids.
        num_classes: the tunnel's number of output classes.
        max_len: the longest sequence the run will feed; ``config.max_len`` wins when set
            (and must be at least this).
        generator: seeds the initial weights; None uses the global RNG.
        value_dim: values per position the tunnel's episodes carry beside the tokens (its
            ``ValueInputs``): the model gets a linear read-in of them. 0: tokens only.

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
    model = cls(config, vocab_size=vocab_size, num_classes=num_classes, max_len=max_len, generator=generator)
    if value_dim:
        model.add_value_read_in(value_dim, generator)
    return model
