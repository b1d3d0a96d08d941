"""What each ``windtunnel`` subcommand does once its arguments are parsed: one function per
subcommand (``cmd_<name>``), each calling the library and printing its result. The parser and
the mapping of errors to exit codes are in :mod:`windtunnel.cli`."""

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

from windtunnel.analysis.runner import analyze
from windtunnel.config import ConfigError, to_mapping
from windtunnel.export import check_out, export_run
from windtunnel.files import DirectoryInUse, directory_lock, portable_path
from windtunnel.jobs import GroupJob, TrainJob
from windtunnel.memory import check_fits
from windtunnel.models import build_model, count_params, model_class, params_by_part
from windtunnel.ray_engine import check_engine, open_engine
from windtunnel.report.build import build_report
from windtunnel.report.folder import ReportError
from windtunnel.reproduce import reproduce
from windtunnel.run_config import RunConfig, load_run_config
from windtunnel.run_files import check_run_files
from windtunnel.runs import evaluate_run, format_table, prepare_new_run, prepare_resume
from windtunnel.training.checkpoint import read_resume_step
from windtunnel.training.group import groups_by_default
from windtunnel.training.tracking import check_installed
from windtunnel.training.trainer import train
from windtunnel.tunnels import make_tunnel
from windtunnel.tunnels.capabilities import value_dim_of

#: ``sample`` draws and prints this many sequences at a time, so memory stays bounded for any
#: --n (so ``--n 1000`` begins with the sequences of ``--n 256``).
SAMPLE_CHUNK = 256


def cmd_sample(args: argparse.Namespace) -> None:
    tunnel = make_tunnel(args.tunnel, overrides=args.overrides)
    chunk = min(args.n, SAMPLE_CHUNK)
    check_fits(f"sampling {chunk} sequence(s) of {tunnel}", tunnel.sample_bytes(chunk), "lower the tunnel's sizes")
    generator = torch.Generator().manual_seed(args.seed)
    # Each line names the tunnel and its parameters: with the hypothesis the record shows, all
    # that the exact posterior depends on (docs/tunnels.md, "Checking a sample by hand").
    described = {"name": tunnel.name, "parameters": to_mapping(tunnel)}
    for start in range(0, args.n, SAMPLE_CHUNK):
        episode = tunnel.sample(min(SAMPLE_CHUNK, args.n - start), generator=generator)
        for i in range(episode.batch_size):
            record = {"tunnel": described, **episode.record(i)}
            print(json.dumps(record) if args.format == "json" else _table(tunnel, record, start + i))
        sys.stdout.flush()


def cmd_info(args: argparse.Namespace) -> None:
    config = load_run_config(args.config, args.overrides)
    tunnel = config.tunnel
    shape = dict(vocab_size=tunnel.vocab_size, num_classes=tunnel.num_classes, max_len=config.max_len)
    with torch.device("meta"):  # counts need shapes, not memory
        model = build_model(config.model_kind, config.model, **shape, value_dim=value_dim_of(tunnel))
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
def _one_writer(directory: Path, *, create: bool = False, elsewhere: str = "give a folder you can write to") -> Iterator[None]:
    """Hold ``directory``'s writer lock for the command (see :mod:`windtunnel.files`).

    Only rank 0 of a ``torchrun`` launch takes it (the other ranks write nothing). A
    directory that does not exist is left to the command's own checks, or with ``create``
    made for the lock (with its missing parents), and removed again if the command fails
    before writing into it. A directory that cannot be written (a read-only mount, no
    permission) is refused before any work, in one line that ends with ``elsewhere``.
    """
    if int(os.environ.get("RANK", "0")) != 0 or (not directory.is_dir() and not create):
        yield
        return
    made = [d for d in (directory, *directory.parents) if not d.exists()]  # innermost first
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"cannot create {str(directory)!r}: {_why_not(directory, error)}") from None
    locked = False
    try:
        with directory_lock(directory):
            locked = True
            yield
    except DirectoryInUse:
        raise  # the holder made or owns it: nothing here is ours to remove
    except BaseException as error:
        for folder in made:
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        if isinstance(error, OSError) and not locked:  # the lock file itself could not be made
            raise ConfigError(f"{str(directory)!r} cannot be written ({error.strerror or error}): {elsewhere}") from None
        raise


def _why_not(directory: Path, error: OSError) -> str:
    """Why ``directory`` cannot be made, in words: a file in the way, or the system's reason."""
    blocker = next((p for p in (directory, *directory.parents) if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        return f"{str(blocker)!r} is a file"
    return error.strerror or str(error)


def cmd_train(args: argparse.Namespace) -> None:
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


def cmd_eval(args: argparse.Namespace) -> None:
    with _one_writer(Path(args.run_dir)):
        result = evaluate_run(Path(args.run_dir), horizons=args.horizons, n=args.n, step=args.step, relabel=args.relabel)
    print(format_table(result))


def cmd_reproduce(args: argparse.Namespace) -> None:
    check_engine(args.engine, args.address)
    with _one_writer(Path(args.out), create=True):
        index = reproduce(
            args.scale, Path(args.out), only=args.only, resume=args.resume, parallel=args.jobs, nproc_per_run=args.nproc_per_run,
            engine=args.engine, address=args.address, only_runs=tuple(args.only_runs), time_limit_s=args.time_limit,
            overrides=tuple(args.overrides), group=args.group,
        )
    print(json.dumps({"report": str(index), "markdown": str(index.with_name("report.md"))}))


def cmd_report(args: argparse.Namespace) -> None:
    out = Path(args.out)
    with _one_writer(out):
        try:
            index = build_report(out, Path(args.beside) if args.beside else None)
        except ReportError as error:  # not a finished reproduction: bad input, as for every command
            raise ConfigError(str(error)) from None
    print(json.dumps({"report": str(index), "markdown": str(index.with_name("report.md"))}))


def cmd_sweep(args: argparse.Namespace) -> None:
    base = load_run_config(args.config, args.overrides)  # validate before starting anything
    check_installed(base.train.log_to)
    out = Path(args.out)
    jobs = []
    for seed in range(base.train.seed, base.train.seed + args.seeds):
        overrides = (*args.overrides, f"train.seed={seed}")
        jobs.append(TrainJob(f"seed_{seed}", Path(args.config), out / f"seed_{seed}", overrides))
    for job in jobs:  # a seed trained before is resumed: its files must be readable
        check_run_files(job.run_dir)
    runs = [str(job.run_dir) for job in jobs]
    if _groups_seeds(args.group, base, args.seeds):
        jobs = [GroupJob(f"seeds_{base.train.seed}-{base.train.seed + args.seeds - 1}", tuple(jobs))]
    check_engine(args.engine, args.address)  # before the folder is created: a bad request changes nothing
    with _one_writer(out, create=True), open_engine(args.engine, args.address) as engine:
        engine.run_jobs(jobs, parallel=args.jobs)
    print(json.dumps({"runs": runs, "analyze": f"windtunnel analyze {out}/seed_* --out {out}/analysis"}))


def _groups_seeds(asked: bool | None, config: RunConfig, seeds: int) -> bool:
    """Whether a sweep trains its seeds as one run group: as asked (``--group`` refused for a
    family that cannot stack), else where it pays (``groups_by_default``)."""
    family = model_class(config.model_kind)
    if asked and family.not_stackable:
        raise ConfigError(f"--group: runs of the {family.kind} family cannot train as one group ({family.not_stackable})")
    if asked is not None:
        return asked and seeds > 1
    return seeds > 1 and groups_by_default(config)


def cmd_analyze(args: argparse.Namespace) -> None:
    run_dirs = [Path(d) for d in args.run_dirs]
    # It writes into --out, or into the one run's directory (RUN_DIR/analysis).
    with _one_writer(Path(args.out), create=True) if args.out else _one_writer(
        run_dirs[0], elsewhere="write the analyses elsewhere with --out DIR"):
        written = analyze(run_dirs, only=args.only, out=Path(args.out) if args.out else None, device=args.device, say=_say("analyze"))
    print(json.dumps({name: str(path) for name, path in written.items()}))


def cmd_export(args: argparse.Namespace) -> None:
    if not args.out.strip():
        raise ConfigError("OUT is empty: give the path of a new folder for the export")
    out = Path(args.out)
    check_out(out, overwrite=args.overwrite)  # the refusals that need nothing made, first
    with _one_writer(out, create=True):  # one writer at a time, as for every folder a command writes
        result = export_run(Path(args.run_dir), out, to=args.to, step=args.step, overwrite=args.overwrite)
    print(json.dumps(result))


def cmd_lm_score(args: argparse.Namespace) -> None:
    import time

    from windtunnel.lm.geometry import decoder_layers, language_model_geometry
    from windtunnel.lm.load import default_model_path, load_language_model
    from windtunnel.lm.page import write_scoring
    from windtunnel.lm.score import describe_model, score_language_model
    from windtunnel.lm.text import FORMATS, check_tunnel, format_for
    from windtunnel.provenance import commit, cpu_model
    from windtunnel.runs import load_run_model

    if args.tunnel not in FORMATS:  # the tunnels it has a text format for, not every registered one
        raise ConfigError(f"unknown tunnel {args.tunnel!r} for lm-score; choose one of: {', '.join(sorted(FORMATS))}")
    started = time.perf_counter()
    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--out {str(out)!r} exists and is not an empty folder: give a new path")
    trained = None
    if args.beside:
        if args.overrides:
            raise ConfigError("--beside scores the run's own tunnel: give no --set")
        config, trained_model, step = load_run_model(Path(args.beside))
        tunnel = config.tunnel
        if tunnel.name != args.tunnel:
            raise ConfigError(f"--beside {args.beside!r} is a run on the {tunnel.name} tunnel, not {args.tunnel}")
        trained = (f"{portable_path(args.beside, Path.cwd())} (step {step})", trained_model)
    else:
        tunnel = make_tunnel(args.tunnel, overrides=args.overrides)
    check_tunnel(tunnel)
    path = Path(args.model) if args.model else default_model_path()
    say = _say("lm-score")  # only once the input is checked: a refusal is one line
    model, tokenizer = load_language_model(path, attention="eager" if args.geometry else "sdpa")
    text_format = format_for(tunnel, tokenizer)
    if args.geometry:
        decoder_layers(model)  # refuse an architecture the geometry cannot read before any forward pass
    torch.manual_seed(args.seed)
    result, episodes, rendered = score_language_model(
        model, text_format, tunnel, n=args.n, batch_size=args.batch_size, seed=args.seed,
        fresh_symbols=args.fresh_symbols, instruction=args.instruction, trained=trained, say=say)
    result["model"] = describe_model(model, path)
    if args.geometry:
        say("geometry")
        result["geometry"] = language_model_geometry(model, tunnel, episodes, rendered, n_sequences=args.geometry_n)
    result["how"] = {"command": _lm_command(args), "machine": cpu_model(), "commit": commit(),
                     "wall_s": round(time.perf_counter() - started, 1)}
    with _one_writer(out, create=True):
        written = write_scoring(out, result)
    rows = result["rows"]
    print(json.dumps({"written": [str(p) for p in written],
                      **{name: {"mae_bits": row["mae_bits"], "kl_bits": row["kl_bits"]} for name, row in rows.items()},
                      "leaked_mass": rows["language_model"]["leaked_mass"]}))


def _lm_command(args: argparse.Namespace) -> str:
    """The lm-score command as typed, from its parsed arguments (defaults left out)."""
    here = Path.cwd()  # paths as typed, or relative to where the command ran: never this machine's own
    words = ["windtunnel lm-score", args.tunnel, "--out", portable_path(args.out, here)]
    for flag, value, default in (("--model", args.model, None), ("--n", args.n, 128), ("--batch-size", args.batch_size, 8),
                                 ("--seed", args.seed, 0), ("--beside", args.beside, None), ("--geometry-n", args.geometry_n, 64)):
        if value != default:
            words += [flag, portable_path(value, here) if flag in ("--model", "--beside") else str(value)]
    words += [flag for flag, on in (("--fresh-symbols", args.fresh_symbols), ("--instruction", args.instruction),
                                    ("--geometry", args.geometry)) if on]
    return " ".join(words + [f"--set {o}" for o in args.overrides])


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
    if "system" in record:
        system = record["system"]
        lines.append(f"system {system['index']} of the bank's {len(record['bank']['r'])}: r = {system['r']:.4f}")
        lines += [f"  {label} = {system[label]}" for label in ("A", "c")]
    lines.append(f"tokens: {' '.join(map(str, record['tokens']))}")
    values = record.get("value_inputs")  # a tunnel whose observations are read as values: show them beside the token
    lines.append(f"{'step':>4} {'pos':>4} {'token':>5} {'value' if values else '':>9} {'target':>6} {'H_bits':>7}  posterior")
    for step, (pos, target, h, post) in enumerate(
        zip(record["positions"], record["targets"], record["entropy_bits"], record["posterior"])
    ):
        value = " ".join(f"{v:+.4f}" for v in values[pos]) if values else ""
        lines.append(f"{step + 1:>4} {pos:>4} {record['tokens'][pos]:>5} {value:>9} {target:>6} {h:>7.4f}  {_describe(post)}")
    return "\n".join(lines) + "\n"


def _describe(posterior: Sequence[float]) -> str:
    """Short form of a distribution: all of it when small, else its support."""
    if len(posterior) <= 8:
        return " ".join(f"{p:.3f}" for p in posterior)
    support = [c for c, p in enumerate(posterior) if p > 0]
    if len(support) == 1:
        return f"point mass on {support[0]}"
    return f"{len(support)} classes with p>0, max p={max(posterior):.3f}: {support}"
