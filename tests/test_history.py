"""The training history: metrics.jsonl records, the HMM plateau exit, and the report's runs section."""

from __future__ import annotations

import json
from pathlib import Path

from windtunnel.history import (
    HMM_PLATEAU_EXIT_MAE_BITS,
    plateau_exit_step,
    read_metrics,
)
from windtunnel.jobs import TrainJob
from windtunnel.report.build import _runs_section
from windtunnel.studies import SCALES, configs_folder

CPU = configs_folder(SCALES["cpu"])


def _write_history(run_dir: Path, evals: list[tuple[int, float]]) -> None:
    """A hand-written metrics.jsonl: a plain log line between held-out evaluations."""
    run_dir.mkdir(parents=True)
    lines = []
    for step, mae in evals:
        lines.append({"step": step - 10, "loss": 1.0, "elapsed_s": float(step)})
        lines.append({"step": step, "loss": 1.0, "elapsed_s": float(step), "eval_mae_bits": mae})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_plateau_exit_is_the_first_evaluation_below_the_threshold():
    records = [{"step": 50, "loss": 1.0}, {"step": 100, "eval_mae_bits": 0.105},
               {"step": 200, "eval_mae_bits": 0.0801}, {"step": 300, "eval_mae_bits": 0.0799},
               {"step": 400, "eval_mae_bits": 0.09}, {"step": 500, "eval_mae_bits": 0.03}]
    assert plateau_exit_step(records) == 300  # 0.0801 is not below 0.08; a later rise does not undo it
    assert plateau_exit_step(records[:3]) is None
    assert plateau_exit_step([]) is None
    assert plateau_exit_step(records, threshold=0.1) == 200
    assert HMM_PLATEAU_EXIT_MAE_BITS == 0.08


def test_read_metrics_of_a_run_that_has_not_logged_is_empty(tmp_path):
    assert read_metrics(tmp_path) == []
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n\n{"step": 2}\n')
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]


def test_the_report_names_each_hmm_run_that_never_left_the_plateau(tmp_path):
    left, stuck, bijection = tmp_path / "hmm_left", tmp_path / "hmm_stuck", tmp_path / "bij"
    _write_history(left, [(1000, 0.105), (2000, 0.104), (3000, 0.06), (4000, 0.04)])
    _write_history(stuck, [(1000, 0.105), (2000, 0.101), (3000, 0.099)])
    _write_history(bijection, [(1000, 1.2), (2000, 0.01)])
    jobs = [TrainJob("hmm_transformer_seed0", CPU / "hmm_transformer.toml", left),
            TrainJob("hmm_transformer_seed1", CPU / "hmm_transformer.toml", stuck),
            TrainJob("bijection_transformer_seed0", CPU / "bijection_transformer.toml", bijection)]
    section = _runs_section(jobs)
    cells = {row[0]: row[-1] for row in section.tables[0].rows}
    assert cells == {
        "hmm_transformer_seed0": "at step 3,000",
        "hmm_transformer_seed1": "no: mae_bits ≥ 0.08 at every evaluation to step 3,000",
        "bijection_transformer_seed0": "—",  # the bijection has no such plateau
    }
    assert "Never left the plateau: hmm_transformer_seed1." in section.text
    assert "hmm_transformer_seed0" not in section.text
    # With every HMM run past the plateau the section says so; a run not evaluated yet is not called stuck.
    assert "Every HMM transformer run here left it." in _runs_section([jobs[0], jobs[2]]).text
    fresh = tmp_path / "hmm_fresh"
    fresh.mkdir()
    section = _runs_section([TrainJob("hmm_transformer_seed2", CPU / "hmm_transformer.toml", fresh)])
    assert section.tables[0].rows[0][-1] == "not evaluated yet" and "Never left" not in section.text
