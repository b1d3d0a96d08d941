"""Fig 3 and 4: layer and head ablation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np

from windtunnel.figures import figure, save


@figure("layer_ablation")
def plot_layer_ablation(result: dict[str, Any], path: Path) -> None:
    """Fig 3: error ratio to the intact model when each layer is removed (log scale)."""
    layers = result["layers"]
    x = np.arange(len(layers))
    ratios = [row["mae_ratio"] for row in layers]
    spread = [row["mae_ratio_std"] for row in layers]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.bar(x, ratios, yerr=spread if result["runs"] > 1 else None, color="#4c72b0", capsize=3)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.axhline(10.0, color="#c44e52", lw=0.8, ls=":", label="10x (paper: every layer exceeds it)")
    ax.set_yscale("log")
    ax.set_xticks(x, [str(row["layer"]) for row in layers])
    ax.set_xlabel("layer removed (attention + FFN)")
    ax.set_ylabel("mae_bits / intact")
    intact = result["intact"]["mae_bits"]["mean"]
    ax.set_title(f"Layer ablation ({result['runs']} run(s); intact mae {intact:.4f} bits)", fontsize=9)
    ax.legend(fontsize=7, loc="upper right")
    save(fig, path)


@figure("head_ablation")
def plot_head_ablation(result: dict[str, Any], path: Path) -> None:
    """Fig 4: heat map layers x heads of the error ratio when one head is zeroed."""
    grid = np.array([[np.nan if v is None else v for v in row] for row in result["mae_ratio"]], dtype=float)
    fig, ax = plt.subplots(figsize=(max(3.2, 1.2 + 0.6 * grid.shape[1]), 1.4 + 0.45 * grid.shape[0]))
    image = ax.imshow(np.log10(grid), cmap="magma_r", aspect="auto")
    dark = 0.5 * np.nanmax(np.log10(grid))  # cells darker than this get white labels
    for (layer, head), value in np.ndenumerate(grid):
        if np.isfinite(value):
            color = "white" if np.log10(value) > dark else "black"
            ax.text(head, layer, f"{value:.1f}", ha="center", va="center", fontsize=7, color=color)
    ax.set_xticks(range(grid.shape[1]))
    ax.set_yticks(range(grid.shape[0]))
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    worst = result["most_destructive"]
    ax.set_title(f"Head ablation: mae ratio\n(worst L{worst['layer']}H{worst['head']})", fontsize=9)
    bar = fig.colorbar(image, ax=ax, label="log10 ratio")
    # Near-equal ratios (an untrained model) would get an offset label ("1e-5") above the
    # bar, on top of the title: plain tick labels instead.
    bar.formatter = matplotlib.ticker.FormatStrFormatter("%.2g")
    save(fig, path)
