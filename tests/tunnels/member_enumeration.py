"""An oracle for the model-selection tunnel written apart from it: every member of every class
listed by construction, the consistent ones counted after each pair.

Members are built directly (matchings, partitions into 3-cycles, affine maps), not by filtering
all ``n!`` permutations, so ``n = 12`` (246,400 permutations made of 3-cycles) is enumerable. Only
the class of every permutation is too large past ``n = 9``; there the count of members consistent
with ``d`` distinct pairs of a permutation is the closed form ``(n - d)!`` (the unseen inputs
matched to the unused outputs in any order), and the answer is the seen one or uniform over the
unused outputs.
"""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np

#: The largest ``n`` at which every permutation is listed (9! = 362,880 rows).
LISTED_PERMUTATIONS = 9


def _matchings(elements: tuple[int, ...]) -> list[list[tuple[int, int]]]:
    if not elements:
        return [[]]
    first, rest = elements[0], elements[1:]
    out = []
    for i, partner in enumerate(rest):
        for tail in _matchings(rest[:i] + rest[i + 1:]):
            out.append([(first, partner), *tail])
    return out


def _cycle_partitions(elements: tuple[int, ...]) -> list[list[tuple[int, int, int]]]:
    """Every partition into 3-cycles: the smallest element's cycle has two others, in either orientation."""
    if not elements:
        return [[]]
    first, rest = elements[0], elements[1:]
    out = []
    for i, j in itertools.combinations(range(len(rest)), 2):
        remaining = tuple(v for k, v in enumerate(rest) if k not in (i, j))
        for tail in _cycle_partitions(remaining):
            out.append([(first, rest[i], rest[j]), *tail])
            out.append([(first, rest[j], rest[i]), *tail])
    return out


@functools.cache  # 246,400 rows at n = 12: built once per process, never written to
def class_members(name: str, n: int) -> np.ndarray | None:
    """``[m, n]`` every member ``f`` of class ``name`` on ``Z_n`` (row ``f``, ``f[x]`` the image of
    ``x``); None for every permutation past :data:`LISTED_PERMUTATIONS`."""
    rows: list[list[int]] = []
    if name == "involution":
        for matching in _matchings(tuple(range(n))):
            f = [0] * n
            for a, b in matching:
                f[a], f[b] = b, a
            rows.append(f)
    elif name == "three_cycles":
        for cycles in _cycle_partitions(tuple(range(n))):
            f = [0] * n
            for a, b, c in cycles:
                f[a], f[b], f[c] = b, c, a
            rows.append(f)
    elif name == "rotation":
        rows = [[(x + c) % n for x in range(n)] for c in range(n)]
    elif name == "multiplication":
        rows = [[(c * x) % n for x in range(n)] for c in range(1, n)]
    elif n <= LISTED_PERMUTATIONS:
        rows = [list(f) for f in itertools.permutations(range(n))]
    else:
        return None
    return np.array(rows, dtype=np.int8)


def posteriors_by_counting(n: int, classes: tuple[str, ...], inputs: list[int], outputs: list[int],
                           members: dict[str, np.ndarray | None]) -> tuple[np.ndarray, np.ndarray]:
    """``[L, n]`` the next answer's posterior and ``[L, classes]`` the class posterior before each
    pair: ``w_c`` proportional to (uniform prior) ``|C_c(D)| / |C_c|``, each class's answer the
    share of its consistent members giving it."""
    consistent = dict(members)
    sizes = {c: (math.factorial(n) if m is None else len(m)) for c, m in members.items()}
    answers, weights_by_pair = [], []
    for k, (x, y) in enumerate(zip(inputs, outputs)):
        seen = dict(zip(inputs[:k], outputs[:k]))
        counts, shares = [], []
        for c in classes:
            m = consistent[c]
            if m is None:  # every permutation, past listing: the closed form in the module docstring
                counts.append(math.factorial(n - len(seen)))
                share = np.zeros(n)
                if x in seen:
                    share[seen[x]] = 1.0
                else:
                    unused = [v for v in range(n) if v not in seen.values()]
                    share[unused] = 1.0 / len(unused)
            else:
                counts.append(len(m))
                share = np.bincount(m[:, x], minlength=n) / max(len(m), 1)
            shares.append(share)
        weights = np.array([count / sizes[c] for count, c in zip(counts, classes)])
        weights /= weights.sum()
        weights_by_pair.append(weights)
        answers.append(sum(w * s for w, s in zip(weights, shares)))
        for c in classes:  # keep the members that give this pair
            if consistent[c] is not None:
                consistent[c] = consistent[c][consistent[c][:, x] == y]
    return np.array(answers), np.array(weights_by_pair)
