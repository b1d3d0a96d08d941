"""Analyses of trained models: each a function of models and a fixed evaluation set that
returns plain JSON-able results (see the paper's figures they reproduce in each module)."""
