"""The phases study (`windtunnel reproduce --only phases`): its plan crosses depth and width and
varies the size and each knob alone; the report reads the grid back from the saved groups, counts
the seeds that left and the dissociation by hand-made results, and calls a knob's shift
'earlier' only when the bootstrap interval excludes zero."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from windtunnel.report.html import Table
from windtunnel.report.phases import dissociation_summary, draw_phase_diagrams, knob_settings, median_shift, parse_grid, phases_sections
from windtunnel.reproduce import plan_runs
from windtunnel.results.phases import PhaseRun, TrainingPhases
from windtunnel.studies import PHASES_CENTRE, PHASES_DEPTHS, PHASES_KNOBS, PHASES_SIZES, PHASES_WIDTHS, STUDIES


# --- the plan ------------------------------------------------------------------------------


def test_the_plan_crosses_depth_and_width_varies_the_size_and_changes_one_knob_at_a_time(tmp_path):
    study = STUDIES["phases"]
    jobs = plan_runs(study.scales["cpu"], tmp_path, study.presets)
    assert len(jobs) == 5 * len(study.presets) and {job.resolved().train.seed for job in jobs} == set(range(5))
    configs = {job.preset: job.resolved() for job in jobs if job.resolved().train.seed == 0}
    for tunnel, (letter, sizes) in PHASES_SIZES.items():
        centre = PHASES_CENTRE[tunnel]
        shapes = {(c.model.n_layers, c.model.d_model, getattr(c.tunnel, letter)) for name, c in configs.items()
                  if name.startswith(f"{tunnel}_") and not any(name.endswith(f"_{knob}") for knob in PHASES_KNOBS[tunnel])}
        plane = {(n, d, centre) for n in PHASES_DEPTHS for d in PHASES_WIDTHS}
        axis = {(PHASES_CENTRE["n_layers"], PHASES_CENTRE["d_model"], s) for s in sizes}
        assert shapes == plane | axis
        base = configs[f"{tunnel}_L2_d48_{letter}{centre}"]
        for knob in PHASES_KNOBS[tunnel]:
            changed = configs[f"{tunnel}_L2_d48_{letter}{centre}_{knob}"]
            differ = [name for name in ("lr", "batch_size") if getattr(base.train, name) != getattr(changed.train, name)]
            differ += ["init_std"] if base.model.init_std != changed.model.init_std else []
            assert len(differ) == 1 and base.tunnel == changed.tunnel and base.model.n_layers == changed.model.n_layers


# --- the report ----------------------------------------------------------------------------


def _run(seed: int, exit_step: int | None, frame_step: int | None = 100, at_frame: float | None = 0.2,
         final: float = 0.01) -> PhaseRun:
    return PhaseRun(
        run=f"transformer seed {seed}", run_dir=f"runs/x_seed{seed}", seed=seed, eval_steps=(50, 100, 150),
        eval_mae_bits=(0.4, 0.1, final), learning_step=100, plateau_step=50, plateau_mae_bits=0.4, final_mae_bits=final,
        final_kl_bits=final / 2, left_plateau=exit_step is not None, exit_step=exit_step, slope_after_exit=-1.0 if exit_step else None,
        attention_moved=frame_step is not None, frame_step=frame_step, mae_bits_at_frame=at_frame if frame_step is not None else None,
        frame_before_exit=None if frame_step is None or exit_step is None else frame_step <= exit_step,
        dissociation=None if frame_step is None else at_frame >= 2 * final,
        pc1_variance_explained=0.5, pc1_entropy_spearman_abs=0.9, key_cos_layer0=0.1, key_cos_chance=0.2, d_head=12,
        attention_entropy_bits_by_layer=(2.0, 1.0), uniform_attention_entropy_bits=3.0, evidence_lift_by_layer=None,
    )


def _result(n_layers: int, d_model: int, size: int, runs: list[PhaseRun]) -> TrainingPhases:
    return TrainingPhases(analysis="training_phases", run_dirs=tuple(r.run_dir for r in runs),
                          tunnel={"name": "hmm", "S": size, "M": size}, task_variant="", tunnel_label=f"hmm S={size}",
                          n_layers=n_layers, d_model=d_model, plateau_window=6, flat_slope=-0.25, left_factor=2.0, dissociation_factor=2.0, runs=tuple(runs))


def _results(knob_exits: list[int]) -> dict[str, dict[str, TrainingPhases]]:
    centre_runs = [_run(s, exit_step) for s, exit_step in enumerate([400, 450, 500, 550, None])]  # 4 of 5 left
    results = {"hmm_L2_d48_S3": {"training_phases": _result(2, 48, 3, centre_runs)}}
    for n in (1, 3):
        results[f"hmm_L{n}_d48_S3"] = {"training_phases": _result(n, 48, 3, [_run(s, None, frame_step=None) for s in range(5)])}
    results["hmm_L2_d48_S2"] = {"training_phases": _result(2, 48, 2, [_run(s, 300, at_frame=0.015) for s in range(5)])}
    results["hmm_L2_d48_S3_lr"] = {"training_phases": _result(2, 48, 3, [_run(s, e) for s, e in enumerate(knob_exits)])}
    return results


def test_the_grid_is_read_back_from_the_group_names():
    grids = parse_grid([*_results([100] * 5), "bijection", "classes_transformer"])
    assert len(grids) == 1
    grid = grids[0]
    assert (grid.tunnel, grid.letter, grid.centre) == ("hmm", "S", (2, 48, 3))
    assert grid.depths() == [1, 2, 3] and grid.widths() == [48] and grid.sizes() == [2, 3]
    assert grid.knobs == {"lr": "hmm_L2_d48_S3_lr"}


def test_the_dissociation_is_counted_over_the_runs_with_a_frame():
    # centre: 5 frames, each 0.2 >= 2 x 0.01; L1 and L3: no frame; S2: 0.015 < 0.02 fails on 5; lr knob: 5 hold.
    held, judged, ordered, both = dissociation_summary(_results([100] * 5))["hmm"]
    assert (held, judged) == (10, 15)
    assert (ordered, both) == (4 + 5 + 5, 4 + 5 + 5)  # frames at step 100, before every exit at 100 or later


def test_a_shift_is_earlier_only_when_its_interval_excludes_zero():
    # Every changed exit below every centre exit: every bootstrap median difference is negative.
    shift, low, high = median_shift([400.0, 450.0, 500.0, 550.0], [100.0, 110.0, 120.0, 130.0, 140.0])
    assert shift == 120.0 - 475.0 and high < 0
    # The same values on both sides: the point shift is 0 and the interval contains it.
    shift, low, high = median_shift([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])
    assert shift == 0 and low <= 0 <= high
    with pytest.raises(ValueError, match="at least one value"):
        median_shift([], [1.0])


@pytest.mark.parametrize("samples", [3, 40, 41, 2000])
def test_the_shift_interval_is_the_lower_order_statistic_of_the_documented_bootstrap_stream(samples):
    """The interval's ends are numpy's 'lower' 2.5% and 97.5% percentiles (the order statistic at
    floor(q (n - 1))) of the bootstrap medians drawn from the documented stream: random.Random(seed),
    each sample resampling the changed seeds, then the base seeds, each to its own size. The sample
    counts put floor(0.025 (n - 1)) and floor(0.975 (n - 1)) on and beside integers (40 and 41: 0 and 1)."""
    import random

    import numpy as np

    # Irregular values, so that neighbouring order statistics of the draws differ.
    base, changed = [400.0 + 7.3 * k * k for k in range(13)], [100.0 + 11.1 * k ** 1.5 for k in range(11)]
    rng = random.Random(0)
    draws = [statistics.median(rng.choices(changed, k=len(changed))) - statistics.median(rng.choices(base, k=len(base)))
             for _ in range(samples)]
    low, high = np.percentile(draws, [2.5, 97.5], method="lower")
    assert median_shift(base, changed, samples=samples) == (statistics.median(changed) - statistics.median(base), low, high)
    assert median_shift(base, changed, samples=samples) == median_shift(base, changed, samples=samples, seed=0)


def _knob_row(tmp_path: Path, knob_exits: list[int], settings=None) -> list:
    sections = phases_sections(_results(knob_exits), tmp_path / "analysis", tmp_path / "figures", settings)
    knobs = next(t for t in sections[0].tables if t.columns[0].startswith("knob"))
    return knobs.rows


def test_the_knob_table_reads_earlier_where_every_seed_exits_sooner_and_not_where_they_overlap(tmp_path):
    rows = _knob_row(tmp_path, [100, 110, 120, 130, 140])
    assert rows[0][1] == "4/5" and rows[1][1] == "5/5"
    assert rows[1][3].startswith(f"{120 - statistics.median([400, 450, 500, 550]):+.0f} [") and rows[1][4] == "earlier"
    assert rows[1][7] == "no shift beyond the interval"  # every learning step is 100 on both sides
    overlapping = _knob_row(tmp_path, [380, 460, 470, 560, 600])
    assert overlapping[1][4] == "no shift beyond the interval"
    settings = {"hmm_L2_d48_S3": {"model.init_std": 0.04, "train.lr": 0.005, "train.batch_size": 64},
                "hmm_L2_d48_S3_lr": {"model.init_std": 0.04, "train.lr": 0.002, "train.batch_size": 64}}
    assert _knob_row(tmp_path, [100] * 5, settings)[1][0] == "lr: train.lr 0.002 (centre 0.005)"


def test_the_sections_write_nothing_and_the_diagrams_they_show_are_drawn_apart(tmp_path):
    results = _results([100] * 5)
    sections = phases_sections(results, tmp_path / "analysis", tmp_path / "figures")
    assert not (tmp_path / "figures").exists()
    shown = [figure.path for figure in sections[0].figures]
    assert draw_phase_diagrams(results, tmp_path / "figures") == shown
    assert shown == [tmp_path / "figures" / "hmm_depth_width.png", tmp_path / "figures" / "hmm_size.png"]
    assert all(path.stat().st_size > 10_000 for path in shown)  # a drawn figure, not an empty file


def test_the_grid_table_counts_the_seeds_that_left_and_shows_each_range(tmp_path):
    sections = phases_sections(_results([100] * 5), tmp_path / "analysis", tmp_path / "figures")
    table: Table = sections[0].tables[0]
    by_point = {(row[0], row[1], row[2]): row for row in table.rows}
    centre = by_point[(2, 48, 3)]
    assert centre[3] == "100 [100, 100]" and centre[4] == "4/5" and centre[5] == "475 [400, 550]" and centre[9] == "5/5"
    assert by_point[(1, 48, 3)][4] == "0/5" and by_point[(1, 48, 3)][5] is None and by_point[(1, 48, 3)][9] == "no frame"
    assert by_point[(2, 48, 2)][9] == "0/5"
    assert centre[8] == "0.005 [0.005, 0.005]"  # final KL: 3 significant digits
    assert sections[-1].tables[0].rows == [["hmm", "10/15", "67%", "14/14"]]
    # A final KL below 1e-4 in exponent form, as Python's 'g' writes it.
    results = _results([100] * 5)
    results["hmm_L2_d48_S2"] = {"training_phases": _result(2, 48, 2, [_run(s, 300, final=2.4e-5 * (s + 1)) for s in range(5)])}
    rows = {(row[0], row[1], row[2]): row for row in phases_sections(results, tmp_path / "a", tmp_path / "f")[0].tables[0].rows}
    assert rows[(2, 48, 2)][8] == "3.6e-05 [1.2e-05, 6e-05]"


def test_knob_settings_read_each_groups_saved_config(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text('{"model": {"init_std": 0.02}, "train": {"lr": 0.001, "batch_size": 32}}')
    assert knob_settings({"g": run, "missing": tmp_path / "nothing"}) == {
        "g": {"model.init_std": 0.02, "train.lr": 0.001, "train.batch_size": 32}}
    # An unreadable group before a readable one: left out, and the next still read.
    assert list(knob_settings({"missing": tmp_path / "nothing", "g": run})) == ["g"]


def test_a_slice_of_the_tiny_study_trains_analyzes_and_reports(tmp_path):
    from windtunnel.cli import main

    out = tmp_path / "phases"
    runs = ["hmm_L2_d48_S3_seed0", "hmm_L2_d48_S3_lr_seed0"]
    assert main(["reproduce", "--scale", "tiny", "--only", "phases", "--out", str(out), "--only-runs", *runs]) == 0
    report = (out / "report" / "report.md").read_text().replace("\\", "")  # the Markdown escapes punctuation
    assert "Phases of the hmm tunnel" in report and "lr: train.lr 0.002 (centre 0.005)" in report
    assert not (out / "analysis_at_init").exists() or not any((out / "analysis_at_init").rglob("*.json"))
    saved = json.loads((out / "analysis" / "hmm_L2_d48_S3" / "training_phases.json").read_text())
    assert [run["seed"] for run in saved["runs"]] == [0]


def test_the_depth_width_heatmaps_show_each_points_median_range_and_seed_count(tmp_path, monkeypatch):
    """What the depth x width figure shows, read off the drawn figure: per panel and grid point,
    the median over the seeds that have the value, their range, how many have it ("none" where
    no seed has it, "not run" where the point was not trained), and the medians as the image
    (log10 for the final error)."""
    import numpy as np

    import windtunnel.report.phases as phases_module

    drawn = {}
    monkeypatch.setattr(phases_module, "save", lambda fig, path: drawn.setdefault(Path(path).name, fig))
    results = _results([100] * 5)
    results["hmm_L2_d64_S3"] = {"training_phases": _result(2, 64, 3, [_run(s, 200 + 10 * s, final=2e-5 * (s + 1)) for s in range(3)])}
    draw_phase_diagrams(results, tmp_path)
    fig = drawn["hmm_depth_width.png"]
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in panels] == ["learning step (half-way)", "plateau exit step", "frame formed (step)", "final mae_bits"]
    boxes = [ax.get_position() for ax in panels]  # side by side in one row, left to right
    assert len({round(box.y0, 6) for box in boxes}) == 1 and [box.x0 for box in boxes] == sorted(box.x0 for box in boxes)

    def cell(values, fmt, of):
        if not values:
            return "none"
        return f"{fmt.format(statistics.median(values))}\n[{fmt.format(min(values))}, {fmt.format(max(values))}]\n{len(values)}/{of} seeds"

    points = {(1, 48): [_run(s, None, frame_step=None) for s in range(5)],
              (2, 48): [_run(s, e) for s, e in enumerate([400, 450, 500, 550, None])],
              (3, 48): [_run(s, None, frame_step=None) for s in range(5)],
              (2, 64): [_run(s, 200 + 10 * s, final=2e-5 * (s + 1)) for s in range(3)]}
    for ax, (field, fmt) in zip(panels, [("learning_step", "{:.0f}"), ("exit_step", "{:.0f}"), ("frame_step", "{:.0f}"),
                                         ("final_mae_bits", "{:.2g}")]):
        expected, image = [], np.full((3, 2), np.nan)
        for i, depth in enumerate((1, 2, 3)):
            for j, width in enumerate((48, 64)):
                runs = points.get((depth, width))
                values = [getattr(r, field) for r in runs if getattr(r, field) is not None] if runs else []
                expected.append("not run" if runs is None else cell(values, fmt, len(runs)))
                if values:
                    image[i, j] = statistics.median(values)
        assert [t.get_text() for t in ax.texts] == expected, field
        shown = np.ma.filled(ax.images[0].get_array().astype(float), np.nan)
        np.testing.assert_allclose(shown, np.log10(image) if field == "final_mae_bits" else image, rtol=1e-12)
    bars = [ax.get_ylabel() for ax in fig.axes if not ax.get_title()]  # each panel's colour bar
    assert bars == ["learning step (half-way)", "plateau exit step", "frame formed (step)", "log10 final mae_bits"]
    assert fig._suptitle.get_text() == "hmm at S = 3: median over seeds [range], seeds that have the value"
    assert [t.get_text() for t in panels[0].get_xticklabels()] == ["d 48", "d 64"]
    assert [t.get_text() for t in panels[0].get_yticklabels()] == ["1 layer", "2 layers", "3 layers"]


def test_the_size_figure_plots_every_seed_and_its_median_against_the_size(tmp_path, monkeypatch):
    """What the size figure shows, read off its lines: per panel and trained size, every seed's
    value at x = size, the median as a bar across it, the chance level of random keys dotted on
    the key panel; the final error on a log axis."""
    import windtunnel.report.phases as phases_module

    drawn = {}
    monkeypatch.setattr(phases_module, "save", lambda fig, path: drawn.setdefault(Path(path).name, fig))
    results = _results([100] * 5)
    # Spread unevenly (a median that is not the mean) at S = 2.
    skewed = [_run(s, 300 + 10 * s * s, final=0.001 * (s + 1) ** 2) for s in range(5)]
    results["hmm_L2_d48_S2"] = {"training_phases": _result(2, 48, 2, skewed)}
    results["hmm_L2_d48_S1"] = {}  # trained, not analyzed: no dots at S = 1, and the larger sizes still drawn
    results["hmm_L2_d48_S4"] = {"training_phases": _result(2, 48, 4, [_run(0, 350)])}  # one seed: its own chance level
    draw_phase_diagrams(results, tmp_path)
    fig = drawn["hmm_size.png"]
    assert len(fig.axes) == 8  # one panel per field, two rows of four: no empty panel
    panels = [ax for ax in fig.axes if ax.get_title()]
    fields = ["learning_step", "exit_step", "frame_step", "final_mae_bits", "key_cos_layer0", "pc1_variance_explained",
              "pc1_entropy_spearman_abs", "plateau_mae_bits"]
    assert [ax.get_title() for ax in panels] == [
        "learning step (half-way)", "plateau exit step", "frame formed (step)", "final mae_bits",
        "layer-0 key mean |cos| (dotted: chance)", "residual PC1 share", "|Spearman ρ| (PC1, H_Bayes)", "plateau mae_bits"]
    assert fig._suptitle.get_text() == "hmm (2 layers, d_model 48): each seed (dots) and the median (bar), against S"
    runs = {size: results[f"hmm_L2_d48_S{size}"]["training_phases"].runs for size in (2, 3, 4)}
    for ax, field in zip(panels, fields):
        lines = [(list(line.get_xdata()), list(line.get_ydata()), line.get_linestyle()) for line in ax.lines]
        expected = []
        for size in (2, 3, 4):
            values = [float(getattr(r, field)) for r in runs[size] if getattr(r, field) is not None]
            expected.append(([size] * len(values), values, "None"))
            if values:
                expected.append(([size - 0.3, size + 0.3], [statistics.median(values)] * 2, "-"))
            if field == "key_cos_layer0":
                expected.append(([size - 0.4, size + 0.4], [0.2, 0.2], ":"))
        assert lines == expected, field
        assert ax.get_yscale() == ("log" if field == "final_mae_bits" else "linear")
        assert list(ax.get_xticks()) == [1, 2, 3, 4] and ax.get_xlabel() == "S"


def test_the_tables_write_steps_whole_read_a_later_shift_and_leave_out_what_is_missing(tmp_path):
    """Steps in the thousands written whole (not in three significant digits) in the grid and
    knob tables; a shift whose interval lies above zero reads "later"; a grid point not analyzed
    is its own row and the others follow it; no knob table without an analyzed centre or without knobs."""
    import dataclasses

    def big(seed: int, exit_step: int) -> PhaseRun:
        return dataclasses.replace(_run(seed, exit_step, frame_step=1500 + seed), learning_step=1234 + seed)

    results = _results([100] * 5)
    results["hmm_L2_d48_S3"] = {"training_phases": _result(2, 48, 3, [big(s, 2000 + 1000 * s) for s in range(5)])}
    results["hmm_L2_d48_S3_lr"] = {"training_phases": _result(2, 48, 3, [big(s, 6001) for s in range(5)])}  # above every centre exit
    results["hmm_L1_d48_S3"] = {}  # trained, not analyzed: first in the table's order
    tables = phases_sections(results, tmp_path / "a", tmp_path / "f")[0].tables
    grid, knobs = tables[0], next(t for t in tables if t.columns[0].startswith("knob"))
    rows = {(row[0], row[1], row[2]): row for row in grid.rows}
    assert rows[(1, 48, 3)] == [1, 48, 3, None, "not analyzed", None, None, None, None, None]
    assert len(grid.rows) == 4 and grid.rows[0][:3] == [1, 48, 3]  # every other point still listed
    centre = rows[(2, 48, 3)]
    assert (centre[3], centre[5], centre[6]) == ("1236 [1234, 1238]", "4000 [2000, 6000]", "1502 [1500, 1504]")
    assert knobs.rows[0][2] == "4000 [2000, 6000]" and knobs.rows[0][5] == "1236 [1234, 1238]"
    assert knobs.rows[1][2] == "6001 [6001, 6001]" and knobs.rows[1][4] == "later" and knobs.rows[1][5] == "1236 [1234, 1238]"
    # A knob trained but not analyzed, before one that is: its own row, and the next still read.
    ordered = {name: value for name, value in results.items() if name != "hmm_L2_d48_S3_lr"}
    ordered["hmm_L2_d48_S3_batch"] = {}
    ordered["hmm_L2_d48_S3_lr"] = results["hmm_L2_d48_S3_lr"]
    knobs = next(t for t in phases_sections(ordered, tmp_path / "e", tmp_path / "j")[0].tables if t.columns[0].startswith("knob"))
    assert [row[1:] for row in knobs.rows[1:]] == [["not analyzed", None, None, None, None, None, None],
                                                   ["5/5", "6001 [6001, 6001]", knobs.rows[2][3], "later", "1236 [1234, 1238]",
                                                    knobs.rows[2][6], "no shift beyond the interval"]]
    # The smallest shift that is later: every changed exit one step after every centre exit.
    results["hmm_L2_d48_S3"] = {"training_phases": _result(2, 48, 3, [big(s, 6000) for s in range(5)])}
    knobs = next(t for t in phases_sections(results, tmp_path / "b", tmp_path / "g")[0].tables if t.columns[0].startswith("knob"))
    assert knobs.rows[1][3] == "+1 [+1, +1]" and knobs.rows[1][4] == "later"
    # A knob whose seeds have no learning step: nothing to compare, said in words.
    results["hmm_L2_d48_S3_lr"] = {"training_phases": _result(2, 48, 3, [dataclasses.replace(big(s, 6001), learning_step=None)
                                                                         for s in range(5)])}
    knobs = next(t for t in phases_sections(results, tmp_path / "k", tmp_path / "l")[0].tables if t.columns[0].startswith("knob"))
    assert knobs.rows[1][5:] == [None, None, "too few learning steps to compare"]
    # No analyzed centre, or no knob: no knob table.
    del results["hmm_L2_d48_S3"]["training_phases"]
    assert not any(t.columns[0].startswith("knob") for t in phases_sections(results, tmp_path / "c", tmp_path / "h")[0].tables)
    results = _results([100] * 5)
    del results["hmm_L2_d48_S3_lr"]
    assert not any(t.columns[0].startswith("knob") for t in phases_sections(results, tmp_path / "d", tmp_path / "i")[0].tables)
