"""Every bad input and fault a user can give the ``windtunnel`` command: one line, exit 2.

Table-driven: each case is the command line, the exit code, and a fragment of the one line
it must print on stderr. Every case also checks that nothing is printed on stdout, that no
traceback appears, and that the command changed nothing on disk: the files of the whole
test world (configs, trained runs, broken runs) have the same bytes and modes afterwards.

The command runs in-process (``windtunnel.cli.main``), so an uncaught exception fails the
case with its traceback and the 250-odd cases take under a minute rather than minutes of interpreter
start-ups. The few faults that need a real process (Ctrl-C) are in tests/training/test_run_safety.py.
"""

from __future__ import annotations

import json
import shutil
import stat
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from windtunnel.cli import main
from windtunnel.files import directory_lock
from windtunnel.run_layout import RESUME_FILE, WEIGHTS_INDEX
from windtunnel.runs import keep_final_weights
from windtunnel.training.checkpoint import list_snapshots, snapshot_path
from windtunnel.tunnels import TUNNELS
from scopes import once_per_module

pytestmark = pytest.mark.slow  # trains one tiny run for the world (a few seconds)

GOOD = """
[tunnel]
name = "bijection"
V = 6
[model]
kind = "transformer"
n_layers = 1
n_heads = 2
d_model = 16
d_mlp = 32
[train]
steps = 10
batch_size = 16
eval_every = 0
checkpoint_every = 5
log_every = 5
[eval]
n = 64
batch_size = 64
bootstrap = 20
"""

# name -> text of a config file in the world's configs/ (suffix from the name)
BROKEN_CONFIGS = {
    "not_toml.toml": "[tunnel\nname = ",
    "binary.toml": "\udcff",  # written as the byte 0xff: not UTF-8
    "empty.toml": "",
    "tunnel_not_table.toml": 'tunnel = 5\n[model]\nkind = "transformer"\n',
    "model_array.toml": '[tunnel]\nname = "bijection"\n[[model]]\nkind = "transformer"\n',
    "train_string.toml": '[tunnel]\nname = "bijection"\n[model]\nkind = "transformer"\ntrain = "fast"\n',
    "unknown_section.toml": GOOD + "\n[optimizer]\nname = 'adam'\n",
    "no_tunnel_name.toml": "[tunnel]\nV = 6\n[model]\nkind = 'transformer'\n",
    "tunnel_name_int.toml": "[tunnel]\nname = 5\n[model]\nkind = 'transformer'\n",
    "unknown_tunnel.toml": "[tunnel]\nname = 'maze'\n[model]\nkind = 'transformer'\n",
    "unknown_kind.toml": "[tunnel]\nname = 'bijection'\n[model]\nkind = 'rnn'\n",
    "unknown_train_key.toml": GOOD.replace("steps = 10", "steps = 10\nepochs = 3"),
    "steps_string.toml": GOOD.replace("steps = 10", "steps = 'many'"),
    "steps_zero.toml": GOOD.replace("steps = 10", "steps = 0"),
    "lr_nan.toml": GOOD.replace("steps = 10", "steps = 10\nlr = nan"),
    "lr_inf.toml": GOOD.replace("steps = 10", "steps = 10\nlr = inf"),
    "betas_short.toml": GOOD.replace("steps = 10", "steps = 10\nbetas = [0.9]"),
    "betas_scalar.toml": GOOD.replace("steps = 10", "steps = 10\nbetas = 0.9"),
    "seed_huge.toml": GOOD.replace("steps = 10", "steps = 10\nseed = 9223372036854775807\n"
                                   "seed_note = 1"),
    "curriculum_not_table.toml": GOOD.replace("steps = 10", "steps = 10\ncurriculum = 5"),
    "curriculum_param.toml": GOOD + "\n[train.curriculum]\nparam = 'nope'\nstart = 0.5\nsteps = 5\n",
    "horizons_zero.toml": GOOD.replace("bootstrap = 20", "bootstrap = 20\nhorizons = [0]"),
    "horizons_string.toml": GOOD.replace("bootstrap = 20", "bootstrap = 20\nhorizons = 'all'"),
    "heads_not_dividing.toml": GOOD.replace("n_heads = 2", "n_heads = 3"),
    "layers_zero.toml": GOOD.replace("n_layers = 1", "n_layers = 0"),
    "device_tpu.toml": GOOD.replace("steps = 10", "steps = 10\ndevice = 'tpu'"),
    "not_object.json": "[1, 2, 3]",
    "bad.json": "{",
    "section_list.json": json.dumps({"tunnel": [1], "model": {"kind": "transformer"}}),
}


@dataclass(frozen=True)
class Case:
    family: str
    argv: str  # split on spaces after the world's paths are filled in ({run}, {cfg}, ...)
    fragment: str
    code: int = 2

    def __str__(self) -> str:
        return f"{self.family}: {self.argv}"


def _sets(command: str, family: str, entries: list[tuple[str, str]]) -> list[Case]:
    return [Case(family, f"{command} --set {assignment}", fragment) for assignment, fragment in entries]


SAMPLE_SETS = [
    ("V=1", "V=1 is out of range"),
    ("V=abc", "V='abc' has the wrong type: expected int"),
    ("V=2.5", "V='2.5' has the wrong type: expected int"),
    ("V=99999999999999999999999", "out of range"),
    ("V=", "V='' has the wrong type"),
    ("V", "override 'V' is not of the form key=value"),
    ("=5", "override '=5' is not of the form key=value"),
    ("L=0", "L=0 is out of range"),
    ("with_replacement=maybe", "with_replacement='maybe' has the wrong type: expected bool"),
    ("query=2", "query='2' has the wrong type: expected bool"),
    ("repeat_rate=1.5", "repeat_rate=1.5 is out of range"),
    ("repeat_rate=nan", "repeat_rate=nan is out of range: need a finite number"),
    ("repeat_rate=-inf", "repeat_rate=-inf is out of range: need a finite number"),
    ("repeat_window=-1", "repeat_window=-1 is out of range"),
    ("nope=1", "unknown key 'nope' for BijectionTunnel"),
    ("K=5", "unknown key 'K' for BijectionTunnel"),
]
HMM_SETS = [
    ("S=0", "S=0 is out of range"),
    ("S=-1", "S=-1 is out of range"),
    ("M=0", "M=0 is out of range"),
    ("K=0", "K=0 is out of range"),
    ("K=-5", "K=-5 is out of range"),
    ("K=ten", "K='ten' has the wrong type: expected int"),
    ("K=10000000", "K=10000000 is out of range: at most 100,000 observations"),
    ("concentration=0", "concentration=0.0 is out of range"),
    ("concentration=-1", "concentration=-1.0 is out of range"),
    ("concentration=nan", "concentration=nan is out of range: need a finite number"),
    ("concentration=inf", "concentration=inf is out of range: need a finite number"),
    ("grid=0", "grid=0.0 is too coarse or not a divisor of 1"),
    ("grid=0.3", "grid=0.3 is too coarse or not a divisor of 1"),
    ("grid=nan", "grid=nan is out of range: need a finite number"),
    ("floor=1", "floor=1.0 is out of range"),
    ("floor=-0.1", "floor=-0.1 is out of range"),
    ("floor=nan", "floor=nan is out of range: need a finite number"),
    ("transition_concentration=0", "transition_concentration=0.0 is out of range"),
    ("transition_concentration=-2", "transition_concentration=-2.0 is out of range"),
    ("stickiness=1", "stickiness=1.0 is out of range: need a finite value in [0, 1)"),
    ("stickiness=-0.5", "stickiness=-0.5 is out of range"),
    ("initial=0.5", "initial"),
    ("initial=0.5,0.6,0,0,0", "initial"),
    ("initial=nan,1,0,0,0", "initial"),
    ("initial=a,b", "initial"),
    ("V=5", "unknown key 'V' for HMMTunnel"),
]

CASES: list[Case] = [
    # --- the command line itself (argparse) ------------------------------------------
    Case("usage", "", "the following arguments are required: COMMAND"),
    Case("usage", "frobnicate", "invalid choice: 'frobnicate'"),
    Case("usage", "--bogus", "the following arguments are required: COMMAND"),
    Case("usage", "sample", "the following arguments are required: TUNNEL"),
    Case("usage", "sample bijection --n 0", "argument --n: 0 is out of range: need an integer >= 1"),
    Case("usage", "sample bijection --n -3", "argument --n: -3 is out of range"),
    Case("usage", "sample bijection --n abc", "argument --n: 'abc' is not an integer"),
    Case("usage", "sample bijection --n 1.5", "argument --n: '1.5' is not an integer"),
    Case("usage", "sample bijection --seed abc", "argument --seed: 'abc' is not an integer"),
    Case("usage", "sample bijection --format xml", "argument --format: invalid choice: 'xml'"),
    Case("usage", "sample bijection --frob", "unrecognized arguments: --frob"),
    Case("usage", "info", "the following arguments are required: CONFIG"),
    Case("usage", "eval", "the following arguments are required: RUN_DIR"),
    Case("usage", "eval {run} --horizons 0", "argument --horizons: 0 is out of range"),
    Case("usage", "eval {run} --n x", "argument --n: 'x' is not an integer"),
    Case("usage", "eval {run} --step x", "argument --step: 'x' is not an integer"),
    Case("usage", "sweep {cfg} --out {tmp}/s", "the following arguments are required: --seeds"),
    Case("usage", "sweep {cfg} --seeds 0 --out {tmp}/s", "argument --seeds: 0 is out of range"),
    Case("usage", "sweep {cfg} --seeds 2 --out {tmp}/s --jobs 0", "argument --jobs: 0 is out of range"),
    Case("usage", "reproduce --jobs 0 --out {tmp}/r", "argument --jobs: 0 is out of range"),
    Case("usage", "reproduce --nproc-per-run 0 --out {tmp}/r", "argument --nproc-per-run: 0 is out of range"),
    Case("usage", "analyze", "the following arguments are required: RUN_DIR"),
    # --- sample: seeds, tunnels, parameters ------------------------------------------
    Case("sample", "sample nope", f"unknown tunnel 'nope'; choose one of: {', '.join(sorted(TUNNELS))}"),
    Case("sample", "sample BIJECTION", "unknown tunnel 'BIJECTION'"),
    Case("sample", "sample bijection --seed 99999999999999999999999", "--seed 99999999999999999999999 is out of range"),
    Case("sample", "sample bijection --seed -1", "--seed -1 is out of range"),
    Case("sample", "sample hmm --set initial=0.5,0.5", "initial"),
    *_sets("sample bijection", "sample", SAMPLE_SETS),
    *_sets("sample hmm", "sample", HMM_SETS),
    # --- memory: sizes that cannot fit are refused up front, with the estimate ---------
    Case("memory", "sample bijection --n 1 --set V=2000000", "sampling 1 sequence(s) of BijectionTunnel(V=2000000"),
    Case("memory", "sample bijection --n 100000 --set V=100000", "sampling 256 sequence(s) of BijectionTunnel(V=100000"),
    Case("memory", "sample hmm --n 1 --set S=100000 --set grid=0.000005", "needs at least"),
    Case("memory", "sample hmm --n 200 --set S=2000 --set M=2000 --set K=100000 --set grid=0.0005", "needs at least"),
    Case("memory", "train {cfg} --out {tmp}/m1 --set train.batch_size=1000000000", "a training step of batch 1000000000 needs at least"),
    Case("memory", "train {cfg} --out {tmp}/m2 --set tunnel.V=300000 --set train.batch_size=64", "a training step of batch 64 needs at least"),
    Case("memory", "train {cfg} --out {tmp}/m3 --set eval.n=10000000000", "a held-out set of 10000000000 sequences at horizon 5 needs at least"),
    Case("memory", "eval {run} --n 1000000000000", "a held-out set of 1000000000000 sequences at horizon 5 needs at least"),
    # --- config files: missing, unreadable, malformed ---------------------------------
    Case("config file", "info {tmp}/missing.toml", "config file '{tmp}/missing.toml' does not exist"),
    Case("config file", "info {tmp}", "is a directory, not a config file"),
    Case("config file", "info /dev/null/x.toml", "does not exist"),
    *[Case("config file", f"info {{configs}}/{name}", fragment) for name, fragment in [
        ("not_toml.toml", "is not valid TOML"),
        ("binary.toml", "is not valid TOML"),
        ("empty.toml", "tunnel.name=None is missing or not a string"),
        ("tunnel_not_table.toml", "[tunnel] must be a table of keys"),
        ("model_array.toml", "[model] must be a table of keys"),
        ("train_string.toml", "unknown key 'model.train' for TransformerConfig"),
        ("unknown_section.toml", "unknown section 'optimizer'"),
        ("no_tunnel_name.toml", "tunnel.name=None is missing or not a string"),
        ("tunnel_name_int.toml", "tunnel.name=5 is missing or not a string"),
        ("unknown_tunnel.toml", "unknown tunnel 'maze'"),
        ("unknown_kind.toml", "model kind 'rnn' is unknown; choose one of"),
        ("unknown_train_key.toml", "unknown key 'train.epochs'"),
        ("steps_string.toml", "train.steps='many' has the wrong type"),
        ("steps_zero.toml", "steps=0 is out of range"),
        ("lr_nan.toml", "train.lr=nan is out of range: need a finite number"),
        ("lr_inf.toml", "train.lr=inf is out of range: need a finite number"),
        ("betas_short.toml", "betas=[0.9] is out of range"),
        ("betas_scalar.toml", "train.betas=0.9 has the wrong type"),
        ("seed_huge.toml", "unknown key 'train.seed_note'"),
        ("curriculum_not_table.toml", "train.curriculum=5 has the wrong type"),
        ("curriculum_param.toml", "curriculum"),
        ("horizons_zero.toml", "horizons=[0] is out of range"),
        ("horizons_string.toml", "eval.horizons='all' has the wrong type"),
        ("heads_not_dividing.toml", "n_heads"),
        ("layers_zero.toml", "n_layers=0 is out of range"),
        ("device_tpu.toml", "train.device='tpu' has the wrong type"),
        ("not_object.json", "a run config must be a table of sections"),
        ("bad.json", "is not valid JSON"),
        ("section_list.json", "[tunnel] must be a table of keys"),
    ]],
    # --- --set overrides of a run config ----------------------------------------------
    *_sets("info {cfg}", "override", [
        ("train.lr", "override 'train.lr' is not of the form key=value"),
        ("lr=1", "does not start with a section"),
        ("optimizer.lr=1", "does not start with a section"),
        ("train.lr=", "train.lr='' has the wrong type"),
        ("train.lr=abc", "train.lr='abc' has the wrong type"),
        ("train.lr=nan", "train.lr=nan is out of range: need a finite number"),
        ("train.lr=inf", "train.lr=inf is out of range: need a finite number"),
        ("train.lr=-1", "lr=-1.0 is out of range"),
        ("train.lr=0", "lr=0.0 is out of range"),
        ("train.weight_decay=nan", "weight_decay=nan is out of range"),
        ("train.grad_clip=nan", "grad_clip=nan is out of range"),
        ("train.grad_clip=-1", "grad_clip=-1.0 is out of range"),
        ("train.min_lr=1", "min_lr=1.0 is out of range"),
        ("train.warmup_steps=-1", "warmup_steps=-1 is out of range"),
        ("train.steps=1.5", "train.steps='1.5' has the wrong type: expected int"),
        ("train.steps=0", "steps=0 is out of range"),
        ("train.batch_size=0", "batch_size=0 is out of range"),
        ("train.seed=99999999999999999999999", "train.seed=99999999999999999999999 is out of range"),
        ("train.seed=-1", "error: train.seed=-1 is out of range"),
        ("train.betas=0.9", "train.betas=[0.9] is out of range: need two numbers"),
        ("train.betas=2,0", "betas=[2.0, 0.0] is out of range"),
        ("train.schedule=linear", "train.schedule='linear' has the wrong type"),
        ("train.target=medium", "train.target='medium' has the wrong type"),
        ("train.device=tpu", "train.device='tpu' has the wrong type"),
        ("train.compile=sometimes", "train.compile='sometimes' has the wrong type"),
        ("train.log_every=0", "log_every=0 is out of range"),
        ("train.eval_every=-1", "eval_every=-1 is out of range"),
        ("train.checkpoint_every=-1", "checkpoint_every=-1 is out of range"),
        ("train.snapshots_per_decade=-1", "snapshots_per_decade=-1 is out of range"),
        ("train.curriculum=5", "train.curriculum='5' has the wrong type"),
        ("train.curriculum.shape=zigzag", "shape='zigzag' is not a curriculum shape"),
        ("train.curriculum.start=nan", "train.curriculum.start=nan is out of range"),
        ("train.curriculum.steps=-1", "curriculum"),
        ("train.nope=1", "unknown key 'train.nope'"),
        ("eval.n=0", "n=0 is out of range"),
        ("eval.batch_size=0", "batch_size=0 is out of range"),
        ("eval.horizons=0", "horizons=[0] is out of range"),
        ("eval.horizons=a", "eval.horizons"),
        ("eval.bootstrap=-1", "bootstrap=-1 is out of range"),
        ("eval.seed=99999999999999999999999", "eval.seed=99999999999999999999999 is out of range"),
        ("model.kind=rnn", "model kind 'rnn' is unknown"),
        ("model.d_model=0", "d_model=0 is out of range"),
        ("model.n_heads=3", "n_heads"),
        ("model.n_layers=-1", "n_layers=-1 is out of range"),
        ("model.no_attention_layers=9", "no_attention_layers"),
        ("model.nope=1", "unknown key 'model.nope'"),
        ("tunnel.name=maze", "unknown tunnel 'maze'"),
        ("tunnel.V=1", "V=1 is out of range"),
        ("tunnel.V=abc", "tunnel.V='abc' has the wrong type"),
        ("tunnel.with_replacement=maybe", "tunnel.with_replacement='maybe' has the wrong type"),
        ("tunnel.K=5", "unknown key 'tunnel.K'"),
    ]),
    # --- train: new runs ----------------------------------------------------------------
    Case("train", "train", "train needs CONFIG and --out RUN_DIR"),
    Case("train", "train {cfg}", "train needs CONFIG and --out RUN_DIR"),
    Case("train", "train --out {tmp}/t", "train needs CONFIG and --out RUN_DIR"),
    Case("train", "train {tmp}/missing.toml --out {tmp}/t", "does not exist"),
    Case("train", "train {cfg} --out {run}", "is not empty"),
    Case("train", "train {cfg} --out {cfg}", "is a file"),
    Case("train", "train {cfg} --out {cfg}/run", "is a file"),
    Case("train", "train {cfg} --out {configs}/bad.json/run", "is a file"),
    Case("train", "train {cfg} --out /sys/windtunnel-run", "cannot create"),
    Case("train", "train {cfg} --out /proc/windtunnel-run", "cannot create"),
    Case("train", "train {cfg} --out {tmp}/t --set train.device=cuda", "CUDA"),
    Case("train", "train {cfg} --out {tmp}/t --force", "--force applies to --resume"),
    Case("train", "train {cfg} --out {tmp}/t --set train.steps=0", "steps=0 is out of range"),
    Case("train", "train {cfg} --out {locked}", "in use by another windtunnel command"),
    # --- train --resume ---------------------------------------------------------------------
    Case("resume", "train --resume {tmp}/nothing", "run directory '{tmp}/nothing' does not exist"),
    Case("resume", "train --resume {cfg}", "is not a run directory"),
    Case("resume", "train {cfg} --resume {run}", "give no CONFIG and no --out"),
    Case("resume", "train --resume {run} --out {tmp}/t", "give no CONFIG and no --out"),
    Case("resume", "train --resume {empty}", "is not a run directory: it has no config.json"),
    Case("resume", "train --resume {cfg_not_object}", "config.json"),
    Case("resume", "train --resume {cfg_bad_json}", "config.json"),
    Case("resume", "train --resume {cfg_bad_value}", "config.json"),
    Case("resume", "train --resume {ckpt_truncated}", "is truncated or corrupt"),
    Case("resume", "train --resume {ckpt_tampered}", "checksum"),
    Case("resume", "train --resume {ckpt_foreign}", "is not a windtunnel resume state"),
    Case("resume", "train --resume {metrics_corrupt}", "line 1 is not a metrics record"),
    Case("resume", "train --resume {run} --set train.lr=1e-2", "resuming with a changed config is refused"),
    Case("resume", "train --resume {run} --set train.lr=nan", "train.lr=nan is out of range"),
    Case("resume", "train --resume {run} --force --set model.d_model=32 --set model.d_mlp=64", "does not fit"),
    Case("resume", "train --resume {run} --force --set tunnel.V=8", "does not fit"),
    Case("resume", "train --resume {locked_run}", "in use by another windtunnel command"),
    # --- eval -----------------------------------------------------------------------------
    Case("eval", "eval {tmp}/nothing", "run directory '{tmp}/nothing' does not exist"),
    Case("eval", "eval {cfg}", "is not a run directory"),
    Case("eval", "eval {empty}", "has no config.json"),
    Case("eval", "eval {cfg_not_object}", "config.json"),
    Case("eval", "eval {cfg_bad_json}", "config.json"),
    Case("eval", "eval {cfg_bad_value}", "config.json"),
    Case("eval", "eval {untrained}", "holds no trained weights yet"),
    Case("eval", "eval {run} --step 7", "--step 7 is not a snapshot"),
    Case("eval", "eval {run} --step -1", "--step -1 is not a snapshot"),
    Case("eval", "eval {run} --relabel", "--relabel applies to tunnels with hidden states to relabel (hmm, model_selection), not 'bijection'"),
    Case("eval", "eval {snapshot_truncated}", "is truncated or corrupt"),
    Case("eval", "eval {snapshot_tampered}", "checksum"),
    Case("eval", "eval {snapshot_bad_meta}", "snapshot metadata"),
    Case("eval", "eval {locked_run}", "in use by another windtunnel command"),
    # --- analyze --------------------------------------------------------------------------
    Case("analyze", "analyze {tmp}/nothing", "does not exist"),
    Case("analyze", "analyze {cfg}", "is not a run directory"),
    Case("analyze", "analyze {empty}", "has no config.json"),
    Case("analyze", "analyze {run} --only nope", "unknown analysis 'nope'"),
    Case("analyze", "analyze {run} {run}", "--out"),
    Case("analyze", "analyze {run} --out {cfg}", "is a file"),
    Case("analyze", "analyze {run} --out {cfg}/a", "is a file"),
    Case("analyze", "analyze {run} --out /sys/windtunnel-analysis", "cannot create"),
    Case("analyze", "analyze {untrained}", "holds no trained weights yet"),
    Case("analyze", "analyze {cfg_not_object}", "config.json"),
    Case("analyze", "analyze {locked_run}", "in use by another windtunnel command"),
    # --- sweep ------------------------------------------------------------------------------
    Case("sweep", "sweep {tmp}/missing.toml --seeds 2 --out {tmp}/s", "does not exist"),
    Case("sweep", "sweep {cfg} --seeds 2 --out {cfg}", "is a file"),
    Case("sweep", "sweep {cfg} --seeds 2 --out {cfg}/s", "is a file"),
    Case("sweep", "sweep {cfg} --seeds 2 --out /sys/windtunnel-sweep", "cannot create"),
    Case("sweep", "sweep {cfg} --seeds 2 --out {tmp}/s --set train.lr=nan", "train.lr=nan is out of range"),
    Case("sweep", "sweep {configs}/lr_inf.toml --seeds 2 --out {tmp}/s", "train.lr=inf is out of range"),
    Case("sweep", "sweep {cfg} --seeds 2 --out {locked}", "in use by another windtunnel command"),
    # --- reproduce --------------------------------------------------------------------------
    Case("reproduce", "reproduce --scale huge --out {tmp}/r", "unknown --scale 'huge'; choose from: tiny, cpu, paper"),
    Case("reproduce", "reproduce --out {cfg}", "is a file"),
    Case("reproduce", "reproduce --out {cfg}/r", "is a file"),
    Case("reproduce", "reproduce --out /sys/windtunnel-reproduction", "cannot create"),
    Case("reproduce", "reproduce --scale tiny --out {run}", "is not empty"),
    Case("reproduce", "reproduce --scale tiny --out {locked}", "in use by another windtunnel command"),
    # --- info ---------------------------------------------------------------------------------
    Case("info", "info {run}/config.json --set train.lr=nan", "train.lr=nan is out of range"),
    Case("info", "info {cfg_not_object}/config.json", "must be a table of sections"),
    Case("info", "info /dev/null", "config file '/dev/null' is not a regular file"),
    Case("override", "info {cfg} --set eval.seed=-1", "error: eval.seed=-1 is out of range"),
    Case("override", "info {cfg} --set train.=5", "override 'train.=5' is not of the form key=value"),
    # --- export ---------------------------------------------------------------------------------
    Case("export", "export {run} --to transformer-lens {locked}", "in use by another windtunnel command"),
    # --- lm-score: the tunnels it has a text format for -------------------------------------------
    Case("lm-score", "lm-score markov --out {tmp}/lm", "unknown tunnel 'markov' for lm-score; choose one of: bijection, hmm"),
    # --- a damaged file in a finished run: named with what to do, before any work, by every reader --
    *[Case("damaged run", command.format(run=f"{{{damaged}}}"), fragment)
      for damaged, fragment in [
          ("metrics_mid_garbage", "line 2 is not a metrics record: 'garbage': delete that line or restore the file"),
          ("provenance_bad", "provenance.json' is damaged (line 1: Expecting property name enclosed in double quotes): "
                             "restore it from a copy, or delete it"),
          ("eval_bad", "eval.json' is damaged (not a JSON object): delete it and run `windtunnel eval`"),
          ("weights_index_bad", "model.safetensors.index.json' is damaged (line 1: Expecting value): restore the weights"),
      ]
      for command in ("eval {run}", "analyze {run} --only calibration training_dynamics",
                      "export {run} --to transformer-lens {{tmp}}/x", "train --resume {run}",
                      "train --resume {run} --force --set train.steps=60")],
    Case("damaged run", "sweep {cfg} --seeds 1 --out {sweep_damaged}", "line 2 is not a metrics record"),
]


@pytest.fixture(scope=once_per_module)
def world(tmp_path_factory) -> dict[str, str]:
    """A folder of configs and run directories, good and broken, that every case may read."""
    root = tmp_path_factory.mktemp("world")
    cfg = root / "good.toml"
    cfg.write_text(GOOD)
    configs = root / "configs"
    configs.mkdir()
    for name, text in BROKEN_CONFIGS.items():
        (configs / name).write_bytes(text.encode(errors="surrogateescape"))
    run = root / "run"
    assert main(["train", str(cfg), "--out", str(run), "--quiet"]) == 0
    paths = {"tmp": root / "scratch", "cfg": cfg, "configs": configs, "run": run}
    paths["tmp"].mkdir()

    def broken(name: str, damage) -> None:
        copy = root / name
        shutil.copytree(run, copy)
        damage(copy)
        paths[name] = copy

    def edit_config(key: str, value) -> callable:
        def damage(folder: Path) -> None:
            data = json.loads((folder / "config.json").read_text())
            data["train"][key] = value
            (folder / "config.json").write_text(json.dumps(data))
        return damage

    def flip_byte(path: Path) -> None:  # a byte of tensor data, past the safetensors header
        data = bytearray(path.read_bytes())
        data[-9] ^= 0x40
        path.write_bytes(bytes(data))

    final = list_snapshots(run)[-1]
    broken("cfg_not_object", lambda d: (d / "config.json").write_text("[1, 2]"))
    broken("cfg_bad_json", lambda d: (d / "config.json").write_text('{"tunnel": '))
    broken("cfg_bad_value", edit_config("lr", -1.0))
    broken("ckpt_truncated", lambda d: (d / RESUME_FILE).write_bytes((d / RESUME_FILE).read_bytes()[:100]))
    broken("ckpt_tampered", lambda d: flip_byte(d / RESUME_FILE))
    broken("ckpt_foreign", lambda d: shutil.copy(snapshot_path(d, final), d / RESUME_FILE))
    broken("metrics_corrupt", lambda d: (d / "metrics.jsonl").write_text("garbage\n" + (d / "metrics.jsonl").read_text()))
    broken("snapshot_truncated", lambda d: snapshot_path(d, final).write_bytes(b"\0" * 16))
    broken("snapshot_tampered", lambda d: flip_byte(snapshot_path(d, final)))
    broken("snapshot_bad_meta", lambda d: snapshot_path(d, final).with_suffix(".json").write_text("{"))
    broken("untrained", lambda d: (shutil.rmtree(d / "checkpoints"), (d / RESUME_FILE).unlink()))

    def garbage_line(folder: Path) -> None:  # neither the first line nor the last (a crash's)
        lines = (folder / "metrics.jsonl").read_text().splitlines(keepends=True)
        assert len(lines) >= 2
        (folder / "metrics.jsonl").write_text("".join([*lines[:1], "garbage\n", *lines[1:]]))

    broken("metrics_mid_garbage", garbage_line)
    broken("provenance_bad", lambda d: (d / "provenance.json").write_text("{garbage"))
    broken("eval_bad", lambda d: (d / "eval.json").write_text("[]"))
    broken("weights_index_bad", lambda d: (keep_final_weights(d), (d / "weights" / WEIGHTS_INDEX).write_text("")))
    sweep = root / "sweep_damaged"
    sweep.mkdir()
    shutil.copytree(paths["metrics_mid_garbage"], sweep / "seed_0")
    paths["sweep_damaged"] = sweep
    empty = root / "empty"
    empty.mkdir()
    paths["empty"] = empty
    for name, source in (("locked", None), ("locked_run", run)):
        folder = root / name
        shutil.copytree(source, folder) if source else folder.mkdir()
        with directory_lock(folder):  # its lock file exists before any case, as after one
            pass
        paths[name] = folder
    return {name: str(path) for name, path in paths.items()}


def _files(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file and folder under ``root`` with its bytes and mode (what a command must not change)."""
    tree = {}
    for path in sorted(root.rglob("*")):
        mode = stat.S_IMODE(path.lstat().st_mode)
        tree[str(path.relative_to(root))] = (path.read_bytes() if path.is_file() else b"<dir>", mode)
    return tree


@pytest.mark.parametrize("case", CASES, ids=str)
def test_bad_input_is_one_line_exit_2_and_changes_nothing(case, world, capsys):
    root = Path(world["tmp"]).parent
    argv = [part.format(**world) for part in case.argv.split()]
    before = _files(root)
    with directory_lock(Path(world["locked"])), directory_lock(Path(world["locked_run"])):
        try:
            code = main(argv)
        except SystemExit as exit_:  # argparse exits
            code = exit_.code
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == case.code, err
    assert len(lines) == 1 and "Traceback" not in err, err  # one line, no traceback, no usage dump
    assert case.fragment.format(**world) in lines[0]
    assert out == ""
    assert _files(root) == before


def test_the_suite_covers_every_family_with_enough_cases():
    families = Counter(case.family for case in CASES)
    assert len(CASES) >= 150 and len(set(map(str, CASES))) == len(CASES), "cases must be distinct"
    assert set(families) >= {"usage", "sample", "memory", "config file", "override", "train", "resume", "eval",
                              "analyze", "sweep", "reproduce"}


@pytest.mark.parametrize(("argv", "fragment"), [
    ("analyze {ro}", "cannot be written (Read-only file system): write the analyses elsewhere with --out DIR"),
    ("export {run} --to transformer-lens {ro}/export", "cannot be written (Read-only file system): give a folder you can write to"),
    ("eval {ro}", "cannot be written (Read-only file system)"),
])
def test_a_read_only_folder_is_refused_before_any_work_saying_what_to_do(argv, fragment, world, tmp_path, monkeypatch, capsys):
    """A read-only mount (simulated: the lock file's creation fails with EROFS there, as the
    kernel refuses it; a test cannot mount one) is named in one line before any work."""
    import errno
    import os

    from windtunnel import files

    ro = tmp_path / "ro"
    shutil.copytree(world["run"], ro, ignore=shutil.ignore_patterns(".lock"))
    real_open = os.open

    def read_only(path, flags, *args, **kwargs):
        if str(path).startswith(str(ro)) and flags & (os.O_CREAT | os.O_WRONLY | os.O_RDWR):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(files.os, "open", read_only)
    before = _files(tmp_path)
    code = main([part.format(ro=ro, **world) for part in argv.split()])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and fragment in lines[0], lines
    assert _files(tmp_path) == before


def test_an_empty_export_path_is_named_as_empty(world, capsys):
    before = _files(Path(world["tmp"]).parent)
    assert main(["export", world["run"], "--to", "transformer-lens", ""]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == ["windtunnel: error: OUT is empty: give the path of a new folder for the export"]
    assert _files(Path(world["tmp"]).parent) == before


def test_a_full_disk_names_the_file_it_could_not_write(world, tmp_path, monkeypatch, capsys):
    """The write fails as a full disk fails it (ENOSPC from write(), which names no file): the line
    names the file, and the run is as it was."""
    from windtunnel import files

    run = tmp_path / "run"
    shutil.copytree(world["run"], run)

    monkeypatch.setattr(files.os, "fdopen", lambda fd, mode: _Full(fd))
    before = _files(tmp_path)
    assert main(["eval", str(run)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"{str(run / 'eval.json')!r}: No space left on device" in lines[0], lines
    assert _files(tmp_path) == before


class _Full:
    """A file object whose writes fail as on a full disk."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        import os

        os.close(self.fd)

    def write(self, data: bytes) -> int:
        import errno
        import os

        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
