"""windtunnel: Bayesian wind tunnels.

In-context prediction tasks whose exact Bayesian posterior is known at every position
(:mod:`windtunnel.tunnels`), small sequence models trained on them, and measurements in
bits of how closely the models match the posterior. See the README and docs/ for the map.
"""

__version__ = "0.1.0"
