"""Entropy calibration: model entropy against the exact Bayes entropy (Fig 1/5, Fig 2/7).

Two views of the same question, "does the model's uncertainty track the posterior's?":

- the *mean curves*: at each supervised position, the model's predictive entropy averaged
  over the held-out sequences against the averaged exact entropy (Fig 1 for the bijection
  tunnel, where the exact curve is ``log2(V - k + 1)``; Fig 5 for the HMM tunnel);
- *single-sequence traces*: eight individual sequences, where the exact entropy is
  sequence-specific (staircases for the bijection tunnel with replacement, rises and falls
  for the HMM tunnel; Fig 2 and Fig 7). A model can match the mean curve while missing
  every trace; ``mae_bits`` and the trace errors say whether it does.

The runs are evaluated on their own tunnel: analyze a run trained with
``tunnel.with_replacement=true`` to see the staircases.

    from windtunnel.analysis.calibration import entropy_calibration
    from windtunnel.evaluation import model_predictor
    result = entropy_calibration({"seed 0": model_predictor(model)}, eval_set, tunnel)
    result["mae_aggregate_bits"], result["traces"]["sequences"][0]["model_entropy_bits"]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from windtunnel.analysis.base import Run, eval_set_for, register
from windtunnel.evaluation import METRICS, EvalSet, Predictor, model_predictor, score
from windtunnel.metrics import entropy_bits
from windtunnel.tunnels import Tunnel
from windtunnel.tunnels.capabilities import ClosedFormEntropy, declares

__all__ = ["closed_form_entropy_bits", "entropy_calibration", "select_traces"]

#: Number of single-sequence traces (the paper's Fig 2 shows eight).
N_TRACES = 8

TRACE_SELECTION = (
    "the sequences whose exact entropy varies most along the sequence (largest sum of |H_Bayes(t+1) - H_Bayes(t)|), "
    "ties broken by eval-set order; chosen from the exact posterior only, never from the model"
)


def closed_form_entropy_bits(tunnel: Tunnel, n_positions: int) -> list[float] | None:
    """``[P]`` the exact entropy where it is the same for every sequence and the tunnel knows
    it in closed form (:class:`~windtunnel.tunnels.capabilities.ClosedFormEntropy`; the
    bijection without replacement: ``log2(V - k + 1)``), else None."""
    if not declares(tunnel, ClosedFormEntropy):
        return None
    return tunnel.closed_form_entropy_bits(n_positions)


def select_traces(h_bayes: Tensor, n: int) -> list[int]:
    """Indices of the ``n`` sequences whose exact entropy varies most (see ``TRACE_SELECTION``).

    Args:
        h_bayes: ``[N, P]`` exact entropy of each sequence at each supervised position.
    """
    variation = h_bayes.diff(dim=1).abs().sum(dim=1)  # [N]
    # A stable sort keeps eval-set order among equals (e.g. every bijection sequence without replacement).
    order = torch.sort(-variation, stable=True).indices
    return order[:n].tolist()


def entropy_calibration(
    predictors: Mapping[str, Predictor] | Sequence[tuple[str, Predictor]],
    eval_set: EvalSet,
    tunnel: Tunnel,
    *,
    n_traces: int = N_TRACES,
) -> dict[str, Any]:
    """Model entropy against exact entropy, per position (mean over sequences) and per sequence.

    Args:
        predictors: ``{label: predictor}`` or ``(label, predictor)`` pairs, e.g. one per seed;
            all are scored on the same sequences. Single-sequence traces are drawn for the first.
        eval_set: the held-out sequences.
        tunnel: the tunnel they come from (for the closed-form check line).
        n_traces: number of single-sequence traces.

    Returns:
        A dict with keys

        - ``positions``: supervised position numbers 1..P (the x axis);
        - ``n_sequences``: sequences averaged over;
        - ``bayes_entropy_bits``: ``[P]`` mean over sequences of the exact entropy;
        - ``closed_form_bits``: ``[P]`` ``log2(V - k + 1)`` for the bijection tunnel without
          replacement (must equal ``bayes_entropy_bits``), else None;
        - ``model_entropy_bits``: ``[P]`` mean over runs of each run's mean model entropy;
        - ``runs``: per run ``label``, ``model_entropy_bits`` ``[P]``, ``mae_aggregate_bits``,
          ``mae_bits``, ``kl_bits``;
        - ``mae_aggregate_bits``, ``mae_bits``, ``kl_bits``: means over runs;
        - ``mae_of_mean_curve_bits``: mean over positions of |mean-over-runs curve - Bayes curve|
          (what the mean-curve panel shows; equals ``mae_aggregate_bits`` for one run);
        - ``traces``: ``run`` (its label), ``selection`` (how sequences were chosen),
          ``sequences``: per trace ``index`` (into the eval set), ``bayes_entropy_bits`` and
          ``model_entropy_bits`` ``[P]``, ``mae_bits`` (mean over its positions of |error|);
        - ``trace_mae_bits``: mean of the traces' ``mae_bits``.
    """
    labelled = list(predictors.items()) if isinstance(predictors, Mapping) else list(predictors)
    if not labelled:
        raise ValueError("entropy_calibration needs at least one predictor")
    episodes = eval_set.episodes
    h_bayes = torch.cat([e.entropy_bits for e in episodes])  # [N, P]
    bayes_curve = h_bayes.mean(0)  # [P]
    runs, model_curves, trace_model_entropy = [], [], None
    for label, predictor in labelled:
        predictions = [predictor(e) for e in episodes]  # each [B, P, C]
        scores = score(predictions, episodes)
        model_curves.append(torch.tensor(scores["curves"]["model_entropy_bits"], dtype=torch.float64))  # [P]
        runs.append({
            "label": label,
            "model_entropy_bits": scores["curves"]["model_entropy_bits"],
            **{name: scores[name] for name in METRICS},
        })
        if trace_model_entropy is None:
            trace_model_entropy = torch.cat([entropy_bits(p).cpu() for p in predictions])  # [N, P]
    mean_curve = torch.stack(model_curves).mean(0)  # [P]

    traces = []
    for index in select_traces(h_bayes, n_traces):
        error = (trace_model_entropy[index] - h_bayes[index]).abs()  # [P]
        traces.append({
            "index": index,
            "bayes_entropy_bits": h_bayes[index].tolist(),
            "model_entropy_bits": trace_model_entropy[index].tolist(),
            "mae_bits": error.mean().item(),
        })
    n_positions = h_bayes.shape[1]
    return {
        "tunnel": tunnel.name,
        "horizon": eval_set.horizon,
        "positions": list(range(1, n_positions + 1)),
        "n_sequences": h_bayes.shape[0],
        "bayes_entropy_bits": bayes_curve.tolist(),
        "closed_form_bits": closed_form_entropy_bits(tunnel, n_positions),
        "model_entropy_bits": mean_curve.tolist(),
        "runs": runs,
        **{name: sum(r[name] for r in runs) / len(runs) for name in METRICS},
        "mae_of_mean_curve_bits": (mean_curve - bayes_curve).abs().mean().item(),
        "traces": {"run": runs[0]["label"], "selection": TRACE_SELECTION, "sequences": traces},
        "trace_mae_bits": sum(t["mae_bits"] for t in traces) / max(len(traces), 1),
    }


@register("calibration")
def calibration_of_runs(runs: Sequence[Run]) -> dict[str, Any]:
    """Fig 1/5 and 2/7: model vs exact Bayes entropy, mean over sequences and eight single sequences."""
    # Every seed is scored on the first run's sequences, so the runs are compared on equal data.
    eval_set = eval_set_for(runs[0].config)
    predictors = [(r.label, model_predictor(r.model)) for r in runs]
    result = entropy_calibration(predictors, eval_set, runs[0].config.tunnel)
    for row, run in zip(result["runs"], runs):
        row["step"] = run.step
    return result
