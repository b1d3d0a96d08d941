"""Evaluation against the exact posterior: how many bits a predictor is away from Bayes.

A *predictor* maps an :class:`~windtunnel.tunnels.Episode` to its predictive
distribution at the supervised positions, ``[B, P, C]`` float64. Models, the exact
posterior (``oracle``: must score 0) and the context-free ``prior`` are all scored the
same way, in one batched forward pass per batch of sequences.

Metrics (SPEC §1), all in bits and reported side by side:

- ``mae_aggregate_bits``: mean over positions of |mean over sequences of (H_model - H_Bayes)|
  (the paper's figure, on sequence-averaged entropies);
- ``mae_bits``: mean over sequences and positions of |H_model - H_Bayes|;
- ``kl_bits``: mean over sequences and positions of KL(posterior || model).

Each comes with a 95% bootstrap interval over sequences (``<name>_ci``), and per-position
curves (``curves``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from windtunnel.metrics import entropy_bits, kl_bits
from windtunnel.models import Trace
from windtunnel.tunnels import Episode, Tunnel

__all__ = [
    "EvalSet",
    "Predictor",
    "evaluate",
    "model_predictor",
    "oracle_predictor",
    "prior_predictor",
    "score",
    "score_relabeling",
]

Predictor = Callable[[Episode], Tensor]  # episode -> [B, P, C] float64 probabilities

#: Names of the scalar metrics, in report order.
METRICS = ("mae_aggregate_bits", "mae_bits", "kl_bits")


@dataclass(frozen=True)
class EvalSet:
    """A fixed held-out set: ``n`` sequences at one horizon, drawn from their own seed.

    The same ``(tunnel, horizon, n, seed)`` always gives the same sequences, so
    evaluations at different checkpoints (or of different models) see identical data.
    """

    episodes: tuple[Episode, ...]
    horizon: int

    @classmethod
    def draw(cls, tunnel: Tunnel, *, horizon: int, n: int, batch_size: int, seed: int) -> EvalSet:
        generator = torch.Generator().manual_seed(seed * 1_000_003 + horizon)  # one stream per horizon
        sizes = [min(batch_size, n - start) for start in range(0, n, batch_size)]
        return cls(tuple(tunnel.sample(size, generator=generator, horizon=horizon) for size in sizes), horizon)


def model_predictor(
    model: torch.nn.Module, *, device: torch.device | str = "cpu", interventions: Mapping[str, Any] | None = None
) -> Predictor:
    """A predictor that runs ``model`` (in eval mode, without gradients) on the episode's tokens.

    Args:
        model: any windtunnel model.
        device: where the forward pass runs.
        interventions: keyword arguments of :class:`~windtunnel.models.Trace` applied to every
            forward (``mask_heads``, ``skip_layers``, ``replace``): an ablated model.
    """

    @torch.no_grad()
    def predict(episode: Episode) -> Tensor:
        was_training = model.training
        model.eval()
        trace = Trace((), **interventions) if interventions else None
        try:
            logits = model(episode.tokens.to(device), trace=trace)[:, episode.positions.to(device)]  # [B, P, C]
        finally:
            model.train(was_training)
        return torch.softmax(logits.double(), dim=-1).cpu()

    return predict


def oracle_predictor(episode: Episode) -> Tensor:
    """The exact posterior itself (scores 0 bits by construction: a check of the pipeline)."""
    return episode.posterior


def prior_predictor(tunnel: Tunnel) -> Predictor:
    """The context-free predictor: the tunnel's prior predictive, ignoring every token."""

    def predict(episode: Episode) -> Tensor:
        prior = tunnel.prior_predictive(len(episode.positions))  # [P, C]
        return prior.expand(episode.batch_size, *prior.shape)

    return predict


def score(predictions: Sequence[Tensor], episodes: Sequence[Episode], *, bootstrap: int = 0, seed: int = 0) -> dict[str, Any]:
    """Metrics of predictions ``[B, P, C]`` against the episodes' exact posteriors.

    Args:
        predictions: one tensor per episode, float64 probabilities.
        episodes: the episodes they predict.
        bootstrap: resamples of sequences for 95% intervals (0: no intervals).
        seed: seed of the bootstrap resampling.
    """
    h_model = torch.cat([entropy_bits(p) for p in predictions])  # [N, P]
    h_bayes = torch.cat([e.entropy_bits for e in episodes])  # [N, P]
    kl = torch.cat([kl_bits(e.posterior, p) for p, e in zip(predictions, episodes)])  # [N, P]
    error = h_model - h_bayes  # [N, P]
    result: dict[str, Any] = {
        "n": h_model.shape[0],
        "mae_aggregate_bits": error.mean(0).abs().mean().item(),
        "mae_bits": error.abs().mean().item(),
        "kl_bits": kl.mean().item(),
    }
    if bootstrap:
        # Resampling sequences with replacement = multinomial weights over sequences.
        N = h_model.shape[0]
        generator = torch.Generator().manual_seed(seed)
        draws = torch.randint(0, N, (bootstrap, N), generator=generator)
        weights = torch.zeros(bootstrap, N, dtype=torch.float64).scatter_add_(
            1, draws, torch.ones(bootstrap, N, dtype=torch.float64)
        ) / N  # [R, N]
        resampled = {
            "mae_aggregate_bits": (weights @ error).abs().mean(1),  # [R]
            "mae_bits": weights @ error.abs().mean(1),
            "kl_bits": weights @ kl.mean(1),
        }
        for name, values in resampled.items():
            low, high = torch.quantile(values, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
            result[f"{name}_ci"] = [low, high]
    result["curves"] = {
        "model_entropy_bits": h_model.mean(0).tolist(),
        "bayes_entropy_bits": h_bayes.mean(0).tolist(),
        "abs_error_bits": error.abs().mean(0).tolist(),
        "kl_bits": kl.mean(0).tolist(),
    }
    return result


def evaluate(
    predictor: Predictor,
    eval_set: EvalSet,
    *,
    tunnel: Tunnel | None = None,
    bootstrap: int = 0,
    seed: int = 0,
    references: bool = True,
) -> dict[str, Any]:
    """Score ``predictor`` on ``eval_set``; with ``references`` also the ``oracle`` and ``prior`` rows.

    Returns:
        ``score(...)`` of the predictor, plus ``oracle`` and ``prior`` sub-results (scalars only).
    """
    episodes = eval_set.episodes
    result = score([predictor(e) for e in episodes], episodes, bootstrap=bootstrap, seed=seed)
    if references:
        if tunnel is None:
            raise ValueError("evaluate(references=True) needs the tunnel for the prior row")
        for name, reference in (("oracle", oracle_predictor), ("prior", prior_predictor(tunnel))):
            scored = score([reference(e) for e in episodes], episodes, bootstrap=bootstrap, seed=seed)
            result[name] = {k: v for k, v in scored.items() if k != "curves"}
    return result


def _per_sequence_mae(predictions: Sequence[Tensor], episodes: Sequence[Episode]) -> Tensor:
    """``[N]`` mean over positions of |H_model - H_Bayes| for each sequence."""
    return torch.cat([(entropy_bits(p) - e.entropy_bits).abs().mean(1) for p, e in zip(predictions, episodes)])


def score_relabeling(predictor: Predictor, eval_set: EvalSet, tunnel: Any, *, seed: int, bootstrap: int = 1000) -> dict[str, Any]:
    """Per-sequence MAE on the held-out sequences and on the same sequences under a random
    relabeling of the hidden states (SPEC §3; Fig 8). A model that filters keeps ΔMAE ≈ 0.

    Returns:
        means before and after, the mean difference (after - before) with its 95% bootstrap
        interval, and the per-sequence values (for the scatter plot).
    """
    generator = torch.Generator().manual_seed(seed + 7)
    relabeled = [
        tunnel.relabel(e, torch.rand(e.batch_size, tunnel.S, generator=generator).argsort(dim=1)) for e in eval_set.episodes
    ]
    before = _per_sequence_mae([predictor(e) for e in eval_set.episodes], eval_set.episodes)  # [N]
    after = _per_sequence_mae([predictor(e) for e in relabeled], relabeled)  # [N]
    delta = after - before
    draws = torch.randint(0, len(delta), (max(bootstrap, 1), len(delta)), generator=generator)
    low, high = torch.quantile(delta[draws].mean(1), torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return {
        "mae_bits_before": before.mean().item(),
        "mae_bits_after": after.mean().item(),
        "delta_mae_bits": delta.mean().item(),
        "delta_mae_bits_ci": [low, high],
        "per_sequence_before": before.tolist(),
        "per_sequence_after": after.tolist(),
    }
