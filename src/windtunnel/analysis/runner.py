"""``windtunnel analyze``: run analyses on trained runs, save ``<name>.json``, draw ``<name>.png``.

One run writes into ``RUN_DIR/analysis/``; several runs (seeds of one configuration)
into ``--out DIR``. The figure is drawn from the JSON just written, so a figure can
always be redrawn from saved results alone.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from windtunnel.analysis.ablation import head_ablation, layer_ablation
from windtunnel.config import ConfigError
from windtunnel.evaluation import EvalSet
from windtunnel.report.figures import FIGURES
from windtunnel.runs import load_run_model
from windtunnel.training.checkpoint import atomic_write_text

__all__ = ["ANALYSES", "analyze"]

#: Analyses by name: each takes (models, eval_set) and returns a JSON-able dict.
ANALYSES: dict[str, Callable[..., dict[str, Any]]] = {
    "layer_ablation": layer_ablation,
    "head_ablation": head_ablation,
}


def analyze(run_dirs: Sequence[Path], *, only: Sequence[str] = (), out: Path | None = None) -> dict[str, Path]:
    """Run the analyses ``only`` names (default: all) on the runs; returns ``{name: json path}``."""
    unknown = [name for name in only if name not in ANALYSES]
    if unknown:
        raise ConfigError(f"unknown analysis {unknown[0]!r}; choose from: {', '.join(ANALYSES)}")
    if not run_dirs:
        raise ConfigError("analyze needs at least one RUN_DIR")
    if len(run_dirs) > 1 and out is None:
        raise ConfigError("several runs are analyzed together: give --out DIR for the results")
    loaded = [load_run_model(Path(d)) for d in run_dirs]
    configs = [config for config, _, _ in loaded]
    if any((c.tunnel, c.model) != (configs[0].tunnel, configs[0].model) for c in configs):
        raise ConfigError("the runs differ in tunnel or model: analyze seeds of one configuration together")
    models = [model.eval() for _, model, _ in loaded]
    config = configs[0]
    eval_set = EvalSet.draw(
        config.tunnel, horizon=config.tunnel.horizon, n=config.eval.n, batch_size=config.eval.batch_size, seed=config.eval.seed
    )
    folder = Path(out) if out is not None else Path(run_dirs[0]) / "analysis"
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    for name in only or ANALYSES:
        if name == "head_ablation" and not models[0].attention_heads:
            continue  # an attention-free control has no heads to ablate
        result = {"runs_dirs": [str(d) for d in run_dirs], **ANALYSES[name](models, eval_set)}
        path = folder / f"{name}.json"
        atomic_write_text(path, json.dumps(result, indent=1))
        FIGURES[name](json.loads(path.read_text()), folder / f"{name}.png")
        written[name] = path
    return written
