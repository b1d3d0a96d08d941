"""The value manifold (the paper's Fig 16-17): is the last layer's geometry one-dimensional in the posterior entropy?

``value_manifold`` runs a PCA of the final residual stream and of the last attention
layer's values at the supervised positions, and reports the variance explained by
PC1/PC2 and the Spearman correlation of PC1 with the exact posterior entropy (the paper:
PC1 > 80%, strongly correlated). ``measures`` holds the same question under each
definition in use, each named for what it is (:data:`MANIFOLD_MEASURES`): ours (the
residual before the final norm at the supervised positions), the authors' Paper-I point
set (the final-normed residual at the bijection's value tokens, the best |Pearson| of
PC1-5) and their HMM script's (the final-normed residual at the observations); each with
the runs' randomly initialized models beside it. The registered analysis reads the first
:data:`~windtunnel.analysis.base.N_DIAGNOSTIC_SEQUENCES` sequences of the fixed eval set.

    from windtunnel.analysis.manifold import value_manifold
    result = value_manifold([model], episodes, tunnel=tunnel)
    result["measures"]["ln_final_value_positions_max_pearson"]["pc1_variance"]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from windtunnel.analysis.base import Run, check_same_architecture, diagnostic_episodes, initial_models_of, register, summarize, traced
from windtunnel.analysis.stats import pca, pearson, spearman
from windtunnel.models import SequenceModel
from windtunnel.tunnels import Episode, Tunnel
from windtunnel.tunnels.capabilities import ValuePositions, lacks

__all__ = ["MANIFOLD_MEASURES", "value_manifold"]


#: Points kept (run 0) for the value-manifold scatter plot.
N_SCATTER = 2000

#: PCs compared with the entropy by the authors' max-over-PCs correlation.
N_CORRELATED_PCS = 5

#: Components with a smaller share of the variance are float32 rounding (relative error
#: ~6e-8, a variance share ~4e-15 along directions without signal) and have no direction
#: to correlate; the max-over-PCs correlation skips them.
NOISE_VARIANCE_SHARE = 1e-10

#: Where each measure reads: the supervised positions, or the value token after each.
POSITIONS = {
    "supervised": "the supervised positions (bijection: each input x_k; HMM: each observation o_t), each with the "
    "exact posterior entropy there",
    "value": "position p + 1 after each supervised position p (bijection: the output token y_k of the pair; a p + 1 "
    "past the sequence's end, such as a final query's, is dropped), labelled with the exact posterior entropy at p",
}

#: The value-manifold measures: where they read, their statistic, and one-sentence definition.
MANIFOLD_MEASURES: dict[str, dict[str, str]] = {
    "resid_supervised_spearman_pc1": {
        "read": "resid_post",
        "positions": "supervised",
        "statistic": "abs_spearman_pc1",
        "definition": "Ours: the residual stream leaving the last block (before the final LayerNorm) at the "
        "supervised positions; PCA (centered, unscaled); the PC1 variance share and |Spearman| of PC1 with the "
        "exact posterior entropy.",
    },
    "ln_final_value_positions_max_pearson": {
        "read": "ln_final",
        "positions": "value",
        "statistic": "max_abs_pearson_pc1_to_pc5",
        "definition": "The authors' Paper-I geometric_analysis.py (bijection only): the final LayerNorm's output at "
        "the value-token position p + 1 after each supervised input p, labelled with the exact posterior entropy "
        "at p; PCA (centered, unscaled); the PC1 variance share, and the largest |Pearson r| of PC1..PC5 with "
        "that entropy (pc says which PC gave it; a component with under 1e-10 of the variance is float rounding "
        "and is skipped).",
    },
    "ln_final_supervised_abs_pearson_pc1": {
        "read": "ln_final",
        "positions": "supervised",
        "statistic": "abs_pearson_pc1",
        "definition": "The authors' HMM script (hmm_figures_better_colors.py): the final LayerNorm's output at the "
        "supervised positions; PCA (centered, unscaled); the PC1 variance share and |Pearson| of PC1 with the "
        "exact posterior entropy (the authors subsample 3,000 points and set no threshold).",
    },
}


def _manifold_spaces(model: SequenceModel) -> dict[str, str]:
    """Space name -> activation read at the supervised positions."""
    spaces = {"resid_post": f"blocks.{model.n_layers - 1}.resid_post"}  # [B, T, d_model]
    if model.attention_heads:
        last = max(model.attention_heads)
        spaces["attn_v"] = f"blocks.{last}.attn.v"  # [B, H, T, d_head]
        spaces["attn_z"] = f"blocks.{last}.attn.z"  # [B, H, T, d_head]
    return spaces


def _measure_activation(model: SequenceModel, name: str) -> str:
    read = MANIFOLD_MEASURES[name]["read"]
    return f"blocks.{model.n_layers - 1}.resid_post" if read == "resid_post" else read


@torch.no_grad()
def _read_points(
    model: SequenceModel, episodes: Sequence[Episode], reads: Sequence[tuple[str, str]], tunnel: Tunnel | None
) -> dict[tuple[str, str], Tensor]:
    """``{(activation, where): [N, width]}`` for ``where`` in :data:`POSITIONS` (heads
    concatenated), ``N = sequences * positions`` in episode, sequence, position order;
    ``"value"`` reads need a tunnel that declares
    :class:`~windtunnel.tunnels.capabilities.ValuePositions`."""
    points: dict[tuple[str, str], list[Tensor]] = {read: [] for read in reads}
    names = sorted({name for name, _ in reads})
    for episode in episodes:
        _, trace = traced(model, episode.tokens, names, episode.value_inputs)
        for name, where in reads:
            at = episode.positions if where == "supervised" else tunnel.value_positions(episode)[0]  # [P] or [P']
            x = trace[name][..., at, :]  # [B, T, d] -> [B, P, d]  or  [B, H, P, d_head]
            if x.dim() == 4:
                x = x.permute(0, 2, 1, 3).flatten(2)  # [B, P, H * d_head]
            points[(name, where)].append(x.flatten(0, 1).double())  # [B * P, width]
    return {read: torch.cat(chunks) for read, chunks in points.items()}


def _correlation_with_entropy(points: Tensor, entropy: Tensor, statistic: str) -> dict[str, Any]:
    """PCA of ``[N, width]`` points and the ``statistic`` of their components against the ``[N]`` entropy:
    ``{pc1_variance, value, pc}`` (``pc`` 1-based)."""
    ratio, scores = pca(points)  # [K], [N, K]
    if statistic == "abs_spearman_pc1":
        value, pc = abs(spearman(scores[:, 0], entropy)), 1
    elif statistic == "abs_pearson_pc1":
        value, pc = abs(pearson(scores[:, 0], entropy)), 1
    elif statistic == "max_abs_pearson_pc1_to_pc5":
        candidates = [i for i in range(min(N_CORRELATED_PCS, len(ratio))) if i == 0 or ratio[i] > NOISE_VARIANCE_SHARE]
        r = {i: abs(pearson(scores[:, i], entropy)) for i in candidates}
        best = max(candidates, key=lambda i: -1.0 if math.isnan(r[i]) else r[i])
        value, pc = r[best], best + 1
    else:
        raise ValueError(f"unknown manifold statistic {statistic!r}")
    return {"pc1_variance": ratio[0].item(), "value": value, "pc": pc}


def value_manifold(
    models: Sequence[SequenceModel],
    episodes: Sequence[Episode],
    *,
    tunnel: Tunnel | None = None,
    initial_models: Sequence[SequenceModel] | None = None,
    n_scatter: int = N_SCATTER,
    seed: int = 0,
) -> dict[str, Any]:
    """PCA of the representations at the supervised positions against the exact entropy (Fig 16-17).

    Spaces: ``resid_post`` (the residual stream after the last block, what the head
    reads), and for models with attention ``attn_v`` (the value vectors of the last
    attention layer, heads concatenated: what each position offers later queries) and
    ``attn_z`` (the same layer's per-head mix of values read at the position, heads
    concatenated). Each component is oriented so that its Spearman correlation with the
    exact posterior entropy is >= 0 (the sign of a principal component is arbitrary), so
    ``spearman_*`` is the strength of a monotone relation in either direction.

    ``measures`` names each definition of the claim (:data:`MANIFOLD_MEASURES`): ours and
    the authors' two, each also for the randomly initialized models.

    Args:
        models: runs of one architecture (transformer or MLP control).
        episodes: the sequences to read.
        tunnel: their tunnel; the value-position measure needs one that declares
            :class:`~windtunnel.tunnels.capabilities.ValuePositions` (None, or another
            tunnel, skips it).
        initial_models: the same runs' initial (step-0) models, read by exactly the same
            code; None leaves every ``random_init`` None.
        n_scatter: points kept (run 0, random subset) for the scatter plot.
        seed: seed of that subset.

    Returns:
        ``runs``, ``n_points``, and ``spaces``: per space its ``activation``, ``dim``,
        ``variance_ratio`` (first 5 components, mean over runs), ``pc1_variance``,
        ``pc2_variance``, ``spearman_pc1_entropy``, ``spearman_pc2_entropy`` (each mean
        and std over runs), and ``scatter``: ``pc1``, ``pc2``, ``entropy_bits`` lists for
        the subset of run 0's points. ``measures``: ``{name: {definition, activation, positions,
        n_points, pc1_variance, correlation: {statistic, value, pc}, random_init:
        {pc1_variance, correlation} | None}}``; ``measures_skipped``: ``{name: reason}``.
    """
    check_same_architecture(models, "the geometric analyses")
    if initial_models is not None:
        check_same_architecture([*models, *initial_models], "the geometric analyses (trained and initial models)")
    skipped = {}
    no_values = "needs a tunnel (pass tunnel=) to know where the value tokens are" if tunnel is None else lacks(tunnel, ValuePositions)
    if no_values:
        skipped["ln_final_value_positions_max_pearson"] = no_values
    entropy = {"supervised": torch.cat([e.entropy_bits.flatten() for e in episodes])}  # [N]
    if not no_values:
        entropy["value"] = torch.cat([e.entropy_bits[:, tunnel.value_positions(e)[1]].flatten() for e in episodes])  # [N']
    N = len(entropy["supervised"])
    keep = torch.randperm(N, generator=torch.Generator().manual_seed(seed))[:n_scatter]
    spaces = _manifold_spaces(models[0])
    measure_names = [name for name in MANIFOLD_MEASURES if name not in skipped]
    measure_reads = {
        name: (_measure_activation(models[0], name), MANIFOLD_MEASURES[name]["positions"]) for name in measure_names
    }
    reads = list(dict.fromkeys([*((name, "supervised") for name in spaces.values()), *measure_reads.values()]))

    def measures_of(points: dict[tuple[str, str], Tensor]) -> dict[str, dict[str, Any]]:
        return {
            name: _correlation_with_entropy(points[read], entropy[read[1]], MANIFOLD_MEASURES[name]["statistic"])
            for name, read in measure_reads.items()
        }

    per_run: list[dict[str, dict[str, Any]]] = []
    trained_measures = []
    for model in models:
        points = _read_points(model, episodes, reads, tunnel)
        trained_measures.append(measures_of(points))
        results = {}
        for space, name in spaces.items():
            ratio, scores = pca(points[(name, "supervised")])  # [K], [N, K]
            rho = [spearman(scores[:, i], entropy["supervised"]) for i in range(2)]
            sign = torch.tensor([-1.0 if r < 0 else 1.0 for r in rho], dtype=torch.float64)
            results[space] = {
                "dim": points[(name, "supervised")].shape[1],
                "ratio": ratio,
                "rho": [abs(r) for r in rho],
                "scores": scores[:, :2] * sign,  # [N, 2], oriented
            }
        per_run.append(results)
    initial_measures = (
        None if initial_models is None else [measures_of(_read_points(m, episodes, reads, tunnel)) for m in initial_models]
    )
    first = per_run[0]
    out_spaces = {}
    for space, name in spaces.items():
        ratios = torch.stack([r[space]["ratio"][:5] for r in per_run])  # [R, 5]
        scatter = first[space]["scores"][keep]  # [n, 2]
        out_spaces[space] = {
            "activation": name,
            "dim": first[space]["dim"],
            "variance_ratio": ratios.mean(0).tolist(),
            "pc1_variance": summarize([r[space]["ratio"][0].item() for r in per_run]),
            "pc2_variance": summarize([r[space]["ratio"][1].item() for r in per_run]),
            "spearman_pc1_entropy": summarize([r[space]["rho"][0] for r in per_run]),
            "spearman_pc2_entropy": summarize([r[space]["rho"][1] for r in per_run]),
            "scatter": {
                "pc1": [float(f"{v:.5g}") for v in scatter[:, 0].tolist()],
                "pc2": [float(f"{v:.5g}") for v in scatter[:, 1].tolist()],
                "entropy_bits": [float(f"{v:.5g}") for v in entropy["supervised"][keep].tolist()],
            },
        }

    def summary(runs: list[dict[str, Any]], name: str) -> dict[str, Any]:
        return {
            "pc1_variance": summarize([r[name]["pc1_variance"] for r in runs]),
            "correlation": {
                "statistic": MANIFOLD_MEASURES[name]["statistic"],
                "value": summarize([r[name]["value"] for r in runs]),
                "pc": runs[0][name]["pc"],
            },
        }

    measures = {
        name: {
            "definition": MANIFOLD_MEASURES[name]["definition"],
            "activation": read[0],
            "positions": POSITIONS[read[1]],
            "n_points": len(entropy[read[1]]),
            **summary(trained_measures, name),
            "random_init": None if initial_measures is None else summary(initial_measures, name),
        }
        for name, read in measure_reads.items()
    }
    return {
        "runs": len(models),
        "n_points": N,
        "spaces": out_spaces,
        "measures": measures,
        "measures_skipped": skipped,
    }


@register("value_manifold")
def value_manifold_of_runs(runs: Sequence[Run]) -> dict[str, Any]:
    """Fig 16-17: PCA of final residuals and last-layer values; PC1 against the exact entropy."""
    return value_manifold(
        [r.model for r in runs],
        diagnostic_episodes(runs),
        tunnel=runs[0].config.tunnel,
        initial_models=initial_models_of(runs),
    )
