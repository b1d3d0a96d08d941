"""Training end to end: the loss falls, checkpoints survive SIGKILL and Ctrl-C bit for bit,
DDP keeps ranks identical, faults give one-line errors and lose nothing."""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import safetensors.torch
import torch

from windtunnel.cli import main
from windtunnel.history import read_metrics, stop_record
from windtunnel.run_config import load_run_config
from windtunnel.training import trainer as trainer_module
from windtunnel.run_layout import RESUME_FILE
from windtunnel.training.checkpoint import list_snapshots, read_resume_step, snapshot_path
from windtunnel.training.schedule import learning_rate
from windtunnel.training.trainer import TrainingDiverged, data_seed, train
from scopes import once_per_module

def windtunnel(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "windtunnel", *args], capture_output=True, text=True, timeout=300, **kwargs)


def cli(capsys, *args: str) -> tuple[int, str, str]:
    """The command line in this process (a bad input returns its code; it never raises): the exit
    code, stdout and stderr. In process, so that mutation testing sees these checks."""
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def final_weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return safetensors.torch.load_file(str(snapshot_path(run_dir, step)))


def assert_bit_identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.fixture(scope=once_per_module)
def reference_run(tmp_path_factory, write_config) -> Path:
    """An uninterrupted 30-step run, trained through the command line's entry point in this
    process (so that mutation testing, which changes the code of this process only, sees the
    tests that read it)."""
    folder = tmp_path_factory.mktemp("reference")
    assert main(["train", str(write_config(folder)), "--out", str(folder / "run"), "--quiet"]) == 0
    return folder / "run"


def test_run_directory_and_loss_falls(reference_run):
    records = [json.loads(line) for line in (reference_run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r][:2] == [5, 10]
    assert {"step", "loss", "lr", "grad_norm", "seq_per_s"} <= set(records[0])
    evals = [r for r in records if "eval_mae_bits" in r]
    assert [r["step"] for r in evals] == [10, 20, 30]
    assert records[-1]["loss"] < records[0]["loss"]
    assert evals[-1]["eval_kl_bits"] < evals[0]["eval_kl_bits"]
    config = json.loads((reference_run / "config.json").read_text())
    assert config["train"]["steps"] == 30 and config["tunnel"] == {"name": "bijection", "V": 6, "L": 5, "with_replacement": False, "query": False, "repeat_rate": 0.0, "repeat_window": 0}
    # Log-spaced snapshots (4 per decade: round(10^(i/4))) plus step 0 and the last step.
    expected = sorted({0, 30} | {round(10 ** (i / 4)) for i in range(8) if 10 ** (i / 4) <= 30})
    assert list_snapshots(reference_run) == expected == [0, 1, 2, 3, 6, 10, 18, 30]
    meta = json.loads(snapshot_path(reference_run, 30).with_suffix(".json").read_text())
    assert meta["step"] == 30 and meta["config"] == config and "torch" in meta and meta["params"] > 0
    assert read_resume_step(reference_run) == 30


# A real signal to a separate process: the in-process twins below check the same trainer logic where
# mutation testing (which runs `-m "not slow"` and changes this process's code only) can see it.
@pytest.mark.slow
def test_sigkill_then_resume_is_bit_identical(reference_run, tmp_path, write_config):
    run_dir = tmp_path / "run"
    config = write_config(tmp_path)
    process = subprocess.Popen(
        [sys.executable, "-m", "windtunnel", "train", str(config), "--out", str(run_dir), "--quiet"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 120
    while time.time() < deadline:  # kill at an arbitrary step past the second checkpoint
        step = read_resume_step(run_dir) if (run_dir / RESUME_FILE).exists() else None
        if step is not None and step >= 10:
            break
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    killed_at = read_resume_step(run_dir)
    assert killed_at is not None and 10 <= killed_at < 30, killed_at
    result = windtunnel("train", "--resume", str(run_dir), "--quiet")
    assert result.returncode == 0, result.stderr
    assert_bit_identical(final_weights(run_dir, 30), final_weights(reference_run, 30))
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps))  # lines past the checkpoint were dropped, then rewritten once


# A real signal to a separate process: the in-process twins below check the same trainer logic where
# mutation testing (which runs `-m "not slow"` and changes this process's code only) can see it.
@pytest.mark.slow
def test_ctrl_c_saves_and_resumes(reference_run, tmp_path, write_config):
    run_dir = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-m", "windtunnel", "train", str(write_config(tmp_path, checkpoint_every=1000)), "--out", str(run_dir), "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    while time.time() < deadline and 6 not in list_snapshots(run_dir):
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert "resume with `windtunnel train --resume" in stderr and "Traceback" not in stderr
    assert 6 <= read_resume_step(run_dir) < 30
    result = windtunnel("train", "--resume", str(run_dir), "--quiet")
    assert result.returncode == 0, result.stderr
    assert_bit_identical(final_weights(run_dir, 30), final_weights(reference_run, 30))


def _break_loss_at(monkeypatch, step: int, factor: float):
    """Make the trainer's loss at ``step`` (counting from 1) ``factor`` times itself; returns
    the real loss function, to restore."""
    real_loss = trainer_module._loss
    calls = {"n": 0}

    def loss_that_breaks(*args):
        calls["n"] += 1
        loss = real_loss(*args)
        return loss * factor if calls["n"] == step else loss

    monkeypatch.setattr(trainer_module, "_loss", loss_that_breaks)
    return real_loss


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path, monkeypatch, write_config):
    real_loss = _break_loss_at(monkeypatch, 13, math.nan)
    config = load_run_config(write_config(tmp_path))
    with pytest.raises(TrainingDiverged, match="at step 13"):
        train(config, tmp_path / "run", progress=False)
    assert read_resume_step(tmp_path / "run") == 10  # the last checkpoint before the NaN step
    monkeypatch.setattr(trainer_module, "_loss", real_loss)
    result = train(config, tmp_path / "run", resume=True, progress=False)
    assert result.steps == 30


def test_bad_run_directories_exit_2(reference_run, tmp_path, write_config, capsys):
    cases = [
        (["train", "--resume", str(tmp_path / "nope")], "does not exist"),
        (["train", "--resume", str(tmp_path)], "is not a run directory"),
        (["eval", str(tmp_path / "nope")], "does not exist"),
        (["train", str(write_config(tmp_path)), "--out", str(reference_run)], "is not empty"),
        (["train", "--resume", str(reference_run), "--set", "train.lr=1"], "resuming with a changed config is refused"),
        (["eval", str(reference_run), "--horizons", "9"], "--horizons=9 is out of range"),
        (["eval", str(reference_run), "--step", "7"], "--step 7 is not a snapshot"),
    ]
    for args, message in cases:
        code, _, stderr = cli(capsys, *args)
        assert code == 2 and message in stderr, (args, stderr)
        assert len(stderr.strip().splitlines()) == 1


def test_corrupt_checkpoint_is_refused_and_kept(reference_run, tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for name in ("config.json", RESUME_FILE):
        (run_dir / name).write_bytes((reference_run / name).read_bytes())
    data = (run_dir / RESUME_FILE).read_bytes()
    (run_dir / RESUME_FILE).write_bytes(data[: len(data) // 2])  # a torn write from some other tool
    code, _, stderr = cli(capsys, "train", "--resume", str(run_dir), "--set", "train.steps=40", "--force")
    assert code == 2 and "truncated or corrupt" in stderr
    assert (run_dir / RESUME_FILE).read_bytes() == data[: len(data) // 2]  # nothing overwritten


def test_eval_scores_against_closed_forms(reference_run, capsys):
    code, stdout, stderr = cli(capsys, "eval", str(reference_run), "--horizons", "3", "5", "--n", "100")
    assert code == 0, stderr
    scores = json.loads((reference_run / "eval.json").read_text())
    assert scores["step"] == 30 and set(scores["horizons"]) == {"3", "5"}
    assert scores["run_dir"] == "run"  # outside a reproduction, by name: no path of this machine
    for horizon, h in scores["horizons"].items():
        # The oracle is the posterior itself: 0 bits up to float64 rounding of log2.
        assert scores["horizons"][horizon]["oracle"]["mae_bits"] < 1e-12 and h["oracle"]["kl_bits"] < 1e-12
        # The context-free prior is uniform over V = 6: error log2 6 - log2(6 - k + 1) at pair k.
        k = range(1, int(horizon) + 1)
        expected = sum(math.log2(6) - math.log2(7 - i) for i in k) / len(k)
        assert h["prior"]["mae_bits"] == pytest.approx(expected, abs=1e-12)
        assert h["prior"]["kl_bits"] == pytest.approx(expected, abs=1e-12)  # KL(uniform-on-subset || uniform) = same gap
        low, high = h["mae_bits_ci"]
        assert low <= h["mae_bits"] <= high
        assert len(h["curves"]["abs_error_bits"]) == int(horizon)
    assert "oracle" in stdout and "prior" in stdout


def test_schedule_closed_forms():
    common = dict(lr=1e-3, warmup_steps=10, total_steps=110, min_lr=1e-4)
    assert learning_rate(0, schedule="cosine", **common) == pytest.approx(1e-4)
    assert learning_rate(9, schedule="cosine", **common) == pytest.approx(1e-3)
    assert learning_rate(10, schedule="cosine", **common) == pytest.approx(1e-3)
    assert learning_rate(109, schedule="cosine", **common) == pytest.approx(1e-4)
    mid = 10 + 99 / 2
    assert learning_rate(int(mid), schedule="cosine", **common) == pytest.approx(1e-4 + 0.45e-3 * (1 + math.cos(math.pi * int(mid - 10) / 99)))
    assert learning_rate(50, schedule="constant", **common) == 1e-3


def test_data_streams_are_disjoint_and_reproducible():
    seeds = {data_seed(0, rank, step) for rank in range(4) for step in range(1000)}
    assert len(seeds) == 4000
    assert data_seed(3, 1, 7) == data_seed(3, 1, 7) != data_seed(4, 1, 7)


@pytest.mark.slow
def test_ddp_two_processes_keep_ranks_identical_on_disjoint_data(tmp_path, write_config):
    config = write_config(tmp_path, steps=20, checkpoint_every=10)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
            str(Path(__file__).with_name("ddp_worker.py")), str(config), str(tmp_path / "run"), str(tmp_path),
        ],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rank0 = safetensors.torch.load_file(str(tmp_path / "rank0.safetensors"))
    rank1 = safetensors.torch.load_file(str(tmp_path / "rank1.safetensors"))
    assert_bit_identical(rank0, rank1)
    assert_bit_identical(rank0, final_weights(tmp_path / "run", 20))  # what rank 0 saved
    losses = [json.loads(line)["loss"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert losses[-1] < losses[0]

    # The ranks draw disjoint data: each step's batches differ between the ranks, and each is
    # the batch the documented seed gives (sha256 of "windtunnel-train:{seed}:{rank}:{step}",
    # first 8 bytes little-endian, shifted to be non-negative), written out here.
    run_config = load_run_config(config)
    for rank in (0, 1):
        batches = safetensors.torch.load_file(str(tmp_path / f"rank{rank}_batches.safetensors"))
        assert len(batches) == 20
        for step in range(20):
            digest = hashlib.sha256(f"windtunnel-train:{run_config.train.seed}:{rank}:{step}".encode()).digest()
            generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)
            expected = run_config.tunnel.sample(run_config.train.batch_size // 2, generator=generator).tokens
            assert torch.equal(batches[f"step{step}"], expected), (rank, step)
    rank0_batches = safetensors.torch.load_file(str(tmp_path / "rank0_batches.safetensors"))
    rank1_batches = safetensors.torch.load_file(str(tmp_path / "rank1_batches.safetensors"))
    assert all(not torch.equal(rank0_batches[k], rank1_batches[k]) for k in rank0_batches)


class _Crash(RuntimeError):
    pass


def test_compiled_training_resumes_exactly_and_follows_the_plain_curve(tmp_path, write_config):
    """``train.compile``: a crashed compiled run resumes bit-identical to an uninterrupted
    compiled one; against the plain step it changes only the floating-point path."""
    path = write_config(tmp_path, steps=12, checkpoint_every=6)
    compiled = load_run_config(path, ["train.compile=true", "train.log_every=1"])
    straight = train(compiled, tmp_path / "straight", progress=False)

    def crash_at_8(step: int) -> None:
        if step == 8:
            raise _Crash

    with pytest.raises(_Crash):
        train(compiled, tmp_path / "resumed", progress=False, on_step=crash_at_8)
    assert read_resume_step(tmp_path / "resumed") == 6
    train(compiled, tmp_path / "resumed", resume=True, progress=False)
    assert_bit_identical(final_weights(tmp_path / "resumed", 12), final_weights(tmp_path / "straight", 12))

    plain = train(load_run_config(path, ["train.log_every=1"]), tmp_path / "plain", progress=False)
    losses = {}
    for name in ("straight", "plain"):
        records = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        losses[name] = torch.tensor([r["loss"] for r in records], dtype=torch.float64)
    assert len(losses["plain"]) == 12
    # Fused kernels reassociate fp32 sums; over 12 steps the losses differ by 1.3e-7 relative
    # (measured on an AMD EPYC), while another seed moves every step's loss by >= 4.6e-4.
    torch.testing.assert_close(losses["straight"], losses["plain"], rtol=1e-5, atol=0)
    assert straight.final_eval is not None and plain.final_eval is not None


def test_supervised_only_follows_the_full_forward_curve(tmp_path, write_config):
    """``train.supervised_only`` (the default) computes the same function as the full forward
    indexed at the supervised positions, so the loss curve is the same up to float rounding."""
    path = write_config(tmp_path, steps=12, checkpoint_every=6)
    losses = {}
    for name, switch in (("pruned", "true"), ("full", "false")):
        train(load_run_config(path, [f"train.supervised_only={switch}", "train.log_every=1"]), tmp_path / name, progress=False)
        records = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        losses[name] = torch.tensor([r["loss"] for r in records], dtype=torch.float64)
    assert len(losses["full"]) == 12
    # Only the matmul shapes of the last block differ (rows dropped), so at most fp32
    # reassociation separates the curves (equal to the bit on the AMD EPYC); another seed moves
    # every step's loss by >= 4.6e-4.
    torch.testing.assert_close(losses["pruned"], losses["full"], rtol=1e-5, atol=0)


def test_curriculum_batches_come_from_the_annealed_tunnel(tmp_path, monkeypatch):
    """Every training batch is drawn from the tunnel the curriculum names for its step; the
    held-out set from the tunnel itself."""
    from windtunnel.tunnels import HMMTunnel

    (tmp_path / "hmm.toml").write_text(
        '[tunnel]\nname = "hmm"\nS = 3\nM = 3\nK = 6\ngrid = 0.05\n'
        '[model]\nkind = "transformer"\nn_layers = 1\nn_heads = 1\nd_model = 8\nd_mlp = 16\n'
        "[train]\nsteps = 8\nbatch_size = 4\neval_every = 0\ncheckpoint_every = 0\n"
        '[train.curriculum]\nparam = "concentration"\nstart = 0.1\nsteps = 5\n'
        "[eval]\nn = 8\nbatch_size = 8\nbootstrap = 0\n"
    )
    drawn: list[tuple[float, int]] = []
    real_sample = HMMTunnel.sample

    def recording_sample(self, batch_size, *, generator, horizon=None):
        drawn.append((self.concentration, batch_size))
        return real_sample(self, batch_size, generator=generator, horizon=horizon)

    monkeypatch.setattr(HMMTunnel, "sample", recording_sample)
    train(load_run_config(tmp_path / "hmm.toml"), tmp_path / "run", progress=False)
    training = [c for c, b in drawn if b == 4]
    held_out = [c for c, b in drawn if b == 8]
    # Closed form: 0.1 * (1.0 / 0.1) ** (s / 5) for s < 5, then the tunnel's 1.0.
    assert training == pytest.approx([0.1 * 10 ** (s / 5) for s in range(5)] + [1.0, 1.0, 1.0], rel=1e-12)
    assert held_out and set(held_out) == {1.0}


def _host_reads_in_the_training_loop(monkeypatch, config, run_dir) -> int:
    """Train ``config`` into ``run_dir`` counting the reads of a tensor's value back to the
    host (``item``, ``tolist``, ``bool``, ``float``, ``int``) made by the trainer's own code
    (other frames, the sampler's or the evaluation's, are not the step's)."""
    counted = {"n": 0}
    trainer_file = trainer_module.__file__

    def counting(name):
        original = getattr(torch.Tensor, name)

        def read(self, *args, **kwargs):
            if sys._getframe(1).f_code.co_filename == trainer_file:
                counted["n"] += 1
            return original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, read)

    for name in ("item", "tolist", "__bool__", "__float__", "__int__"):
        counting(name)
    train(config, run_dir, progress=False)
    monkeypatch.undo()
    return counted["n"]


def test_the_step_reads_nothing_back_between_boundaries(tmp_path, monkeypatch, write_config):
    """Issue 15: the loss, the grad norm and the divergence check stay on the device and are
    read at a boundary (a log, an evaluation, a checkpoint) only. Two runs with the same two
    boundaries, one of twice the steps between them, make the same number of reads; a per-step
    read would add one per extra step."""
    path = write_config(tmp_path)
    quiet = ["train.eval_every=0", "train.checkpoint_every=0", "train.snapshots_per_decade=0"]
    short = load_run_config(path, [*quiet, "train.steps=20", "train.log_every=10"])
    long = load_run_config(path, [*quiet, "train.steps=40", "train.log_every=20"])
    reads_short = _host_reads_in_the_training_loop(monkeypatch, short, tmp_path / "short")
    reads_long = _host_reads_in_the_training_loop(monkeypatch, long, tmp_path / "long")
    assert 0 < reads_short == reads_long, (reads_short, reads_long)


def test_divergence_is_named_at_its_first_step_though_read_at_the_next_boundary(tmp_path, monkeypatch, write_config):
    """A loss that turns infinite at step 7 is seen at the log of step 10; the message names
    step 7 and its value, and no checkpoint of the diverged weights is written."""
    _break_loss_at(monkeypatch, 7, math.inf)
    config = load_run_config(write_config(tmp_path, checkpoint_every=10), ["train.log_every=10"])
    with pytest.raises(TrainingDiverged, match=r"loss became inf at step 7; no checkpoint was saved yet"):
        train(config, tmp_path / "run", progress=False)
    assert read_resume_step(tmp_path / "run") is None


def test_fused_adamw_is_off_on_a_cpu_by_default_and_follows_the_plain_curve_when_asked(tmp_path, write_config):
    """``train.fused_adamw``: None keeps a CPU run on the foreach AdamW (its trajectory
    unchanged); true takes PyTorch's fused kernel, the same update up to float rounding."""
    path = write_config(tmp_path, steps=12, checkpoint_every=6)
    model = torch.nn.Linear(2, 2)
    assert trainer_module._optimizer(model, load_run_config(path), torch.device("cpu")).defaults["fused"] is None
    assert trainer_module._optimizer(model, load_run_config(path), torch.device("cuda")).defaults["fused"] is True
    losses = {}
    for name, overrides in (("plain", []), ("fused", ["train.fused_adamw=true"])):
        train(load_run_config(path, ["train.log_every=1", *overrides]), tmp_path / name, progress=False)
        records = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        losses[name] = torch.tensor([r["loss"] for r in records], dtype=torch.float64)
    assert len(losses["fused"]) == 12
    # As for compilation: reassociated fp32 sums move a 12-step curve by ~1e-7 relative, while
    # another seed moves every step's loss by >= 4.6e-4 (test above).
    torch.testing.assert_close(losses["fused"], losses["plain"], rtol=1e-5, atol=0)


def test_bf16_autocast_follows_the_float32_curve_on_a_cpu(tmp_path, write_config):
    """``train.bf16`` (the paper presets' precision) autocasts the forward to bfloat16 on a CPU
    as on CUDA, and keeps the float32 run's trajectory within a stated tolerance."""
    path = write_config(tmp_path, steps=12, checkpoint_every=6)
    losses = {}
    for name, sets in (("float32", []), ("bf16", ["train.bf16=true"]), ("other_seed", ["train.seed=1"])):
        train(load_run_config(path, ["train.log_every=1", *sets]), tmp_path / name, progress=False)
        records = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        losses[name] = torch.tensor([r["loss"] for r in records], dtype=torch.float64)
    assert not torch.equal(losses["bf16"], losses["float32"])  # the autocast is in force on the CPU
    # bfloat16 keeps 8 significant bits (2**-9 relative rounding) of each matmul input, summed in
    # float32: over 12 steps the losses differ by at most 3.0e-5 relative (measured on an Intel
    # Xeon), while another seed moves every step's loss by >= 4.6e-4; 1e-4 lies between the two.
    torch.testing.assert_close(losses["bf16"], losses["float32"], rtol=1e-4, atol=0)
    assert ((losses["other_seed"] - losses["float32"]).abs() / losses["float32"]).min() > 1e-4


def test_the_loss_is_the_cross_entropy_over_classes_and_weight_decay_spares_vectors(tmp_path, write_config):
    """The training loss against numpy's log-sum-exp (soft: against the exact posterior; hard:
    against the sampled target), and the optimizer's groups against the parameters' shapes."""
    import numpy as np
    from types import SimpleNamespace

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 4, 5, generator=g, dtype=torch.float64)  # [B, P, C]: P != C, so the class axis is told apart
    posterior = torch.softmax(torch.randn(3, 4, 5, generator=g, dtype=torch.float64), -1)
    targets = torch.randint(0, 5, (3, 4), generator=g)
    episode = SimpleNamespace(posterior=posterior, targets=targets)
    x = logits.numpy()
    log_probs = x - (np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)) + x.max(-1, keepdims=True))
    soft = -(posterior.numpy() * log_probs).sum(-1).mean()
    hard = -np.take_along_axis(log_probs, targets.numpy()[..., None], -1).mean()
    # float32 log-softmax (the trainer's precision for the soft loss): 1e-6 relative is ~10 float32 ulps
    assert trainer_module._loss(logits, episode, "soft").item() == pytest.approx(soft, rel=1e-6)
    assert trainer_module._loss(logits, episode, "hard").item() == pytest.approx(hard, rel=1e-12)  # float64 throughout

    config = load_run_config(write_config(tmp_path), ["train.weight_decay=0.25"])
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))
    marked = torch.nn.Parameter(torch.zeros(2, 2))
    marked._no_weight_decay = True
    model.register_parameter("marked", marked)
    decay, no_decay = trainer_module._optimizer(model, config, torch.device("cpu")).param_groups
    assert decay["weight_decay"] == 0.25 and [p.shape for p in decay["params"]] == [torch.Size([4, 3])]
    assert no_decay["weight_decay"] == 0.0 and {id(p) for p in no_decay["params"]} == {
        id(marked), id(model[0].bias), id(model[1].weight), id(model[1].bias)}


# --- In process: the time limit, Ctrl-C and resume, as mutation testing can see them ---------
# The subprocess tests above (SIGKILL, a real SIGINT) need a separate process; these check the
# same trainer logic inside the test process, on the tiny config, in about a second each.


def _clock_jumping_to(monkeypatch, seconds: float, after_step: int):
    """The trainer's clock reads 0 until ``after_step`` steps are done, then ``seconds``: the
    step a time limit ends a run at then depends on the steps alone, not this machine's speed.
    Returns the ``on_step`` hook that moves it."""
    clock = {"now": 0.0}
    monkeypatch.setattr(trainer_module, "time", SimpleNamespace(perf_counter=lambda: clock["now"]))

    def on_step(step: int) -> None:
        if step == after_step:
            clock["now"] = seconds

    return on_step


def _provenance_starts(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / "provenance.json").read_text())["starts"]


def test_a_run_whose_time_limit_is_reached_ends_at_the_next_log_and_says_it_stopped_everywhere(tmp_path, monkeypatch, write_config):
    """``train.time_limit_s`` (run_config): at the first log boundary with the limit reached
    the run ends as at a last step (final evaluation, checkpoint and snapshot), with a metrics
    record ``"stopped": "time_limit"``. Here 50 s have passed, to the second, once step 12 is
    done: logging every 5 steps, the run ends at step 15 of 20 (neither an evaluation, a
    checkpoint nor a snapshot step of its own), and everything it wrote says step 15."""
    on_step = _clock_jumping_to(monkeypatch, 50.0, after_step=12)
    config = load_run_config(write_config(tmp_path, steps=20, checkpoint_every=1000), ["train.time_limit_s=50", "train.eval_every=0"])
    result = train(config, tmp_path / "run", progress=False, on_step=on_step)
    assert result.steps == 15
    records = read_metrics(tmp_path / "run")
    assert [r["step"] for r in records] == [5, 10, 15]
    assert not [r for r in records[:2] if "stopped" in r]  # the limit was not reached yet
    assert stop_record(records) is records[-1]
    assert records[-1]["stopped"] == "time_limit" and records[-1]["time_limit_s"] == 50.0
    assert "eval_mae_bits" in records[-1] and result.final_eval is not None  # the final evaluation, as at a last step
    [start] = _provenance_starts(tmp_path / "run")
    assert start["stopped"] == "time_limit" and (start["start_step"], start["end_step"], start["configured_steps"]) == (0, 15, 20)
    assert read_resume_step(tmp_path / "run") == 15 and list_snapshots(tmp_path / "run") == [0, 1, 2, 3, 6, 10, 15]


@pytest.mark.parametrize(
    "limit_s, seconds, after_step",
    [
        (50.0, 49.5, 2),  # the limit is never reached: 49.5 s < 50 s at every log
        (50.0, 1000.0, 17),  # reached, but first looked at on the last step (20), which ends the run anyway
        (0.0, 1e6, 2),  # 0 means no limit, however long the run takes
    ],
)
def test_a_run_that_trains_all_its_steps_does_not_say_it_stopped(tmp_path, monkeypatch, write_config, limit_s, seconds, after_step):
    on_step = _clock_jumping_to(monkeypatch, seconds, after_step)
    config = load_run_config(write_config(tmp_path, steps=20, checkpoint_every=1000), [f"train.time_limit_s={limit_s}"])
    assert train(config, tmp_path / "run", progress=False, on_step=on_step).steps == 20
    records = read_metrics(tmp_path / "run")
    assert [r["step"] for r in records] == [5, 10, 15, 20]
    assert not [r for r in records if "stopped" in r or "time_limit_s" in r] and stop_record(records) is None
    [start] = _provenance_starts(tmp_path / "run")
    assert start["stopped"] is None and start["end_step"] == start["configured_steps"] == 20


def test_records_past_the_checkpoint_are_dropped_on_resume_and_the_one_at_it_is_kept(tmp_path):
    """``_truncate_metrics``: on a resume from step 10, records with step <= 10 stay (they are
    not recomputed: the run restarts after step 10) and later ones go (they will be)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    lines = [json.dumps({"step": step, "loss": float(step)}) + "\n" for step in (5, 9, 10, 11, 15)]
    (run_dir / "metrics.jsonl").write_text("".join(lines))
    kept = trainer_module._truncate_metrics(run_dir, 10)
    assert kept == [{"step": 5, "loss": 5.0}, {"step": 9, "loss": 9.0}, {"step": 10, "loss": 10.0}]
    assert (run_dir / "metrics.jsonl").read_text() == "".join(lines[:3])
    assert trainer_module._truncate_metrics(run_dir, 0) == [] and (run_dir / "metrics.jsonl").read_text() == ""
    assert trainer_module._truncate_metrics(tmp_path / "none", 10) == [] and not (tmp_path / "none").exists()


class _Crash(RuntimeError):
    """Stands for a kill: the run stops after a step, saving nothing more."""


def test_a_run_crashed_past_a_checkpoint_resumes_in_process_bit_identical_with_each_record_once(reference_run, tmp_path, write_config):
    """The in-process twin of the SIGKILL test: the run dies after step 17 (records 5, 10, 15
    written; the checkpoint of step 10 the last); resumed, it keeps records 5 and 10 as they
    were written, writes 15 to 30 once, and ends with the reference run's weights."""
    config = load_run_config(write_config(tmp_path, checkpoint_every=10))

    def crash_after_17(step: int) -> None:
        if step == 17:
            raise _Crash

    with pytest.raises(_Crash):
        train(config, tmp_path / "run", progress=False, on_step=crash_after_17)
    before = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in before] == [5, 10, 15] and read_resume_step(tmp_path / "run") == 10
    assert main(["train", "--resume", str(tmp_path / "run"), "--quiet"]) == 0
    after = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in after] == [5, 10, 15, 20, 25, 30]
    assert after[:2] == before[:2]  # the record at the checkpoint is the first start's, kept byte for byte
    assert_bit_identical(final_weights(tmp_path / "run", 30), final_weights(reference_run, 30))
    starts = _provenance_starts(tmp_path / "run")
    assert [(s["start_step"], s["end_step"], s["stopped"]) for s in starts] == [(10, 30, None)]  # the crashed start wrote none


def _ctrl_c_during_step(monkeypatch, steps: tuple[int, ...]) -> list:
    """Deliver SIGINT, as the OS would, by calling the handler the trainer installed, during
    each step of ``steps`` (counting from 1); returns the handlers seen (to check them)."""
    real_step = trainer_module._step
    handlers = []

    def step_with_ctrl_c(s, step):
        out = real_step(s, step)
        if step + 1 in steps:
            handler = signal.getsignal(signal.SIGINT)
            handlers.append(handler)
            handler(signal.SIGINT, None)
        return out

    monkeypatch.setattr(trainer_module, "_step", step_with_ctrl_c)
    return handlers


def test_ctrl_c_in_process_saves_the_step_it_came_in_and_resumes_bit_identical(reference_run, tmp_path, write_config, capsys, monkeypatch):
    """The in-process twin of the Ctrl-C test: a first Ctrl-C during step 7 is a request to
    stop at that step's end (the step is never cut in half), though step 7 is no boundary of
    its own (no log, evaluation, checkpoint or snapshot): the state of step 7 is saved, the
    command exits 130 with one line naming it, and the resumed run ends as the reference."""
    before = signal.getsignal(signal.SIGINT)
    handlers = _ctrl_c_during_step(monkeypatch, (7,))
    run_dir = tmp_path / "run"
    # checkpoint_every 1000: the only state saved before the end is the one Ctrl-C asks for.
    assert main(["train", str(write_config(tmp_path, checkpoint_every=1000)), "--out", str(run_dir), "--quiet"]) == 130
    assert [type(h.__self__).__name__ for h in handlers] == ["_InterruptFlag"]  # the trainer's own handler took it
    assert signal.getsignal(signal.SIGINT) == before  # and it was put back
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"windtunnel: interrupted after step 7; state saved: resume with `windtunnel train --resume {run_dir}`"]
    assert read_resume_step(run_dir) == 7 and [r["step"] for r in read_metrics(run_dir)] == [5]
    monkeypatch.undo()
    assert main(["train", "--resume", str(run_dir), "--quiet"]) == 0
    assert_bit_identical(final_weights(run_dir, 30), final_weights(reference_run, 30))
    assert [r["step"] for r in read_metrics(run_dir)] == [5, 10, 15, 20, 25, 30]
    # Both starts trained steps the weights hold, so both are in the provenance.
    starts = _provenance_starts(run_dir)
    assert [(s["start_step"], s["end_step"], s["stopped"]) for s in starts] == [(0, 7, "interrupted"), (7, 30, None)]


def test_a_second_ctrl_c_aborts_at_once_keeping_the_last_checkpoint(tmp_path, write_config, capsys, monkeypatch):
    """Two Ctrl-C in one step (during step 8): the second aborts there, saving nothing more,
    so the checkpoint of step 5 is what a resume starts from; the command exits 130."""
    real_step = trainer_module._step

    def step_with_two_ctrl_c(s, step):
        out = real_step(s, step)
        if step + 1 == 8:
            signal.getsignal(signal.SIGINT)(signal.SIGINT, None)
            signal.getsignal(signal.SIGINT)(signal.SIGINT, None)
        return out

    monkeypatch.setattr(trainer_module, "_step", step_with_two_ctrl_c)
    run_dir = tmp_path / "run"
    assert main(["train", str(write_config(tmp_path, steps=20, checkpoint_every=5)), "--out", str(run_dir), "--quiet"]) == 130
    assert capsys.readouterr().err.strip().splitlines() == ["windtunnel: interrupted"]
    assert read_resume_step(run_dir) == 5 and [r["step"] for r in read_metrics(run_dir)] == [5]
