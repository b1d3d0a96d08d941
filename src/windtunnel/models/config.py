"""Parameter objects of the two built-in model families: frozen, type-checked dataclasses.

A model config holds only the model's own shape. What it learns from the tunnel
(``vocab_size``, ``num_classes``, and ``max_len`` when the config leaves it ``None``) is
passed to the builder separately, so one config file serves every tunnel.

    >>> TransformerConfig(n_layers=9, n_heads=8, d_model=256, d_mlp=1024).d_head
    32
    >>> MLPConfig(d_model=256, matched_to=TransformerConfig(9, 8, 256, 1024)).n_blocks is None
    True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from windtunnel.config import ConfigError, check_field_types

__all__ = ["INIT_STD", "MLPConfig", "ModelConfig", "TransformerConfig", "check_control_config", "resolve_max_len"]

#: Standard deviation of the initial weights (GPT-2's choice).
INIT_STD = 0.02


class ModelConfig(Protocol):
    """What the rest of the package needs of any family's config.

    A family's ``config_class`` is a frozen dataclass of typed fields (so run configs
    check, override and serialize it field by field) with a ``max_len`` field: the
    position table, ``None`` to take the run's longest sequence.
    """

    @property
    def max_len(self) -> int | None:
        """Size of the position table (``None``: filled in by the run)."""


def _check_positive(name: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise ConfigError(f"{name}={value} is out of range: need {name} >= 1")


@dataclass(frozen=True)
class TransformerConfig:
    """A pre-norm causal transformer (docs/protocol.md §4).

    Args:
        n_layers: number of residual blocks.
        n_heads: attention heads per block; must divide ``d_model``.
        d_model: residual stream width.
        d_mlp: hidden width of each block's GELU feed-forward network.
        max_len: size of the learned position table; ``None`` lets the run fill it in
            from the tunnel's longest sequence (the builder's ``max_len``).
        no_attention_layers: indices of blocks built without attention (feed-forward and
            residual kept): the paper's "late attention disabled" variant is ``(7, 8)``
            for the 9-layer HMM model.
        init_std: standard deviation of the initial weights (GPT-2's 0.02; the
            projections into the residual stream get ``init_std / sqrt(2 * n_layers)``).
            A knob of the HMM recipe study (``bench/hmm_recipe.py``); the presets keep 0.02.
    """

    n_layers: int = 6
    n_heads: int = 6
    d_model: int = 192
    d_mlp: int = 768
    max_len: int | None = None
    no_attention_layers: tuple[int, ...] = ()
    init_std: float = INIT_STD

    def __post_init__(self) -> None:
        check_field_types(self)
        for name in ("n_layers", "n_heads", "d_model", "d_mlp", "max_len"):
            _check_positive(name, getattr(self, name))
        if not self.init_std > 0:  # NaN and infinities are refused by check_field_types
            raise ConfigError(f"init_std={self.init_std} is out of range: need init_std > 0")
        if self.d_model % self.n_heads:
            raise ConfigError(
                f"n_heads={self.n_heads} does not divide d_model={self.d_model}: need d_model % n_heads == 0"
            )
        layers = self.no_attention_layers
        for layer in layers:
            if not 0 <= layer < self.n_layers:
                raise ConfigError(
                    f"no_attention_layers={list(layers)} is out of range: "
                    f"layer indices must lie in 0..{self.n_layers - 1}"
                )
        if len(set(layers)) != len(layers):
            raise ConfigError(f"no_attention_layers={list(layers)} repeats a layer: list each layer once")

    @property
    def d_head(self) -> int:
        """Width of each head's queries, keys and values."""
        return self.d_model // self.n_heads


@dataclass(frozen=True)
class MLPConfig:
    """The capacity-matched, attention-free control (docs/protocol.md §4).

    A per-position stack of residual MLP blocks on the same token + position
    embeddings as the transformer. Leave ``n_blocks`` and/or ``d_hidden`` as ``None``
    to have them chosen (see :func:`windtunnel.models.sizing.size_mlp`) so that the
    parameter count is within 1% of the transformer described by ``matched_to``
    (built for the same vocabulary, classes and position table).

    Args:
        d_model: embedding and residual width; equal to ``matched_to.d_model`` when
            matching (the control shares the transformer's embeddings).
        n_blocks: number of residual MLP blocks (``None``: chosen by sizing, 18-20).
        d_hidden: hidden width of each block (``None``: chosen by sizing).
        max_len: size of the position table (``None``: filled in by the run).
        matched_to: the transformer whose parameter count the control matches.
    """

    d_model: int = 192
    n_blocks: int | None = None
    d_hidden: int | None = None
    max_len: int | None = None
    matched_to: TransformerConfig | None = None

    def __post_init__(self) -> None:
        check_control_config(self, ("n_blocks", "d_hidden"))


def check_control_config(config: Any, sizes: tuple[str, str], others: tuple[str, ...] = ()) -> None:
    """The checks every capacity-matched control's config makes: field types; ``d_model``,
    ``max_len``, the two ``sizes`` and ``others`` positive where set; both sizes given unless
    a transformer to match is (``matched_to``); and that transformer's embedding width.

    Raises:
        ConfigError: one line naming the field, its value and what is allowed.
    """
    check_field_types(config)
    for name in ("d_model", *sizes, *others, "max_len"):
        _check_positive(name, getattr(config, name))
    depth, width = (getattr(config, name) for name in sizes)
    if (depth is None or width is None) and config.matched_to is None:
        raise ConfigError(
            f"matched_to=None leaves {sizes[0]}={depth}, {sizes[1]}={width} undetermined: "
            "give both sizes or a transformer to match"
        )
    if config.matched_to is not None and config.matched_to.d_model != config.d_model:
        raise ConfigError(
            f"d_model={config.d_model} differs from matched_to.d_model={config.matched_to.d_model}: "
            "the control uses the transformer's embedding width"
        )


def resolve_max_len(config_max_len: int | None, max_len: int | None) -> int:
    """The position-table size: the config's if set, else the run's.

    Args:
        config_max_len: ``max_len`` from the model config (may be ``None``).
        max_len: the longest sequence the run will feed (from the tunnel), or ``None``.

    Raises:
        ConfigError: neither is known, or the config's table is shorter than the
            sequences the run needs.
    """
    if config_max_len is None:
        if max_len is None:
            raise ConfigError(
                "max_len=None in the model config and none given by the run: "
                "set model.max_len or pass the tunnel's sequence length"
            )
        _check_positive("max_len", max_len)
        return max_len
    if max_len is not None and max_len > config_max_len:
        raise ConfigError(
            f"max_len={config_max_len} is out of range: the run needs positions up to {max_len}; "
            f"need max_len >= {max_len}"
        )
    return config_max_len
