"""The plug-in contract, executable: what every tunnel and every model family must do, checked
on the plug-in itself.

``check_tunnel(tunnel)`` draws from a tunnel and checks:

- **shapes and types**: ``tokens [B, T]`` int64 within the vocabulary with ``T = seq_len()``,
  ``positions [P]`` within ``T``, ``targets [B, P]`` within the classes, ``posterior
  [B, P, C]`` and ``entropy_bits [B, P]`` in float64;
- **normalization**: every posterior row is a distribution, its entropy is the one stated,
  and the target drawn at a position has positive posterior probability (the exact posterior
  cannot rule out what happened); ``prior_predictive`` rows are distributions;
- **determinism from the generator**: the same seed gives the same draw, bit for bit, and
  another seed another draw;
- **the device rule**: every tensor is made on the generator's device. Under
  ``torch.device("meta")``, a factory call that forgets ``device=generator.device`` makes a
  meta tensor, so a draw from a CPU generator made under it must come out on the CPU and
  equal to the normal draw (no GPU needed to check it);
- **memory**: ``sample_bytes(B)`` is the bytes of the draw's per-sequence tensors;
- **words**: ``describe()`` (the task variant) and ``label()`` (the name with its sizing
  parameters) are one-line texts, the label starting with the tunnel's name: the report
  prints them and knows nothing else of a tunnel.

``check_model_family(kind)`` builds the family with its default config (a capacity-matched
control: matched to a small transformer) and checks:

- **full initialization coverage**: the generator fixes every parameter and buffer. Built
  twice from one seed with the global random stream in two different states, the two models
  are identical; a parameter a family forgets to initialize from the generator (left to
  ``nn.Linear``'s own reset, which reads the global stream) differs and fails;
- another seed gives other weights, every one finite;
- the forward pass gives finite float logits ``[B, T, C]``, and the family declares its
  ``kind`` and a ``role`` (``subject`` or ``control``).

Each check raises :class:`ContractError` naming the plug-in and the rule it breaks. The test
suite runs both over every registered plug-in (``tests/contract/test_contract.py``); a new tunnel or
family is checked by the same call, with no test to edit::

    from windtunnel.contract import check_model_family, check_tunnel
    check_tunnel(MyTunnel())
    check_model_family("my_family")
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from windtunnel.models import build_model, model_class
from windtunnel.tunnels import Episode
from windtunnel.tunnels.capabilities import value_dim_of

__all__ = ["ContractError", "check_draws_on_generator_device", "check_model_family", "check_tunnel"]

#: Float64 sums of a few dozen probabilities: rounding is about 1e-16 per term.
PROBABILITY_TOLERANCE = 1e-9


#: The config a capacity-matched control is checked with: its defaults, matched to a small transformer.
SMALL_MATCHED_CONTROL = {"d_model": 64, "matched_to": {"n_layers": 4, "n_heads": 4, "d_model": 64, "d_mlp": 256}}


class ContractError(AssertionError):
    """A plug-in breaks a rule of the contract (the message names the plug-in and the rule)."""


def _require(condition: bool, who: str, rule: str) -> None:
    if not condition:
        raise ContractError(f"{who}: {rule}")


def _tensor_fields(episode: Episode) -> dict[str, torch.Tensor]:
    return {f.name: getattr(episode, f.name) for f in dataclasses.fields(episode) if torch.is_tensor(getattr(episode, f.name))}


def check_tunnel(tunnel: Any, *, batch_size: int = 16, seed: int = 0) -> None:
    """Check a tunnel instance against the contract (see the module docstring).

    Raises:
        ContractError: naming the first rule the tunnel breaks.
    """
    who = f"tunnel {getattr(tunnel, 'name', type(tunnel).__name__)!r}"
    vocab, classes, horizon = tunnel.vocab_size, tunnel.num_classes, tunnel.horizon
    _require(all(isinstance(v, int) and v >= 1 for v in (vocab, classes, horizon)), who,
             f"vocab_size, num_classes and horizon must be positive integers (got {vocab}, {classes}, {horizon})")
    episode = tunnel.sample(batch_size, generator=torch.Generator().manual_seed(seed))
    fields = _tensor_fields(episode)
    tokens, positions, targets = episode.tokens, episode.positions, episode.targets
    posterior, entropy = episode.posterior, episode.entropy_bits
    length, n_positions = tunnel.seq_len(), positions.shape[0] if positions.ndim == 1 else -1

    # Shapes and types.
    _require(tokens.dtype == torch.int64 and tuple(tokens.shape) == (batch_size, length), who,
             f"tokens must be int64 [{batch_size}, seq_len()={length}], got {tokens.dtype} {list(tokens.shape)}")
    _require(bool(((tokens >= 0) & (tokens < vocab)).all()), who, f"tokens must lie in [0, vocab_size={vocab})")
    _require(positions.dtype == torch.int64 and n_positions >= 1, who, "positions must be a non-empty int64 vector")
    _require(bool(((positions >= 0) & (positions < length)).all()), who, f"positions must index the sequence [0, {length})")
    _require(targets.dtype == torch.int64 and tuple(targets.shape) == (batch_size, n_positions), who,
             f"targets must be int64 [{batch_size}, {n_positions}], got {targets.dtype} {list(targets.shape)}")
    _require(bool(((targets >= 0) & (targets < classes)).all()), who, f"targets must lie in [0, num_classes={classes})")
    _require(posterior.dtype == torch.float64 and tuple(posterior.shape) == (batch_size, n_positions, classes), who,
             f"posterior must be float64 [{batch_size}, {n_positions}, {classes}], got {posterior.dtype} {list(posterior.shape)}")
    _require(entropy.dtype == torch.float64 and tuple(entropy.shape) == (batch_size, n_positions), who,
             f"entropy_bits must be float64 [{batch_size}, {n_positions}]")
    value_dim, value_inputs = value_dim_of(tunnel), episode.value_inputs
    _require((value_inputs is None) == (value_dim == 0), who,
             "value_inputs must be given exactly when the tunnel declares ValueInputs (value_dim)")
    if value_inputs is not None:
        _require(value_inputs.dtype == torch.float64 and tuple(value_inputs.shape) == (batch_size, length, value_dim), who,
                 f"value_inputs must be float64 [{batch_size}, {length}, value_dim={value_dim}]")
        _require(bool(torch.isfinite(value_inputs).all()) and torch.equal(value_inputs.float().double(), value_inputs), who,
                 "value_inputs must be finite float32 values (the model reads float32: the posterior must condition on those)")

    # Normalization, computed here from the probabilities alone.
    _require(bool((posterior >= 0).all()) and bool(torch.isfinite(posterior).all()), who, "posterior has a negative or non-finite entry")
    row_error = (posterior.sum(-1) - 1).abs().max().item()
    _require(row_error <= PROBABILITY_TOLERANCE, who, f"a posterior row sums to 1 {row_error:+.2e} (must be a distribution)")
    logs = torch.where(posterior > 0, posterior.log2(), torch.zeros_like(posterior))
    entropy_error = (-(posterior * logs).sum(-1) - entropy).abs().max().item()
    _require(entropy_error <= PROBABILITY_TOLERANCE, who, f"entropy_bits differs from the posterior's entropy by {entropy_error:.2e} bits")
    drawn = posterior.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    _require(bool((drawn > 0).all()), who, "a target the sequence drew has posterior probability 0 (the exact posterior rules out what happened)")
    prior = tunnel.prior_predictive(n_positions)
    _require(tuple(prior.shape) == (n_positions, classes) and prior.dtype == torch.float64, who,
             f"prior_predictive({n_positions}) must be float64 [{n_positions}, {classes}]")
    _require(bool((prior >= 0).all()) and (prior.sum(-1) - 1).abs().max().item() <= PROBABILITY_TOLERANCE, who,
             "prior_predictive rows must be distributions")

    # Determinism from the generator.
    again = _tensor_fields(tunnel.sample(batch_size, generator=torch.Generator().manual_seed(seed)))
    _require(again.keys() == fields.keys() and all(torch.equal(again[k], fields[k]) for k in fields), who,
             "two draws from generators seeded alike differ (draw every random number from the generator given)")
    other = _tensor_fields(tunnel.sample(batch_size, generator=torch.Generator().manual_seed(seed + 1)))
    _require(not all(torch.equal(other[k], fields[k]) for k in fields), who, "another seed gives the same draw")

    check_draws_on_generator_device(tunnel, batch_size=batch_size, seed=seed)

    # Memory.
    # The per-sequence tensors (positions, one vector for the batch, is left out).
    held = sum(value.numel() * value.element_size() for name, value in fields.items() if name != "positions")
    _require(tunnel.sample_bytes(batch_size) == held, who,
             f"sample_bytes({batch_size}) = {tunnel.sample_bytes(batch_size)}, but the draw's per-sequence tensors hold {held} bytes")

    # Words.
    for method in ("describe", "label"):
        text = getattr(tunnel, method)()
        _require(isinstance(text, str) and text.strip() != "" and "\n" not in text, who, f"{method}() must give a one-line text, got {text!r}")
    _require(tunnel.label().startswith(tunnel.name), who, f"label() must start with the tunnel's name {tunnel.name!r}")


def check_draws_on_generator_device(tunnel: Any, *, batch_size: int = 16, seed: int = 0) -> None:
    """The device rule alone: a draw from a CPU generator made under ``torch.device("meta")``
    comes out on the CPU, equal to the normal draw, bit for bit.

    Raises:
        ContractError: naming the first tensor made elsewhere, or drawn differently.
    """
    who = f"tunnel {getattr(tunnel, 'name', type(tunnel).__name__)!r}"
    reference = _tensor_fields(tunnel.sample(batch_size, generator=torch.Generator().manual_seed(seed)))
    with torch.device("meta"):
        under_meta = _tensor_fields(tunnel.sample(batch_size, generator=torch.Generator().manual_seed(seed)))
    _require(under_meta.keys() == reference.keys(), who, "a draw under another default device has other fields")
    for name, value in under_meta.items():
        _require(value.device.type == "cpu", who, f"{name} was made on {value.device.type}, not on the generator's device "
                 "(pass device=generator.device to every tensor factory)")
        _require(value.dtype == reference[name].dtype and torch.equal(value, reference[name]), who,
                 f"{name} drawn under another default device differs")


def check_model_family(kind: str, config: Any = None, *, vocab_size: int = 7, num_classes: int = 5, max_len: int = 12) -> None:
    """Check the registered model family ``kind`` against the contract (see the module
    docstring), built from ``config`` (default: its config class's defaults).

    Raises:
        ContractError: naming the first rule the family breaks.
    """
    who = f"model family {kind!r}"
    cls = model_class(kind)
    _require(getattr(cls, "kind", None) == kind, who, f"its class declares kind {getattr(cls, 'kind', None)!r}")
    _require(getattr(cls, "role", None) in ("subject", "control"), who, "it must declare role 'subject' or 'control'")
    if config is None:
        config = {}
        if "matched_to" in {f.name for f in dataclasses.fields(cls.config_class)}:
            config = SMALL_MATCHED_CONTROL  # a capacity-matched control sizes itself to a transformer

    state = torch.random.get_rng_state()  # building reads the global stream (nn.Linear's own reset): restored after
    try:
        _check_built_family(who, kind, config, vocab_size, num_classes, max_len)
    finally:
        torch.random.set_rng_state(state)


def _check_built_family(who: str, kind: str, config: Any, vocab_size: int, num_classes: int, max_len: int) -> None:
    def build(seed: int, global_seed: int) -> torch.nn.Module:
        torch.manual_seed(global_seed)  # a parameter initialized from the global stream moves with this
        return build_model(kind, config, vocab_size=vocab_size, num_classes=num_classes, max_len=max_len,
                           generator=torch.Generator().manual_seed(seed))

    first, second, other = build(0, 1).state_dict(), build(0, 2).state_dict(), build(1, 1).state_dict()
    moved = [name for name in first if not torch.equal(first[name], second[name])]
    _require(not moved, who, f"{', '.join(moved[:3])} not drawn from the generator (it moves with the global random "
             "stream: initialize every parameter in reset_parameters from the generator given)")
    _require(any(not torch.equal(first[name], other[name]) for name in first), who, "another seed gives the same weights")
    broken = [name for name, value in first.items() if value.is_floating_point() and not bool(torch.isfinite(value).all())]
    _require(not broken, who, f"non-finite initial values in {', '.join(broken[:3])}")

    model = build_model(kind, config, vocab_size=vocab_size, num_classes=num_classes, max_len=max_len,
                        generator=torch.Generator().manual_seed(0)).eval()
    tokens = torch.randint(0, vocab_size, (2, max_len), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(tokens)
    _require(tuple(logits.shape) == (2, max_len, num_classes) and logits.is_floating_point(), who,
             f"forward must give float logits [2, {max_len}, {num_classes}], got {logits.dtype} {list(logits.shape)}")
    _require(bool(torch.isfinite(logits).all()), who, "forward gives non-finite logits")
