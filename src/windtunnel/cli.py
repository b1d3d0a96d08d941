"""The ``windtunnel`` command: a thin layer that parses, validates, calls the library, prints.

    windtunnel sample bijection --n 2 --seed 0 --set V=8 --set with_replacement=true
    windtunnel sample hmm --n 1 --format table
    windtunnel export runs/hmm --to transformer-lens exports/hmm

Bad input (unknown tunnel or key, wrong type, value out of range) prints one line on
stderr and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from windtunnel import __version__
from windtunnel.analysis.runner import ANALYSES, analyze
from windtunnel.exit_codes import EXIT_INTERRUPTED
from windtunnel.config import ConfigError
from windtunnel.export import FORMATS, export_run
from windtunnel.files import DirectoryInUse, directory_lock
from windtunnel.jobs import JobFailed, TrainJob, run_jobs
from windtunnel.memory import check_fits
from windtunnel.models import build_model, count_params, model_class, params_by_part
from windtunnel.ray_engine import ENGINES, RayEngine, check_engine
from windtunnel.report.build import build_report
from windtunnel.report.folder import ReportError
from windtunnel.reproduce import reproduce
from windtunnel.run_config import MAX_SEED, load_run_config
from windtunnel.runs import evaluate_run, format_table, prepare_new_run, prepare_resume
from windtunnel.training.checkpoint import CheckpointError, read_resume_step
from windtunnel.training.tracking import check_installed
from windtunnel.training.trainer import TrainingDiverged, TrainingInterrupted, train
from windtunnel.tunnels import TUNNELS, make_tunnel

EXIT_BAD_INPUT = 2
EXIT_DIVERGED = 3


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
    sample.set_defaults(run=_cmd_sample)

    info = commands.add_parser(
        "info",
        help="parameter counts of a run config's model",
        description="Build the model CONFIG describes (for its tunnel) and print its parameter counts, in total and "
        "by part, and for a capacity-matched control its target and mismatch: a table, or one JSON object with --json.",
    )
    info.add_argument("config", metavar="CONFIG", help="a run config (.toml), e.g. configs/paper/hmm_mlp.toml")
    info.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    _add_overrides(info, "override a config value, e.g. model.d_model=128 (repeatable)")
    info.set_defaults(run=_cmd_info)

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
    train.set_defaults(run=_cmd_train)

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
    evaluate.set_defaults(run=_cmd_eval)

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
        help="claims (default: the paper's claims) or architectures (transformer, Mamba, LSTM and MLP on every "
        "inference primitive; scales tiny and cpu)",
    )
    reproduce.add_argument("--out", default="reproduction", metavar="DIR", help="output directory (default ./reproduction)")
    reproduce.add_argument("--resume", action="store_true", help="continue the reproduction in DIR, reusing what is done")
    reproduce.add_argument("--jobs", type=_positive_int, help="runs trained side by side (default: 2 on CPU scales, 1 for paper)")
    reproduce.add_argument(
        "--nproc-per-run", type=_positive_int, default=1, metavar="N", help="train each run with DDP over N processes (one per GPU)"
    )
    reproduce.add_argument(
        "--only-runs", nargs="+", default=[], metavar="RUN",
        help="train only these runs of the plan (e.g. bijection_transformer_seed0), keep what DIR already holds, "
        "and analyze every group over the runs present: one slice of a reproduction filled over several sessions",
    )
    reproduce.add_argument(
        "--time-limit", type=_non_negative_float, default=0.0, metavar="SECONDS",
        help="a wall-clock budget for each run trained now: a run that reaches it ends there, and the report says so",
    )
    _add_engine(reproduce, "DIR")
    _add_overrides(reproduce, "override a config value of every run, e.g. train.steps=500 (repeatable; for trials: the runs "
                   "then differ from the scale's)")
    reproduce.set_defaults(run=_cmd_reproduce)

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
    report.set_defaults(run=_cmd_report)

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
    _add_engine(sweep, "DIR")
    _add_overrides(sweep, "override a config value for every seed, e.g. train.steps=500 (repeatable)")
    sweep.set_defaults(run=_cmd_sweep)

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
    analyze.set_defaults(run=_cmd_analyze)

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
    export.set_defaults(run=_cmd_export)
    return parser


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


#: ``sample`` draws and prints this many sequences at a time, so memory stays bounded for any
#: --n (so ``--n 1000`` begins with the sequences of ``--n 256``).
SAMPLE_CHUNK = 256


def _cmd_sample(args: argparse.Namespace) -> None:
    tunnel = make_tunnel(args.tunnel, overrides=args.overrides)
    chunk = min(args.n, SAMPLE_CHUNK)
    check_fits(f"sampling {chunk} sequence(s) of {tunnel}", tunnel.sample_bytes(chunk), "lower the tunnel's sizes")
    generator = torch.Generator().manual_seed(args.seed)
    for start in range(0, args.n, SAMPLE_CHUNK):
        episode = tunnel.sample(min(SAMPLE_CHUNK, args.n - start), generator=generator)
        for i in range(episode.batch_size):
            record = episode.record(i)
            print(json.dumps(record) if args.format == "json" else _table(tunnel, record, start + i))
        sys.stdout.flush()


def _cmd_info(args: argparse.Namespace) -> None:
    config = load_run_config(args.config, args.overrides)
    tunnel = config.tunnel
    shape = dict(vocab_size=tunnel.vocab_size, num_classes=tunnel.num_classes, max_len=config.max_len)
    with torch.device("meta"):  # counts need shapes, not memory
        model = build_model(config.model_kind, config.model, **shape)
        # the family's own lines (the MLP control's sizing builds a transformer to count it)
        family_info = model_class(config.model_kind).sizing_info(config.model, **shape)
    result: dict[str, Any] = {"config": args.config, "kind": config.model_kind, **shape}
    result["params"] = count_params(model)
    result["params_by_part"] = params_by_part(model)
    result.update(family_info)
    print(json.dumps(result) if args.json else _info_table(result))


def _info_table(result: dict[str, Any]) -> str:
    rows = [("config", result["config"]), ("model", result["kind"]),
            ("vocab_size / classes / max_len", f"{result['vocab_size']} / {result['num_classes']} / {result['max_len']}")]
    # the family's own sizes (the MLP's n_blocks x d_hidden, the LSTM's n_layers x d_hidden, ...)
    common = {"config", "kind", "vocab_size", "num_classes", "max_len", "params", "params_by_part", "target_params", "mismatch"}
    sizes = [key for key in result if key not in common]
    if sizes:
        rows.append((" x ".join(sizes), " x ".join(str(result[key]) for key in sizes)))
    rows.append(("parameters", f"{result['params']:,}"))
    rows += [(f"  {part}", f"{count:,}") for part, count in result["params_by_part"].items()]
    if "target_params" in result:
        rows.append(("matched to (transformer)", f"{result['target_params']:,}"))
        rows.append(("mismatch", f"{result['mismatch']:+.4%}"))
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


@contextmanager
def _one_writer(directory: Path, *, create: bool = False) -> Iterator[None]:
    """Hold ``directory``'s writer lock for the command (see :mod:`windtunnel.files`).

    Only rank 0 of a ``torchrun`` launch takes it (the other ranks write nothing). A
    directory that does not exist is left to the command's own checks, or with ``create``
    made for the lock (with its missing parents), and removed again if the command fails
    before writing into it.
    """
    if int(os.environ.get("RANK", "0")) != 0 or (not directory.is_dir() and not create):
        yield
        return
    made = [d for d in (directory, *directory.parents) if not d.exists()]  # innermost first
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"cannot create {str(directory)!r}: {_why_not(directory, error)}") from None
    try:
        with directory_lock(directory):
            yield
    except DirectoryInUse:
        raise  # the holder made or owns it: nothing here is ours to remove
    except BaseException:
        for folder in made:
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        raise


def _why_not(directory: Path, error: OSError) -> str:
    """Why ``directory`` cannot be made, in words: a file in the way, or the system's reason."""
    blocker = next((p for p in (directory, *directory.parents) if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        return f"{str(blocker)!r} is a file"
    return error.strerror or str(error)


def _cmd_train(args: argparse.Namespace) -> None:
    if args.force and not args.resume:
        raise ConfigError("--force applies to --resume (it accepts --set values that change a run's config)")
    if args.resume:
        if args.config or args.out:
            raise ConfigError("--resume RUN_DIR continues an existing run: give no CONFIG and no --out")
        run_dir, resume = Path(args.resume), True
        with _one_writer(run_dir):
            config = prepare_resume(run_dir, args.overrides, force=args.force)
            if read_resume_step(run_dir) is None:
                print(f"windtunnel: {str(run_dir)!r} saved no checkpoint before it stopped: training it from step 0",
                      file=sys.stderr)
            result = train(config, run_dir, resume=resume, progress=not args.quiet)
    else:
        if not args.config or not args.out:
            raise ConfigError("train needs CONFIG and --out RUN_DIR (or --resume RUN_DIR)")
        config = load_run_config(args.config, args.overrides)
        check_installed(config.train.log_to)
        run_dir, resume = Path(args.out), False
        prepare_new_run(run_dir)  # refuse before anything is created
        with _one_writer(run_dir, create=True):
            prepare_new_run(run_dir)  # again, holding the lock: another command may have started here meanwhile
            result = train(config, run_dir, resume=resume, progress=not args.quiet)
    summary = {"run_dir": str(result.run_dir), "steps": result.steps, "wall_s": round(result.wall_s, 1), **(result.final_eval or {})}
    print(json.dumps(summary))


def _cmd_eval(args: argparse.Namespace) -> None:
    with _one_writer(Path(args.run_dir)):
        result = evaluate_run(Path(args.run_dir), horizons=args.horizons, n=args.n, step=args.step, relabel=args.relabel)
    print(format_table(result))


def _cmd_reproduce(args: argparse.Namespace) -> None:
    check_engine(args.engine, args.address)
    with _one_writer(Path(args.out), create=True):
        index = reproduce(
            args.scale, Path(args.out), only=args.only, resume=args.resume, parallel=args.jobs, nproc_per_run=args.nproc_per_run,
            engine=args.engine, address=args.address, only_runs=tuple(args.only_runs), time_limit_s=args.time_limit,
            overrides=tuple(args.overrides),
        )
    print(json.dumps({"report": str(index), "markdown": str(index.with_name("report.md"))}))


def _cmd_report(args: argparse.Namespace) -> None:
    out = Path(args.out)
    with _one_writer(out):
        try:
            index = build_report(out, Path(args.beside) if args.beside else None)
        except ReportError as error:  # not a finished reproduction: bad input, as for every command
            raise ConfigError(str(error)) from None
    print(json.dumps({"report": str(index), "markdown": str(index.with_name("report.md"))}))


def _cmd_sweep(args: argparse.Namespace) -> None:
    base = load_run_config(args.config, args.overrides)  # validate before starting anything
    check_installed(base.train.log_to)
    out = Path(args.out)
    jobs = []
    for seed in range(base.train.seed, base.train.seed + args.seeds):
        overrides = (*args.overrides, f"train.seed={seed}")
        jobs.append(TrainJob(f"seed_{seed}", Path(args.config), out / f"seed_{seed}", overrides))
    check_engine(args.engine, args.address)
    with _one_writer(out, create=True):
        if args.engine == "ray":
            with RayEngine(args.address) as engine:
                engine.run_jobs(jobs, parallel=args.jobs)
        else:
            run_jobs(jobs, parallel=args.jobs)
    print(json.dumps({"runs": [str(job.run_dir) for job in jobs], "analyze": f"windtunnel analyze {out}/seed_* --out {out}/analysis"}))


def _cmd_analyze(args: argparse.Namespace) -> None:
    run_dirs = [Path(d) for d in args.run_dirs]
    # It writes into --out, or into the one run's directory (RUN_DIR/analysis).
    with _one_writer(Path(args.out), create=True) if args.out else _one_writer(run_dirs[0]):
        written = analyze(run_dirs, only=args.only, out=Path(args.out) if args.out else None, device=args.device, say=_say("analyze"))
    print(json.dumps({name: str(path) for name, path in written.items()}))


def _cmd_export(args: argparse.Namespace) -> None:
    result = export_run(Path(args.run_dir), Path(args.out), to=args.to, step=args.step, overwrite=args.overwrite)
    print(json.dumps(result))


def _say(stage: str) -> Callable[[str], None]:
    """Progress lines on stderr (stdout carries the command's result)."""
    return lambda line: print(f"[{stage}] {line}", file=sys.stderr, flush=True)


def _table(tunnel: Any, record: dict[str, Any], index: int) -> str:
    """A human-readable view of one sequence record."""
    lines = [f"# sequence {index}: {tunnel}"]
    if "mapping" in record:
        lines.append("mapping pi: " + " ".join(f"{x}->{y}" for x, y in enumerate(record["mapping"])))
    if "T" in record:
        for label in ("T", "E"):
            lines.append(f"{label} (decoded from the header):")
            lines += ["  " + " ".join(f"{p:.2f}" for p in row) for row in record[label]]
    lines.append(f"tokens: {' '.join(map(str, record['tokens']))}")
    lines.append(f"{'step':>4} {'pos':>4} {'token':>5} {'target':>6} {'H_bits':>7}  posterior")
    for step, (pos, target, h, post) in enumerate(
        zip(record["positions"], record["targets"], record["entropy_bits"], record["posterior"])
    ):
        lines.append(f"{step + 1:>4} {pos:>4} {record['tokens'][pos]:>5} {target:>6} {h:>7.4f}  {_describe(post)}")
    return "\n".join(lines) + "\n"


def _describe(posterior: Sequence[float]) -> str:
    """Short form of a distribution: all of it when small, else its support."""
    if len(posterior) <= 8:
        return " ".join(f"{p:.3f}" for p in posterior)
    support = [c for c, p in enumerate(posterior) if p > 0]
    if len(support) == 1:
        return f"point mass on {support[0]}"
    return f"{len(support)} classes with p>0, max p={max(posterior):.3f}: {support}"


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:200]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        args.run(args)
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
