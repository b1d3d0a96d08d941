"""The class posterior of model selection, read out of a model and probed from its layers.

A tunnel whose hypotheses come in classes
(:class:`~windtunnel.tunnels.capabilities.HypothesisClasses`: the model-selection tunnel)
knows the exact class posterior ``w`` before each answer and each class's own predictive
``q_c``; the exact answer posterior is ``sum_c w_c q_c``. Two readings of a model's class
posterior (the authors' model-selection paper reads it from the answer distribution "where a
class predicts differently from the others"):

- **read out** of the model's predictive ``p``: the weights on the simplex whose mixture
  ``sum_c w_c q_c`` is nearest to ``p`` (least squares on the offsets ``q_c - q_K``, then the
  Euclidean projection onto the simplex), among the classes the pairs before have not ruled
  out (a ruled-out class has no predictive; its weight is 0). Only where two or more classes
  remain and their predictives are linearly independent (the smallest singular value of the
  offsets above :data:`INFORMATIVE`) does the answer say anything of the class; elsewhere the
  position is left out and counted;
- **probed**: a ridge regression of the class posterior on the residual stream at each depth
  (fit on the first :data:`~windtunnel.analysis.probes.TRAIN_FRACTION` of the sequences, its
  strength chosen on held-out ones), its prediction projected onto the simplex.

Both are scored by the class-posterior MAE (the mean over classes of the absolute error) on
the test sequences, beside the uniform prior over classes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from windtunnel.analysis.base import Run, eval_set_for, register
from windtunnel.analysis.probes import TRAIN_FRACTION, _probe_points, _residuals, fit_ridge_validated
from windtunnel.tunnels.capabilities import HypothesisClasses, lacks

__all__ = ["INFORMATIVE", "N_SEQUENCES", "class_posterior_mae", "project_to_simplex", "read_class_posterior"]

#: The smallest singular value of the classes' predictive offsets at which a position counts
#: as informative: predictives that differ by less than this cannot be told apart in an
#: answer distribution (a probability difference of 1e-6 is below any model's precision).
INFORMATIVE = 1e-6
#: Sequences read: the first whole batches of the run's held-out set up to this many.
N_SEQUENCES = 1024


def project_to_simplex(v: Tensor) -> Tensor:
    """``[..., K]``: the Euclidean projection of each row onto the probability simplex
    (sort, threshold; Duchi et al., ICML 2008)."""
    u, _ = v.sort(-1, descending=True)
    cumulative = u.cumsum(-1) - 1.0
    index = torch.arange(1, v.shape[-1] + 1, device=v.device, dtype=v.dtype)
    active = (u - cumulative / index) > 0  # a prefix of the sorted entries
    rho = active.sum(-1, keepdim=True).clamp_min(1)  # [..., 1]
    theta = cumulative.gather(-1, rho - 1) / rho.to(v.dtype)
    return (v - theta).clamp_min(0.0)


def read_class_posterior(predictive: Tensor, class_predictives: Tensor, possible: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The class weights whose mixture of ``class_predictives`` is nearest to ``predictive``.

    Args:
        predictive: ``[N, C]`` a model's answer distribution at ``N`` positions.
        class_predictives: ``[N, K, C]`` each class's own predictive there (``K >= 2``).
        possible: ``[N, K]`` bool, the classes the pairs before have not ruled out (None: all).
            A ruled-out class has no predictive to mix: its weight is 0 and the weights are
            read among the others; where one class is left the answer says nothing of the class.

    Returns:
        ``[N, K]`` float64 weights on the simplex, and ``[N]`` bool: where at least two classes
        are possible and their predictives are independent enough (:data:`INFORMATIVE`) for
        the weights to mean anything.
    """
    p, q = predictive.double(), class_predictives.double()
    N, K = q.shape[:2]
    if possible is None:
        possible = torch.ones(N, K, dtype=torch.bool, device=q.device)
    weights = possible.double() / possible.sum(-1, keepdim=True).clamp_min(1)
    informative = torch.zeros(N, dtype=torch.bool, device=q.device)
    for pattern in possible.unique(dim=0):  # the classes still possible, one set of positions at a time
        at = (possible == pattern).all(-1)
        classes = pattern.nonzero()[:, 0]
        if len(classes) < 2:
            continue
        q_at = q[at][:, classes]  # [n, k, C]
        offsets = (q_at[:, :-1] - q_at[:, -1:]).transpose(1, 2)  # [n, C, k-1]
        target = (p[at] - q_at[:, -1])[..., None]  # [n, C, 1]
        informative[at] = torch.linalg.svdvals(offsets)[:, -1] > INFORMATIVE
        solution = torch.linalg.lstsq(offsets, target, driver="gelsd").solution[..., 0]  # [n, k-1]
        read = torch.zeros(int(at.sum()), K, dtype=torch.float64, device=q.device)
        read[:, classes] = project_to_simplex(torch.cat([solution, 1.0 - solution.sum(-1, keepdim=True)], -1))
        weights[at] = read
    return weights, informative


def class_posterior_mae(estimate: Tensor, exact: Tensor) -> Tensor:
    """``[...]``: the mean over the class axis of ``|estimate - exact|``."""
    return (estimate - exact).abs().mean(-1)


def _requires(runs: Sequence[Run]) -> str | None:
    tunnel = runs[0].config.tunnel
    why = lacks(tunnel, HypothesisClasses)
    if why:
        return why
    if len(tunnel.class_names) < 2:
        return f"the tunnel compares one class ({tunnel.class_names[0]}): there is no class posterior to read"
    return None


@register("class_posterior", requires=_requires)
def class_posterior(runs: Sequence[Run]) -> dict[str, Any]:
    """The class posterior read out of each model's answer distribution and probed from its layers."""
    config = runs[0].config
    tunnel = config.tunnel
    episodes, count = [], 0
    for episode in eval_set_for(config).episodes:  # whole batches: they keep the tunnel's own fields
        if count >= N_SEQUENCES:
            break
        episodes.append(episode)
        count += episode.batch_size
    exact = torch.cat([tunnel.class_posterior(e) for e in episodes])  # [N, P, K]
    predictives = torch.cat([tunnel.class_predictives(e) for e in episodes])  # [N, P, K, C]
    N, P, K = exact.shape
    n_train = round(TRAIN_FRACTION * N)
    test = slice(n_train, N)
    prior_mae = class_posterior_mae(torch.full_like(exact[test], 1.0 / K), exact[test]).mean().item()
    rows = []
    for run in runs:
        points = _probe_points(run.model)
        residuals, predictive = _residuals(run.model, episodes, [name for _, _, name in points])
        weights, informative = read_class_posterior(predictive[test].flatten(0, 1), predictives[test].flatten(0, 1),
                                                    exact[test].flatten(0, 1) > 0)
        errors = class_posterior_mae(weights, exact[test].flatten(0, 1)).view(-1, P)  # [N_test, P]
        informative = informative.view(-1, P)
        share = informative.double().mean(0)  # [P]
        positions = [p for p in range(P) if share[p] > 0]
        probe_layers = []
        for layer, label, name in points:
            probe = fit_ridge_validated(residuals[name][:n_train], {"class_posterior": exact[:n_train]})["class_posterior"]
            estimate = project_to_simplex(probe.predict(residuals[name][test].flatten(0, 1)))
            probe_layers.append({"layer": layer, "name": label, "alpha": probe.alpha,
                                 "mae": class_posterior_mae(estimate, exact[test].flatten(0, 1)).mean().item()})
        row = {
            "run_dir": run.recorded_dir,
            "readout_positions": positions,
            "readout_mae_by_position": [errors[informative[:, p], p].mean().item() for p in positions],
            "informative_share_by_position": share.tolist(),
            "probe_layers": probe_layers,
        }
        if informative.any():
            row["readout_mae"] = errors[informative].mean().item()
        rows.append(row)
    return {"classes": list(tunnel.class_names), "n_train_sequences": n_train, "n_test_sequences": N - n_train,
            "prior_mae": prior_mae, "runs": rows}
