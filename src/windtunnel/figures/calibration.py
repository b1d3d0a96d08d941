"""Fig 1, 2, 5, 7: model entropy against the exact posterior's, mean and per sequence."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np

from windtunnel.figures import figure, save


@figure("calibration")
def plot_calibration(result: dict[str, Any], path: Path) -> None:
    """Fig 1/5 and 2/7: mean entropy curves (left) and eight single-sequence traces (right)."""
    positions = np.array(result["positions"])
    fig = plt.figure(figsize=(13, 4.6))
    outer = fig.add_gridspec(1, 2, width_ratios=[1.0, 1.9], wspace=0.18)
    ax = fig.add_subplot(outer[0])
    ax.plot(positions, result["bayes_entropy_bits"], color="black", lw=2.2, label="exact Bayes (mean)")
    if result["closed_form_bits"] is not None:
        ax.plot(positions, result["closed_form_bits"], ls="none", marker="x", ms=5, color="#c44e52",
                label=r"$\log_2(V-k+1)$")
    if len(result["runs"]) > 1:
        for run in result["runs"]:
            ax.plot(positions, run["model_entropy_bits"], color="#dd8452", lw=0.8, alpha=0.4)
    model_label = "model (mean)" if len(result["runs"]) == 1 else f"model (mean of {len(result['runs'])} runs)"
    ax.plot(positions, result["model_entropy_bits"], color="#dd8452", lw=1.4, marker="o", ms=3, label=model_label)
    ax.set_xlabel("supervised position k")
    ax.set_ylabel("entropy (bits)")
    ax.set_ylim(0, 1.1 * max(max(result["bayes_entropy_bits"]), max(result["model_entropy_bits"])))
    ax.set_title(
        f"Mean over {result['n_sequences']} sequences: mae_aggregate {result['mae_aggregate_bits']:.4f},\n"
        f"mae {result['mae_bits']:.4f}, KL {result['kl_bits']:.4f} bits",
        fontsize=9,
    )
    ax.legend(fontsize=8, loc="lower left")

    sequences = result["traces"]["sequences"]
    peaks = [max(*s["bayes_entropy_bits"], *s["model_entropy_bits"]) for s in sequences]
    top = 1.08 * max(peaks, default=1.0)  # one y scale for all traces
    grid = outer[1].subgridspec(2, 4, hspace=0.45, wspace=0.12)
    for i, sequence in enumerate(sequences[:8]):
        cell = fig.add_subplot(grid[i // 4, i % 4])
        cell.plot(positions, sequence["bayes_entropy_bits"], color="black", lw=1.6)
        cell.plot(positions, sequence["model_entropy_bits"], color="#dd8452", lw=1.0, marker="o", ms=2.5)
        cell.set_ylim(0, top)
        cell.set_title(f"seq {sequence['index']}: mae {sequence['mae_bits']:.3f}", fontsize=8)
        cell.tick_params(labelsize=7)
        if i % 4:
            cell.set_yticklabels([])
        if i >= 4:
            cell.set_xlabel("position k", fontsize=8)
    fig.suptitle(
        f"Entropy calibration, {result['tunnel']} tunnel (black: exact Bayes, orange: model). "
        f"Right: {len(sequences)} single sequences of {result['traces']['run']}, "
        f"mean trace mae {result['trace_mae_bits']:.4f} bits",
        fontsize=10,
        y=1.03,
    )
    save(fig, path, tight=False)  # tight_layout cannot handle nested grids
