"""Fig 14-17 and probes: key orthogonality, QK sharpening, value manifold, linear probes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.image
import matplotlib.pyplot as plt
import numpy as np

from windtunnel.figures import figure, save


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


#: Colors of a trained number and of the same number at random initialization.
TRAINED_COLOR, INITIAL_COLOR = "#4c72b0", "#bbbbbb"


def _short_measure_name(name: str) -> str:
    return name.replace("_", " ")


def _key_measure_bars(ax: plt.Axes, name: str, measure: dict[str, Any], runs: int, legend: bool) -> None:
    """Mean over heads per layer, trained beside random init, the best head as a dot, the chance level dashed."""
    rows = measure["layers"]
    x = np.arange(len(rows))
    width = 0.38
    spread = [row["mean_over_heads"]["std"] for row in rows] if runs > 1 else None
    ax.bar(x - width / 2, [row["mean_over_heads"]["mean"] for row in rows], width, yerr=spread,
           color=TRAINED_COLOR, capsize=2, label="trained (mean over heads)")
    ax.scatter(x - width / 2, [row["best_head"]["mean"] for row in rows], color="black", s=10, zorder=3,
               label="best head (min)")
    if rows[0]["random_init_mean_over_heads"] is not None:
        ax.bar(x + width / 2, [row["random_init_mean_over_heads"]["mean"] for row in rows], width,
               color=INITIAL_COLOR, label="random init")
        ax.scatter(x + width / 2, [row["random_init_best_head"]["mean"] for row in rows], color="black", s=10,
                   marker="x", zorder=3)
    chance = measure["chance"]
    if "expected_abs_cos" in chance:
        ax.axhline(chance["expected_abs_cos"], color="#c44e52", ls="--", lw=1.0,
                   label=f"random directions, d={measure['d_head']}")
        ax.axhline(chance["welch_rms_bound"], color="#c44e52", ls=":", lw=1.0, label="Welch bound (RMS)")
        ax.set_ylim(0, 1)
    else:
        ax.axhline(chance["expected_signed_cos"], color="#c44e52", ls="--", lw=1.0)
        ax.set_ylim(-1, 1)
    ax.set_xticks(x, [str(row["layer"]) for row in rows])
    ax.set_xlabel("layer")
    ax.set_title(f"{_short_measure_name(name)}\n{measure['statistic']}, {measure['n_tokens']} tokens", fontsize=8)
    if legend:
        ax.legend(fontsize=6)


@figure("key_orthogonality")
def plot_key_orthogonality(result: dict[str, Any], path: Path) -> None:
    """Fig 14: the frame head's key cosine matrices, mean |off-diagonal cos| per layer and head (first run),
    and each definition of the measure per layer, trained beside random init, against chance."""
    frame = result["frame_heads"][0]
    labels = result["token_labels"]
    raw = result["heads_mean_abs_offdiag_cos"][0]
    n_heads = max(len(row) for row in raw if row is not None)
    measures = result.get("measures", {})
    fig = plt.figure(figsize=(max(10.0, 3.2 * len(measures)), 8.6 + (3.2 if measures else 0.0)), layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=[8.6, 3.2]) if measures else (fig, None)
    axes = top.subplots(2, 2)
    matrices = [
        ("raw keys", result["frame_head_cos"]),
        ("keys centered over tokens", result["frame_head_cos_centered"]),
    ]
    for ax, (what, matrix) in zip(axes[0], matrices):
        image = ax.imshow(np.array(matrix, dtype=float), cmap="RdBu_r", vmin=-1.0, vmax=1.0)
        ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=6)
        ax.set_yticks(range(len(labels)), labels, fontsize=6)
        ax.set_title(f"frame head L{frame['layer']}H{frame['head']}: cosines, {what}", fontsize=9)
        top.colorbar(image, ax=ax, fraction=0.046)
    _annotated_head_heat(axes[1, 0], _head_grid(raw, n_heads), "mean |off-diag cos|, raw keys")
    reference = result["centered_orthonormal_reference"]
    heat = _annotated_head_heat(
        axes[1, 1],
        _head_grid(result["heads_mean_abs_offdiag_cos_centered"][0], n_heads),
        f"centered keys (orthonormal keys give {reference:.2f})",
    )
    top.colorbar(heat, ax=axes[1].tolist(), fraction=0.046)
    if bottom is not None:
        bar_axes = np.atleast_1d(bottom.subplots(1, len(measures)))
        for i, (ax, (name, measure)) in enumerate(zip(bar_axes, measures.items())):
            _key_measure_bars(ax, name, measure, result["runs"], legend=i == 0)
        by_reason: dict[str, list[str]] = {}
        for name, why in result.get("measures_skipped", {}).items():
            by_reason.setdefault(why, []).append(name)
        skipped = "; ".join(f"{', '.join(names)} skipped: {why}" for why, names in by_reason.items())
        bottom.suptitle(
            "each definition per layer: trained vs random init (x: its best head), dashed: random directions"
            + (f"\n{skipped}" if skipped else ""),
            fontsize=8,
        )
    frame_layer = result["layers"][0]["mean_abs_offdiag_cos"]["mean"]
    fig.suptitle(
        f"Key orthogonality over {len(labels)} token values, first of {result['runs']} run(s)\n"
        f"in-context keys, layer {frame['layer']}: mean |off-diag cos| {frame_layer:.2f}, frame head "
        f"{result['frame_head_mean_abs_offdiag_cos']['mean']:.2f} (mean over runs)",
        fontsize=10,
    )
    save(fig, path, tight=False)  # constrained layout


def _qk_mass_and_entropy(fig: plt.Figure, result: dict[str, Any]) -> None:
    """Ours: mass by kind of key and attention entropy by layer (random init beside, where given)."""
    rows = result["layers"]
    layers = [row["layer"] for row in rows]
    mass_ax, entropy_ax = fig.subplots(1, 2)
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
        color=TRAINED_COLOR,
        marker="o",
        lw=1.5,
        capsize=3,
        label="mean over heads",
        zorder=3,
    )
    if rows[0].get("random_init") is not None:
        entropy_ax.plot(layers, [row["random_init"]["entropy_bits"]["mean"] for row in rows], color="#777777",
                        marker="x", ls=":", lw=1.2, label="random init (mean over heads)", zorder=3)
    entropy_ax.axhline(result["uniform_entropy_bits"], color="grey", ls="--", lw=0.8, label="uniform attention")
    entropy_ax.scatter([], [], s=14, color="#999999", label="heads (first run)")
    entropy_ax.set_xticks(layers)
    entropy_ax.set_ylim(bottom=0)
    entropy_ax.set_xlabel("layer")
    entropy_ax.set_ylabel("attention entropy (bits)")
    entropy_ax.set_title("attention entropy at supervised queries", fontsize=9)
    entropy_ax.legend(fontsize=7)


def _qk_cosine_heatmaps(fig: plt.Figure, authors: dict[str, Any]) -> None:
    """The authors' query-key cosine heat map, one panel per attention layer (first run)."""
    rows = authors["layers"]
    axes = np.atleast_1d(fig.subplots(1, len(rows)))
    for ax, row in zip(axes, rows):
        grid = np.array([[np.nan if v is None else v for v in line] for line in authors["heatmap"][row["layer"]]],
                        dtype=float)
        image = ax.imshow(grid, cmap="RdBu_r", vmin=-1.0, vmax=1.0)
        initial = row["random_init_mean_cos"]
        title = f"layer {row['layer']}: mean cos {row['mean_cos']['mean']:.2f}"
        ax.set_title(title + (f" (init {initial['mean']:.2f})" if initial is not None else ""), fontsize=8)
        ax.set_xlabel("key: earlier supervised position", fontsize=7)
        ax.set_ylabel("query: supervised position", fontsize=7)
        ax.tick_params(labelsize=6)
    fig.colorbar(image, ax=axes.tolist(), fraction=0.03, label="cos(q, k)")
    fig.suptitle("the authors' measure: cosine of each supervised query with the earlier supervised keys "
                 f"(mean over sequences and heads; {authors['note']})", fontsize=8)


@figure("qk_sharpening")
def plot_qk_sharpening(result: dict[str, Any], path: Path) -> None:
    """Fig 15: attention mass by kind of key and attention entropy at the supervised positions, by layer;
    below, the authors' query-key cosine heat maps."""
    authors = result.get("authors_query_key_cosine")
    fig = plt.figure(figsize=(10.5, 3.8 + (3.4 if authors else 0.0)), layout="constrained")
    if authors:
        top, bottom = fig.subfigures(2, 1, height_ratios=[3.8, 3.4])
        _qk_mass_and_entropy(top, result)
        _qk_cosine_heatmaps(bottom, authors)
    else:
        _qk_mass_and_entropy(fig, result)
    fig.suptitle(f"QK sharpening ({result['tunnel']}, {result['runs']} run(s))", fontsize=10)
    save(fig, path, tight=False)  # constrained layout


def _manifold_measure_bars(ax: plt.Axes, result: dict[str, Any]) -> None:
    """PC1 share and correlation of each definition, trained beside random init."""
    measures = result["measures"]
    x = np.arange(len(measures))
    width = 0.2
    bars = [
        ("PC1 share", lambda m: m["pc1_variance"], "#4c72b0"),
        ("|correlation|", lambda m: m["correlation"]["value"], "#55a868"),
    ]
    for i, (label, get, color) in enumerate(bars):
        ax.bar(x + (2 * i - 1.5) * width, [get(m)["mean"] for m in measures.values()], width, color=color,
               label=f"{label}, trained")
        if all(m["random_init"] is not None for m in measures.values()):
            ax.bar(x + (2 * i - 0.5) * width, [get(m["random_init"])["mean"] for m in measures.values()], width,
                   color=color, alpha=0.35, hatch="//", label=f"{label}, random init")
    ax.axhline(0.8, color="#c44e52", ls="--", lw=1.0, label="paper: PC1 > 80%")
    names = [
        f"{_short_measure_name(name)}\n(PC{m['correlation']['pc']}, {m['correlation']['statistic']})"
        for name, m in measures.items()
    ]
    ax.set_xticks(x, names, fontsize=6, rotation=15)
    ax.set_ylim(0, 1)
    ax.set_title("each definition: trained vs random init", fontsize=9)
    ax.legend(fontsize=6)


@figure("value_manifold")
def plot_value_manifold(result: dict[str, Any], path: Path) -> None:
    """Fig 16-17: PC1 vs PC2 of each representation at the supervised positions, colored by exact entropy;
    and the PC1 share and correlation under each definition, trained beside random init."""
    spaces = result["spaces"]
    with_measures = bool(result.get("measures"))
    n_panels = len(spaces) + int(with_measures)
    fig, axes = plt.subplots(
        1, n_panels, figsize=(max(4.2 * n_panels + 1.2, 6.4), 4.6), squeeze=False, layout="constrained"
    )
    scatter_axes = axes[0][: len(spaces)]
    entropy_range = [
        min(min(s["scatter"]["entropy_bits"]) for s in spaces.values()),
        max(max(s["scatter"]["entropy_bits"]) for s in spaces.values()),
    ]
    for ax, (name, space) in zip(scatter_axes, spaces.items()):
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
    fig.colorbar(points, ax=scatter_axes.tolist(), label="exact posterior entropy (bits)")
    if with_measures:
        _manifold_measure_bars(axes[0][-1], result)
    fig.suptitle(
        f"Value manifold, {result['runs']} run(s): {len(scatter['pc1'])} of {result['n_points']} points "
        "of the first run\npaper: PC1 > 80% of the variance, tracking the posterior entropy",
        fontsize=10,
    )
    save(fig, path, tight=False)  # constrained layout


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


@figure("class_posterior")
def plot_class_posterior(result: dict[str, Any], path: Path) -> None:
    """Class posterior: the read-out's error by position (with the share of informative
    sequences) and the probes' error by depth, each beside the uniform prior over classes."""
    fig, (position_ax, depth_ax) = plt.subplots(1, 2, figsize=(10.5, 3.8))
    share_ax = position_ax.twinx()
    for i, run in enumerate(result["runs"]):
        color = plt.cm.tab10(i % 10)
        label = run["run_dir"].rstrip("/").split("/")[-1]
        positions = [p + 1 for p in run["readout_positions"]]
        position_ax.plot(positions, run["readout_mae_by_position"], marker="o", ms=3, color=color, label=label)
        share = run["informative_share_by_position"]
        share_ax.bar(np.arange(1, len(share) + 1) + 0.15 * i, share, width=0.15, color=color, alpha=0.25)
        layers = run["probe_layers"]
        depth_ax.plot(range(len(layers)), [layer["mae"] for layer in layers], marker="o", ms=4, color=color, label=label)
    for ax in (position_ax, depth_ax):
        ax.axhline(result["prior_mae"], color="grey", ls="--", lw=0.8, label="uniform prior over classes")
        ax.set_ylabel("class-posterior MAE")
        ax.legend(fontsize=7)
    share_ax.set_ylim(0, 1)
    share_ax.set_ylabel("share of sequences informative (bars)", fontsize=8)
    position_ax.set_xlabel("pair k (the class posterior before its answer)")
    position_ax.set_title("read out of the answer distribution", fontsize=9)
    names = [{"input": "in", "ln_final": "LN"}.get(layer["name"], str(layer["layer"])) for layer in result["runs"][0]["probe_layers"]]
    depth_ax.set_xticks(range(len(names)), names)
    depth_ax.set_xlabel("depth: embeddings (in), after block l, final LayerNorm (LN)")
    depth_ax.set_title(f"ridge probes ({result['n_test_sequences']} held-out sequences)", fontsize=9)
    fig.suptitle(f"The class posterior ({' vs '.join(result['classes'])})", fontsize=10)
    save(fig, path)
