"""What ``windtunnel lm-score`` writes, and the Markdown page of saved scorings.

A scoring folder holds ``lm_score.json`` (the scores, the model, the format, the geometry
when asked for), ``calibration.png`` and ``geometry.png`` drawn from it, and ``report.md``.
:func:`results_page` renders the documentation's page from every scoring under a results
folder (``results/lm``), from the saved JSON alone.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt

from windtunnel.figures import save
from windtunnel.files import atomic_write_text

__all__ = ["RESULT_FILE", "draw_figures", "markdown", "results_page", "write_scoring"]

RESULT_FILE = "lm_score.json"
ROW_NAMES = {"language_model": "language model", "trained_model": "windtunnel's trained transformer",
             "uniform": "uniform over the symbols (knows nothing)"}
LABEL = ("A measurement, not a claim of the paper: a small pretrained language model reading tunnel text it was "
         "never trained on, scored against the exact predictive of the next symbol.")


def _interval(row: dict[str, Any], name: str) -> str:
    low, high = row.get(f"{name}_ci", [None, None])
    return f"{row[name]:.3g} [{low:.3g}, {high:.3g}]" if low is not None else f"{row[name]:.3g}"


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def markdown(result: dict[str, Any], *, heading: str = "##", figures: str | None = None) -> str:
    """One scoring as Markdown: the model, the format, the scores, the geometry by layer."""
    model = result["model"]
    variant = [v for v, on in (("fresh symbols", result["fresh_symbols"]), ("instruction", result["instruction"])) if on]
    lines = [f"{heading} {model['name']} on {result['tunnel_label']}" + (f", {' and '.join(variant)}" if variant else ""), "",
             f"{model['class']}, {model['params'] / 1e6:.1f}M parameters, {model['n_layers']} layers; "
             f"{result['n']} sequences ({result['tunnel_variant']}), seed {result['seed']}; "
             f"{'a fresh symbol map per sequence' if result['fresh_symbols'] else 'one symbol map'}, "
             f"{'with' if result['instruction'] else 'no'} instruction; {result['text_tokens']} tokens at most; "
             f"forward passes {result['forward_s']:.1f} s.", "",
             "The first sequence as the model reads it:", "", "```text", result["example_text"].strip(), "```", ""]
    rows = [[ROW_NAMES.get(name, name), _interval(row, "mae_bits"), _interval(row, "kl_bits"),
             f"{row['impossible_mass']:.3g}" if "impossible_mass" in row else "",
             f"{row['leaked_mass']:.3g} (max {row['leaked_mass_max']:.3g})" if "leaked_mass" in row else ""]
            for name, row in result["rows"].items()]
    lines += _table(["predictor", "entropy MAE (bits) [95% CI]", "KL (bits) [95% CI]",
                     "mass on symbols ruled out", "mass outside the symbols"], rows)
    lines.append("")
    curves = {name: row["reliability"] for name, row in result["rows"].items() if "reliability" in row}
    if curves:
        lines += ["Calibration against the exact posterior: every probability a predictor gives a symbol, binned; per "
                  "bin its mean, the mean exact probability of the same symbols, and how many (calibrated: equal means).", ""]
        header = ["predicted probability"] + [f"{ROW_NAMES.get(name, name)}: mean predicted / exact (n)" for name in curves]
        edges = next(iter(curves.values()))["bin_edges"]
        table = []
        for i in range(len(edges) - 1):
            cells = [f"{edges[i]:.1f}-{edges[i + 1]:.1f}"]
            for curve in curves.values():
                q, p, n = curve["mean_predicted"][i], curve["mean_exact"][i], curve["count"][i]
                cells.append(f"{q:.3f} / {p:.3f} ({n})" if n else "")
            table.append(cells)
        lines += _table(header, table) + [""]
    if figures:
        lines += [f"![calibration]({figures}/calibration.png)", ""]
    geometry = result.get("geometry")
    if geometry:
        lines += [f"Geometry on {geometry['n_sequences']} sequences: key mean |cos| per key-value head (mean over "
                  f"heads; chance for d_head {geometry['d_head']}: {geometry['chance_abs_cos']:.3f}); attention entropy "
                  f"at the read positions (uniform: {geometry['uniform_attention_entropy_bits']:.2f} bits) and mass on "
                  f"the symbols (their share of the visible tokens: {geometry['uniform_symbol_share']:.2f}); residual "
                  "PC1's share and the absolute Spearman rho of PC1 with the exact entropy (the authors: rho = "
                  f"{geometry['authors_pythia_410m_pc1_spearman']} for Pythia-410M's last layer on their text task); "
                  "held-out KL of a ridge probe of the exact predictive.", ""]
        state = "pc1_state_entropy_spearman_abs" in geometry["layers"][0]
        header = ["layer", "keys in context", "keys centered", "keys (embedding, normed)", "attn entropy", "symbol mass",
                  "PC1 share", "abs. rho PC1, H(next)"] + (["abs. rho PC1, H(state)"] if state else []) + \
                 ["probe KL next (bits)"] + (["probe KL state (bits)"] if state else [])
        table = []
        for row in geometry["layers"]:
            cells = [row["layer"], f"{row['in_context_keys']['mean']:.3f}", f"{row['in_context_keys_centered']['mean']:.3f}",
                     f"{row['normalized_embedding_keys']['mean']:.3f}", f"{row['attention_entropy_bits']:.2f}",
                     f"{row['symbol_mass']:.2f}", f"{row['pc1_variance']:.2f}", f"{row['pc1_next_entropy_spearman_abs']:.2f}"]
            if state:
                cells.append(f"{row['pc1_state_entropy_spearman_abs']:.2f}")
            cells.append(f"{row['probe_next_symbol']['posterior_kl_bits']:.3f}")
            if state:
                cells.append(f"{row['probe_state_posterior']['posterior_kl_bits']:.3f}")
            table.append(cells)
        lines += _table(header, table)
        lines.append("")
        if figures:
            lines += [f"![geometry]({figures}/geometry.png)", ""]
    return "\n".join(lines)


def draw_figures(result: dict[str, Any], folder: Path) -> list[Path]:
    """``calibration.png`` (entropy, KL and leaked mass by position) and, with geometry, ``geometry.png``."""
    written = []
    rows = result["rows"]
    fig, axes = plt.subplots(1, 4, figsize=(20, 3.8))
    first = next(iter(rows.values()))["curves"]
    positions = range(1, len(first["bayes_entropy_bits"]) + 1)
    axes[0].plot(positions, first["bayes_entropy_bits"], color="black", lw=2, label="exact")
    for name, row in rows.items():
        axes[0].plot(positions, row["curves"]["model_entropy_bits"], marker="o", ms=3, label=ROW_NAMES.get(name, name))
        if name != "uniform":
            axes[1].plot(positions, row["curves"]["kl_bits"], marker="o", ms=3, label=ROW_NAMES.get(name, name))
    axes[0].set_title("mean predictive entropy by position (bits)", fontsize=9)
    axes[1].set_title("KL(exact || predictor) by position (bits)", fontsize=9)
    axes[1].set_yscale("log")
    axes[2].plot(positions, rows["language_model"]["leaked_mass_curve"], marker="o", ms=3, color="#c44e52")
    axes[2].set_title("language model: mass outside the symbols", fontsize=9)
    for ax in axes[:3]:
        ax.set_xlabel("supervised position")
    for name, row in rows.items():
        if "reliability" in row:
            curve = row["reliability"]
            shown = [(q, p) for q, p in zip(curve["mean_predicted"], curve["mean_exact"]) if q is not None]
            axes[3].plot([q for q, _ in shown], [p for _, p in shown], marker="o", ms=3, label=ROW_NAMES.get(name, name))
    axes[3].plot([0, 1], [0, 1], color="grey", ls=":", label="calibrated")
    axes[3].set_xlabel("predicted probability of a symbol (binned)")
    axes[3].set_ylabel("mean exact probability")
    axes[3].set_title("calibration against the exact posterior", fontsize=9)
    for ax in axes[[0, 1, 3]]:
        ax.legend(fontsize=7)
    fig.suptitle(f"{result['model']['name']} on {result['tunnel_label']}", fontsize=10)
    path = folder / "calibration.png"
    save(fig, path)
    written.append(path)
    geometry = result.get("geometry")
    if geometry:
        layers = [row["layer"] for row in geometry["layers"]]
        fig, axes = plt.subplots(1, 4, figsize=(18, 3.8))
        for key, label in (("in_context_keys", "in context"), ("in_context_keys_centered", "in context, centered"),
                           ("normalized_embedding_keys", "embedding, normed")):
            axes[0].plot(layers, [row[key]["mean"] for row in geometry["layers"]], marker="o", ms=3, label=label)
        axes[0].axhline(geometry["chance_abs_cos"], color="grey", ls=":", label="chance")
        axes[0].set_title("symbol keys: mean |cos| (mean over heads)", fontsize=9)
        axes[0].legend(fontsize=7)
        axes[1].plot(layers, [row["attention_entropy_bits"] for row in geometry["layers"]], marker="o", ms=3, label="attention entropy")
        axes[1].axhline(geometry["uniform_attention_entropy_bits"], color="grey", ls=":", label="uniform")
        axes[1].set_title("attention entropy at the read positions (bits)", fontsize=9)
        axes[1].legend(fontsize=7)
        axes[2].plot(layers, [row["pc1_variance"] for row in geometry["layers"]], marker="o", ms=3, label="PC1 share")
        axes[2].plot(layers, [row["pc1_next_entropy_spearman_abs"] for row in geometry["layers"]], marker="o", ms=3,
                     label="|rho| PC1, H(next symbol)")
        if "pc1_state_entropy_spearman_abs" in geometry["layers"][0]:
            axes[2].plot(layers, [row["pc1_state_entropy_spearman_abs"] for row in geometry["layers"]], marker="o", ms=3,
                         label="|rho| PC1, H(state)")
        axes[2].axhline(abs(geometry["authors_pythia_410m_pc1_spearman"]), color="grey", ls=":", label="Pythia-410M (authors)")
        axes[2].set_title("residual stream: PC1", fontsize=9)
        axes[2].legend(fontsize=7)
        axes[3].plot(layers, [row["probe_next_symbol"]["posterior_kl_bits"] for row in geometry["layers"]], marker="o",
                     ms=3, label="next symbol")
        if "probe_state_posterior" in geometry["layers"][0]:
            axes[3].plot(layers, [row["probe_state_posterior"]["posterior_kl_bits"] for row in geometry["layers"]],
                         marker="o", ms=3, label="hidden state")
        axes[3].set_title("ridge probe of the exact posterior: held-out KL (bits)", fontsize=9)
        axes[3].legend(fontsize=7)
        for ax in axes:
            ax.set_xlabel("layer")
        path = folder / "geometry.png"
        save(fig, path)
        written.append(path)
    return written


def write_scoring(folder: Path, result: dict[str, Any]) -> list[Path]:
    """Write ``lm_score.json``, the figures and ``report.md`` into ``folder`` (which exists)."""
    atomic_write_text(folder / RESULT_FILE, json.dumps(result, indent=1) + "\n")
    written = [folder / RESULT_FILE, *draw_figures(result, folder)]
    atomic_write_text(folder / "report.md", f"{LABEL}\n\n" + markdown(result, heading="#", figures=".") + "\n")
    return [*written, folder / "report.md"]


def results_page(folder: Path, title: str) -> str:
    """The documentation's page of every scoring saved under ``folder`` (one subfolder each)."""
    parts = [f"# {title}", "", "<!-- generated by tools/results_pages.py from the saved results; do not edit -->", "",
             LABEL, ""]
    for path in sorted(folder.glob(f"*/{RESULT_FILE}")):
        result = json.loads(path.read_text())
        parts.append(markdown(result))
        how = result.get("how")
        if how:
            parts += [f"Measured: `{how['command']}` on {how['machine']}, commit {how['commit']}, {how['wall_s']:.0f} s wall.", ""]
    return "\n".join(parts)
