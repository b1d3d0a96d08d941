"""Analyses of trained runs: each a function of loaded runs that returns plain JSON-able
results (see the paper's figures they reproduce in each module), registered by name."""

from windtunnel.analysis.base import ANALYSES, Analysis, Run, eval_set_for, load_runs, register, traced

# Importing each analysis module registers its analyses, in the order they run.
from windtunnel.analysis import ablation, generalization, calibration, keys, manifold, attention, probes, dynamics, classes, phases  # noqa: E402, F401  isort: skip

__all__ = ["ANALYSES", "Analysis", "Run", "eval_set_for", "load_runs", "register", "traced"]
