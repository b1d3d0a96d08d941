"""The report of a reproduction folder that slices fill (``reproduce --only-runs``): a claim
whose runs are not in the folder yet, and a planned run not trained yet, read "not yet run"
(docs/reproducing.md: "Runs the folder lacks read 'not yet run' in the report, never 'no'"),
which is neither a verdict nor "n/a" (a claim this scale does not evaluate); what the folder
holds is reported as usual. Folders are written by hand: no training."""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

from windtunnel.report.build import assemble_report
from windtunnel.report.claims import CLAIMS
from windtunnel.results import RESULT_TYPES
from windtunnel.run_layout import ANALYSIS_DIR, CONFIG_FILE, INIT_DIR, MANIFEST_FILE, METRICS_FILE

from fakes import fill

NOT_YET_RUN = "not yet run"  # the words the docs promise, spelled out rather than imported
BY_KEY = {claim.key: claim.claim for claim in CLAIMS}
BIJECTION = {"tunnel": {"name": "bijection", "with_replacement": False}, "task_variant": "without replacement"}
HMM = {"tunnel": {"name": "hmm", "floor": 0.0, "grid": 0.05}, "task_variant": "no floor, grid 0.05"}
PRESENT, MISSING = "bijection_transformer_seed0", ("bijection_mlp_seed0", "hmm_transformer_seed0")


def _comparison(header: dict, by_horizon: dict[int, dict[str, float]], training_horizon: int) -> dict:
    """A one-seed transformer's Table 1 (``model_comparison``) with the given metrics."""
    rows = {str(h): {**{m: {"mean": v} for m, v in metrics.items()}, "prior": {"mae_bits": 1.0, "kl_bits": 1.0}}
            for h, metrics in by_horizon.items()}
    return {**header, "horizons": sorted(by_horizon), "training_horizon": training_horizon,
            "models": {"transformer": {"n_runs": 1, "horizons": rows}}}


def _write_analysis(out: Path, folder: str, group: str, name: str, partial: dict) -> None:
    path = out / folder / group / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(fill(RESULT_TYPES[name], {"analysis": name, **partial})))


def _folder(out: Path, planned: list[str]) -> Path:
    """A finished claims reproduction holding one trained run, ``bijection_transformer_seed0``:
    the bijection's Table 1 trained (holds: 0.004 < 0.02) and at initialization (fails: 0.9),
    and the HMM's trained only (0.02 bits at K = 20: fails kl < 0.01). ``planned``: the plan's runs."""
    run_dir = out / "runs" / PRESENT
    run_dir.mkdir(parents=True)
    (run_dir / CONFIG_FILE).write_text(json.dumps({"tunnel": {"name": "bijection"}, "model": {"kind": "transformer"},
                                                    "train": {"steps": 300, "batch_size": 32}, "eval": {}}))
    (run_dir / METRICS_FILE).write_text(json.dumps({"step": 300, "eval_mae_bits": 0.0123}) + "\n")
    manifest = {"scale": "tiny", "stage": "done", "wall_s": 60.0, "command": "windtunnel reproduce --scale tiny --out x",
                "hardware": "a laptop", "cuts": [], "study": "claims", "planned": planned,
                "runs": [{"name": PRESENT, "run_dir": f"runs/{PRESENT}", "preset": "bijection_transformer", "seed": 0}]}
    (out / MANIFEST_FILE).write_text(json.dumps(manifest))
    bijection = {19: {"mae_aggregate_bits": 0.004, "mae_bits": 0.03, "kl_bits": 0.001}}
    _write_analysis(out, ANALYSIS_DIR, "bijection", "model_comparison", _comparison(BIJECTION, bijection, 19))
    _write_analysis(out, INIT_DIR, "bijection", "model_comparison",
                    _comparison(BIJECTION, {19: {"mae_aggregate_bits": 0.9, "mae_bits": 0.9, "kl_bits": 0.9}}, 19))
    hmm = {h: {"kl_bits": 0.02, "mae_bits": 0.02, "mae_aggregate_bits": 0.02} for h in (20, 30, 50)}
    _write_analysis(out, ANALYSIS_DIR, "hmm", "model_comparison", _comparison(HMM, hmm, 20))
    return out


class Read(NamedTuple):
    """What a test reads of a report: the claim table's and the numbers table's rows by claim,
    the runs table's rows by run, the report's summary, the claim section's text and the claim
    table's caption."""

    verdicts: dict[str, list]
    numbers: dict[str, list]
    runs: dict[str, list]
    summary: str
    text: str
    caption: str


def _tables(out: Path) -> Read:
    report = assemble_report(out)
    sections = {section.title: section for section in report.sections}
    verdicts, numbers = sections["Claims"].tables
    (runs,) = sections["Runs"].tables
    assert verdicts.columns[1] == "holds?" and verdicts.columns[-1] == "random init holds? (must be no)"
    assert numbers.columns[2] == "ours (tiny scale)" and numbers.columns[-1] == "random init"
    assert runs.columns[1] == "model"
    return Read({row[0]: row for row in verdicts.rows}, {row[0]: row for row in numbers.rows},
                {row[0]: row for row in runs.rows}, report.summary, sections["Claims"].text, verdicts.caption)


def test_a_claim_whose_runs_are_missing_reads_not_yet_run_and_one_with_results_keeps_its_verdict(tmp_path):
    verdicts, numbers, _, _, text, caption = _tables(_folder(tmp_path, [PRESENT, *MISSING]))
    # The MLP control is one of the runs not trained yet: its claim waits, trained and at initialization.
    waiting = BY_KEY["bijection_separation"]
    assert verdicts[waiting][1] == NOT_YET_RUN and verdicts[waiting][-1] == NOT_YET_RUN
    assert numbers[waiting][2] == NOT_YET_RUN and numbers[waiting][-1] == NOT_YET_RUN
    # The claims the folder can judge are judged, on the trained weights and on the initial ones.
    bijection, k20 = BY_KEY["bijection_accuracy"], BY_KEY["hmm_k20"]
    assert (verdicts[bijection][1], verdicts[bijection][-1]) == ("yes", "no")
    assert numbers[bijection][2].startswith("0.004 bits") and numbers[bijection][-1].startswith("0.9 bits")
    # HMM K = 20 is judged trained (no) but has no initial-weights result: "n/a" there, not "not yet
    # run", for the trained claim's runs are all in the folder.
    assert (verdicts[k20][1], verdicts[k20][-1], numbers[k20][-1]) == ("no", "n/a", "n/a")
    assert numbers[k20][2].startswith("0.02 bits")
    # Every claim without a result waits; the tally says how many.
    judged = [row for row in verdicts.values() if row[1] != NOT_YET_RUN]
    assert all(row[1] in ("yes", "no") for row in judged)
    assert f"({len(verdicts) - len(judged)} {NOT_YET_RUN})" in text
    assert caption.endswith(f" '{NOT_YET_RUN}': the runs this claim reads are not in the folder yet.")


def test_a_folder_with_every_planned_run_has_no_claim_not_yet_run_only_not_applicable(tmp_path):
    # The same analyses, but the plan is the one run present (or no plan at all: an older manifest).
    for planned in ([PRESENT], []):
        out = tmp_path / f"planned{len(planned)}"
        out.mkdir()
        verdicts, numbers, runs, summary, text, caption = _tables(_folder(out, planned))
        unjudged = BY_KEY["bijection_separation"]
        assert verdicts[unjudged][1] == "n/a" and verdicts[unjudged][-1] == "n/a"
        assert numbers[unjudged][2].startswith("n/a") and numbers[unjudged][-1] == "n/a"
        assert (verdicts[BY_KEY["bijection_accuracy"]][1], verdicts[BY_KEY["hmm_k20"]][1]) == ("yes", "no")
        cells = [cell for table in (verdicts, numbers, runs) for row in table.values() for cell in row]
        assert NOT_YET_RUN not in cells, planned
        assert NOT_YET_RUN not in summary and NOT_YET_RUN not in caption and "not evaluated)" in text
        assert list(runs) == [PRESENT]


def test_a_planned_run_not_in_the_folder_is_listed_as_not_yet_run_and_a_trained_one_as_itself(tmp_path):
    # A plan not in alphabetical order, so that its order shows.
    _, _, runs, summary, _, _ = _tables(_folder(tmp_path, [MISSING[1], PRESENT, MISSING[0]]))
    assert list(runs) == [PRESENT, MISSING[1], MISSING[0]]  # the folder's runs, then the waiting ones in plan order
    for name in MISSING:  # nothing about a run that never trained but that it waits
        assert runs[name][1] == NOT_YET_RUN and runs[name][2:] == [None] * (len(runs[name]) - 2)
    trained = runs[PRESENT]
    assert NOT_YET_RUN not in trained
    assert trained[1:4] == ["transformer", 300, 32] and trained[5] == 0.0123  # its config and its last evaluation
    assert f"{len(MISSING)} of the 3 planned runs are {NOT_YET_RUN}" in summary


def test_a_run_that_logged_nothing_has_no_train_minutes_rather_than_zero(tmp_path):
    out = _folder(tmp_path, [PRESENT])
    (out / "runs" / PRESENT / METRICS_FILE).write_text(json.dumps({"step": 5, "loss": 1.0, "elapsed_s": 90.0}) + "\n")
    assert _tables(out).runs[PRESENT][4] == 1.5  # 90 s of its own clock
    (out / "runs" / PRESENT / METRICS_FILE).unlink()  # started, killed before its first log line
    trained = _tables(out).runs[PRESENT]
    assert trained[4] is None and trained[5] is None  # no minutes and no evaluation: unknown, not 0
