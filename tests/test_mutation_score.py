"""tools/mutation_score.py: which surviving mutants it leaves out of the score (a prose rewrite
of a string, a listed equivalent) and the score it computes, on hand-written mutants."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("mutation_score", Path(__file__).parent.parent / "tools" / "mutation_score.py")
mutation_score = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mutation_score)


def _function(source: str) -> ast.AST:
    return ast.parse(source).body[0]


ORIGINAL = 'def f__mutmut_orig(x):\n    raise ValueError(f"x={x} is out of range")\n'


@pytest.mark.parametrize(
    "mutant, text_only",
    [
        ('def f__mutmut_1(x):\n    raise ValueError(f"XXx=XX{x}XX is out of rangeXX")\n', True),  # mutmut's "XX" rewrite
        ('def f__mutmut_2(x):\n    raise ValueError(f"X={x} IS OUT OF RANGE")\n', True),  # case
        ('def f__mutmut_3(x):\n    raise ValueError(None)\n', False),  # the message dropped: a change of structure
        ('def f__mutmut_4(x):\n    raise TypeError(f"x={x} is out of range")\n', False),  # another exception
        ('def f__mutmut_5(x):\n    raise ValueError(f"x={x} is out of rang")\n', False),  # not a prose rewrite
        ('def f__mutmut_6(x):\n    raise ValueError(f"x={x} is out of range")\n', False),  # no change at all
    ],
)
def test_a_mutant_changes_only_text_when_its_strings_alone_are_rewritten_as_prose(mutant, text_only):
    assert mutation_score.changes_only_text(_function(ORIGINAL), _function(mutant)) is text_only


def test_a_changed_number_key_or_operator_is_behaviour():
    original = _function('def g__mutmut_orig(d):\n    return d["n"] + 1\n')
    for mutant in ('d["n"] - 1', 'd["n"] + 2', 'd["XXnXX"] + 1', 'd["N"] + 1'):
        # A dictionary key is a string too, but no prose: its rewrite reads another key.
        assert not mutation_score.changes_only_text(original, _function(f"def g__mutmut_1(d):\n    return {mutant}\n")), mutant


PLOT = 'def p__mutmut_orig(ax, x, y):\n    ax.plot(x, y, "o", color="#4c72b0", alpha=0.6, ms=5)\n    ax.set_title("t", fontsize=9)\n'


@pytest.mark.parametrize(
    "change, style_only",
    [
        (('alpha=0.6', 'alpha=None'), True),  # a style keyword's value
        (('fontsize=9', 'fontsize=10'), True),
        ((', ms=5', ''), True),  # a style keyword dropped for its default
        (('color="#4c72b0", ', ''), True),
        (('ax.plot(x, y', 'ax.plot(y, x'), False),  # what is plotted
        (('"o"', '"-"'), False),  # the marker is a positional argument: not a listed keyword
        (('ax.set_title("t"', 'ax.set_title(None'), False),
        (('alpha=0.6', 'alpha=0.6'), False),  # no change at all
    ],
)
def test_a_mutant_changes_only_style_when_only_a_calls_style_keywords_differ(change, style_only):
    mutant = PLOT.replace("__mutmut_orig", "__mutmut_1").replace(*change)
    assert mutation_score.changes_only_style(_function(PLOT), _function(mutant)) is style_only


def test_one_part_of_an_implicitly_joined_caption_rewritten_is_text():
    original = _function('def h__mutmut_orig():\n    return ("Bits from the exact posterior. " "The same criterion.")\n')
    mutant = _function('def h__mutmut_1():\n    return ("Bits from the exact posterior. " "XXThe same criterion.XX")\n')
    assert mutation_score.changes_only_text(original, mutant)


def test_the_score_is_killed_over_the_mutants_that_change_behaviour():
    mutants = [
        {"name": "windtunnel.metrics.x_a__mutmut_1", "status": "killed", "text_only": False},
        {"name": "windtunnel.metrics.x_a__mutmut_2", "status": "killed", "text_only": False},
        {"name": "windtunnel.metrics.x_a__mutmut_3", "status": "killed", "text_only": False},
        {"name": "windtunnel.metrics.x_a__mutmut_4", "status": "survived", "text_only": False},
        {"name": "windtunnel.metrics.x_a__mutmut_5", "status": "no tests", "text_only": False},
        {"name": "windtunnel.metrics.x_a__mutmut_6", "status": "survived", "text_only": True},
        {"name": "windtunnel.metrics.x_a__mutmut_7", "status": "survived", "text_only": False},
        {"name": "windtunnel.evaluation.x_b__mutmut_1", "status": "killed", "text_only": False},
        {"name": "windtunnel.figures.geometry.x_c__mutmut_1", "status": "survived", "text_only": False},
        {"name": "windtunnel.report.build.x_d__mutmut_1", "status": "killed", "text_only": False},
    ]
    result = mutation_score.score(mutants, {"windtunnel.metrics.x_a__mutmut_7": "equivalent, by hand"})
    metrics = result["metrics.py"]
    assert (metrics["mutants"], metrics["killed"], metrics["survived"], metrics["no_tests"]) == (7, 3, 3, 1)
    assert (metrics["text_only_survivors"], metrics["equivalent"], metrics["scored"]) == (1, 1, 5)
    assert metrics["score"] == 0.6 and metrics["survivors"] == ["windtunnel.metrics.x_a__mutmut_4", "windtunnel.metrics.x_a__mutmut_5"]
    assert metrics["noted"] == 0 and metrics["unexplained"] == metrics["survivors"]
    # A note explains a survivor without scoring it as killed; a note on a killed mutant counts nowhere.
    noted = mutation_score.score(mutants, {"windtunnel.metrics.x_a__mutmut_7": "equivalent, by hand"},
                                 {"windtunnel.metrics.x_a__mutmut_4": "left alive, why", "windtunnel.metrics.x_a__mutmut_1": "stale"})
    assert noted["metrics.py"]["score"] == 0.6 and noted["metrics.py"]["noted"] == 1
    assert noted["metrics.py"]["unexplained"] == ["windtunnel.metrics.x_a__mutmut_5"]
    assert result["evaluation.py"]["score"] == 1.0 and "tunnels/" not in result
    # a figure's mutant counts on the figures' row alone, not on the rest of the report's
    assert result["figures/"]["mutants"] == 1 and result["figures/"]["score"] == 0.0
    assert result["report/ tables and page"]["mutants"] == 1 and result["report/ tables and page"]["score"] == 1.0


def test_a_sampled_score_carries_the_wilson_interval_of_its_proportion():
    # 235 of 300: the Wilson 95% interval, by the closed form (scipy's binomtest gives the same).
    from scipy import stats

    low, high = mutation_score.wilson_interval(235, 300)
    expected = stats.binomtest(235, 300).proportion_ci(confidence_level=0.95, method="wilson")
    assert (low, high) == (round(expected.low, 3), round(expected.high, 3))
    mutants = [{"name": f"windtunnel.metrics.x_a__mutmut_{i}", "status": s, "text_only": False}
               for i, s in enumerate(["killed"] * 3 + ["survived", "not checked"])]
    result = mutation_score.score(mutants, {})["metrics.py"]
    assert result["score"] == 0.75 and result["score_interval"] == mutation_score.wilson_interval(3, 4)
    assert mutation_score.score(mutants[:4], {})["metrics.py"]["score_interval"] is None  # every mutant ran: no estimate


def test_a_rerun_of_the_survivors_updates_a_saved_score():
    # Saved: 10 scored (8 killed, survivors _4 and _5 with _5 reached by no test), 1 text-only
    # survivor. The rerun kills _4; _5 is listed as equivalent since.
    saved = {"metrics.py": {"mutants": 11, "killed": 8, "survived": 2, "no_tests": 1, "not_checked": 0, "text_only_survivors": 1,
                            "equivalent": 0, "scored": 10, "score": 0.8, "score_interval": None,
                            "survivors": ["windtunnel.metrics.x_a__mutmut_4", "windtunnel.metrics.x_a__mutmut_5"]}}
    rerun = [{"name": "windtunnel.metrics.x_a__mutmut_4", "status": "killed", "text_only": False},
             {"name": "windtunnel.metrics.x_a__mutmut_5", "status": "no tests", "text_only": False}]
    got = mutation_score.rescore(saved, rerun, {"windtunnel.metrics.x_a__mutmut_5": "why"}, {})["metrics.py"]
    assert (got["killed"], got["survived"], got["no_tests"], got["equivalent"], got["scored"]) == (9, 1, 1, 1, 9)
    assert got["score"] == 1.0 and got["survivors"] == [] and got["unexplained"] == []
    # Not rerun: the survivor stands, and a note explains it without scoring it.
    got = mutation_score.rescore(saved, [], {}, {"windtunnel.metrics.x_a__mutmut_4": "why"})["metrics.py"]
    assert (got["killed"], got["survived"], got["no_tests"], got["scored"], got["score"], got["noted"]) == (8, 2, 1, 10, 0.8, 1)
    assert got["unexplained"] == ["windtunnel.metrics.x_a__mutmut_5"]


def test_the_readme_table_has_one_row_per_package_with_its_counts(capsys):
    saved = {"metrics.py": {"mutants": 21, "killed": 20, "survived": 1, "no_tests": 0, "not_checked": 0, "text_only_survivors": 0,
                            "equivalent": 0, "noted": 1, "score": 0.952, "score_interval": None},
             "report/ tables and page": {"mutants": 2034, "killed": 258, "survived": 41, "no_tests": 1, "not_checked": 1734,
                                         "text_only_survivors": 14, "equivalent": 4, "score": 0.915, "score_interval": [0.876, 0.942]}}
    mutation_score.print_table(saved)
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == "| `metrics.py` | 21 (21) | 20 | 1 | 0 | 0 | 0 | 1 | 95.2% |"
    assert lines[3] == "| `report/ tables and page` | 2034 (300) | 258 | 41 | 1 | 14 | 4 | 0 | 91.5% (sample; 95% CI 87.6%–94.2%) |"


def test_an_update_replaces_only_the_rows_of_packages_checked_in_full():
    saved = {"provenance": {"commit": "old"}, "packages": {
        "metrics.py": {"mutants": 21, "not_checked": 0, "score": 0.9},
        "tunnels/": {"mutants": 100, "not_checked": 0, "score": 0.99},
        "analysis/": {"mutants": 50, "not_checked": 40, "score": 0.8}}}
    result = {"metrics.py": {"mutants": 21, "not_checked": 0, "score": 1.0},  # run in full: replaced
              "analysis/": {"mutants": 50, "not_checked": 10, "score": 0.95},  # in part: the saved row stands
              "training/ (checkpoints, trainer)": {"mutants": 5, "not_checked": 0, "score": 0.6}}  # new and full: added
    got = mutation_score.update(saved, result, {"commit": "new"})
    assert got["provenance"] == {"commit": "old"}
    assert got["packages"]["metrics.py"] == {"mutants": 21, "not_checked": 0, "score": 1.0, "provenance": {"commit": "new"}}
    assert got["packages"]["tunnels/"] == saved["packages"]["tunnels/"] and got["packages"]["analysis/"] == saved["packages"]["analysis/"]
    assert got["packages"]["training/ (checkpoints, trainer)"]["provenance"] == {"commit": "new"}
