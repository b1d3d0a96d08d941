"""Figures drawn from saved analysis results (JSON), never from models.

Each ``plot_<analysis>(result, path)`` takes the dict an analysis returned (as read back
from its ``<name>.json``) and writes a PNG; ``@figure(name)`` registers it in
:data:`FIGURES`. The plots live beside their analyses' concepts: ``ablation``,
``generalization``, ``calibration``, ``dynamics``, ``geometry``.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers and CI
import matplotlib.pyplot as plt  # noqa: E402

from windtunnel.files import atomic_write_bytes  # noqa: E402

__all__ = ["FIGURES", "figure", "save"]

#: Figure function for each analysis name: ``plot(result, path)`` writes a PNG.
FIGURES: dict[str, Callable[[dict[str, Any], Path], None]] = {}


#: Pixels per inch of the saved PNGs.
SAVE_DPI = 120


def figure(name: str) -> Callable:
    """Decorator: register ``plot(result, path)`` as the figure of analysis ``name``."""

    def decorate(plot: Callable[[dict[str, Any], Path], None]) -> Callable:
        FIGURES[name] = plot
        return plot

    return decorate


def save(fig: plt.Figure, path: Path, *, tight: bool = True, **savefig_options: Any) -> None:
    """Write ``fig`` as a PNG and free it. ``tight=False`` for figures that lay themselves
    out (``layout="constrained"``, nested grids), which ``tight_layout`` would undo;
    ``savefig_options`` go to ``savefig``. The file is replaced atomically. The saved image is cropped or grown to what the
    figure draws (``bbox_inches="tight"``), so a title wider than its figure is never clipped."""
    if tight:
        fig.tight_layout()
    # Drawn in memory, then written at once: a kill leaves the old figure or the new one, never a piece.
    image = io.BytesIO()
    try:
        fig.savefig(image, format="png", dpi=SAVE_DPI, **{"bbox_inches": "tight", "pad_inches": 0.05, **savefig_options})
    finally:
        plt.close(fig)
    atomic_write_bytes(Path(path), image.getvalue())


# Importing the plotting modules registers their figures.
from windtunnel.figures import ablation, calibration, dynamics, generalization, geometry, phases  # noqa: E402, F401  isort: skip
