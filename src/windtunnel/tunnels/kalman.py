"""A Kalman tunnel: observations of a linear-Gaussian state-space model drawn from a finite
bank of systems, the next observation's exact predictive scored on fixed buckets.

Each sequence draws one of ``K`` stable systems uniformly (the bank: fixed by the tunnel's
parameters and ``bank_seed``) and a fresh path of it::

    x_1 ~ N(0, P_k)      x_{t+1} = A_k x_t + w_t,  w_t ~ N(0, I)      y_t = c_k x_t + v_t,  v_t ~ N(0, r_k)

with state ``x_t`` of dimension ``n`` and scalar observations ``y_t``; ``P_k`` is system
``k``'s stationary state covariance, so each path starts stationary. The bank's prior:
``A_k = rho_k Q_k`` with ``Q_k`` a uniformly random orthogonal matrix and ``rho_k`` uniform
on ``[rho_min, rho_max]`` (every eigenvalue inside the unit circle); ``c_k`` a Gaussian row
scaled so that a fraction ``s_k`` (uniform on ``[signal_min, signal_max]``) of the
observation's variance comes from the state; ``r_k = 1 - s_k``. Every system's stationary
observation variance is therefore 1, and the buckets are fixed on that scale.

**Why the posterior stays exact.** The parameters are not shown: they are one of a finite
set, so the predictive of ``y_{t+1}`` given ``y_1..y_t`` is a Gaussian mixture, one
component per system, its Kalman-filter predictive weighted by the system's posterior
(prior ``1/K`` times the likelihood of the observations so far, the product of the filter's
one-step predictive densities). No parameter is quantized and nothing is approximated; a
header of quantized parameters (the HMM's route) would make the task filtering with known
parameters, and this one asks the model to identify the system in context too.

**What the model reads and predicts.** Token layout (``T = L``), values beside the tokens::

    tokens  BOS  OBS  OBS  ...  OBS
    values   0   y_1  y_2  ...  y_{L-1}

``BOS`` is token 0, ``OBS`` token 1; the observation enters the model as a value through a
linear read-in (:class:`~windtunnel.tunnels.capabilities.ValueInputs`). The observations are
rounded to float32 before anything is computed from them, so the posterior conditions on
exactly the numbers the model reads. At position ``t`` the model predicts ``y_{t+1}`` as a
distribution over ``buckets`` fixed intervals (the "bar distribution" of prior-data fitted
networks): ``buckets - 2`` of equal width on ``[-bound, bound]`` and two unbounded ones
outside it. The exact posterior is the mixture's probability of each bucket, from Gaussian
CDFs in float64, so KL and entropy in bits are exact on the buckets. The target is the bucket
of the observation drawn.

Transformers match the Kalman filter's point prediction in context on linear systems (Goel &
Bartlett, arXiv 2312.06937; Akram & Vikalo, arXiv 2410.16546) and selective SSMs converge to
the Bayes predictive on linear-Gaussian tasks (arXiv 2602.17744); here the whole predictive
distribution is scored against the exact one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar, NamedTuple

import torch
from torch import Tensor

from windtunnel.config import ConfigError, check_field_types
from windtunnel.metrics import entropy_bits
from windtunnel.tunnels.base import Episode, label_with

__all__ = ["KalmanBank", "KalmanEpisode", "KalmanTunnel", "bucket_probabilities", "kalman_predictive"]

#: Token ids: the start of a sequence, and an observation (its value beside it).
BOS, OBS = 0, 1
#: The largest state dimension, bank and bucket count the tunnel accepts (the filter's cost
#: grows with ``n^2``, its memory with ``K * buckets``).
MAX_STATE, MAX_SYSTEMS, MAX_BUCKETS = 16, 256, 1024


class KalmanBank(NamedTuple):
    """The ``K`` systems, float64 on the CPU.

    Attributes:
        A: ``[K, n, n]`` transitions. c: ``[K, n]`` observation rows. r: ``[K]`` observation
        noise variances. P: ``[K, n, n]`` stationary state covariances (``P = A P A^T + I``).
    """

    A: Tensor
    c: Tensor
    r: Tensor
    P: Tensor


@dataclass(frozen=True)
class KalmanEpisode(Episode):
    """An :class:`Episode` plus the hidden system, the observations and the bank they came from.

    Attributes:
        system: ``[B]`` int64 the bank index of each sequence's system.
        observations: ``[B, L]`` float64 ``y_1..y_L`` (float32 values; the last is only a target).
        bank: every system of the tunnel (the prior's support, uniform over it): the exact
            posterior mixes all of them, so a record that shows one could not be checked.
    """

    system: Tensor
    observations: Tensor
    bank: KalmanBank

    def record(self, i: int) -> dict[str, Any]:
        record = super().record(i)
        k = int(self.system[i])
        record["system"] = {"index": k, **{name: matrix[k].tolist() for name, matrix in self.bank._asdict().items()}}
        record["bank"] = {name: matrix.tolist() for name, matrix in self.bank._asdict().items()}
        record["observations"] = self.observations[i].tolist()
        return record


def kalman_predictive(observations: Tensor, bank: KalmanBank) -> tuple[Tensor, Tensor, Tensor]:
    """Every system's one-step predictive of every observation given those before it.

    Args:
        observations: ``[B, L]`` float64.
        bank: the systems (moved to the observations' device).

    Returns:
        ``mean [B, L, K]`` and ``variance [L, K]`` of ``y_i`` given ``y_1..y_{i-1}`` under each
        system (the covariances do not depend on the data), and ``log_weight [B, L, K]``: each
        system's log posterior before ``y_i`` is seen (normalized over ``K``).
    """
    device = observations.device
    A, c, r, P = (t.to(device) for t in bank)
    B, L = observations.shape
    K, n = c.shape
    mean_state = torch.zeros(B, K, n, dtype=torch.float64, device=device)  # E[x_i | y_<i]
    cov = P.clone()  # [K, n, n] Cov[x_i | y_<i]
    means, variances = [], []
    for i in range(L):
        mean = torch.einsum("kn,bkn->bk", c, mean_state)  # [B, K]
        cov_c = torch.einsum("kij,kj->ki", cov, c)  # [K, n]: P c^T
        variance = (cov_c * c).sum(-1) + r  # [K]
        means.append(mean)
        variances.append(variance)
        gain = cov_c / variance[:, None]  # [K, n]
        filtered = mean_state + gain[None] * (observations[:, i, None] - mean)[..., None]  # [B, K, n]
        filtered_cov = cov - gain[:, :, None] * cov_c[:, None, :]  # P - g (P c^T)^T
        mean_state = torch.einsum("kij,bkj->bki", A, filtered)
        cov = A @ filtered_cov @ A.transpose(1, 2) + torch.eye(n, dtype=torch.float64, device=device)
        cov = (cov + cov.transpose(1, 2)) / 2
    mean = torch.stack(means, 1)  # [B, L, K]
    variance = torch.stack(variances, 0)  # [L, K]
    log_density = -0.5 * ((observations[..., None] - mean) ** 2 / variance + torch.log(2 * math.pi * variance))
    seen = torch.cumsum(log_density, 1) - log_density  # [B, L, K]: the log-likelihood of y_<i
    return mean, variance, torch.log_softmax(seen, -1)


def bucket_probabilities(mean: Tensor, std: Tensor, edges: Tensor) -> Tensor:
    """``[..., C]`` float64: the probability that ``N(mean, std^2)`` falls in each of the
    ``C = len(edges) + 1`` buckets the inner ``edges`` cut (the outer two unbounded).

    A bucket above the mean is the difference of two upper-tail probabilities, one below of
    two lower-tail ones: far tails keep their relative precision instead of vanishing as
    ``1 - 1``. The tail is ``erfc(-z / sqrt 2) / 2``: ``torch.special.ndtr`` goes through
    ``erf`` and loses the tail (2% wrong at 8 standard deviations, 0 at 12)."""
    z = (edges - mean[..., None]) / std[..., None]  # [..., C - 1]
    infinity = torch.full_like(z[..., :1], math.inf)
    z = torch.cat([-infinity, z, infinity], -1)
    low, high = z[..., :-1], z[..., 1:]
    return torch.where(low > 0, _lower_tail(-low) - _lower_tail(-high), _lower_tail(high) - _lower_tail(low))


def _lower_tail(z: Tensor) -> Tensor:
    """``Phi(z)``, the standard normal CDF, to full relative precision for negative ``z``."""
    return 0.5 * torch.special.erfc(-z / math.sqrt(2.0))


@dataclass(frozen=True)
class KalmanTunnel:
    """Scalar observations of a stable linear-Gaussian system drawn per sequence from a bank.

    Args:
        n: state dimension (``1..16``).
        K: systems in the bank (``1..256``), drawn uniformly per sequence.
        L: observations predicted per sequence (the horizon).
        buckets: buckets of the predictive (``3..1024``; the outer two unbounded).
        bound: the inner buckets cover ``[-bound, bound]`` (the stationary observation sd is 1).
        rho_min, rho_max: each system's spectral radius is uniform on this range (``0 < rho < 1``).
        signal_min, signal_max: the share of the observation's variance from the state is
            uniform on this range (``0 < s < 1``; the rest is observation noise).
        bank_seed: seeds the bank's draw (the bank is part of the task, like ``K``).
    """

    name: ClassVar[str] = "kalman"
    primitive: ClassVar[str] = "Gaussian filtering"

    n: int = 2
    K: int = 4
    L: int = 32
    buckets: int = 32
    bound: float = 4.0
    rho_min: float = 0.5
    rho_max: float = 0.95
    signal_min: float = 0.5
    signal_max: float = 0.9
    bank_seed: int = 0

    def __post_init__(self) -> None:
        check_field_types(self)
        for name, value, top in (("n", self.n, MAX_STATE), ("K", self.K, MAX_SYSTEMS)):
            if not 1 <= value <= top:
                raise ConfigError(f"{name}={value} is out of range: need 1 <= {name} <= {top}")
        if not 3 <= self.buckets <= MAX_BUCKETS:
            raise ConfigError(f"buckets={self.buckets} is out of range: need 3 <= buckets <= {MAX_BUCKETS}")
        if not self.bound > 0 or math.isinf(self.bound):  # also refuses NaN
            raise ConfigError(f"bound={self.bound} is out of range: need a finite bound > 0")
        for low, high in (("rho_min", "rho_max"), ("signal_min", "signal_max")):
            a, b = getattr(self, low), getattr(self, high)
            if not 0 < a <= b < 1:
                raise ConfigError(f"{low}={a}, {high}={b} are out of range: need 0 < {low} <= {high} < 1")
        self.check_horizon(self.L, name="L")

    def check_horizon(self, horizon: int, *, name: str = "horizon") -> None:
        """Raise :class:`ConfigError` unless ``horizon`` observations can be predicted."""
        if horizon < 1:
            raise ConfigError(f"{name}={horizon} is out of range: need at least 1 observation")

    @cached_property
    def bank(self) -> KalmanBank:
        """The ``K`` systems, drawn once from the stated priors with ``bank_seed``."""
        generator = torch.Generator().manual_seed(self.bank_seed)
        K, n = self.K, self.n
        gaussian = torch.randn(K, n, n, generator=generator, dtype=torch.float64)
        q, upper = torch.linalg.qr(gaussian)
        orthogonal = q * torch.sign(torch.diagonal(upper, dim1=1, dim2=2))[:, None, :]  # Haar-uniform (Mezzadri 2007)
        rho = self.rho_min + (self.rho_max - self.rho_min) * torch.rand(K, generator=generator, dtype=torch.float64)
        A = rho[:, None, None] * orthogonal
        # P = A P A^T + I with A = rho Q, Q orthogonal: P = sum_j rho^(2j) I = I / (1 - rho^2)
        P = torch.eye(n, dtype=torch.float64) / (1.0 - rho**2)[:, None, None]
        c = torch.randn(K, n, generator=generator, dtype=torch.float64)
        signal = self.signal_min + (self.signal_max - self.signal_min) * torch.rand(K, generator=generator, dtype=torch.float64)
        c = c * torch.sqrt(signal / torch.einsum("ki,kij,kj->k", c, P, c))[:, None]
        return KalmanBank(A=A, c=c, r=1.0 - signal, P=P)

    @cached_property
    def edges(self) -> Tensor:
        """``[buckets - 1]`` float64: the inner bucket edges."""
        return torch.linspace(-self.bound, self.bound, self.buckets - 1, dtype=torch.float64)

    @property
    def value_dim(self) -> int:
        """One value per position: the observation."""
        return 1

    @property
    def vocab_size(self) -> int:
        return 2

    @property
    def num_classes(self) -> int:
        return self.buckets

    @property
    def horizon(self) -> int:
        return self.L

    def seq_len(self, horizon: int | None = None) -> int:
        return self.L if horizon is None else horizon

    def prior_predictive(self, n_positions: int) -> Tensor:
        """``[n_positions, buckets]`` float64: the buckets of N(0, 1), the marginal of every
        observation (each system starts stationary with observation variance 1)."""
        one = bucket_probabilities(torch.zeros(1, dtype=torch.float64), torch.ones(1, dtype=torch.float64), self.edges)
        return one.expand(n_positions, -1).clone()

    def sample_bytes(self, batch_size: int, horizon: int | None = None) -> int:
        """The int64 tokens, targets and systems, the float64 values read, observations, entropies
        and posteriors ``[B, L, buckets]`` (the draw's per-system bucket probabilities, ``K`` times
        the posteriors, live only while it is computed)."""
        L = self.seq_len(horizon)
        return batch_size * 8 * (L * (5 + self.buckets) + 1)

    def _path(self, batch_size: int, L: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """``[B]`` systems and ``[B, L]`` float64 observations (float32-representable)."""
        device = generator.device
        A, c, r, P = (t.to(device) for t in self.bank)
        system = torch.randint(self.K, (batch_size,), generator=generator, device=device)
        noise = torch.randn(batch_size, L + 1, self.n, generator=generator, dtype=torch.float64, device=device)
        observation_noise = torch.randn(batch_size, L, generator=generator, dtype=torch.float64, device=device)
        A_b, c_b = A[system], c[system]  # [B, n, n], [B, n]
        state = torch.einsum("bij,bj->bi", torch.linalg.cholesky(P)[system], noise[:, 0])  # x_1 ~ N(0, P)
        observations = torch.empty(batch_size, L, dtype=torch.float64, device=device)
        for i in range(L):
            observations[:, i] = (c_b * state).sum(-1) + torch.sqrt(r[system]) * observation_noise[:, i]
            state = torch.einsum("bij,bj->bi", A_b, state) + noise[:, i + 1]
        return system, observations.float().double()  # the model reads float32: condition on exactly that

    def _component_buckets(self, observations: Tensor) -> tuple[Tensor, Tensor]:
        """Each system's bucket probabilities ``[B, L, K, C]`` and log posterior ``[B, L, K]``."""
        mean, variance, log_weight = kalman_predictive(observations, self.bank)
        edges = self.edges.to(observations.device)
        return bucket_probabilities(mean, variance.sqrt().expand_as(mean), edges), log_weight

    def episode_of(self, system: Tensor, observations: Tensor) -> KalmanEpisode:
        """The episode of the given systems ``[B]`` and observations ``[B, L]`` (float32 values)."""
        B, L = observations.shape
        components, log_weight = self._component_buckets(observations)
        posterior = torch.einsum("blk,blkc->blc", log_weight.exp(), components)
        tokens = torch.full((B, L), OBS, dtype=torch.long, device=observations.device)
        tokens[:, 0] = BOS
        value_inputs = torch.zeros(B, L, 1, dtype=torch.float64, device=observations.device)
        value_inputs[:, 1:, 0] = observations[:, :-1]
        return KalmanEpisode(
            tokens=tokens,
            positions=torch.arange(L, device=observations.device),
            targets=torch.bucketize(observations, self.edges.to(observations.device)),
            posterior=posterior,
            entropy_bits=entropy_bits(posterior),
            value_inputs=value_inputs,
            system=system,
            observations=observations,
            bank=self.bank,
        )

    def sample(self, batch_size: int, *, generator: torch.Generator, horizon: int | None = None) -> KalmanEpisode:
        """Draw ``batch_size`` systems from the bank and ``horizon`` observations from each."""
        L = self.seq_len(horizon)
        self.check_horizon(L)
        return self.episode_of(*self._path(batch_size, L, generator))

    def describe(self) -> str:
        return f"{self.K} systems of state dimension {self.n}, {self.buckets} buckets on ±{self.bound:g}"

    def label(self) -> str:
        return label_with(self, ("n", "K", "L"))

    # --- optional capabilities (windtunnel.tunnels.capabilities) ---------------------

    why_not: ClassVar[dict[str, str]] = {
        "SymbolTokens": "its observations are values read through a linear read-in, not symbol tokens with keys",
        "HypothesisTokens": "no token names a hypothesis: the system is never shown",
        "Relabeling": "its hidden variables are a system index and a continuous state, not labels to permute",
        "ValuePositions": "no position shows an answer apart from the next observation itself",
        "AttentionCategories": "every earlier observation is evidence about the system and the state",
        "ClosedFormEntropy": "the predictive's entropy depends on the observations",
    }

    def position_wise_predictive(self, episode: KalmanEpisode) -> Tensor:
        """``[B, L, buckets]``: the predictive given only the observation at each position. Under
        every system ``(y_t, y_{t+1})`` is Gaussian with unit variances and correlation
        ``c A P c^T``, and ``y_t``'s own density is N(0, 1) under each, so one observation leaves
        the systems equally likely: an equal mixture of ``N(rho_k y_t, 1 - rho_k^2)``. At ``BOS``
        the prior."""
        A, c, _, P = (t.to(episode.observations.device) for t in self.bank)
        correlation = torch.einsum("ki,kij,kjl,kl->k", c, A, P, c)  # [K] lag-1, with unit variances
        current = episode.value_inputs[..., 0]  # [B, L] y_t (0 at BOS, overwritten below)
        mean = current[..., None] * correlation  # [B, L, K]
        std = torch.sqrt(1.0 - correlation**2).expand_as(mean)
        floor = bucket_probabilities(mean, std, self.edges.to(mean.device)).mean(2)  # [B, L, C]
        floor[:, 0] = self.prior_predictive(1)[0].to(floor.device)
        return floor

    def parameter_predictive(self, episode: KalmanEpisode) -> Tensor:
        """``[B, L, buckets]`` the Kalman filter's predictive under each sequence's own system."""
        components, _ = self._component_buckets(episode.observations)
        index = episode.system[:, None, None, None].expand(-1, components.shape[1], 1, components.shape[-1])
        return components.gather(2, index).squeeze(2)
