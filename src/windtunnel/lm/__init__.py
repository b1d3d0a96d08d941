"""Pretrained language models in the wind tunnel: their next-token distribution scored against
the exact posterior in bits (:mod:`~windtunnel.lm.score`), the tunnels as text
(:mod:`~windtunnel.lm.text`), the geometric diagnostics on their layers
(:mod:`~windtunnel.lm.geometry`), and the page of a scoring's results (:mod:`~windtunnel.lm.page`).
``windtunnel lm-score`` runs them. Needs the ``lm`` extra (``transformers``, ``gguf``).
"""
