"""bench/owed_group.py: what a GPU window trains next, on folders and benches written here."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

_spec = importlib.util.spec_from_file_location("owed_group", Path(__file__).resolve().parents[1] / "bench" / "owed_group.py")
owed_group = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(owed_group)

HMM = [*(f"hmm_transformer_seed{s}" for s in range(5)), "hmm_transformer_floor_seed0"]
BIJECTION = [*(f"bijection_transformer_seed{s}" for s in range(3)), "bijection_replacement_transformer_seed0"]


def _hold(results: Path, *names: str) -> None:
    for name in names:
        (results / "runs" / name).mkdir(parents=True)
        (results / "runs" / name / "config.json").write_text("{}")


def _bench(per_size: dict[int, float]) -> dict:
    return {"devices": {"cuda": {"hmm_transformer": {f"group_{n}": {"steps_per_s": rate, "runs_steps_per_s": n * rate}
                                                     for n, rate in per_size.items()}}}}


def test_the_next_runs_are_the_owed_members_of_the_first_owed_runs_group(tmp_path):
    priority = ["bijection_transformer_seed0", "bijection_transformer_seed1", "hmm_transformer_seed0", "bijection_mlp_seed0"]
    assert owed_group.owed_runs(tmp_path, priority, 500, None) == BIJECTION
    _hold(tmp_path, "bijection_transformer_seed0", "bijection_transformer_seed2")
    # The group's other owed runs come along, though the priority list does not name them.
    assert owed_group.owed_runs(tmp_path, priority, 500, None) == ["bijection_transformer_seed1", "bijection_replacement_transformer_seed0"]
    _hold(tmp_path, "bijection_transformer_seed1", "bijection_replacement_transformer_seed0", *HMM, "bijection_mlp_seed0")
    assert owed_group.owed_runs(tmp_path, priority, 500, None) == []  # every run of the priority list held


def test_a_group_the_bench_says_cannot_finish_is_passed_over(tmp_path, capsys):
    priority = ["hmm_transformer_seed0", "bijection_transformer_seed0"]
    # Six owed HMM runs; measured up to 5: 5 x 40 = 200 runs x steps/s shared by 6, 100k steps in 3000 s.
    assert owed_group.projected_s(_bench({1: 100.0, 5: 40.0}), "hmm_transformer", 6, 100_000) == 3000
    assert owed_group.owed_runs(tmp_path, priority, 600, _bench({1: 100.0, 5: 40.0})) == BIJECTION  # not measured: taken
    assert "passed over hmm_transformer_seed0" in capsys.readouterr().err
    # Four owed: the size measured at or above it (5) gives their steps/s: 100k steps in 500 s.
    _hold(tmp_path, "hmm_transformer_seed0", "hmm_transformer_seed1")
    assert owed_group.projected_s(_bench({3: 300.0, 5: 200.0}), "hmm_transformer", 4, 100_000) == 500
    assert owed_group.owed_runs(tmp_path, ["hmm_transformer_seed2", *priority], 600, _bench({3: 300.0, 5: 200.0})) == HMM[2:]
    assert owed_group.projected_s({}, "hmm_transformer", 4, 100_000) is None
    json.dumps(_bench({1: 1.0}))  # the bench shape is JSON, as bench/step.py writes it
