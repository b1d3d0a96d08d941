"""The model-selection study's report page, built from the committed CPU-scale results
(`results/model-selection/`) without training, and checked against an independent reading of
the same JSON files: every number is read with the json module and combined here with
`statistics.median`, `min` and `max` as docs/reproducing.md defines it ("decided on the median
over seeds; every seed's own value is shown", the share of the class used is
``1 - kl_bits / permutation kl_bits``). Section titles and column headers are those of the
rendered page of exactly these results, docs/results-model-selection.md.

The page shows numbers to three significant digits (``format(x, ".3g")``: "5.38e-05",
"0.000596") and shares as whole percents (``format(x, ".0%")``, a share that rounds to zero
from below shown as "0%"); the oracle formats its own numbers the same way and compares the
strings, so no float tolerance is needed.
"""

from __future__ import annotations

import dataclasses
import json
import re
import statistics
from pathlib import Path

import pytest

from windtunnel.report.folder import load_results
from windtunnel.report.model_selection import (
    MODEL_SELECTION_CLAIMS,
    PAPER_NUMBERS,
    Cell,
    _range,
    fails_completely,
    judge_claims,
    model_selection_sections,
    paper_passes,
    succeeds,
)

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results" / "model-selection"
DOC = ROOT / "docs" / "results-model-selection.md"
MEANING = "What a CPU-scale verdict means."

#: The presets in the order the page lists them (docs/results-model-selection.md, Table 2).
PRESETS = [f"{task}_{mode}" for task in ("involution", "rotation", "multiplication")
           for mode in ("integer", "opaque", "fixed")] + ["classes_transformer"]
#: The thresholds of docs/reproducing.md: 0.01 bits, below 0.001, 90% or more, 10% or less.
AGREEMENT, POSTERIOR, SUCCEED, FAIL = 0.01, 0.001, 0.9, 0.1


# --- the oracle: the JSON files read directly ---------------------------------------------------


def _json(folder: str, group: str, analysis: str) -> dict:
    return json.loads((RESULTS / folder / group / f"{analysis}.json").read_text())


def num(x: float) -> str:
    return format(x, ".3g")


def pct(x: float) -> str:
    text = format(x, ".0%")
    return "0%" if text == "-0%" else text


def spread(values: list[float], fmt=num) -> str:
    """median [min, max] over seeds, as the page shows it."""
    return f"{fmt(statistics.median(values))} [{fmt(min(values))}, {fmt(max(values))}]"


def _scores(horizons: dict, training_horizon: int) -> dict:
    h = horizons[str(training_horizon)]
    kl = [r["kl_bits"] for r in h["per_run"]]
    permutation = h["permutation"]["kl_bits"]
    return {"mae": [r["mae_bits"] for r in h["per_run"]], "kl": kl,
            "shares": [1 - k / permutation for k in kl], "permutation": permutation,
            "prior": h["prior"]["kl_bits"]}


def preset(folder: str, name: str) -> dict:
    data = _json(folder, name, "length_generalization")
    return {**_scores(data["horizons"], data["training_horizon"]), "tunnel": data["tunnel"]}


def readout(folder: str) -> list[float]:
    return [r["readout_mae"] for r in _json(folder, "classes_transformer", "class_posterior")["runs"]
            if r["readout_mae"] is not None]


def yes(value: bool) -> str:
    return "yes" if value else "no"


def oracle_verdicts(folder: str) -> dict[str, tuple[str, str | None]]:
    """Each claim's (holds, direction) as docs/reproducing.md states the criteria."""
    p = {name: preset(folder, name) for name in PRESETS}
    mae = {n: statistics.median(c["mae"]) for n, c in p.items()}
    share = {n: statistics.median(c["shares"]) for n, c in p.items()}
    involution = ("involution_integer", "involution_opaque")
    integer, opaque = ("rotation_integer", "multiplication_integer"), ("rotation_opaque", "multiplication_opaque")
    fixed = ("rotation_fixed", "multiplication_fixed")
    return {
        "involution_agreement": (yes(all(mae[n] <= AGREEMENT for n in involution)),
                                 yes(all(share[n] >= SUCCEED for n in involution))),
        "class_posterior": (yes(statistics.median(readout(folder)) < POSTERIOR), None),
        "arithmetic_symbols": (yes(all(mae[n] <= AGREEMENT for n in integer) and all(share[n] <= FAIL for n in opaque)),
                               yes(all(share[n] >= SUCCEED for n in integer) and all(share[n] <= FAIL for n in opaque))),
        "fixed_control": (yes(all(mae[n] <= AGREEMENT for n in fixed)), yes(all(share[n] >= SUCCEED for n in fixed))),
    }


def _doc_tables() -> list[list[str]]:
    """The column headers of each table of the rendered page, in order (Markdown unescaped)."""
    headers, lines = [], DOC.read_text().splitlines()
    for line, below in zip(lines, lines[1:]):
        if line.startswith("| ") and below.startswith("| ---"):
            headers.append([re.sub(r"\\(.)", r"\1", cell.strip()) for cell in line.strip().strip("|").split(" | ")])
    return headers


def _doc_titles() -> list[str]:
    text = DOC.read_text()
    return re.findall(r"^## (.+)$", text, flags=re.M)[1:]  # after "Contents"


# --- the page ------------------------------------------------------------------------------------


# Per test, not per module (both take milliseconds): mutation testing maps each test to the code
# it runs, and a module's fixture runs inside its first test only, hiding the others.
@pytest.fixture
def results():
    return load_results(RESULTS), load_results(RESULTS, "analysis_at_init")


@pytest.fixture
def page(results):
    # model_selection_sections only looks for figures in analysis_dir (none are committed), so
    # the committed folder is passed as it is: nothing is written into results/.
    trained, at_init = results
    return model_selection_sections(trained, RESULTS / "analysis", at_init, meaning=MEANING)


def trained_presets(trained) -> list[str]:
    """The transformer presets among the groups: a task and a symbol mode, or the class comparison."""
    return [g for g in trained if g.endswith(("_integer", "_opaque", "_fixed")) or g == "classes_transformer"]


def _claim_rows(page) -> dict[str, list]:
    keys = {text: key for key, text in MODEL_SELECTION_CLAIMS.items()}
    return {keys[row[0]]: row for row in page[0].tables[0].rows}


def _in_order(text: str, *parts: str) -> None:
    """Each part occurs in text, after the one before it."""
    at = 0
    for part in parts:
        found = text.find(part, at)
        assert found >= 0, f"{part!r} not found after position {at} in {text!r}"
        at = found + len(part)


def _chunk(text: str, label: str, labels: tuple[str, ...]) -> str:
    """The part of text from label up to the next of the other labels."""
    start = text.index(label)
    ends = [text.find(other, start + len(label)) for other in labels if other != label]
    return text[start:min([e for e in ends if e >= 0], default=len(text))]


def test_the_page_has_the_documented_sections_in_order_with_the_studys_meaning_beside_the_claims(page):
    assert [s.title for s in page] == _doc_titles()[:5]  # the rest (runs, training) come from the report builder
    assert page[0].note == MEANING


def test_every_table_has_the_documented_columns_in_order(page):
    assert [t.columns for s in page for t in s.tables] == _doc_tables()[:6]


def test_every_section_and_table_carries_text_or_an_empty_string_never_none(page):
    # None would render as "None" or break the renderers, which expect strings.
    for section in page:
        assert isinstance(section.text, str) and isinstance(section.note, str), section.title
        for table in section.tables:
            assert isinstance(table.caption, str), section.title


def test_the_claim_rows_follow_the_abstract_and_each_verdict_is_the_criterion_applied_to_the_seeds_median(page):
    rows = _claim_rows(page)
    assert list(rows) == ["involution_agreement", "class_posterior", "arithmetic_symbols", "fixed_control"]
    expected = oracle_verdicts("analysis")
    for claim, (holds, direction) in expected.items():
        assert rows[claim][4:6] == [holds, direction], claim
    # These results: involutions and the fixed control hold; the read-out and arithmetic do not.
    assert expected == {"involution_agreement": ("yes", "yes"), "class_posterior": ("no", None),
                        "arithmetic_symbols": ("no", "no"), "fixed_control": ("yes", "yes")}


def test_the_initial_weights_column_applies_the_same_criteria_to_the_untrained_models(page):
    rows = _claim_rows(page)
    for claim, (holds, _) in oracle_verdicts("analysis_at_init").items():
        assert rows[claim][6] == holds, claim
    # The criteria must not pass on random weights (the caption's promise).
    assert [row[6] for row in rows.values()] == ["no"] * 4


def test_the_claim_table_shows_each_presets_median_and_range_under_its_own_name(page):
    rows = _claim_rows(page)
    p = {name: preset("analysis", name) for name in PRESETS}

    ours = rows["involution_agreement"][2]
    for mode in ("integer", "opaque"):
        c = p[f"involution_{mode}"]
        _in_order(_chunk(ours, mode, ("integer", "opaque")), mode, spread(c["mae"]), spread(c["shares"], pct))

    ours = rows["arithmetic_symbols"][2]
    for task in ("rotation", "multiplication"):
        integer, opaque = p[f"{task}_integer"], p[f"{task}_opaque"]
        _in_order(_chunk(ours, task, ("rotation", "multiplication")), task, "integer", spread(integer["mae"]),
                  spread(integer["shares"], pct), "opaque", spread(opaque["shares"], pct))

    ours = rows["fixed_control"][2]
    for task in ("rotation", "multiplication"):
        c = p[f"{task}_fixed"]
        _in_order(_chunk(ours, task, ("rotation", "multiplication")), task, spread(c["mae"]), spread(c["shares"], pct))

    assert spread(readout("analysis")) in rows["class_posterior"][2]


@pytest.mark.parametrize("missing, claim", [
    ("rotation_opaque", "arithmetic_symbols"),  # rotations and multiplications, each in both modes
    ("multiplication_fixed", "fixed_control"),
    ("involution_opaque", "involution_agreement"),
    ("classes_transformer", "class_posterior"),
])
def test_a_claim_whose_presets_were_not_all_trained_gets_no_verdict(results, missing, claim):
    # Judging on part of a claim's presets would decide it on evidence the claim does not name.
    trained, at_init = ({group: r for group, r in side.items() if group != missing} for side in results)
    sections = model_selection_sections(trained, RESULTS / "analysis", at_init)
    rows = _claim_rows(sections)
    assert rows[claim][3:] == [None] * 4
    # The presets table leaves out the missing preset alone (every other trained one has its row),
    # and without a meaning given the claims carry no note.
    shown = [(row[0], row[1]) for row in sections[1].tables[0].rows]
    expected = [("involution vs 3-cycles", "integer") if g == "classes_transformer" else tuple(g.split("_")) for g in trained_presets(trained)]
    assert sorted(shown) == sorted(expected) and len(expected) == 9
    assert sections[0].note == ""
    others = oracle_verdicts("analysis")
    for other in set(MODEL_SELECTION_CLAIMS) - {claim}:
        assert rows[other][4:6] == list(others[other]), other


def test_the_claim_table_states_the_papers_numbers_and_each_criterions_thresholds(page):
    rows = _claim_rows(page)
    assert "0.01" in rows["involution_agreement"][1] and "0.001" in rows["class_posterior"][1]
    assert "0.009" in rows["fixed_control"][1]
    for claim in ("involution_agreement", "fixed_control"):
        _in_order(rows[claim][3], "0.01", "90%")
    _in_order(rows["arithmetic_symbols"][3], "0.01", "10%", "90%", "10%")
    assert "0.001" in rows["class_posterior"][3]
    caption = page[0].tables[0].caption
    _in_order(caption, "90%", "10%")  # succeeds at 90% or more, fails completely at 10% or less


def test_every_preset_row_shows_its_seeds_median_and_range_at_the_training_horizon(page):
    table = page[1].tables[0]
    expected = []
    for name in PRESETS:
        c, init = preset("analysis", name), preset("analysis_at_init", name)
        classes = " vs ".join({"three_cycles": "3-cycles"}.get(k, k) for k in c["tunnel"]["classes"])
        expected.append([classes, c["tunnel"]["symbols"], len(c["kl"]), spread(c["mae"]), spread(c["kl"]),
                         spread(c["shares"], pct), num(c["permutation"]), num(c["prior"]),
                         pct(statistics.median(init["shares"]))])
    assert table.rows == expected


def test_the_class_posterior_section_shows_each_runs_readout_best_probe_and_the_prior(page):
    data = _json("analysis", "classes_transformer", "class_posterior")
    section = page[2]
    assert str(data["n_test_sequences"]) in section.text  # "on 256 held-out sequences"
    runs, positions = section.tables
    expected = []
    for run in data["runs"]:
        best = min(run["probe_layers"], key=lambda layer: layer["mae"])
        expected.append([Path(run["run_dir"]).name, num(run["readout_mae"]), f"{num(best['mae'])} ({best['name']})",
                         num(data["prior_mae"])])
    assert runs.rows == expected


def test_a_lone_run_without_a_readout_shows_a_blank_beside_its_probes_and_its_own_pairs(results):
    """A group of one run (its informative share per pair is that run's) whose read-out did not
    apply (no informative position): the read-out cell is blank, not a number."""
    trained, at_init = results
    posterior = trained["classes_transformer"]["class_posterior"]
    lone = dataclasses.replace(posterior.runs[0], readout_mae=None)
    trained = {**trained, "classes_transformer": {**trained["classes_transformer"],
                                                  "class_posterior": dataclasses.replace(posterior, runs=(lone,))}}
    [section] = [s for s in model_selection_sections(trained, RESULTS / "analysis", at_init) if s.title.startswith("The class posterior")]
    assert section.tables[0].rows[0][1] is None and section.tables[0].rows[0][0] == Path(lone.run_dir).name
    shares = _json("analysis", "classes_transformer", "class_posterior")["runs"][0]["informative_share_by_position"]
    assert [row[1] for row in section.tables[1].rows] == [f"{shares[p]:.0%}" for p in lone.readout_positions]


def test_the_readout_by_pair_gathers_every_seed_at_each_position_numbered_from_one(page):
    data = _json("analysis", "classes_transformer", "class_posterior")
    by_position: dict[int, list[float]] = {}
    for run in data["runs"]:
        for position, mae in zip(run["readout_positions"], run["readout_mae_by_position"], strict=True):
            by_position.setdefault(position, []).append(mae)
    # The share of sequences whose answers differ is a property of the held-out set: every run's is the same.
    shares = data["runs"][0]["informative_share_by_position"]
    assert all(run["informative_share_by_position"] == shares for run in data["runs"])
    expected = [[position + 1, pct(shares[position]), spread(maes)] for position, maes in sorted(by_position.items())]
    assert all(len(maes) == len(data["runs"]) for maes in by_position.values())
    assert page[2].tables[1].rows == expected


def test_every_architecture_on_the_comparison_shows_its_parameters_and_its_seeds_median_and_range(page):
    data = _json("analysis", "classes", "model_comparison")
    expected = []
    for name, model in data["models"].items():
        c = _scores(model["horizons"], data["training_horizon"])
        expected.append([name, f"{model['n_parameters']:,}", len(c["kl"]), spread(c["mae"]), spread(c["kl"]),
                         spread(c["shares"], pct)])
    section = page[3]
    assert section.tables[0].rows == expected
    assert "1%" in section.text  # matched to the transformer's parameters within 1%


def test_every_relabeled_group_shows_its_change_in_error_and_its_error_before(page):
    groups = sorted(p.parent.name for p in (RESULTS / "analysis").glob("*/relabeling.json"))
    expected = []
    for group in groups:
        runs = _json("analysis", group, "relabeling")["per_run"]
        expected.append([group, spread([r["delta_mae_bits"] for r in runs]), spread([r["delta_kl_bits"] for r in runs]),
                         spread([r["kl_bits_before"] for r in runs])])
    assert page[4].tables[0].rows == expected
    assert page[4].text  # what relabeling tests, said before its table


def test_no_figure_is_shown_where_none_was_drawn(page):
    assert [s.figures for s in page] == [[]] * 5


def test_the_figures_are_shown_from_their_groups_folder_where_they_were_drawn(results, tmp_path):
    # Empty PNG files stand in for the drawn figures, in a folder of their own (results/ untouched).
    drawn = {2: tmp_path / "classes_transformer" / "class_posterior.png", 3: tmp_path / "classes" / "model_comparison.png"}
    for path in drawn.values():
        path.parent.mkdir()
        path.write_bytes(b"")
    page = model_selection_sections(results[0], tmp_path, results[1], meaning=MEANING)
    for index, section in enumerate(page):
        if index not in drawn:
            assert section.figures == [], section.title
            continue
        [figure] = section.figures
        assert figure.path == drawn[index] and figure.title == {2: "Class posterior", 3: "Architectures"}[index]
        assert isinstance(figure.title, str) and figure.title and isinstance(figure.caption, str) and figure.caption


# --- the pieces the page is made of --------------------------------------------------------------


def test_a_model_succeeds_at_exactly_ninety_percent_and_fails_completely_at_exactly_ten():
    # "A model succeeds at a class at 90% or more and fails completely at 10% or less."
    assert succeeds(0.9) and not succeeds(0.89)
    assert fails_completely(0.1) and not fails_completely(0.11)


def test_a_cell_keeps_every_seed_and_both_references_of_the_scores_it_is_read_from(results):
    data = _json("analysis", "involution_integer", "length_generalization")
    result = results[0]["involution_integer"]["length_generalization"]
    cell = Cell.of(result.horizons[result.training_horizon])
    h = data["horizons"][str(data["training_horizon"])]
    assert cell == Cell(tuple(r["mae_bits"] for r in h["per_run"]), tuple(r["kl_bits"] for r in h["per_run"]),
                        h["permutation"]["kl_bits"], h["prior"]["kl_bits"], h["prior"]["mae_bits"])


def test_a_cell_needs_the_permutation_reference_and_says_which_declaration_is_missing(results):
    result = results[0]["involution_integer"]["length_generalization"]
    scores = dataclasses.replace(result.horizons[result.training_horizon], permutation=None)
    with pytest.raises(ValueError, match="PermutationReference"):  # the tunnel trait to declare, by its name
        Cell.of(scores)


def test_one_seed_is_shown_as_its_value_and_several_as_median_and_range():
    one = _range([0.25])
    assert "0.25" in one and "1 seed" in one and "[" not in one
    assert _range([0.25, 0.75]) == "0.5 [0.25, 0.75]"  # two seeds: the median is their mean
    assert _range([0.3, 0.1, 0.2]) == "0.2 [0.1, 0.3]"


@pytest.mark.parametrize("share", [-0.001, -0.004, -0.0049])
def test_a_share_that_rounds_to_zero_from_below_is_shown_as_zero_percent_not_minus_zero(share):
    assert _range([share, share, share], ".0%") == "0% [0%, 0%]"


def test_a_share_is_rounded_for_display_after_the_median_is_taken():
    # Two seeds at 12.4% and 13.4%: their median is 12.9%, shown 13%; rounding each first
    # (12% and 13%) would put the median at 12.5%, shown 12%.
    assert _range([0.124, 0.134], ".0%") == "13% [12%, 13%]"
    assert _range([-0.3, 0.2, 0.5], ".0%") == "20% [-30%, 50%]"  # a share below zero keeps its sign


def test_the_class_posterior_verdict_has_the_documented_fields():
    verdict = judge_claims({}, [0.002, 0.0005, 0.0009])["class_posterior"]
    assert set(verdict) == {"holds", "direction", "ours", "criterion"}
    assert verdict["holds"] is True and verdict["direction"] is None  # median 0.0009 < 0.001
    assert "0.0009 [0.0005, 0.002]" in verdict["ours"]


@pytest.mark.parametrize("numbers, passes", [
    ({"integer": 0.01, "opaque_share": 0.0}, True),
    ({"integer": 0.01, "opaque_share": 0.5}, False),  # opaque symbols used half the class: not a complete failure
    ({"integer": 0.5, "opaque_share": 0.0}, False),  # integers missed the paper's precision
])
def test_the_arithmetic_criterion_needs_both_integer_agreement_and_opaque_failure(monkeypatch, numbers, passes):
    monkeypatch.setitem(PAPER_NUMBERS, "arithmetic_symbols", numbers)
    assert paper_passes()["arithmetic_symbols"] is passes
