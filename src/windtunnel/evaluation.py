"""Evaluation against the exact posterior: how many bits a predictor is away from Bayes.

A *predictor* maps an :class:`~windtunnel.tunnels.Episode` to its predictive
distribution at the supervised positions, ``[B, P, C]`` float64, on any device. Models, the
exact posterior (``oracle``: must score 0) and the context-free ``prior`` are all scored the
same way, in one batched forward pass per batch of sequences. Entropies and KL are computed
where the predictions are (on the GPU for a model there); only the per-sequence, per-position
numbers ``[N, P]`` come back to the host, once per evaluation, for the means and intervals.

Metrics (docs/protocol.md §1), all in bits and reported side by side:

- ``mae_aggregate_bits``: mean over positions of |mean over sequences of (H_model - H_Bayes)|
  (the paper's figure, on sequence-averaged entropies);
- ``mae_bits``: mean over sequences and positions of |H_model - H_Bayes|;
- ``kl_bits``: mean over sequences and positions of KL(posterior || model).

Each comes with a bootstrap interval over sequences (``<name>_ci``; 95% unless another
``level`` is asked for), and per-position curves (``curves``). Sequences are the unit of
resampling (:func:`bootstrap_weights`), and the interval is the percentile interval of the
resampled statistic (:func:`percentile_interval`); ``score`` and ``score_relabeling`` share both.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from windtunnel.metrics import entropy_bits, kl_bits
from windtunnel.memory import check_fits
from windtunnel.models import Trace
from windtunnel.tunnels import Episode, Tunnel
from windtunnel.tunnels.capabilities import KnownParameters, PermutationReference, PositionWiseFloor, declares

__all__ = [
    "EvalSet",
    "Predictor",
    "bootstrap_weights",
    "evaluate",
    "loss_gap_bits",
    "model_predictor",
    "oracle_predictor",
    "percentile_interval",
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
        check_fits(f"a held-out set of {n} sequences at horizon {horizon}", tunnel.sample_bytes(n, horizon), "lower --n or eval.n")
        generator = torch.Generator().manual_seed(seed * 1_000_003 + horizon)  # one stream per horizon
        sizes = [min(batch_size, n - start) for start in range(0, n, batch_size)]
        return cls(tuple(tunnel.sample(size, generator=generator, horizon=horizon) for size in sizes), horizon)

    def to(self, device: torch.device | str) -> EvalSet:
        """The same sequences on ``device`` (drawn on the host, so identical on every device;
        moved once, so an evaluation copies nothing to the device)."""
        return EvalSet(tuple(e.to(device) for e in self.episodes), self.horizon)


def model_predictor(
    model: torch.nn.Module, *, device: torch.device | str | None = None, interventions: Mapping[str, Any] | None = None
) -> Predictor:
    """A predictor that runs ``model`` (in eval mode, without gradients) on the episode's tokens.

    Args:
        model: any windtunnel model.
        device: where the forward pass runs (None: where the model's parameters are). The
            probabilities stay there.
        interventions: keyword arguments of :class:`~windtunnel.models.Trace` applied to every
            forward (``mask_heads``, ``skip_layers``, ``replace``): an ablated model.
    """

    where = device if device is not None else next(model.parameters()).device

    @torch.no_grad()
    def predict(episode: Episode) -> Tensor:
        was_training = model.training
        model.eval()
        trace = Trace((), **interventions) if interventions else None
        try:
            values = {} if episode.value_inputs is None else {"values": episode.value_inputs.to(where)}
            logits = model(episode.tokens.to(where), trace=trace, at=episode.positions.to(where), **values)  # [B, P, C]
        finally:
            model.train(was_training)
        return torch.softmax(logits.double(), dim=-1)

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


def bootstrap_weights(n: int, resamples: int, generator: torch.Generator) -> Tensor:
    """``[resamples, n]`` float64: each row the weights of one bootstrap resample of ``n`` sequences.

    A resample draws ``n`` sequences with replacement; sequence ``i``'s weight is the number
    of times it was drawn, divided by ``n`` (multinomial counts; every row sums to 1). A
    weighted mean ``weights @ values`` is then the statistic's mean over each resample.
    """
    draws = torch.randint(0, n, (resamples, n), generator=generator)
    counts = torch.zeros(resamples, n, dtype=torch.float64).scatter_add_(1, draws, torch.ones(resamples, n, dtype=torch.float64))
    return counts / n


def percentile_interval(values: Tensor, level: float = 0.95) -> list[float]:
    """``[low, high]``: the central ``level`` interval of the resampled statistic ``values`` ``[R]``.

    The percentile bootstrap: the ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles
    (linear interpolation between order statistics).
    """
    if not 0 < level < 1:
        raise ValueError(f"level={level} is not a probability strictly between 0 and 1")
    tail = round((1.0 - level) / 2, 12)  # 0.025 exactly for 0.95, not 1 - 0.95's 0.025000000000000022
    return torch.quantile(values, torch.tensor([tail, 1.0 - tail], dtype=torch.float64)).tolist()


def score(
    predictions: Sequence[Tensor], episodes: Sequence[Episode], *, bootstrap: int = 0, seed: int = 0, level: float = 0.95
) -> dict[str, Any]:
    """Metrics of predictions ``[B, P, C]`` against the episodes' exact posteriors.

    Args:
        predictions: one tensor per episode, float64 probabilities, on any device (each is
            scored there against its episode's posterior, moved to it if it is elsewhere).
        episodes: the episodes they predict.
        bootstrap: resamples of sequences for the intervals (0: no intervals).
        seed: seed of the bootstrap resampling.
        level: coverage of the intervals (0.95: 95% intervals).
    """
    h_model = _to_host([entropy_bits(p) for p in predictions])  # [N, P]
    h_bayes = _to_host([e.entropy_bits for e in episodes])  # [N, P]
    kl = _to_host([kl_bits(e.posterior.to(p.device), p) for p, e in zip(predictions, episodes)])  # [N, P]
    error = h_model - h_bayes  # [N, P]
    result: dict[str, Any] = {
        "n": h_model.shape[0],
        "mae_aggregate_bits": error.mean(0).abs().mean().item(),
        "mae_bits": error.abs().mean().item(),
        "kl_bits": kl.mean().item(),
    }
    if bootstrap:
        weights = bootstrap_weights(h_model.shape[0], bootstrap, torch.Generator().manual_seed(seed))  # [R, N]
        resampled = {
            "mae_aggregate_bits": (weights @ error).abs().mean(1),  # [R]: |sequence mean| per position, then mean
            "mae_bits": weights @ error.abs().mean(1),
            "kl_bits": weights @ kl.mean(1),
        }
        for name, values in resampled.items():
            result[f"{name}_ci"] = percentile_interval(values, level)
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
    """Score ``predictor`` on ``eval_set``; with ``references`` also the ``oracle`` and ``prior`` rows,
    the ``position_wise`` row where the tunnel declares
    :class:`~windtunnel.tunnels.capabilities.PositionWiseFloor` and the ``permutation`` row
    where it declares :class:`~windtunnel.tunnels.capabilities.PermutationReference`.

    Returns:
        ``score(...)`` of the predictor, plus those sub-results (scalars only).
    """
    episodes = eval_set.episodes
    predictions = [predictor(e) for e in episodes]
    result = score(predictions, episodes, bootstrap=bootstrap, seed=seed)
    # The oracle that knows each sequence's parameters, once for every row (a Kalman bank refilters)
    known = [tunnel.parameter_predictive(e) for e in episodes] if tunnel is not None and declares(tunnel, KnownParameters) else None
    if known:
        result["loss_gap_bits"] = loss_gap_bits(predictions, episodes, known)
    if references:
        if tunnel is None:
            raise ValueError("evaluate(references=True) needs the tunnel for the prior row")
        references_of = [("oracle", oracle_predictor), ("prior", prior_predictor(tunnel))]
        if declares(tunnel, PositionWiseFloor):  # what a model that mixes no positions can reach
            references_of.append(("position_wise", tunnel.position_wise_predictive))
        if declares(tunnel, PermutationReference):  # what the answers being distinct alone tell
            references_of.append(("permutation", tunnel.permutation_predictive))
        for name, reference in references_of:
            referenced = [reference(e) for e in episodes]
            scored = score(referenced, episodes, bootstrap=bootstrap, seed=seed)
            result[name] = {k: v for k, v in scored.items() if k != "curves"}
            if known:
                result[name]["loss_gap_bits"] = loss_gap_bits(referenced, episodes, known)
    return result


def loss_gap_bits(predictions: Sequence[Tensor], episodes: Sequence[Episode], known: Sequence[Tensor]) -> float:
    """Mean over sequences and positions of the log-loss of ``predictions`` on the targets drawn
    minus that of ``known``, each episode's predictive given its own parameters
    (:class:`~windtunnel.tunnels.capabilities.KnownParameters`), in bits: the loss gap the
    literature reports (Bondaschi et al., arXiv 2502.10178). The exact posterior's own gap is
    the price of not knowing the parameters; a model's is that plus its distance from it."""
    gaps = []
    for p, e, oracle in zip(predictions, episodes, known):
        targets = e.targets.to(p.device)[..., None]
        gaps.append((oracle.to(p.device).gather(-1, targets).log2() - p.gather(-1, targets).log2()).squeeze(-1))
    return _to_host(gaps).mean().item()


def _to_host(per_batch: Sequence[Tensor]) -> Tensor:
    """Batches' ``[B, ...]`` results joined on their device, then one copy to the host."""
    return torch.cat([t.to(per_batch[0].device) for t in per_batch]).cpu()


def _per_sequence_mae(predictions: Sequence[Tensor], episodes: Sequence[Episode]) -> Tensor:
    """``[N]`` mean over positions of |H_model - H_Bayes| for each sequence."""
    return _to_host([(entropy_bits(p) - e.entropy_bits.to(p.device)).abs().mean(1) for p, e in zip(predictions, episodes)])


def _per_sequence_kl(predictions: Sequence[Tensor], episodes: Sequence[Episode]) -> Tensor:
    """``[N]`` mean over positions of KL(posterior || model) for each sequence."""
    return _to_host([kl_bits(e.posterior.to(p.device), p).mean(1) for p, e in zip(predictions, episodes)])


def score_relabeling(
    predictor: Predictor, eval_set: EvalSet, tunnel: Any, *, seed: int, bootstrap: int = 1000, level: float = 0.95
) -> dict[str, Any]:
    """Per-sequence MAE on the held-out sequences and on the same sequences under a random
    relabeling of the hidden states (docs/protocol.md §3; Fig 8). A model that filters keeps ΔMAE ≈ 0.

    ΔMAE ≈ 0 alone does not show filtering: a predictor that ignores the header is exactly
    as (in)accurate after a relabeling. ``mae_bits_prior`` is the scale to read it against:
    the per-sequence MAE of the context-free prior (:func:`prior_predictor`) on the same,
    un-relabeled sequences; a filter's own MAE lies well below it. Entropy cannot see which
    state is which, so ΔMAE is also blind to a predictor bound to state labels; ΔKL
    (``delta_kl_bits``, the same sequences and resamples) is the stricter measure: it
    compares each prediction with the permuted posterior state by state.

    Args:
        predictor: what is scored.
        eval_set: the held-out sequences.
        tunnel: declares :class:`~windtunnel.tunnels.capabilities.Relabeling`.
        seed: seed of the permutations (one per sequence) and of the bootstrap.
        bootstrap: resamples of sequences for the interval of ΔMAE (at least 1 is drawn).
        level: coverage of that interval (0.95: a 95% interval).

    Returns:
        ``mae_bits_before`` / ``mae_bits_after`` (means over sequences), ``delta_mae_bits``
        (mean of after - before) with its bootstrap interval ``delta_mae_bits_ci``,
        ``mae_bits_prior``, the same for KL (``kl_bits_before``, ``kl_bits_after``,
        ``delta_kl_bits``, ``delta_kl_bits_ci``), and ``per_sequence_before`` /
        ``per_sequence_after`` (MAE, for the scatter plot).
    """
    generator = torch.Generator().manual_seed(seed + 7)
    relabeled = [
        tunnel.relabel(e, torch.rand(e.batch_size, tunnel.n_labels, generator=generator).argsort(dim=1)) for e in eval_set.episodes
    ]
    predicted = [predictor(e) for e in eval_set.episodes]
    predicted_relabeled = [predictor(e) for e in relabeled]
    before = _per_sequence_mae(predicted, eval_set.episodes)  # [N]
    after = _per_sequence_mae(predicted_relabeled, relabeled)  # [N]
    kl_before = _per_sequence_kl(predicted, eval_set.episodes)  # [N]
    kl_after = _per_sequence_kl(predicted_relabeled, relabeled)  # [N]
    prior = prior_predictor(tunnel)
    prior_mae = _per_sequence_mae([prior(e) for e in eval_set.episodes], eval_set.episodes)  # [N]
    delta, delta_kl = after - before, kl_after - kl_before
    # The same generator, continued after the permutations: the resamples of sequences.
    weights = bootstrap_weights(len(delta), max(bootstrap, 1), generator)  # [R, N]
    return {
        "mae_bits_before": before.mean().item(),
        "mae_bits_after": after.mean().item(),
        "delta_mae_bits": delta.mean().item(),
        "delta_mae_bits_ci": percentile_interval(weights @ delta, level),
        "mae_bits_prior": prior_mae.mean().item(),
        "kl_bits_before": kl_before.mean().item(),
        "kl_bits_after": kl_after.mean().item(),
        "delta_kl_bits": delta_kl.mean().item(),
        "delta_kl_bits_ci": percentile_interval(weights @ delta_kl, level),
        "per_sequence_before": before.tolist(),
        "per_sequence_after": after.tolist(),
    }
