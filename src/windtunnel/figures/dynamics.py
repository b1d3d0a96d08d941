"""Training dynamics: attention change, value-manifold state and error over snapshots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np

from windtunnel.figures import figure, save


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
