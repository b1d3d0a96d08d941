"""Training phases of one configuration's seeds: each seed's held-out error curve with its
plateau exit and frame formation marked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt

from windtunnel.figures import figure, save


@figure("training_phases")
def plot_training_phases(result: dict[str, Any], path: Path) -> None:
    """Every seed's held-out mae_bits against step (log-log), its exit (circle) and frame step (triangle)."""
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, run in enumerate(result["runs"]):
        color = colors[i % len(colors)]
        steps, errors = run["eval_steps"], run["eval_mae_bits"]
        ax.plot(steps, errors, color=color, lw=1.2, label=f"seed {run['seed']}")
        at = dict(zip(steps, errors))
        if run["exit_step"] is not None:
            ax.plot(run["exit_step"], at[run["exit_step"]], "o", color=color, ms=7, mfc="none")
        if run["frame_step"] is not None and run["mae_bits_at_frame"] is not None:
            ax.plot(max(run["frame_step"], 1), run["mae_bits_at_frame"], "^", color=color, ms=6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("training step")
    ax.set_ylabel("held-out mae_bits")
    ax.set_title(f"{result['tunnel_label']}: {result['n_layers']} layers, d_model {result['d_model']}"
                 " (circle: plateau exit; triangle: frame formed)", fontsize=9)
    ax.legend(fontsize=7, loc="lower left")
    save(fig, path)
