"""``windtunnel sample`` prints what a reader needs to check it: each record's exact posterior is
recomputed here from the printed JSON alone (the tunnel's parameters and the sequence's
hypothesis), by a route written apart from the tunnel: counting (bijection, associative recall,
Laplace), hmmlearn's forward-backward on each prefix (HMM), filterpy's Kalman filter over the
printed bank with scipy's normal CDF (Kalman), and enumeration of every class member (model
selection)."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
from filterpy.kalman import KalmanFilter
from hmmlearn import hmm as hmmlearn_hmm
from scipy import stats

from windtunnel.cli import main
from windtunnel.tunnels import TUNNELS, make_tunnel

from member_enumeration import class_members, posteriors_by_counting

#: Rationals and sums of a few dozen float64 terms recomputed in another order (counting,
#: Laplace) agree to rounding; forward-backward and the Kalman recursion in other libraries
#: add the rounding of their own recursions (a few dozen steps, well-conditioned): 1e-9.
EXACT, RECURSIVE = 1e-12, 1e-9


def _records(capsys, name: str, settings: dict[str, object], n: int = 6, seed: int = 1) -> list[dict]:
    args = ["sample", name, "--n", str(n), "--seed", str(seed)]
    for key, value in settings.items():
        args += ["--set", f"{key}={value}"]
    assert main(args) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def _uniform_over(support: list[int], size: int) -> np.ndarray:
    row = np.zeros(size)
    row[support] = 1.0 / len(support)
    return row


def _point(index: int, size: int) -> np.ndarray:
    row = np.zeros(size)
    row[index] = 1.0
    return row


def _bijection(record: dict) -> tuple[np.ndarray, float]:
    V = record["tunnel"]["parameters"]["V"]
    mapping, inputs, outputs = record["mapping"], record["inputs"], record["outputs"]
    assert sorted(mapping) == list(range(V)) and outputs == [mapping[x] for x in inputs]
    asked = list(inputs) + ([record["query"]["input"]] if "query" in record else [])
    rows = []
    for k, x in enumerate(asked):
        seen = dict(zip(inputs[:k], outputs[:k]))
        rows.append(_point(seen[x], V) if x in seen else _uniform_over(sorted(set(range(V)) - set(seen.values())), V))
    return np.array(rows), EXACT


def _assoc_recall(record: dict) -> tuple[np.ndarray, float]:
    values_n = record["tunnel"]["parameters"]["value_vocab"]
    bound = dict(zip(record["keys"], record["values"]))
    assert all(record["mapping"][k] == v for k, v in bound.items())
    free = sorted(set(range(values_n)) - set(bound.values()))
    rows = [_point(bound[q], values_n) if q in bound else _uniform_over(free, values_n) for q in record["queries"]]
    assert record["stored"] == [q in bound for q in record["queries"]]
    return np.array(rows), EXACT


def _laplace(record: dict) -> tuple[np.ndarray, float]:
    parameters = record["tunnel"]["parameters"]
    V, symbols = parameters["V"], record["symbols"]
    k = parameters.get("k", 0)
    concentration = parameters["beta"] if "beta" in parameters else parameters["alpha"]
    rows_printed = np.array(record["rows"])
    assert rows_printed.shape == (V**k, V) and np.allclose(rows_printed.sum(-1), 1.0, atol=EXACT)
    rows = []
    for t in range(len(symbols)):
        if t < k:
            rows.append(np.full(V, 1.0 / V))
            continue
        context = tuple(symbols[t - k:t])
        counts = np.zeros(V)
        for j in range(k, t):
            if tuple(symbols[j - k:j]) == context:
                counts[symbols[j]] += 1
        rows.append((counts + concentration) / (counts.sum() + V * concentration))
    return np.array(rows), EXACT


def _hmm(record: dict) -> tuple[np.ndarray, float]:
    T, E, initial = np.array(record["T"]), np.array(record["E"]), np.array(record["initial"])
    S, M = E.shape
    model = hmmlearn_hmm.CategoricalHMM(n_components=S, n_features=M, init_params="", params="")
    model.startprob_, model.transmat_, model.emissionprob_ = initial, T, E
    observations = np.array(record["observations"])[:, None]
    rows = []
    with warnings.catch_warnings():  # quantized rows may hold zeros: log(0) warns in hmmlearn
        warnings.simplefilter("ignore", RuntimeWarning)
        for t in range(1, len(observations) + 1):  # the filter at t: the smoother of the prefix, at its end
            rows.append(model.predict_proba(observations[:t])[-1])
    return np.array(rows), RECURSIVE


def _kalman(record: dict) -> tuple[np.ndarray, float]:
    parameters, bank, y = record["tunnel"]["parameters"], record["bank"], record["observations"]
    A, c, r, P = (np.array(bank[key]) for key in ("A", "c", "r", "P"))
    system = record["system"]
    assert np.array_equal(A[system["index"]], system["A"]) and r[system["index"]] == system["r"]
    edges = np.linspace(-parameters["bound"], parameters["bound"], parameters["buckets"] - 1)
    K, n = c.shape
    means, variances, log_likelihood = np.zeros((len(y), K)), np.zeros((len(y), K)), np.zeros((len(y), K))
    for k in range(K):
        kf = KalmanFilter(dim_x=n, dim_z=1)
        kf.F, kf.H, kf.Q, kf.R = A[k], c[k][None, :], np.eye(n), np.array([[r[k]]])
        kf.x, kf.P = np.zeros((n, 1)), P[k].copy()
        seen = 0.0
        for t in range(len(y)):
            if t:
                kf.predict()
            means[t, k] = (kf.H @ kf.x).item()
            variances[t, k] = (kf.H @ kf.P @ kf.H.T + kf.R).item()
            log_likelihood[t, k] = seen  # of the observations before t
            seen += stats.norm.logpdf(y[t], means[t, k], math.sqrt(variances[t, k]))
            kf.update(np.array([[y[t]]]))
    weights = np.exp(log_likelihood - log_likelihood.max(1, keepdims=True))
    weights /= weights.sum(1, keepdims=True)
    cdf = stats.norm.cdf(np.concatenate([[-np.inf], edges, [np.inf]])[None, None, :],
                         means[..., None], np.sqrt(variances)[..., None])  # [L, K, buckets + 1]
    return np.einsum("lk,lkc->lc", weights, np.diff(cdf, axis=-1)), RECURSIVE


def _model_selection(record: dict) -> tuple[np.ndarray, float]:
    parameters = record["tunnel"]["parameters"]
    n, classes = parameters["n"], tuple(parameters["classes"])
    mapping, inputs, outputs, sigma = record["mapping"], record["inputs"], record["outputs"], record["relabel"]
    drawn = classes[record["hypothesis_class"]]
    assert mapping in class_members(drawn, n).tolist() and outputs == [mapping[x] for x in inputs]
    answers, class_posterior = posteriors_by_counting(n, classes, inputs, outputs, {c: class_members(c, n) for c in classes})
    np.testing.assert_allclose(record["class_posterior"], class_posterior, atol=EXACT)
    symbols = np.zeros_like(answers)
    symbols[:, sigma] = answers  # value v is shown as symbol sigma(v)
    return symbols, EXACT


ORACLES = {"bijection": _bijection, "assoc_recall": _assoc_recall, "dirichlet": _laplace, "markov": _laplace,
           "hmm": _hmm, "kalman": _kalman, "model_selection": _model_selection}


@pytest.mark.parametrize(("name", "settings"), [
    ("bijection", {"V": 7}),
    ("bijection", {"V": 5, "L": 9, "with_replacement": "true", "query": "true"}),
    ("assoc_recall", {"key_vocab": 6, "value_vocab": 9, "n_pairs": 4, "n_queries": 6, "p_stored": 0.5}),
    ("dirichlet", {"V": 4, "alpha": 0.5, "L": 12}),
    ("markov", {"V": 3, "k": 2, "beta": 2.0, "L": 20}),
    ("hmm", {"S": 3, "M": 4, "K": 12, "floor": 0.05}),
    ("hmm", {"S": 2, "M": 3, "K": 8, "initial": "0.9,0.1"}),
    ("kalman", {"n": 2, "K": 3, "L": 12, "buckets": 9}),
    ("model_selection", {"n": 6, "classes": "involution,three_cycles,rotation", "L": 6}),
    ("model_selection", {"n": 9, "classes": "three_cycles,rotation,bijection", "L": 9, "symbols": "opaque"}),
])
def test_the_posterior_is_recomputed_from_the_printed_record_alone(capsys, name, settings):
    for record in _records(capsys, name, settings):
        expected, tolerance = ORACLES[name](record)
        np.testing.assert_allclose(record["posterior"], expected, atol=tolerance)


@pytest.mark.parametrize("name", sorted(TUNNELS))
def test_every_record_names_its_tunnel_and_every_parameter(capsys, name):
    """The printed parameters rebuild the tunnel that drew the record, for any registered tunnel."""
    for record in _records(capsys, name, {}, n=2):
        described = record["tunnel"]
        assert described["name"] == name and make_tunnel(name, described["parameters"]) == make_tunnel(name)


def test_every_built_in_tunnel_has_an_oracle_here():
    from windtunnel.tunnels import BUILT_IN

    assert {cls.name for cls in BUILT_IN} <= set(ORACLES)


def test_a_record_that_lies_is_caught(capsys):
    """The check fails where it should: a Kalman record whose bank is not the one that drew it."""
    record = _records(capsys, "kalman", {"n": 2, "K": 3, "L": 8, "buckets": 9}, n=1)[0]
    record["bank"]["r"] = [v * 1.5 for v in record["bank"]["r"]]
    record["system"]["r"] = record["bank"]["r"][record["system"]["index"]]
    expected, tolerance = _kalman(record)
    assert np.abs(np.array(record["posterior"]) - expected).max() > 100 * tolerance
