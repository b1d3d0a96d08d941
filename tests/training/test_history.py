"""The training history: metrics.jsonl records, the HMM plateau exit, and the report's runs section."""

from __future__ import annotations

import json
from pathlib import Path

from windtunnel.history import (
    HMM_PLATEAU_EXIT_MAE_BITS,
    clock_segments,
    plateau_exit_step,
    read_metrics,
    training_seconds,
)
from windtunnel.jobs import TrainJob, status_line
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
    jobs = [TrainJob("hmm_transformer_seed0", CPU / "hmm_transformer.toml", left, preset="hmm_transformer"),
            TrainJob("hmm_transformer_seed1", CPU / "hmm_transformer.toml", stuck, preset="hmm_transformer"),
            TrainJob("bijection_transformer_seed0", CPU / "bijection_transformer.toml", bijection, preset="bijection_transformer")]
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
    section = _runs_section([TrainJob("hmm_transformer_seed2", CPU / "hmm_transformer.toml", fresh, preset="hmm_transformer")])
    assert section.tables[0].rows[0][-1] == "not evaluated yet" and "Never left" not in section.text


# A run of 1,000 steps interrupted after step 400 (logged at 40 s, 0.1 s a step) and resumed
# from its checkpoint at step 300, whose new process logs 0.2 s a step from 0 s again.
RESUMED = [
    {"step": 100, "loss": 1.0, "elapsed_s": 10.0},
    {"step": 200, "loss": 1.0, "elapsed_s": 20.0, "eval_mae_bits": 0.5},
    {"step": 300, "loss": 1.0, "elapsed_s": 30.0},
    {"step": 400, "loss": 1.0, "elapsed_s": 40.0},
    {"step": 350, "loss": 1.0, "elapsed_s": 10.0},
    {"step": 400, "loss": 1.0, "elapsed_s": 20.0},
    {"step": 500, "loss": 1.0, "elapsed_s": 40.0},
]


def test_a_resumed_runs_clock_is_split_at_each_start_and_summed():
    segments = clock_segments(RESUMED)
    assert [[r["step"] for r in segment] for segment in segments] == [[100, 200, 300, 400], [350, 400, 500]]
    assert training_seconds(RESUMED) == 40.0 + 40.0  # not the last record's 40 s, nor the largest
    assert clock_segments([{"step": 1, "loss": 1.0}]) == [] and training_seconds([]) == 0.0


def test_the_eta_of_a_resumed_run_uses_its_current_speed(tmp_path):
    # Across the restart the rate would be (40 - 10) / (500 - 100) s a step from the window's
    # ends, and one step later negative; this start's own rate is 0.2 s a step.
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RESUMED))
    job = TrainJob("hmm_transformer_seed0", CPU / "hmm_transformer.toml", run_dir, preset="hmm_transformer")
    steps = job.resolved().train.steps
    line = status_line([(job, 0.0)], [], parallel=1)
    minutes, seconds = divmod(int((steps - 500) * 0.2), 60)
    expected = f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m{seconds:02d}s"
    assert line == f"running hmm_transformer_seed0 500/{steps}; ETA {expected}"


def test_the_report_counts_every_start_of_a_resumed_run(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RESUMED))
    section = _runs_section([TrainJob("bijection_transformer_seed0", CPU / "bijection_transformer.toml", run_dir, preset="bijection_transformer")])
    assert section.tables[0].rows[0][4] == round(80.0 / 60, 1)  # train minutes: both starts


def test_a_study_without_the_hmm_plateau_gets_the_runs_table_without_its_column(tmp_path):
    run_dir = tmp_path / "bij"
    _write_history(run_dir, [(1000, 1.2), (2000, 0.01)])
    section = _runs_section([TrainJob("bijection_transformer_seed0", CPU / "bijection_transformer.toml", run_dir, preset="bijection_transformer")], plateau=False,
                            not_yet_run=["bijection_lstm_seed0"])
    assert section.title == "Runs" and section.text == ""
    (table,) = section.tables
    assert table.columns == ["run", "model", "steps", "batch", "train minutes", "final eval mae_bits", "trained on"]
    assert [len(row) for row in table.rows] == [7, 7] and table.rows[1][:2] == ["bijection_lstm_seed0", "not yet run"]
