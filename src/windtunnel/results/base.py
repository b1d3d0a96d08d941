"""Typed results: frozen dataclasses that round-trip through JSON, and what they share.

An analysis result on disk is a JSON object; in memory it is a frozen dataclass whose
fields mirror that object key by key, in the same order, so ``to_json(from_json(T, data))``
gives back ``data`` exactly (a saved file re-written from its type is the same bytes).

The conversion is written here rather than taken from pydantic or msgspec: the analyses
also run on GPU machines with no package registry, where only the standard library and
PyTorch can be relied on, and the report must build from saved folders on any machine. It
is short because the types use few shapes: dataclasses, ``tuple[X, ...]``, ``dict[K, V]``
(int keys are JSON's strings), ``X | None``, ``str``, ``int``, ``float``, ``bool`` and
``Any`` (kept as read, for the rare part that is free-form).

A field made with :func:`omitted_when_none` is absent from the JSON when it is None (a key
an analysis writes only in some cases, such as the numbers past the training horizon).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from functools import cache
from typing import Any, TypeVar, Union

__all__ = ["RESULT_TYPES", "AnalysisResult", "MetricSummaries", "Metrics", "ResultError", "Summary", "from_json", "omitted_when_none", "result_type", "to_json"]

T = TypeVar("T")

_OMIT = "omitted_when_none"


class ResultError(ValueError):
    """Saved data does not fit its result type; the message names the path to the bad value."""


def omitted_when_none() -> Any:
    """A field that defaults to None and is left out of the JSON while it is None."""
    return field(default=None, metadata={_OMIT: True})


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def to_json(value: Any) -> Any:
    """``value`` as plain JSON values: dataclasses as objects in field order, tuples as
    lists, dict keys as strings."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {}
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            if item is None and f.metadata.get(_OMIT):
                continue
            out[f.name] = to_json(item)
        return out
    if isinstance(value, (list, tuple)):
        return [to_json(item) for item in value]
    if isinstance(value, dict):
        return {str(key): to_json(item) for key, item in value.items()}
    return value


def _fail(where: str, expected: str, data: Any) -> ResultError:
    shown = repr(data) if len(repr(data)) <= 40 else type(data).__name__
    return ResultError(f"{where or 'the result'}: expected {expected}, found {shown}")


def from_json(kind: Any, data: Any, where: str = "") -> Any:
    """``data`` (plain JSON values) as type ``kind``; a :class:`ResultError` naming the path
    (``horizons.30.kl_bits``) of the first value that does not fit."""
    origin = typing.get_origin(kind)
    if kind is Any:
        return data
    if origin in (Union, types.UnionType):
        options = typing.get_args(kind)
        if data is None and type(None) in options:
            return None
        errors = []
        for option in (o for o in options if o is not type(None)):
            try:
                return from_json(option, data, where)
            except ResultError as error:
                errors.append(error)
        raise errors[0]
    if dataclasses.is_dataclass(kind):
        if not isinstance(data, dict):
            raise _fail(where, f"an object ({kind.__name__})", data)
        hints = _hints(kind)
        names = {f.name for f in dataclasses.fields(kind)}
        extra = [key for key in data if key not in names]
        if extra:
            raise ResultError(f"{where or 'the result'}: unexpected key {extra[0]!r} for {kind.__name__}")
        values = {}
        for f in dataclasses.fields(kind):
            path = f"{where}.{f.name}" if where else f.name
            if f.name in data:
                values[f.name] = from_json(hints[f.name], data[f.name], path)
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ResultError(f"{path}: missing (damaged, or written by an older windtunnel)")
        return kind(**values)
    if origin is tuple:
        if not isinstance(data, list):
            raise _fail(where, "a list", data)
        args = typing.get_args(kind)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(from_json(args[0], item, f"{where}[{i}]") for i, item in enumerate(data))
        if len(args) != len(data):
            raise _fail(where, f"a list of {len(args)}", data)
        return tuple(from_json(a, item, f"{where}[{i}]") for i, (a, item) in enumerate(zip(args, data)))
    if origin is dict:
        if not isinstance(data, dict):
            raise _fail(where, "an object", data)
        key_kind, value_kind = typing.get_args(kind)
        out = {}
        for key, item in data.items():
            if key_kind is int:
                try:
                    parsed: Any = int(key)
                except ValueError:
                    raise _fail(where, "integer keys", key) from None
            else:
                parsed = key
            out[parsed] = from_json(value_kind, item, f"{where}.{key}" if where else str(key))
        return out
    if kind is float:
        # JSON has one number type: an integral float may have been written as an int; it is
        # kept as read so that writing it back gives the same text.
        if isinstance(data, (int, float)) and not isinstance(data, bool):
            return data
        raise _fail(where, "a number", data)
    if kind in (int, str, bool):
        if isinstance(data, kind) and (kind is bool or not isinstance(data, bool)):
            return data
        raise _fail(where, {int: "an integer", str: "a text", bool: "true or false"}[kind], data)
    if kind is type(None):
        if data is None:
            return None
        raise _fail(where, "null", data)
    raise TypeError(f"{kind!r} is not a result field type")


@dataclass(frozen=True)
class Summary:
    """One number over runs (:func:`windtunnel.analysis.base.summarize`): mean, population
    std, and the median with the smallest and largest value (claims are decided on the
    median where seeds disagree)."""

    mean: float
    std: float
    median: float
    min: float
    max: float


@dataclass(frozen=True, kw_only=True)
class Metrics:
    """One model's three error metrics on held-out sequences, in bits
    (:data:`windtunnel.evaluation.METRICS`), or the same three as factors of another's.

    Attributes:
        mae_aggregate_bits: mean over positions of |mean model entropy - mean exact entropy|
            (the paper's bijection figure).
        mae_bits: mean over sequences and positions of |model entropy - exact entropy|.
        kl_bits: mean KL(exact posterior || model).
    """

    mae_aggregate_bits: float
    mae_bits: float
    kl_bits: float


@dataclass(frozen=True, kw_only=True)
class MetricSummaries:
    """Each of the three error metrics (or each one's ratio to a reference) over runs.

    Attributes:
        mae_aggregate_bits: ``mae_aggregate_bits`` (or its ratio) over runs.
        mae_bits: ``mae_bits`` (or its ratio) over runs.
        kl_bits: ``kl_bits`` (or its ratio) over runs.
    """

    mae_aggregate_bits: Summary
    mae_bits: Summary
    kl_bits: Summary


@dataclass(frozen=True)
class AnalysisResult:
    """What every saved analysis starts with: its name, the runs it read, and the task.

    Attributes:
        analysis: the registered analysis that wrote it.
        run_dirs: the runs it read, each as :func:`~windtunnel.runs.recorded_run_dir` names it
            (``runs/<run>`` in a reproduction, else the run's folder name); readers take the last
            part, the run's name, which a result holding the paths as given has too.
        tunnel: the tunnel's name and parameters (``{"name": "hmm", "S": 5, ...}``): the
            task variant every number belongs to.
        task_variant: the tunnel's own words for that variant (``"floor 0.05, grid 0.01"``;
            :meth:`~windtunnel.tunnels.Tunnel.describe`), so a reader need not know tunnels.
        tunnel_label: the tunnel's name with the parameters that size it (``"hmm (S = 5,
            M = 5, K = 20)"``; :meth:`~windtunnel.tunnels.Tunnel.label`).
    """

    analysis: str
    run_dirs: tuple[str, ...]
    tunnel: dict[str, Any]
    task_variant: str
    tunnel_label: str

    @classmethod
    def from_json(cls: type[T], data: Any) -> T:
        """The result saved as ``data`` (a :class:`ResultError` if it does not fit)."""
        return from_json(cls, data)

    def to_json(self) -> dict[str, Any]:
        """The result as plain JSON values, key for key as it is saved."""
        return to_json(self)


#: The result type of every analysis, by the analysis's registered name.
RESULT_TYPES: dict[str, type[AnalysisResult]] = {}


def result_type(name: str) -> typing.Callable[[type[T]], type[T]]:
    """Class decorator: the result type of the analysis registered as ``name``."""

    def decorate(cls: type[T]) -> type[T]:
        if name in RESULT_TYPES:
            raise ValueError(f"analysis {name!r} has a result type already ({RESULT_TYPES[name].__name__})")
        if not (isinstance(cls, type) and issubclass(cls, AnalysisResult)):
            raise TypeError(f"{cls!r} is not an AnalysisResult")
        RESULT_TYPES[name] = cls
        return cls

    return decorate
