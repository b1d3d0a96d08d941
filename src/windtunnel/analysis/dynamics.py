"""Training dynamics: the frame-precision dissociation (docs/protocol.md §6, Fig 16-17).

The paper's claim: over training, the attention maps (the "frame": which earlier tokens
each position reads) settle early, while the geometry of the representations (the
"precision": a value manifold parameterized by posterior entropy) and the calibration
keep improving long after. Measured on the run's permanent weight snapshots
(``checkpoints/step_*.safetensors``, log-spaced), each rebuilt and run on one fixed batch:

- **frame**: Jensen-Shannon divergence (bits, 0..1) between each attention row
  (a query at a supervised position, over its keys) of the snapshot and of the final
  model, averaged over layers, heads, sequences and queries (and per layer);
- **manifold**: PCA of the last block's residual stream at the supervised positions:
  the variance fraction of PC1, and |Spearman rho| between PC1 and the exact entropy;
- **precision**: ``mae_bits``, ``mae_aggregate_bits`` and ``kl_bits`` on the same batch
  (one forward per snapshot gives all three views; the run's ``eval.json`` has the
  final model on the full held-out set).

The attention has *stabilized* at the first snapshot after which its JSD to the final
model stays below a threshold; the dissociation is ``mae_bits`` there against the end.
Models without attention (the MLP control) get the manifold and precision curves only.

    from windtunnel.analysis.dynamics import training_dynamics
    result = training_dynamics("runs/bij_seed0", jsd_threshold_bits=0.05)
    result["stabilization_step"], result["mae_bits_at_stabilization"], result["mae_bits_final"]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from windtunnel.analysis.base import Run, eval_set_for, model_device, register, traced
from windtunnel.analysis.stats import pca, spearman
from windtunnel.evaluation import METRICS, score
from windtunnel.run_config import build_run_model
from windtunnel.runs import read_run_config, recorded_run_dir
from windtunnel.training.checkpoint import (
    CheckpointError,
    list_snapshots,
    load_snapshot,
)
from windtunnel.tunnels import Episode

__all__ = [
    "js_divergence_bits",
    "stabilization_index",
    "training_dynamics",
]

#: Mean attention-row JSD to the final model (bits) below which the frame counts as settled.
JSD_THRESHOLD_BITS = 0.05
#: Sequences of the fixed batch the attention maps and residuals are taken on.
N_SEQUENCES = 256

_LN2 = math.log(2.0)


def js_divergence_bits(p: Tensor, q: Tensor) -> Tensor:
    """Jensen-Shannon divergence in bits over the last dimension: ``[..., K], [..., K] -> [...]``.

    Between 0 (identical rows) and 1 (disjoint supports); computed in float64.
    """
    p, q = p.double(), q.double()
    m = 0.5 * (p + q)  # exactly p where p == q, so identical rows give exactly 0
    kl_pm = (torch.special.xlogy(p, p) - torch.special.xlogy(p, m)).sum(-1)
    kl_qm = (torch.special.xlogy(q, q) - torch.special.xlogy(q, m)).sum(-1)
    return (0.5 * (kl_pm + kl_qm) / _LN2).clamp_min(0.0)  # rounding can leave -1e-17








def stabilization_index(values: Sequence[float], threshold: float) -> int | None:
    """Index of the first value after which (itself included) every value is below ``threshold``.

    None when the last value is not below it. A dip below the threshold that is followed by
    a rise above it does not count: the frame must stay settled.
    """
    above = [i for i, value in enumerate(values) if not value < threshold]
    if not above:
        return 0
    return above[-1] + 1 if above[-1] + 1 < len(values) else None


def _nan_to_none(value: float) -> float | None:
    return None if math.isnan(value) else value


def _concatenate(episodes: Sequence[Episode]) -> Episode:
    """One episode of all sequences (episodes of one eval set share their positions)."""
    return Episode(
        tokens=torch.cat([e.tokens for e in episodes]),
        positions=episodes[0].positions,
        targets=torch.cat([e.targets for e in episodes]),
        posterior=torch.cat([e.posterior for e in episodes]),
        entropy_bits=torch.cat([e.entropy_bits for e in episodes]),
        value_inputs=None if episodes[0].value_inputs is None else torch.cat([e.value_inputs for e in episodes]),
    )


def _snapshot_state(
    model: nn.Module, episode: Episode, attention_layers: Sequence[int]
) -> tuple[Tensor, Tensor | None, Tensor]:
    """One forward of ``model`` on ``episode`` (``N`` sequences), read at its supervised positions (``P``).

    Returns:
        ``[N, P, C]`` float64 predictive probabilities; ``[n_attention_layers, N, H, P, T]``
        attention rows (None without attention layers); ``[N, P, d_model]`` residual stream
        leaving the last block.
    """
    resid_name = f"blocks.{model.n_layers - 1}.resid_post"
    names = [resid_name] + [f"blocks.{layer}.attn.pattern" for layer in attention_layers]
    with torch.no_grad():
        logits, trace = traced(model.eval(), episode.tokens, names, episode.value_inputs)  # logits [N, T, C], on the host
    positions = episode.positions
    probabilities = torch.softmax(logits[:, positions].double(), dim=-1)
    patterns = None
    if attention_layers:
        patterns = torch.stack([trace[f"blocks.{layer}.attn.pattern"][:, :, positions] for layer in attention_layers])
    return probabilities, patterns, trace[resid_name][:, positions]


def training_dynamics(
    run_dir: Path | str,
    *,
    n_sequences: int = N_SEQUENCES,
    jsd_threshold_bits: float = JSD_THRESHOLD_BITS,
    device: torch.device | str = "cpu",
) -> dict[str, Any]:
    """Attention change, value-manifold state and calibration at every snapshot of one run.

    Args:
        run_dir: a trained run directory with at least two snapshots.
        n_sequences: size of the fixed batch (held-out sequences at the training horizon,
            drawn from the run's ``eval.seed``) every snapshot is run on.
        jsd_threshold_bits: mean attention-row JSD to the final model under which the frame
            counts as settled.
        device: where each snapshot's forward pass runs (the statistics run on the host).

    Returns:
        A dict with keys

        - ``steps``: ``[S]`` snapshot steps on disk, ascending; ``reference_step``: the last
          (the "final model" every JSD is taken to);
        - ``n_sequences``, ``jsd_threshold_bits``, ``resid_name`` (the residual PCA'd);
        - ``attention_layers``: layers with attention (empty for the MLP control);
        - ``attention_jsd_bits``: ``[S]`` mean JSD to the final model over layers, heads,
          sequences and supervised queries; ``attention_jsd_by_layer_bits``: ``[S][layers]``
          (both None without attention);
        - ``pc1_variance_explained``: ``[S]`` fraction of residual variance on PC1;
          ``pc1_entropy_spearman_abs``: ``[S]`` |Spearman rho| of PC1 with the exact entropy;
        - ``mae_aggregate_bits``, ``mae_bits``, ``kl_bits``: ``[S]`` on the fixed batch;
        - ``stabilization_step``: first step after which the JSD stays below the threshold
          (None without attention, or when it never does); ``stabilization_fraction``: that
          step over ``reference_step``;
        - ``mae_bits_at_stabilization``, ``mae_bits_final``, and their ratio
          ``mae_ratio_stabilization_to_final`` (above 1: precision keeps improving after the
          frame has settled); the same for every metric in ``at_stabilization``, ``final`` and
          ``ratio_stabilization_to_final``; ``pc1_variance_explained_at_stabilization`` and
          ``pc1_entropy_spearman_abs_at_stabilization`` likewise (None without a stabilization step).
    """
    run_dir = Path(run_dir)
    config = read_run_config(run_dir)
    steps = list_snapshots(run_dir)
    if len(steps) < 2:
        raise CheckpointError(f"training dynamics needs at least two snapshots in {str(run_dir)!r}; found {steps}")
    batch = eval_set_for(config, n=n_sequences).episodes
    episode = batch[0] if len(batch) == 1 else _concatenate(batch)
    entropy = episode.entropy_bits.reshape(-1)  # [N * P], matches the residual rows

    # Every parameter is overwritten by each snapshot (loading is strict and models have no
    # buffers), so one model serves them all; a fresh one per snapshot would be identical.
    model = build_run_model(config).to(device)
    attention_layers = sorted(model.attention_heads)
    resid_name = f"blocks.{model.n_layers - 1}.resid_post"
    reference: Tensor | None = None  # [n_attention_layers, N, H, P, T] attention of the final model
    rows: dict[int, dict[str, Any]] = {}
    # Newest first, so the final model's attention is at hand for every earlier snapshot.
    for step in reversed(steps):
        load_snapshot(run_dir, model, step)
        probabilities, patterns, resid = _snapshot_state(model, episode, attention_layers)
        row: dict[str, Any] = {}
        if patterns is not None:  # [La, N, H, P, T]
            if reference is None:
                reference = patterns
            by_layer = [js_divergence_bits(now, end).mean().item() for now, end in zip(patterns, reference)]  # per layer
            row["jsd_by_layer"] = by_layer
            row["jsd"] = sum(by_layer) / len(by_layer)  # every attention layer has the same row count
        ratio, coordinates = pca(resid.reshape(-1, resid.shape[-1]))
        explained, scores = ratio[0].item(), coordinates[:, 0]  # scores [N * P]
        row["pc1_variance_explained"] = _nan_to_none(explained)
        row["pc1_entropy_spearman_abs"] = _nan_to_none(abs(spearman(scores, entropy)))
        metrics = score([probabilities], [episode])
        row.update({name: metrics[name] for name in METRICS})
        rows[step] = row

    ordered = [rows[step] for step in steps]
    has_attention = bool(attention_layers)
    result: dict[str, Any] = {
        "run_dir": recorded_run_dir(run_dir),
        "steps": steps,
        "reference_step": steps[-1],
        "n_sequences": episode.batch_size,
        "jsd_threshold_bits": jsd_threshold_bits,
        "resid_name": resid_name,
        "attention_layers": attention_layers,
        "attention_jsd_bits": [r["jsd"] for r in ordered] if has_attention else None,
        "attention_jsd_by_layer_bits": [r["jsd_by_layer"] for r in ordered] if has_attention else None,
        "pc1_variance_explained": [r["pc1_variance_explained"] for r in ordered],
        "pc1_entropy_spearman_abs": [r["pc1_entropy_spearman_abs"] for r in ordered],
        **{name: [r[name] for r in ordered] for name in METRICS},
    }
    index = stabilization_index(result["attention_jsd_bits"], jsd_threshold_bits) if has_attention else None
    stable = ordered[index] if index is not None else None
    final = ordered[-1]
    result.update({
        "stabilization_step": steps[index] if index is not None else None,
        "stabilization_fraction": steps[index] / steps[-1] if index is not None and steps[-1] else None,
        "mae_bits_at_stabilization": stable["mae_bits"] if stable else None,
        "mae_bits_final": final["mae_bits"],
        "mae_ratio_stabilization_to_final": (
            stable["mae_bits"] / final["mae_bits"] if stable and final["mae_bits"] else None
        ),
        "at_stabilization": {name: stable[name] for name in METRICS} if stable else None,
        "final": {name: final[name] for name in METRICS},
        "ratio_stabilization_to_final": {
            name: stable[name] / final[name] if final[name] else None for name in METRICS
        } if stable else None,
        "pc1_variance_explained_at_stabilization": stable["pc1_variance_explained"] if stable else None,
        "pc1_entropy_spearman_abs_at_stabilization": stable["pc1_entropy_spearman_abs"] if stable else None,
    })
    return result


def _has_history(runs: Sequence[Run]) -> str | None:
    """Why the runs have no training history to read (fewer than two snapshots: a run a
    results folder keeps holds its final weights alone), or None."""
    steps = list_snapshots(runs[0].directory)
    if len(steps) < 2:
        return f"it reads a run's snapshots, and {runs[0].directory.name} keeps {len(steps)} (a kept run holds its final weights alone)"
    return None


@register("training_dynamics", requires=_has_history)
def training_dynamics_of_runs(runs: Sequence[Run]) -> dict[str, Any]:
    """Fig 16-17: attention settles early (JSD to final) while PC1 geometry and mae_bits keep improving."""
    # One run's history is the measurement; seeds would need their snapshot steps aligned.
    return {"run": runs[0].label, **training_dynamics(runs[0].directory, device=model_device(runs[0].model))}
