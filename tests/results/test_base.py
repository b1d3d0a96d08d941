"""The JSON conversion every result type rests on, on small hand-made types: what it accepts,
what it writes back, and the one line it gives for data that does not fit."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from windtunnel.analysis import ANALYSES
from windtunnel.results import RESULT_TYPES, ResultError, Summary, from_json, omitted_when_none, to_json


@dataclass(frozen=True, kw_only=True)
class Row:
    value: float
    ci: tuple[float, float] | None = omitted_when_none()


@dataclass(frozen=True, kw_only=True)
class Table:
    name: str
    by_horizon: dict[int, Row]
    counts: tuple[int, ...]
    best: Summary | None


def test_a_typed_value_writes_back_the_json_it_was_read_from_key_for_key():
    text = json.dumps({"name": "t", "by_horizon": {"30": {"value": 1}, "20": {"value": 0.5, "ci": [0.4, 0.6]}},
                       "counts": [1, 2], "best": None}, indent=1)
    table = from_json(Table, json.loads(text))
    assert table.by_horizon[30] == Row(value=1) and table.by_horizon[20].ci == (0.4, 0.6)  # int keys, tuples
    assert type(table.by_horizon[30].value) is int  # an integral number stays as written: the text round-trips
    assert json.dumps(to_json(table), indent=1) == text  # the order of keys kept, the absent ci left out, null kept


@pytest.mark.parametrize(("data", "message"), [
    ({"name": "t", "by_horizon": {}, "counts": []}, "^best: missing"),
    ({"name": "t", "by_horizon": {"x": {"value": 1.0}}, "counts": [], "best": None}, "^by_horizon: expected integer keys"),
    ({"name": "t", "by_horizon": {"20": {"value": "1"}}, "counts": [], "best": None}, "^by_horizon.20.value: expected a number"),
    ({"name": "t", "by_horizon": {"20": {"value": True}}, "counts": [], "best": None}, "^by_horizon.20.value: expected a number"),
    ({"name": "t", "by_horizon": {}, "counts": [1, 2.5], "best": None}, r"^counts\[1\]: expected an integer"),
    ({"name": "t", "by_horizon": {"20": {"value": 1.0, "ci": [1.0]}}, "counts": [], "best": None},
     "^by_horizon.20.ci: expected a list of 2"),
    ({"name": "t", "by_horizon": {}, "counts": [], "best": {"mean": 1.0}}, "^best.std: missing"),
    ({"name": "t", "by_horizon": {}, "counts": [], "best": None, "extra": 1}, "^the result: unexpected key 'extra' for Table"),
])
def test_data_that_does_not_fit_is_named_by_its_path(data, message):
    with pytest.raises(ResultError, match=message):
        from_json(Table, data)


def test_every_analysis_has_a_result_type_and_every_type_an_analysis():
    assert set(RESULT_TYPES) == set(ANALYSES)
