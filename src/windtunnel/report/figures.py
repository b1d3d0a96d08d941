"""Figures drawn from saved analysis results (JSON), never from models.

Each ``plot_<analysis>(result, path)`` takes the dict an analysis returned (as read back
from its ``<name>.json``) and writes a PNG.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers and CI
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

__all__ = [
    "FIGURES",
    "figure",
    "save",
    "plot_calibration",
    "plot_head_ablation",
    "plot_key_orthogonality",
    "plot_late_attention",
    "plot_layer_ablation",
    "plot_length_generalization",
    "plot_linear_probes",
    "plot_model_comparison",
    "plot_qk_sharpening",
    "plot_relabeling",
    "plot_seeds",
    "plot_training_dynamics",
    "plot_value_manifold",
]

#: Figure function for each analysis name: ``plot(result, path)`` writes a PNG.
FIGURES: dict[str, Callable[[dict[str, Any], Path], None]] = {}


def figure(name: str) -> Callable:
    """Decorator: register ``plot(result, path)`` as the figure of analysis ``name``."""

    def decorate(plot: Callable[[dict[str, Any], Path], None]) -> Callable:
        FIGURES[name] = plot
        return plot

    return decorate


def save(fig: plt.Figure, path: Path) -> None:
    """Write ``fig`` as a PNG and free it."""
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)



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
    fig, ax = plt.subplots(figsize=(1.2 + 0.6 * grid.shape[1], 1.2 + 0.45 * grid.shape[0]))
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
    ax.set_title(f"Head ablation: mae ratio (worst L{worst['layer']}H{worst['head']})", fontsize=9)
    fig.colorbar(image, ax=ax, label="log10 ratio")
    save(fig, path)


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
    fig.savefig(path, dpi=120, bbox_inches="tight")  # tight_layout cannot handle nested grids
    plt.close(fig)


@figure("training_dynamics")
def plot_training_dynamics(result: dict[str, Any], path: Path) -> None:
    """Fig 16-17: attention JSD to the final model, PC1 geometry and mae over training (log steps)."""
    x = np.array(result["steps"]) + 1  # step 0 (initialization) shown at 1 on the log axis
    stable = result["stabilization_step"]
    has_attention = result["attention_jsd_bits"] is not None
    fig, axes = plt.subplots(3 if has_attention else 2, 1, figsize=(8.5, 8 if has_attention else 5.6), sharex=True)
    ax_jsd, ax_pc, ax_mae = axes if has_attention else (None, *axes)
    outside = {"fontsize": 7, "loc": "upper left", "bbox_to_anchor": (1.01, 1.0)}  # legends beside the data
    if has_attention:
        by_layer = np.array(result["attention_jsd_by_layer_bits"])  # [S, layers]
        for i, layer in enumerate(result["attention_layers"]):
            ax_jsd.plot(x, by_layer[:, i], lw=0.8, alpha=0.7, label=f"layer {layer}")
        ax_jsd.plot(x, result["attention_jsd_bits"], color="black", lw=2, marker="o", ms=3, label="mean")
        ax_jsd.axhline(result["jsd_threshold_bits"], color="grey", ls=":", lw=1,
                       label=f"threshold {result['jsd_threshold_bits']:g}")
        ax_jsd.legend(**outside)
        ax_jsd.set_ylabel("attention JSD to final (bits)")

    pc_variance = np.array([np.nan if v is None else v for v in result["pc1_variance_explained"]], dtype=float)
    pc_rho = np.array([np.nan if v is None else v for v in result["pc1_entropy_spearman_abs"]], dtype=float)
    ax_pc.plot(x, pc_variance, color="#55a868", marker="o", ms=3, label="PC1 variance fraction")
    ax_pc.plot(x, pc_rho, color="#8172b2", marker="s", ms=3, label="|Spearman ρ| (PC1, H_Bayes)")
    ax_pc.set_ylim(0, 1.02)
    ax_pc.set_ylabel(f"PC1 of {result['resid_name']}", fontsize=8)
    ax_pc.legend(**outside)

    for name, color in (("mae_bits", "#4c72b0"), ("mae_aggregate_bits", "#dd8452"), ("kl_bits", "#c44e52")):
        ax_mae.plot(x, result[name], color=color, marker="o", ms=3, label=name)
    errors = np.array([result[name] for name in ("mae_bits", "mae_aggregate_bits", "kl_bits")], dtype=float)
    if errors.min() > 0 and errors.max() / errors.min() > 10:  # a log axis only where it spans a decade
        ax_mae.set_yscale("log")
    ax_mae.set_ylabel("error (bits)")
    ax_mae.set_xscale("log")
    ax_mae.set_xlabel("training step + 1 (log)")
    ax_mae.legend(**outside)

    if stable is not None:
        for ax in axes:
            ax.axvline(stable + 1, color="grey", ls="--", lw=1)
        title = (
            f"Attention settles at step {stable} ({100 * result['stabilization_fraction']:.0f}% of training); "
            f"mae_bits there {result['mae_bits_at_stabilization']:.4f},\nat the end {result['mae_bits_final']:.4f} "
            f"({result['mae_ratio_stabilization_to_final']:.1f}x lower)"
        )
    elif not has_attention:
        title = f"Training dynamics of a model without attention; final mae_bits {result['mae_bits_final']:.4f}"
    else:
        title = f"Attention JSD never stays below {result['jsd_threshold_bits']:g} bits"
    axes[0].set_title(title, fontsize=9)
    save(fig, path)


# --- geometry: key orthogonality, QK sharpening, value manifold, linear probes (Fig 14-17) ---


def _head_grid(rows: list[list[float] | None], n_heads: int) -> np.ndarray:
    """``[layer][head]`` lists (None for layers without attention) -> a float array with NaN gaps."""
    return np.array([[np.nan] * n_heads if row is None else row for row in rows], dtype=float)


def _annotated_head_heat(ax: plt.Axes, grid: np.ndarray, title: str) -> matplotlib.image.AxesImage:
    image = ax.imshow(grid, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
    for (layer, head), value in np.ndenumerate(grid):
        if np.isfinite(value):
            ax.text(
                head,
                layer,
                f"{value:.2f}",
                ha="center",
                va="center",
                fontsize=7,
                color="black" if value > 0.6 else "white",
            )
    ax.set_xticks(range(grid.shape[1]))
    ax.set_yticks(range(grid.shape[0]))
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(title, fontsize=9)
    return image


@figure("key_orthogonality")
def plot_key_orthogonality(result: dict[str, Any], path: Path) -> None:
    """Fig 14: the frame head's key cosine matrices, and mean |off-diagonal cos| per layer and head (first run)."""
    frame = result["frame_heads"][0]
    labels = result["token_labels"]
    raw = result["heads_mean_abs_offdiag_cos"][0]
    n_heads = max(len(row) for row in raw if row is not None)
    fig, axes = plt.subplots(2, 2, figsize=(10.0, 8.6), layout="constrained")
    matrices = [
        ("raw keys", result["frame_head_cos"]),
        ("keys centered over tokens", result["frame_head_cos_centered"]),
    ]
    for ax, (what, matrix) in zip(axes[0], matrices):
        image = ax.imshow(np.array(matrix, dtype=float), cmap="RdBu_r", vmin=-1.0, vmax=1.0)
        ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=6)
        ax.set_yticks(range(len(labels)), labels, fontsize=6)
        ax.set_title(f"frame head L{frame['layer']}H{frame['head']}: cosines, {what}", fontsize=9)
        fig.colorbar(image, ax=ax, fraction=0.046)
    _annotated_head_heat(axes[1, 0], _head_grid(raw, n_heads), "mean |off-diag cos|, raw keys")
    reference = result["centered_orthonormal_reference"]
    heat = _annotated_head_heat(
        axes[1, 1],
        _head_grid(result["heads_mean_abs_offdiag_cos_centered"][0], n_heads),
        f"centered keys (orthonormal keys give {reference:.2f})",
    )
    fig.colorbar(heat, ax=axes[1].tolist(), fraction=0.046)
    anchor = result["anchor"]
    fig.suptitle(
        f"Key orthogonality over {len(labels)} token values, first of {result['runs']} run(s)\n"
        f"paper: layer-0 mean |off-diag cos| < 0.1; here layer {frame['layer']} mean "
        f"{anchor['frame_layer_mean_abs_offdiag_cos']:.2f}, frame head "
        f"{anchor['frame_head_mean_abs_offdiag_cos']:.2f} (mean over runs)",
        fontsize=10,
    )
    fig.savefig(path, dpi=120)  # not save(): its tight_layout would undo the constrained layout
    plt.close(fig)


@figure("qk_sharpening")
def plot_qk_sharpening(result: dict[str, Any], path: Path) -> None:
    """Fig 15: attention mass by kind of key and attention entropy at the supervised positions, by layer."""
    rows = result["layers"]
    layers = [row["layer"] for row in rows]
    fig, (mass_ax, entropy_ax) = plt.subplots(1, 2, figsize=(10.5, 3.8))
    colors = plt.cm.tab10(np.arange(len(result["categories"])))
    for name, color in zip(result["categories"], colors):
        means = [row["mass"][name]["mean"] for row in rows]
        if max(means) == 0 and result["uniform_mass"][name] == 0:
            continue  # a kind of key these sequences never have (e.g. repeats without replacement)
        spread = [row["mass"][name]["std"] for row in rows] if result["runs"] > 1 else None
        label = f"{name} (uniform {result['uniform_mass'][name]:.2f})"
        mass_ax.errorbar(layers, means, yerr=spread, color=color, marker="o", lw=1.5, capsize=3, label=label)
        mass_ax.axhline(result["uniform_mass"][name], color=color, ls="--", lw=0.8)
    mass_ax.set_xticks(layers)
    mass_ax.set_xlabel("layer")
    mass_ax.set_ylabel("attention mass at supervised queries")
    mass_ax.set_ylim(0, 1)
    mass_ax.set_title("mass by kind of key (dashed: uniform attention)", fontsize=9)
    mass_ax.legend(fontsize=7)
    for row in rows:
        heads = row["heads"]["entropy_bits"]
        entropy_ax.scatter([row["layer"]] * len(heads), heads, s=14, color="#999999", zorder=2)
    spread = [row["entropy_bits"]["std"] for row in rows] if result["runs"] > 1 else None
    entropy_ax.errorbar(
        layers,
        [row["entropy_bits"]["mean"] for row in rows],
        yerr=spread,
        color="#4c72b0",
        marker="o",
        lw=1.5,
        capsize=3,
        label="mean over heads",
        zorder=3,
    )
    entropy_ax.axhline(result["uniform_entropy_bits"], color="grey", ls="--", lw=0.8, label="uniform attention")
    entropy_ax.scatter([], [], s=14, color="#999999", label="heads (first run)")
    entropy_ax.set_xticks(layers)
    entropy_ax.set_ylim(bottom=0)
    entropy_ax.set_xlabel("layer")
    entropy_ax.set_ylabel("attention entropy (bits)")
    entropy_ax.set_title("attention entropy at supervised queries", fontsize=9)
    entropy_ax.legend(fontsize=7)
    fig.suptitle(f"QK sharpening ({result['tunnel']}, {result['runs']} run(s))", fontsize=10)
    save(fig, path)


@figure("value_manifold")
def plot_value_manifold(result: dict[str, Any], path: Path) -> None:
    """Fig 16-17: PC1 vs PC2 of each representation at the supervised positions, colored by exact entropy."""
    spaces = result["spaces"]
    fig, axes = plt.subplots(
        1, len(spaces), figsize=(max(4.2 * len(spaces) + 1.2, 6.4), 4.6), squeeze=False, layout="constrained"
    )
    entropy_range = [
        min(min(s["scatter"]["entropy_bits"]) for s in spaces.values()),
        max(max(s["scatter"]["entropy_bits"]) for s in spaces.values()),
    ]
    for ax, (name, space) in zip(axes[0], spaces.items()):
        scatter = space["scatter"]
        points = ax.scatter(
            scatter["pc1"],
            scatter["pc2"],
            c=scatter["entropy_bits"],
            cmap="viridis",
            s=4,
            alpha=0.7,
            vmin=entropy_range[0],
            vmax=entropy_range[1],
            rasterized=True,
        )
        ax.set_xlabel(f"PC1 ({space['pc1_variance']['mean']:.0%} of variance)")
        ax.set_ylabel(f"PC2 ({space['pc2_variance']['mean']:.0%})")
        ax.set_title(
            f"{name} ({space['activation']})\nSpearman(PC1, H) = {space['spearman_pc1_entropy']['mean']:.2f}",
            fontsize=9,
        )
    fig.colorbar(points, ax=axes[0].tolist(), label="exact posterior entropy (bits)")
    fig.suptitle(
        f"Value manifold, {result['runs']} run(s): {len(scatter['pc1'])} of {result['n_points']} points "
        "of the first run\npaper: PC1 > 80% of the variance, tracking the posterior entropy",
        fontsize=10,
    )
    fig.savefig(path, dpi=120)  # not save(): its tight_layout would undo the constrained layout
    plt.close(fig)


@figure("linear_probes")
def plot_linear_probes(result: dict[str, Any], path: Path) -> None:
    """Linear probes: held-out R² and KL of ridge probes of the exact posterior and its entropy, by depth."""
    rows = result["layers"]
    x = np.arange(len(rows))
    labels = [{"input": "in", "ln_final": "LN"}.get(row["name"], str(row["layer"])) for row in rows]
    fig, (r2_ax, kl_ax) = plt.subplots(1, 2, figsize=(10.5, 3.8))

    def line(ax: plt.Axes, key: str, label: str, color: str) -> None:
        spread = [row[key]["std"] for row in rows] if result["runs"] > 1 else None
        ax.errorbar(
            x,
            [row[key]["mean"] for row in rows],
            yerr=spread,
            marker="o",
            ms=4,
            lw=1.5,
            capsize=3,
            color=color,
            label=label,
        )

    line(r2_ax, "posterior_r2", "posterior (probabilities)", "#4c72b0")
    line(r2_ax, "log_posterior_r2", "posterior (centered log)", "#55a868")
    line(r2_ax, "entropy_r2", "entropy (bits)", "#c44e52")
    r2_ax.set_ylim(-0.05, 1.05)
    r2_ax.set_ylabel("held-out R²")
    r2_ax.set_title(f"R² ({result['n_test_sequences']} held-out sequences)", fontsize=9)
    line(kl_ax, "posterior_kl_bits", "probability probe (clipped)", "#4c72b0")
    line(kl_ax, "log_posterior_kl_bits", "log probe (softmax)", "#55a868")
    kl_ax.axhline(result["baseline"]["posterior_kl_bits"], color="grey", ls="--", lw=0.8, label="constant predictor")
    kl_ax.axhline(result["model_kl_bits"]["mean"], color="black", ls=":", lw=1.0, label="the model itself")
    kl_values = [row[key]["mean"] for row in rows for key in ("posterior_kl_bits", "log_posterior_kl_bits")]
    kl_values += [result["model_kl_bits"]["mean"], result["baseline"]["posterior_kl_bits"]]
    if min(kl_values) > 0 and max(kl_values) > 10 * min(kl_values):  # a log axis only when it spans a decade
        kl_ax.set_yscale("log")
    kl_ax.set_ylabel("KL(posterior || probe) (bits)")
    kl_ax.set_title("KL of the probe's distribution", fontsize=9)
    for ax in (r2_ax, kl_ax):
        ax.set_xticks(x, labels, fontsize=7 if len(rows) > 12 else 9)
        ax.set_xlabel("depth: embeddings (in), after block l, final LayerNorm (LN)")
        ax.legend(fontsize=7)
    fig.suptitle(f"Linear probes of the residual stream ({result['runs']} run(s))", fontsize=10)
    save(fig, path)
