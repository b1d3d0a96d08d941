"""Run groups (windtunnel.training.group): runs trained as one stacked model are held to the
same runs trained alone: the same initial weights and batches exactly, per-step losses and the
final evaluation within float32 rounding; each run diverges, resumes and writes its folder as
it would alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import safetensors.torch
import torch

from windtunnel.config import ConfigError
from windtunnel.history import read_metrics
from windtunnel.models.build import MODELS
from windtunnel.run_config import load_run_config
from windtunnel.training import group as group_module
from windtunnel.run_layout import RESUME_FILE
from windtunnel.training.checkpoint import read_resume_step, snapshot_path
from windtunnel.training.group import train_group
from windtunnel.training.trainer import TrainingDiverged, TrainingInterrupted, train
from windtunnel.tunnels import Episode
from scopes import once_per_module

# A group computes each run's forward as one batched (vmap) matmul where the lone run does one
# matmul per run: float32 sums in another order, about one rounding (1.2e-7 relative) per op.
# Measured over these 12 steps: losses within 1.1e-7 relative, evaluations within 1e-9 bits,
# weights within 2.4e-7. The bounds below leave about 100x room and are far below any change
# training makes (a step moves the loss by ~1e-2).
LOSS_RTOL = 1e-5
EVAL_ATOL_BITS = 1e-6

HMM = """
[tunnel]
name = "hmm"
S = 3
M = 3
K = 8
grid = 0.01
[model]
kind = "{kind}"
d_model = 16
{model}
[train]
steps = 12
batch_size = 16
lr = 3e-3
target = "soft"
eval_every = 6
checkpoint_every = 6
log_every = 1
grad_clip = 1.0
[eval]
n = 64
batch_size = 64
"""
TRANSFORMER = "n_layers = 2\nn_heads = 2\nd_mlp = 32"
MLP = "n_blocks = 2\nd_hidden = 32"


def _configs(tmp_path: Path, kind: str, overrides_per_run: list[tuple[str, ...]]):
    path = tmp_path / f"{kind}.toml"
    path.write_text(HMM.format(kind=kind, model=TRANSFORMER if kind == "transformer" else MLP))
    return [load_run_config(path, list(overrides)) for overrides in overrides_per_run]


def _losses(run_dir: Path) -> list[float]:
    return [record["loss"] for record in read_metrics(run_dir)]


def _batches(monkeypatch) -> list[bytes]:
    """Records every training batch as it is moved to the device (its tokens' and posteriors' bytes)."""
    drawn = []
    real_to = Episode.to

    def to(self, device):
        drawn.append(self.tokens.numpy().tobytes() + self.posterior.numpy().tobytes())
        return real_to(self, device)

    monkeypatch.setattr(Episode, "to", to)
    return drawn


def _assert_twins(alone_dirs: list[Path], group_dirs: list[Path], alone, grouped) -> None:
    for a, g, ra, rg in zip(alone_dirs, group_dirs, alone, grouped):
        init_a, init_g = (safetensors.torch.load_file(str(snapshot_path(d, 0))) for d in (a, g))
        assert init_a.keys() == init_g.keys() and all(torch.equal(init_a[k], init_g[k]) for k in init_a)  # exactly
        la, lg = _losses(a), _losses(g)
        assert len(la) == len(lg) == 12
        assert la != _losses(alone_dirs[0]) or a == alone_dirs[0]  # the runs differ from each other
        assert torch.allclose(torch.tensor(lg), torch.tensor(la), rtol=LOSS_RTOL, atol=0)
        for key in ("eval_mae_bits", "eval_kl_bits", "eval_mae_aggregate_bits"):
            assert abs(rg.final_eval[key] - ra.final_eval[key]) <= EVAL_ATOL_BITS, key


@pytest.mark.parametrize("kind, overrides", [
    ("transformer", [("train.seed=0",), ("train.seed=1",), ("train.seed=2",)]),  # the seeds of a preset
    ("transformer", [("train.seed=0",), ("train.seed=0", "tunnel.floor=0.05")]),  # the HMM and its floored twin (the paper's grid)
    ("mlp", [("train.seed=0",), ("train.seed=1",), ("train.seed=2",)]),  # the MLP control
])
def test_a_group_trains_each_run_as_it_trains_alone(tmp_path, monkeypatch, kind, overrides):
    configs = _configs(tmp_path, kind, overrides)
    drawn = _batches(monkeypatch)
    alone_dirs = [tmp_path / f"alone{i}" for i in range(len(configs))]
    alone = [train(config, d, progress=False) for config, d in zip(configs, alone_dirs)]
    alone_batches = list(drawn)
    drawn.clear()
    group_dirs = [tmp_path / f"group{i}" for i in range(len(configs))]
    grouped = train_group(configs, group_dirs, progress=False)
    # The same batches: alone run by run, in the group step by step, each run's own.
    per_run = len(alone_batches) // len(configs)
    expected = [alone_batches[i * per_run + step] for step in range(per_run) for i in range(len(configs))]
    assert drawn == expected
    _assert_twins(alone_dirs, group_dirs, alone, grouped)
    provenance = json.loads((group_dirs[1] / "provenance.json").read_text())["starts"]
    assert provenance[-1]["group"] == {"size": len(configs), "runs": [d.name for d in group_dirs]}
    assert "group" not in json.loads((alone_dirs[1] / "provenance.json").read_text())["starts"][-1]


def _seeds(tmp_path: Path, n: int = 3):
    return _configs(tmp_path, "transformer", [(f"train.seed={seed}",) for seed in range(n)])


@pytest.fixture(scope=once_per_module)
def whole_group(tmp_path_factory) -> tuple[list[Path], list]:
    """Three seeds of the tiny transformer trained as one group, uninterrupted: their run folders and results."""
    folder = tmp_path_factory.mktemp("whole")
    dirs = [folder / f"whole{i}" for i in range(3)]
    return dirs, train_group(_seeds(folder), dirs, progress=False)


def test_a_run_that_diverges_ends_alone_with_its_message_and_the_others_go_on(tmp_path, monkeypatch, whole_group):
    configs = _seeds(tmp_path)
    reference_dirs, reference = whole_group
    real_losses, calls = group_module._GroupLoop._losses, []

    def losses(self, logits, episodes):  # the second run's loss is infinite from its 8th step on
        out = real_losses(self, logits, episodes)
        calls.append(len(out))
        if len(calls) >= 8 and len(out) == 3:
            out = out * torch.tensor([1.0, float("inf"), 1.0])
        return out

    monkeypatch.setattr(group_module._GroupLoop, "_losses", losses)
    dirs = [tmp_path / f"run{i}" for i in range(3)]
    outcomes = train_group(configs, dirs, progress=False)
    assert isinstance(outcomes[1], TrainingDiverged)
    assert str(outcomes[1]) == "loss became inf at step 8; the checkpoint of step 6 is kept (lower train.lr or keep train.grad_clip > 0)"
    assert [record["step"] for record in read_metrics(dirs[1])] == list(range(1, 8))  # nothing of step 8 written
    assert not (dirs[1] / "provenance.json").exists()  # as a lone run that diverges in its first start
    for i in (0, 2):
        assert outcomes[i].steps == 12
        assert torch.allclose(torch.tensor(_losses(dirs[i])), torch.tensor(_losses(reference_dirs[i])), rtol=LOSS_RTOL, atol=0)
        assert abs(outcomes[i].final_eval["eval_mae_bits"] - reference[i].final_eval["eval_mae_bits"]) <= EVAL_ATOL_BITS
    assert len(calls) == 12 and calls[7:] == [3] + [2] * 4  # the stack shrank at the boundary of step 8


def test_a_group_killed_part_way_resumes_every_member_to_the_uninterrupted_weights(tmp_path, whole_group):
    configs = _seeds(tmp_path)
    whole, _ = whole_group
    dirs = [tmp_path / f"run{i}" for i in range(3)]

    def crash(step: int) -> None:
        if step == 9:
            raise RuntimeError("killed")  # as a kill after step 9: the checkpoints of step 6 remain

    with pytest.raises(RuntimeError, match="killed"):
        train_group(configs, dirs, progress=False, on_step=crash)
    results = train_group(configs, dirs, resume=True, progress=False)
    for i in range(3):
        assert results[i].steps == 12
        final = safetensors.torch.load_file(str(snapshot_path(dirs[i], 12)))
        expected = safetensors.torch.load_file(str(snapshot_path(whole[i], 12)))
        assert all(torch.equal(final[k], expected[k]) for k in expected), i  # bit for bit, as a lone run resumes
        assert [record["step"] for record in read_metrics(dirs[i])] == list(range(1, 13))
        starts = json.loads((dirs[i] / "provenance.json").read_text())["starts"]
        assert [(s["start_step"], s["end_step"], s["group"]["size"]) for s in starts] == [(6, 12, 3)]


def test_ctrl_c_saves_every_member_and_members_at_different_steps_resume_alone(tmp_path):
    configs = _seeds(tmp_path, 2)
    dirs = [tmp_path / f"run{i}" for i in range(2)]

    def ctrl_c(step: int) -> None:
        if step == 7:
            import signal
            signal.getsignal(signal.SIGINT)(signal.SIGINT, None)  # the handler the group installed

    with pytest.raises(TrainingInterrupted):
        train_group(configs, dirs, progress=False, on_step=ctrl_c)
    for d in dirs:
        assert json.loads((d / "provenance.json").read_text())["starts"][-1]["stopped"] == "interrupted"
        assert read_resume_step(d) == 8  # the request is acted on after the next step, as alone
    (dirs[1] / RESUME_FILE).unlink()  # as if killed between the two members' saves
    results = train_group(configs, dirs, resume=True, progress=False)
    assert [r.steps for r in results] == [12, 12]
    for d in dirs:  # each went on alone
        assert "group" not in json.loads((d / "provenance.json").read_text())["starts"][-1]


def test_runs_that_differ_in_more_than_seed_and_variant_are_refused(tmp_path):
    configs = _configs(tmp_path, "transformer", [("train.seed=0",), ("train.seed=1", "train.lr=1e-3")])
    with pytest.raises(ConfigError, match=r"must share the training settings \(all but train.seed\)"):
        train_group(configs, [tmp_path / "a", tmp_path / "b"], progress=False)
    configs = _configs(tmp_path, "transformer", [("train.seed=0",), ("train.seed=1", "model.d_mlp=48")])
    with pytest.raises(ConfigError, match="must share the model config"):
        train_group(configs, [tmp_path / "a", tmp_path / "b"], progress=False)
    assert not (tmp_path / "a").exists()  # refused before anything is written


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_every_family_either_trains_as_a_group_or_says_why_it_cannot(tmp_path, monkeypatch, kind):
    """A family's ``not_stackable`` is the truth: where it is None a two-run group trains, where
    it names a reason, the group is refused with it, and without the guard vmap indeed fails."""
    preset = Path(__file__).parents[2] / "configs" / "cpu" / f"hmm_{kind}.toml"
    overrides = ["train.steps=2", "train.eval_every=0", "train.checkpoint_every=0", "train.log_every=1", "train.batch_size=4",
                 "train.warmup_steps=1", "eval.n=8"]
    configs = [load_run_config(preset, [*overrides, f"train.seed={seed}"]) for seed in range(2)]
    dirs = [tmp_path / "a", tmp_path / "b"]
    family = MODELS[kind]
    if family.not_stackable is None:
        assert [r.steps for r in train_group(configs, dirs, progress=False)] == [2, 2]
        return
    with pytest.raises(ConfigError, match=f"runs of the {kind} family cannot train as one group"):
        train_group(configs, dirs, progress=False)
    monkeypatch.setattr(family, "not_stackable", None)
    with pytest.raises(RuntimeError, match="vmap|[Bb]atching rule"):
        train_group(configs, dirs, progress=False)


def test_sweep_trains_the_seeds_as_one_group_when_asked_and_alone_by_default_on_a_cpu(tmp_path, capsys, monkeypatch, write_config):
    from windtunnel.cli import main

    config = write_config(tmp_path, steps=10, checkpoint_every=5)
    out = tmp_path / "sweep"
    assert main(["sweep", str(config), "--seeds", "2", "--out", str(out), "--group"]) == 0
    for seed in (0, 1):
        starts = json.loads((out / f"seed_{seed}" / "provenance.json").read_text())["starts"]
        assert [s["group"] for s in starts] == [{"size": 2, "runs": ["seed_0", "seed_1"]}]
    assert (out / "logs" / "seeds_0-1.log").is_file()
    capsys.readouterr()
    assert main(["sweep", str(config), "--seeds", "2", "--out", str(out), "--group"]) == 0  # done: kept as it is
    assert "all 1 runs already done" in capsys.readouterr().err
    # Without --group or --no-group: a group on a GPU only, for a family that stacks, of more than one seed.
    from windtunnel.cli_commands import _groups_seeds

    cpu = load_run_config(config, ["train.device=cpu"])
    assert (_groups_seeds(None, cpu, 2), _groups_seeds(True, cpu, 2), _groups_seeds(False, cpu, 2), _groups_seeds(True, cpu, 1)) == (
        False, True, False, False)
    monkeypatch.setattr("windtunnel.training.group.pick_device", lambda device: torch.device("cuda"))
    assert (_groups_seeds(None, cpu, 2), _groups_seeds(None, cpu, 1)) == (True, False)
    lstm = Path(__file__).parents[2] / "configs" / "cpu" / "hmm_lstm.toml"
    assert main(["sweep", str(lstm), "--seeds", "2", "--out", str(tmp_path / "lstm"), "--group"]) == 2
    assert "--group: runs of the lstm family cannot train as one group" in capsys.readouterr().err
    assert not (tmp_path / "lstm").exists()
    lstm_config = load_run_config(lstm, ["train.device=cpu"])
    assert _groups_seeds(None, lstm_config, 3) is False  # even on a GPU


def test_a_group_jobs_state_is_its_members_and_only_unstarted_members_are_cleared(tmp_path, write_config):
    from windtunnel.jobs import GroupJob, TrainJob, job_state

    config = write_config(tmp_path, steps=10, checkpoint_every=5)
    runs = tmp_path / "runs"
    members = tuple(TrainJob(f"seed_{s}", config, runs / f"seed_{s}", (f"train.seed={s}",)) for s in (0, 1))
    group = GroupJob("seeds_0-1", members)
    assert job_state(group) == "new" and group.log == runs / "logs" / "seeds_0-1.log"

    def crash(step: int) -> None:
        if step == 7:
            raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        train(members[0].resolved(), members[0].run_dir, progress=False, on_step=crash)  # a checkpoint at step 5
    (members[1].run_dir).mkdir(parents=True)
    (members[1].run_dir / "stray").write_text("left by a start that died before its config")
    assert [job_state(m) for m in members] == ["partial", "new"] and job_state(group) == "partial"
    group.clear_unstarted()
    assert (members[0].run_dir / "resume.safetensors").is_file() and not members[1].run_dir.exists()
    with pytest.raises(ValueError, match="share one runs folder"):
        GroupJob("mixed", (members[0], TrainJob("x", config, tmp_path / "elsewhere" / "x")))


@pytest.mark.slow  # compiling the stacked forward takes about 30 s on a CPU
def test_a_compiled_group_follows_the_plain_group_within_rounding(tmp_path, whole_group):
    """``train.compile``: the forward over the run axis through torch.compile; its fused kernels
    round differently, so the losses follow the plain group's within float32 rounding (as a lone
    compiled run follows a plain one)."""
    dirs, _ = whole_group
    configs = _configs(tmp_path, "transformer", [(f"train.seed={seed}", "train.compile=true") for seed in range(3)])
    compiled = [tmp_path / f"compiled{i}" for i in range(3)]
    train_group(configs, compiled, progress=False)
    for plain, fused in zip(dirs, compiled):
        assert torch.allclose(torch.tensor(_losses(fused)), torch.tensor(_losses(plain)), rtol=LOSS_RTOL, atol=0)


def test_a_plan_groups_the_runs_that_stack_and_leaves_the_others_alone(tmp_path):
    from windtunnel.jobs import GroupJob, group_jobs
    from windtunnel.reproduce import plan_runs
    from windtunnel.studies import SCALES

    jobs = plan_runs(SCALES["paper"], tmp_path)
    grouped = group_jobs(jobs, lambda config: True)
    groups = {job.name: [m.name for m in job.members] for job in grouped if isinstance(job, GroupJob)}
    # The seeds of a preset stack with its twins on the authors' task variants (at the paper's
    # scale one vocabulary and one length: the HMM's floored twin on the paper's grid, the
    # bijection with replacement): the 16 runs in 5 jobs. Every run is in exactly one job.
    assert groups == {
        "bijection_transformer_seed0+3": [*(f"bijection_transformer_seed{s}" for s in range(3)), "bijection_replacement_transformer_seed0"],
        "bijection_mlp_seed0+1": ["bijection_mlp_seed0", "bijection_replacement_mlp_seed0"],
        "hmm_transformer_seed0+5": [*(f"hmm_transformer_seed{s}" for s in range(5)), "hmm_transformer_floor_seed0"],
        "hmm_mlp_seed0+1": ["hmm_mlp_seed0", "hmm_mlp_floor_seed0"],
        "hmm_late_attention_off_seed0+1": ["hmm_late_attention_off_seed0", "hmm_late_attention_off_floor_seed0"],
    }
    assert len(grouped) == 5
    names = [m.name for job in grouped for m in (job.members if isinstance(job, GroupJob) else (job,))]
    assert sorted(names) == sorted(job.name for job in jobs)
    assert group_jobs(jobs, lambda config: False) == jobs  # nobody wants groups: every run alone
