"""Fig 6, 8, 9, 10, 11: per-position error across horizons, relabeling, late attention, models, seeds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np

from windtunnel.figures import figure, save


def _positions(curve: list[float]) -> np.ndarray:
    return np.arange(1, len(curve) + 1)


def _log_floor(values: list[float]) -> np.ndarray:
    """Per-position errors for a log axis: exact zeros (the first position, where every
    model is exact by symmetry) would vanish, so they are floored at 1e-6 bits."""
    return np.maximum(np.asarray(values, dtype=float), 1e-6)


@figure("length_generalization")
def plot_length_generalization(result: dict[str, Any], path: Path) -> None:
    """Fig 6: per-position |entropy error| and KL at each horizon, training horizon marked."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for (horizon, row), color in zip(result["horizons"].items(), plt.cm.viridis(np.linspace(0, 0.85, len(result["horizons"])))):
        for ax, curve in zip(axes, ("abs_error_bits", "kl_bits")):
            values = row["curves"][curve]
            ax.plot(_positions(values), _log_floor(values), color=color, lw=1.2, label=f"horizon {horizon} (mae {row['mae_bits']['mean']:.3g})")
    for ax, label in zip(axes, ("|H_model − H_Bayes| (bits)", "KL(Bayes ‖ model) (bits)")):
        ax.axvline(result["training_horizon"], color="#c44e52", ls="--", lw=0.9, label="training horizon")
        ax.set_yscale("log")
        ax.set_xlabel("position t")
        ax.set_ylabel(label)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"Length generalization: {result['model']} ({result['n_runs']} run(s))", fontsize=9)
    save(fig, path)


@figure("relabeling")
def plot_relabeling(result: dict[str, Any], path: Path) -> None:
    """Fig 8: per-sequence MAE before vs after relabeling the hidden states, on the diagonal."""
    before, after = np.asarray(result["scatter"]["before"]), np.asarray(result["scatter"]["after"])
    fig, ax = plt.subplots(figsize=(4.2, 4))
    ax.scatter(before, after, s=4, alpha=0.4, color="#4c72b0", edgecolors="none")
    top = float(max(before.max(), after.max())) * 1.05
    ax.plot([0, top], [0, top], color="grey", lw=0.8, ls="--")
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel("per-sequence mae_bits, original labels")
    ax.set_ylabel("after a random state permutation")
    delta = result["per_run"][0]
    ax.set_title(
        f"Relabeling: ΔMAE {delta['delta_mae_bits']:+.2g} bits "
        f"[{delta['delta_mae_bits_ci'][0]:+.2g}, {delta['delta_mae_bits_ci'][1]:+.2g}]",
        fontsize=9,
    )
    save(fig, path)


def _per_horizon_axes(n: int) -> tuple[plt.Figure, np.ndarray]:
    fig, axes = plt.subplots(1, n, figsize=(3.3 * n + 0.6, 3.2), squeeze=False, sharey=True)
    return fig, axes[0]


@figure("model_comparison")
def plot_model_comparison(result: dict[str, Any], path: Path) -> None:
    """Fig 10 (and Table 1's curves): per-position |entropy error| of every model per horizon."""
    fig, axes = _per_horizon_axes(len(result["horizons"]))
    colors = plt.cm.tab10(np.arange(len(result["models"])))
    for ax, horizon in zip(axes, result["horizons"]):
        for (name, model), color in zip(result["models"].items(), colors):
            row = model["horizons"][str(horizon)]
            values = row["curves"]["abs_error_bits"]
            ax.plot(_positions(values), _log_floor(values), color=color, lw=1.2, label=f"{name} ({row['mae_bits']['mean']:.3g})")
        ax.axvline(result["training_horizon"], color="grey", ls="--", lw=0.8)
        ax.set_yscale("log")
        ax.set_title(f"horizon {horizon}", fontsize=9)
        ax.set_xlabel("position t")
    axes[0].set_ylabel("|H_model − H_Bayes| (bits)")
    axes[-1].legend(fontsize=6.5, loc="lower right")
    save(fig, path)


@figure("late_attention")
def plot_late_attention(result: dict[str, Any], path: Path) -> None:
    """Fig 9: the full transformer against the variant without late attention, per horizon."""
    fig, axes = _per_horizon_axes(len(result["horizons"]))
    for ax, (horizon, row) in zip(axes, result["horizons"].items()):
        for key, color, label in (("full", "#4c72b0", "full"), ("variant", "#dd8452", f"no attention in {result['no_attention_layers']}")):
            values = row[key]["curves"]["abs_error_bits"]
            ax.plot(_positions(values), _log_floor(values), color=color, lw=1.2, label=label)
        ax.axvline(result["training_horizon"], color="grey", ls="--", lw=0.8)
        ax.set_yscale("log")
        ax.set_title(f"horizon {horizon}: {row['mae_factor']:.2g}x worse", fontsize=9)
        ax.set_xlabel("position t")
    axes[0].set_ylabel("|H_model − H_Bayes| (bits)")
    axes[0].legend(fontsize=7)
    save(fig, path)


@figure("seeds")
def plot_seeds(result: dict[str, Any], path: Path) -> None:
    """Fig 11: per-position error of each seed overlaid (and the MLP control's), per horizon."""
    fig, axes = _per_horizon_axes(len(result["horizons"]))
    for ax, (horizon, row) in zip(axes, result["horizons"].items()):
        for entry, color in zip(row["per_seed"], plt.cm.viridis(np.linspace(0, 0.85, len(row["per_seed"])))):
            values = entry["abs_error_bits"]
            ax.plot(_positions(values), _log_floor(values), color=color, lw=1.0, label=f"seed {entry['seed']}")
        if "mlp" in row:
            values = row["mlp"]["abs_error_bits"]
            ax.plot(_positions(values), _log_floor(values), color="#c44e52", ls="--", lw=1.0, label="MLP control")
        ax.axvline(result["training_horizon"], color="grey", ls="--", lw=0.8)
        ax.set_yscale("log")
        ax.set_title(f"horizon {horizon}: seed spread {row['spread_bits']:.2g} bits", fontsize=9)
        ax.set_xlabel("position t")
    axes[0].set_ylabel("|H_model − H_Bayes| (bits)")
    axes[-1].legend(fontsize=7)
    fig.suptitle(result["model"], fontsize=9)
    save(fig, path)
