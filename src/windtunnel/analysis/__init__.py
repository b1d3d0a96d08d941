"""Analyses of trained runs: each a function of loaded runs that returns plain JSON-able
results (see the paper's figures they reproduce in each module), registered by name."""

from windtunnel.analysis.base import ANALYSES, Analysis, Run, eval_set_for, load_runs, register

__all__ = ["ANALYSES", "Analysis", "Run", "eval_set_for", "load_runs", "register"]
