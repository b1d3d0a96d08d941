"""Typed, strict parameter objects: the one place where values from files and the
command line are checked against what a frozen dataclass declares.

Every parameter object in windtunnel (a tunnel's parameters now; model, training and
run configs later) is a frozen dataclass whose ``__post_init__`` calls
:func:`check_field_types` and then checks ranges, raising :class:`ConfigError` with
one line that names the parameter, the value and what is allowed.

    >>> from windtunnel.tunnels import BijectionTunnel
    >>> from_mapping(BijectionTunnel, {"V": 6})
    BijectionTunnel(V=6, L=None, with_replacement=False, query=False)
    >>> apply_overrides(BijectionTunnel, {}, ["V=8", "with_replacement=true"])
    {'V': 8, 'with_replacement': True}
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Literal, get_args, get_origin, get_type_hints

__all__ = [
    "ConfigError",
    "apply_overrides",
    "check_field_types",
    "from_mapping",
    "parse_text",
    "to_mapping",
]


class ConfigError(ValueError):
    """A bad parameter: the message is one line naming it, its value and what is allowed."""


def _type_name(annotation: Any) -> str:
    origin = get_origin(annotation)
    if origin is Literal:
        return " | ".join(repr(a) for a in get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in get_args(annotation))
    if origin is tuple:
        return f"list of {_type_name(get_args(annotation)[0])}"
    if annotation is type(None):
        return "none"
    return getattr(annotation, "__name__", str(annotation))


class _OutOfRange(ConfigError):
    """A value of the right type that no parameter can take (NaN, inf, an int beyond 64 bits)."""


def _coerce(value: Any, annotation: Any, name: str) -> Any:
    """Return ``value`` as ``annotation`` (lists become tuples, ints become floats), or raise."""
    origin = get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        for option in get_args(annotation):
            try:
                return _coerce(value, option, name)
            except _OutOfRange:
                raise  # the right type with an impossible value: say so, not "wrong type"
            except ConfigError:
                continue
    elif origin is Literal:
        if value in get_args(annotation):
            return value
    elif origin is tuple:
        (item_type, ellipsis) = get_args(annotation)
        assert ellipsis is Ellipsis, "only homogeneous tuple[X, ...] parameters are supported"
        if isinstance(value, Sequence) and not isinstance(value, str):
            return tuple(_coerce(v, item_type, f"{name}[{i}]") for i, v in enumerate(value))
    elif annotation is type(None):
        if value is None:
            return None
    elif annotation is bool:
        if isinstance(value, bool):
            return value
    elif annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            if not -(2**63) <= value < 2**63:  # seeds and sizes become int64 (torch generators, tensor shapes)
                raise _OutOfRange(f"{name}={value} is out of range: need an integer that fits in 64 bits")
            return value
    elif annotation is float:
        # An int is a fine float (``grid = 1`` in a file), a bool is not.
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):  # NaN passes every range check (all comparisons are false)
                raise _OutOfRange(f"{name}={value} is out of range: need a finite number")
            return float(value)
    elif annotation is str:
        if isinstance(value, str):
            return value
    elif dataclasses.is_dataclass(annotation):
        if isinstance(value, annotation):
            return value
        if isinstance(value, Mapping):
            return from_mapping(annotation, value, prefix=f"{name}.")
    else:  # pragma: no cover - a programming error in a parameter class
        raise TypeError(f"unsupported parameter annotation {annotation!r} for {name}")
    raise ConfigError(f"{name}={value!r} has the wrong type: expected {_type_name(annotation)}")


def check_field_types(obj: Any) -> None:
    """Check (and normalize, e.g. list -> tuple) every field of a frozen dataclass in place.

    Called from ``__post_init__`` so that objects built directly in Python are held to
    the same rules as those loaded from files or the command line.
    """
    hints = get_type_hints(type(obj))
    for field in dataclasses.fields(obj):
        value = getattr(obj, field.name)
        coerced = _coerce(value, hints[field.name], field.name)
        if coerced is not value:
            object.__setattr__(obj, field.name, coerced)


def _dataclass_of(annotation: Any) -> type | None:
    """The dataclass an annotation holds: ``C`` for ``C`` or ``C | None``, else None."""
    if dataclasses.is_dataclass(annotation):
        return annotation
    if get_origin(annotation) in (typing.Union, types.UnionType):
        options = [a for a in get_args(annotation) if a is not type(None)]
        if len(options) == 1 and dataclasses.is_dataclass(options[0]):
            return options[0]
    return None


def _field_types(cls: type) -> dict[str, Any]:
    hints = get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _unknown_key(key: str, prefix: str, cls: type) -> ConfigError:
    allowed = ", ".join(_field_types(cls))
    return ConfigError(f"unknown key '{prefix}{key}' for {cls.__name__}; allowed keys: {allowed}")


def from_mapping(cls: type, data: Mapping[str, Any], *, prefix: str = "") -> Any:
    """Build the dataclass ``cls`` from a mapping, refusing keys it does not declare."""
    types_by_name = _field_types(cls)
    kwargs = {}
    for key, value in data.items():
        if key not in types_by_name:
            raise _unknown_key(key, prefix, cls)
        nested = _dataclass_of(types_by_name[key])
        if nested is not None and isinstance(value, Mapping):
            value = from_mapping(nested, value, prefix=f"{prefix}{key}.")
        kwargs[key] = value
    try:
        return cls(**kwargs)
    except ConfigError as error:
        if prefix:  # name nested parameters by their full dotted path
            raise ConfigError(f"{prefix}{error}") from None
        raise


def to_mapping(obj: Any) -> dict[str, Any]:
    """The inverse of :func:`from_mapping` (tuples become lists, for JSON and TOML)."""

    def plain(value: Any) -> Any:
        if dataclasses.is_dataclass(value):
            return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, tuple):
            return [plain(v) for v in value]
        return value

    return plain(obj)


_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def parse_text(text: str, annotation: Any, name: str) -> Any:
    """Parse a command-line string as ``annotation`` (``1e-3`` -> float, ``a,b`` -> tuple)."""
    origin = get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        options = get_args(annotation)
        if type(None) in options and text.strip().lower() in {"none", "null"}:
            return None
        for option in options:
            if option is type(None):
                continue
            try:
                return parse_text(text, option, name)
            except ConfigError:
                continue
    elif origin is Literal:
        for option in get_args(annotation):
            if str(option) == text:
                return option
    elif origin is tuple:
        item_type = get_args(annotation)[0]
        items = [t for t in text.replace("[", "").replace("]", "").split(",") if t.strip()]
        return tuple(parse_text(t.strip(), item_type, f"{name}[{i}]") for i, t in enumerate(items))
    elif annotation is bool:
        if text.strip().lower() in _TRUE | _FALSE:
            return text.strip().lower() in _TRUE
    elif annotation is int:
        try:
            return int(text)
        except ValueError:
            pass
    elif annotation is float:
        try:
            return float(text)
        except ValueError:
            pass
    elif annotation is str:
        return text
    raise ConfigError(f"{name}={text!r} has the wrong type: expected {_type_name(annotation)}")


def apply_overrides(cls: type, data: Mapping[str, Any], assignments: Sequence[str], *, prefix: str = "") -> dict[str, Any]:
    """Return a copy of ``data`` with each ``dotted.key=value`` assignment applied, typed by ``cls``.

    ``prefix`` (e.g. ``"train."``) is prepended to the keys named in error messages.
    """
    result: dict[str, Any] = _deep_copy(data)
    for assignment in assignments:
        key, sep, text = assignment.partition("=")
        if not sep or not key.strip() or "" in (part.strip() for part in key.split(".")):
            raise ConfigError(f"override {prefix + assignment!r} is not of the form key=value")
        path = key.strip().split(".")
        owner, node = cls, result
        for depth, part in enumerate(path):
            types_by_name = _field_types(owner)
            if part not in types_by_name:
                raise _unknown_key(part, prefix + "".join(p + "." for p in path[:depth]), owner)
            annotation = types_by_name[part]
            if depth == len(path) - 1:
                node[part] = parse_text(text, annotation, prefix + ".".join(path))
            elif _dataclass_of(annotation) is not None:
                child = node.get(part)
                if child is None:
                    child = {}
                elif dataclasses.is_dataclass(child):
                    child = to_mapping(child)
                node[part] = child
                owner, node = _dataclass_of(annotation), child
            else:
                raise ConfigError(f"'{prefix}{'.'.join(path[: depth + 1])}' is a value, not a section; cannot set {prefix}{key}")
    return result


def _deep_copy(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, Mapping) else v for k, v in data.items()}
