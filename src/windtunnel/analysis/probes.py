"""Linear probes: how much of the exact posterior each layer's residual stream holds linearly.

At every depth (``input`` = token + position embedding, then each block's
``resid_post``, and last the final LayerNorm that the head reads), a ridge regression
from the residual stream at the supervised positions to (a) the exact posterior vector
and (b) its entropy in bits, fitted in closed form in float64 on some sequences and
scored on others (a split of sequences, not positions: the positions of one sequence
share their hypothesis, so a position split would leak it).

The posterior is probed two ways, because neither alone answers "is it linearly there":

- ``posterior``: regress the probabilities. Bounded targets, an R² that reads directly;
  for the KL the output is clipped at :data:`PROBABILITY_FLOOR` and renormalized (a probe
  that puts ~0 where the posterior has mass pays ``log2(p / 1e-6)`` bits: a strict KL).
  But the model itself never produces probabilities linearly: its head is
  LayerNorm -> linear -> softmax, so a well-calibrated model can still score a modest R².
- ``log_posterior``: regress the log-posterior, floored at ``log(PROBABILITY_FLOOR)``
  (the bijection posterior is exactly 0 on eliminated outputs) and centered over the
  classes; the probe's distribution is the softmax of its output. Centered
  log-probabilities are linear in the logits (``log p_c - mean_c log p_c = z_c - mean_c
  z_c``), so this is the model's own kind of readout, and its KL is comparable with the
  model's (``model_kl_bits``). The floor only sets how negative "impossible" is; any
  value far below ``log(1/C)`` gives nearly the same softmax.

Works for any model (transformer or MLP control).

    from windtunnel.analysis.probes import linear_probes
    result = linear_probes([model], episodes)
    [(row["name"], row["posterior_r2"]["mean"]) for row in result["layers"]]
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from windtunnel.analysis.base import Run, diagnostic_episodes, register, summarize, traced
from windtunnel.metrics import kl_bits
from windtunnel.models import SequenceModel
from windtunnel.tunnels import Episode

__all__ = [
    "ALPHAS",
    "RidgeProbe",
    "RidgeSolver",
    "centered_log",
    "fit_ridge",
    "fit_ridge_validated",
    "linear_probes",
    "probe_layer",
    "r2_score",
]

#: Fraction of the sequences the probes are fitted on; the rest score them.
TRAIN_FRACTION = 0.75

#: Ridge strengths tried, relative to the mean feature variance (so they are scale-free);
#: the one with the best R² on a held-out fifth of the training sequences is kept.
ALPHAS = (1e-8, 1e-6, 1e-4, 1e-2, 1.0)

#: Smallest probability a posterior probe may give before renormalizing (for the KL).
PROBABILITY_FLOOR = 1e-6


@dataclass(frozen=True)
class RidgeProbe:
    """An affine map ``features @ weight + bias`` fitted by ridge regression.

    Attributes:
        weight: ``[d, k]`` float64.
        bias: ``[k]`` float64 (unpenalized: features and targets are centered first).
        alpha: the ridge strength relative to the mean feature variance.
    """

    weight: Tensor
    bias: Tensor
    alpha: float

    def predict(self, features: Tensor) -> Tensor:
        """``[..., d] -> [..., k]`` float64."""
        return features.double() @ self.weight + self.bias


class RidgeSolver:
    """Ridge regressions of any targets on one set of features, in float64, closed form.

    The features are centered and their Gram matrix eigendecomposed once; each fit is then
    two small matrix products, for any target and ridge strength. The intercept is not
    penalized (features and targets are centered).

    Args:
        features: ``[N, d]``.
    """

    def __init__(self, features: Tensor) -> None:
        x = features.double()
        self.mean = x.mean(0)  # [d]
        self.centered = x - self.mean  # [N, d]
        gram = self.centered.T @ self.centered  # [d, d]
        eigenvalues, self.eigenvectors = torch.linalg.eigh(gram)  # [d], [d, d]
        self.eigenvalues = eigenvalues.clamp_min(0.0)  # a PSD matrix; rounding can dip below 0
        self.scale = (gram.trace() / gram.shape[0]).item()  # mean sum of squares per feature

    def fit(self, targets: Tensor, *, alpha: float) -> RidgeProbe:
        """Fit ``[N, k]`` targets with penalty ``lambda = alpha * trace(Xc^T Xc) / d``
        (relative to the mean sum of squares per feature, so ``alpha`` is scale-free)."""
        y = targets.double()
        y_mean = y.mean(0)  # [k]
        penalty = max(alpha * self.scale, 1e-12)  # constant features: a tiny penalty keeps it solvable
        rotated = self.eigenvectors.T @ (self.centered.T @ (y - y_mean))  # [d, k]
        weight = self.eigenvectors @ (rotated / (self.eigenvalues + penalty)[:, None])  # [d, k]
        return RidgeProbe(weight, y_mean - self.mean @ weight, alpha)


def fit_ridge(features: Tensor, targets: Tensor, *, alpha: float) -> RidgeProbe:
    """Closed-form ridge regression of ``[N, k]`` targets on ``[N, d]`` features (see :class:`RidgeSolver`)."""
    return RidgeSolver(features).fit(targets, alpha=alpha)


def r2_score(predictions: Tensor, targets: Tensor) -> float:
    """Coefficient of determination pooled over outputs: ``1 - SSE / SST``.

    ``[N, k]`` (or ``[N]``) each; ``SST`` is around the targets' own mean per output, so a
    constant prediction of that mean scores 0 and a perfect one 1 (the variance-weighted
    R² of several outputs).
    """
    y = targets.double()
    sse = (predictions.double() - y).square().sum()
    sst = (y - y.mean(0)).square().sum()
    return (1.0 - sse / sst).item() if sst > 0 else float("nan")


def fit_ridge_validated(
    features: Tensor,
    targets: Mapping[str, Tensor],
    *,
    alphas: Sequence[float] = ALPHAS,
    validation_fraction: float = 0.2,
) -> dict[str, RidgeProbe]:
    """For each target, choose the ridge strength on held-out sequences, then refit on all.

    Args:
        features: ``[n_sequences, P, d]``.
        targets: ``{name: [n_sequences, P, k]}``.
        alphas: strengths tried (see :meth:`RidgeSolver.fit`).
        validation_fraction: share of the sequences (the last ones) held out to choose.

    Returns:
        ``{name: probe}`` fitted on every sequence with the chosen strength.
    """
    n = features.shape[0]
    n_fit = n - max(1, round(validation_fraction * n))
    fit_solver = RidgeSolver(features[:n_fit].flatten(0, 1))
    all_solver = RidgeSolver(features.flatten(0, 1))
    validation = features[n_fit:].flatten(0, 1)
    probes = {}
    for name, y in targets.items():
        scores = [
            r2_score(fit_solver.fit(y[:n_fit].flatten(0, 1), alpha=a).predict(validation), y[n_fit:].flatten(0, 1))
            for a in alphas
        ]
        best = max(range(len(alphas)), key=lambda i: scores[i] if scores[i] == scores[i] else -math.inf)  # NaN: worst
        probes[name] = all_solver.fit(y.flatten(0, 1), alpha=alphas[best])
    return probes


def _as_distribution(probe_output: Tensor) -> Tensor:
    """``[..., C]`` regression output -> a distribution: clip at the floor, renormalize."""
    clipped = probe_output.clamp_min(PROBABILITY_FLOOR)
    return clipped / clipped.sum(-1, keepdim=True)


def centered_log(posterior: Tensor) -> Tensor:
    """``[..., C]`` probabilities -> ``log(max(p, floor))`` minus its mean over the classes."""
    log = posterior.double().clamp_min(PROBABILITY_FLOOR).log()
    return log - log.mean(-1, keepdim=True)


def probe_layer(
    features: Tensor, posterior: Tensor, entropy: Tensor, *, train_fraction: float = TRAIN_FRACTION
) -> dict[str, float]:
    """Fit and score the posterior and entropy probes on one layer's residual stream.

    Args:
        features: ``[n_sequences, P, d]`` the residual stream at the supervised positions.
        posterior: ``[n_sequences, P, C]`` float64 exact posterior.
        entropy: ``[n_sequences, P]`` float64 its entropy in bits.
        train_fraction: the first sequences fit the probes, the rest score them.

    Returns:
        ``posterior_r2``, ``posterior_kl_bits`` (mean over test positions of
        KL(posterior || clipped, renormalized probe)), ``log_posterior_r2`` (on the
        centered, floored log-posterior), ``log_posterior_kl_bits`` (KL(posterior ||
        softmax(probe))), ``entropy_r2``, ``entropy_mae_bits`` (mean |probe - H|), and the
        chosen ``posterior_alpha``, ``log_posterior_alpha`` and ``entropy_alpha``.
    """
    n_train = round(train_fraction * features.shape[0])
    if not 2 <= n_train < features.shape[0]:
        raise ValueError(f"need at least 2 training and 1 test sequence; got {features.shape[0]} sequences")
    train, test = slice(0, n_train), slice(n_train, None)
    log_posterior = centered_log(posterior)  # [n, P, C]
    targets = {"posterior": posterior[train], "log_posterior": log_posterior[train], "entropy": entropy[train, :, None]}
    probes = fit_ridge_validated(features[train], targets)
    posterior_probe, log_probe, entropy_probe = probes["posterior"], probes["log_posterior"], probes["entropy"]
    predicted_posterior = posterior_probe.predict(features[test])  # [n_test, P, C]
    predicted_log = log_probe.predict(features[test])  # [n_test, P, C]
    predicted_entropy = entropy_probe.predict(features[test])[..., 0]  # [n_test, P]
    return {
        "posterior_r2": r2_score(predicted_posterior.flatten(0, 1), posterior[test].flatten(0, 1)),
        "posterior_kl_bits": kl_bits(posterior[test], _as_distribution(predicted_posterior)).mean().item(),
        "log_posterior_r2": r2_score(predicted_log.flatten(0, 1), log_posterior[test].flatten(0, 1)),
        "log_posterior_kl_bits": kl_bits(posterior[test], torch.softmax(predicted_log, dim=-1)).mean().item(),
        "entropy_r2": r2_score(predicted_entropy.flatten(), entropy[test].flatten()),
        "entropy_mae_bits": (predicted_entropy - entropy[test]).abs().mean().item(),
        "posterior_alpha": posterior_probe.alpha,
        "log_posterior_alpha": log_probe.alpha,
        "entropy_alpha": entropy_probe.alpha,
    }


def _probe_points(model: SequenceModel) -> list[tuple[int, str, str]]:
    """``(layer, label, activation)`` for each depth probed: layer -1 is the embedding,
    layer ``n_layers`` the final LayerNorm, which the head reads linearly."""
    points = [(-1, "input", "blocks.0.resid_pre")]  # token + position embedding
    points += [(layer, f"block {layer}", f"blocks.{layer}.resid_post") for layer in range(model.n_layers)]
    # The logits are exactly linear in ln_final, so the log probe there shows what the probe
    # method itself loses (the floor, the squared loss), against the model's own KL.
    return [*points, (model.n_layers, "ln_final", "ln_final")]


@torch.no_grad()
def _residuals(
    model: SequenceModel, episodes: Sequence[Episode], names: Sequence[str]
) -> tuple[dict[str, Tensor], Tensor]:
    """``{name: [n_sequences, P, d_model]}`` float64 at the supervised positions, and the
    model's own ``[n_sequences, P, C]`` float64 predictive there."""
    chunks: dict[str, list[Tensor]] = {name: [] for name in names}
    predictions = []
    for episode in episodes:
        logits, trace = traced(model, episode.tokens, names, episode.value_inputs)
        predictions.append(torch.softmax(logits[:, episode.positions].double(), dim=-1))  # [B, P, C]
        for name in names:
            chunks[name].append(trace[name][:, episode.positions].double())  # [B, P, d_model]
    return {name: torch.cat(parts) for name, parts in chunks.items()}, torch.cat(predictions)


_SCORES = (
    "posterior_r2",
    "posterior_kl_bits",
    "log_posterior_r2",
    "log_posterior_kl_bits",
    "entropy_r2",
    "entropy_mae_bits",
)
_ALPHAS = ("posterior_alpha", "log_posterior_alpha", "entropy_alpha")


def linear_probes(
    models: Sequence[SequenceModel], episodes: Sequence[Episode], *, train_fraction: float = TRAIN_FRACTION
) -> dict[str, Any]:
    """Ridge probes of the exact posterior and its entropy at every depth (see the module docstring).

    Args:
        models: runs of one architecture.
        episodes: the sequences; the first ``train_fraction`` of them fit the probes.
        train_fraction: share of sequences used for fitting.

    Returns:
        ``runs``, ``n_train_sequences``, ``n_test_sequences``, ``alphas``,
        ``probability_floor``; ``layers``: per depth ``layer`` (-1 for the embedding,
        ``n_layers`` for the final LayerNorm),
        ``name``, ``activation``, the scores of :func:`probe_layer` (``posterior_r2``,
        ``posterior_kl_bits``, ``log_posterior_r2``, ``log_posterior_kl_bits``,
        ``entropy_r2``, ``entropy_mae_bits``; each mean and std over runs) and the chosen
        ``*_alpha`` per run; ``model_kl_bits``: the model's own KL(posterior || model) on
        the test sequences (mean and std over runs); ``baseline``: ``posterior_kl_bits``
        and ``entropy_mae_bits`` of the constant predictor (the training mean; its R² is
        ~0 by definition).
    """
    if len({m.n_layers for m in models}) != 1:
        raise ValueError("probes average over runs of one architecture; these models differ in depth")
    posterior = torch.cat([e.posterior for e in episodes])  # [n, P, C]
    entropy = torch.cat([e.entropy_bits for e in episodes])  # [n, P]
    n_train = round(train_fraction * posterior.shape[0])
    points = _probe_points(models[0])
    per_run, model_kl = [], []
    for model in models:
        residuals, predictive = _residuals(model, episodes, [name for _, _, name in points])
        per_run.append(
            [probe_layer(residuals[name], posterior, entropy, train_fraction=train_fraction) for _, _, name in points]
        )
        model_kl.append(kl_bits(posterior[n_train:], predictive[n_train:]).mean().item())
    rows = []
    for i, (layer, label, name) in enumerate(points):
        scores = [run[i] for run in per_run]
        row: dict[str, Any] = {"layer": layer, "name": label, "activation": name}
        row.update({key: summarize([s[key] for s in scores]) for key in _SCORES})
        row.update({key: [s[key] for s in scores] for key in _ALPHAS})
        rows.append(row)
    mean_posterior = posterior[:n_train].flatten(0, 1).mean(0)  # [C]
    mean_entropy = entropy[:n_train].mean()
    return {
        "runs": len(models),
        "n_train_sequences": n_train,
        "n_test_sequences": posterior.shape[0] - n_train,
        "alphas": list(ALPHAS),
        "probability_floor": PROBABILITY_FLOOR,
        "layers": rows,
        "model_kl_bits": summarize(model_kl),
        "baseline": {
            "posterior_kl_bits": kl_bits(posterior[n_train:], _as_distribution(mean_posterior)).mean().item(),
            "entropy_mae_bits": (entropy[n_train:] - mean_entropy).abs().mean().item(),
        },
    }


@register("linear_probes")
def linear_probes_of_runs(runs: Sequence[Run]) -> dict[str, Any]:
    """Ridge probes of the exact posterior and its entropy from the residual stream at each depth."""
    return linear_probes([r.model for r in runs], diagnostic_episodes(runs))
