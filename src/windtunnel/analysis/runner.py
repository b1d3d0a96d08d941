"""``windtunnel analyze``: run analyses on trained runs, save ``<name>.json``, draw ``<name>.png``.

One run writes into ``RUN_DIR/analysis/``; several runs (seeds of one configuration, or
models compared on one tunnel) into ``--out DIR``. Without ``--only``, every analysis
that applies to the runs given is run (an MLP has no heads to ablate; a comparison needs
more than one model). The figure is drawn from the JSON just written, so a figure can
always be redrawn from saved results alone.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

from windtunnel.analysis import ANALYSES, Run, load_runs
from windtunnel.config import ConfigError
from windtunnel.figures import FIGURES
from windtunnel.files import atomic_write_text
from windtunnel.run_layout import ANALYSIS_DIR

__all__ = ["analyze", "analyze_runs"]


def analyze_runs(
    runs: Sequence[Run],
    folder: Path,
    *,
    only: Sequence[str] = (),
    skip_existing: bool = False,
    applicable: bool = False,
    say: Callable[[str], None] | None = None,
    starting: Callable[[str, int, int], None] | None = None,
) -> dict[str, Path]:
    """Run the analyses ``only`` names (default: all that apply) on loaded runs.

    Writes ``folder/<name>.json`` (the typed result, :meth:`~windtunnel.analysis.base.Analysis.run`) and ``folder/<name>.png``; with ``skip_existing`` an
    analysis whose JSON is already there is not recomputed. An analysis named in ``only``
    that does not apply to the runs is an error, unless ``applicable`` (then it is
    skipped). ``say`` receives one line per analysis written or skipped (and why) as it goes,
    so a failure part-way leaves a record of what was done; ``starting(name, i, n)`` is called
    before analysis ``i`` of the ``n`` named is computed. Returns ``{name: json path}``.
    """
    say = say or (lambda line: None)
    unknown = [name for name in only if name not in ANALYSES]
    if unknown:
        raise ConfigError(f"unknown analysis {unknown[0]!r}; choose from: {', '.join(ANALYSES)}")
    for name in () if applicable else only:
        reason = ANALYSES[name].applies_to(runs)
        if reason:
            raise ConfigError(f"analysis {name!r} does not apply to these runs: {reason}")
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    names = list(only or ANALYSES)
    for index, name in enumerate(names, 1):
        analysis = ANALYSES[name]
        reason = analysis.applies_to(runs)
        if reason:
            say(f"skipped {name}: {reason}")
            continue
        path = folder / f"{name}.json"
        if not (skip_existing and path.exists()):
            if starting is not None:
                starting(name, index, len(names))
            result = analysis.run(runs).to_json()
            atomic_write_text(path, json.dumps(result, indent=1))
            if "markdown" in result:  # a table (Table 1) also as Markdown, beside its JSON
                atomic_write_text(folder / f"{name}.md", result["markdown"])
        FIGURES[name](json.loads(path.read_text()), folder / f"{name}.png")
        written[name] = path
        say(f"wrote {name}: {path} and {path.with_suffix('.png').name}")
    return written


def analyze(
    run_dirs: Sequence[Path],
    *,
    only: Sequence[str] = (),
    out: Path | None = None,
    device: str = "auto",
    say: Callable[[str], None] | None = None,
) -> dict[str, Path]:
    """Load the runs in ``run_dirs`` on ``device`` (``auto``: CUDA when present) and analyze
    them (see :func:`analyze_runs`)."""
    if not run_dirs:
        raise ConfigError("analyze needs at least one RUN_DIR")
    if len(run_dirs) > 1 and out is None:
        raise ConfigError("several runs are analyzed together: give --out DIR for the results")
    runs = load_runs(run_dirs, device=device)
    if len({r.config.tunnel for r in runs}) > 1:
        raise ConfigError("the runs differ in tunnel: analyze runs of one tunnel together")
    folder = Path(out) if out is not None else Path(run_dirs[0]) / ANALYSIS_DIR
    return analyze_runs(runs, folder, only=only, say=say)
