"""Hand-written analysis results for the report's tests, completed into their typed form.

A test writes only the values a claim or table reads (``{"layers": [{"ratios": ...}]}``);
:func:`typed_results` fills every other field of the analysis's result type with a neutral
value (0, "", empty, None) and builds the type, so the report reads exactly what it reads from
a saved folder. A summary over runs given by its mean alone is one run's value: its median,
smallest and largest value are that mean. Where a field accepts two classes (a horizon within
or beyond training), the smallest class holding every key given is built.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Union

from windtunnel.results import RESULT_TYPES, Summary, from_json


def _neutral(kind: Any) -> Any:
    origin = typing.get_origin(kind)
    if origin in (Union, types.UnionType):
        return None if type(None) in typing.get_args(kind) else _neutral(typing.get_args(kind)[0])
    if dataclasses.is_dataclass(kind):
        return fill(kind, {})
    if origin is tuple:
        args = typing.get_args(kind)
        return [] if len(args) == 2 and args[1] is Ellipsis else [_neutral(a) for a in args]
    return {} if origin is dict else {float: 0.0, int: 0, str: "", bool: False}.get(kind)


def _fill_value(kind: Any, value: Any) -> Any:
    origin = typing.get_origin(kind)
    if origin in (Union, types.UnionType):
        options = [o for o in typing.get_args(kind) if o is not type(None)]
        classes = [o for o in options if dataclasses.is_dataclass(o)]
        if not isinstance(value, dict) or not classes:
            return value
        fitting = [c for c in classes if set(value) <= {f.name for f in dataclasses.fields(c)}]
        return fill(min(fitting or classes, key=lambda c: len(dataclasses.fields(c))), value)
    if dataclasses.is_dataclass(kind) and isinstance(value, dict):
        return fill(kind, value)
    if origin is tuple and isinstance(value, list):
        args = typing.get_args(kind)
        item = args[0] if len(args) == 2 and args[1] is Ellipsis else None
        return [_fill_value(item, v) for v in value] if item is not None else value
    if origin is dict and isinstance(value, dict):
        return {k: _fill_value(typing.get_args(kind)[1], v) for k, v in value.items()}
    return value


def fill(kind: type, partial: dict[str, Any]) -> dict[str, Any]:
    """``partial`` with every missing required field of dataclass ``kind`` set to a neutral
    value, recursively (plain JSON values, in field order)."""
    hints = typing.get_type_hints(kind)
    if issubclass(kind, Summary) and "mean" in partial:
        partial = {"median": partial["mean"], "min": partial["mean"], "max": partial["mean"], **partial}
    out = {}
    for f in dataclasses.fields(kind):
        if f.name in partial:
            out[f.name] = _fill_value(hints[f.name], partial[f.name])
        elif f.default is dataclasses.MISSING:
            out[f.name] = _neutral(hints[f.name])
    return out


def typed_result(analysis: str, partial: dict[str, Any]) -> Any:
    """The typed result of ``analysis`` holding ``partial``, the rest neutral."""
    kind = RESULT_TYPES[analysis]
    return from_json(kind, fill(kind, {"analysis": analysis, **partial}))


def typed_results(results: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """``{group: {analysis: partial}}`` as the report reads a folder: every result typed."""
    return {group: {name: typed_result(name, partial) for name, partial in analyses.items()} for group, analyses in results.items()}
