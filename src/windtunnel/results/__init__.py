"""Typed analysis results: one frozen type per analysis, round-tripping through JSON.

:mod:`windtunnel.results.base` holds the conversion, the header every result starts with
(:class:`AnalysisResult`) and the registry :data:`RESULT_TYPES`; each other module holds the
types of one analysis module's results (importing it registers them). The analyses build
these types (:meth:`windtunnel.analysis.Analysis.run`) and the report reads them
(:func:`windtunnel.report.folder.load_results`); this package imports nothing else of windtunnel.
"""

from windtunnel.results import ablation, attention, calibration, classes, dynamics, generalization, keys, manifold, phases, probes  # noqa: F401  (registers the types)
from windtunnel.results.base import (
    RESULT_TYPES,
    AnalysisResult,
    MetricSummaries,
    Metrics,
    ResultError,
    Summary,
    from_json,
    omitted_when_none,
    result_type,
    to_json,
)

__all__ = [
    "RESULT_TYPES", "AnalysisResult", "MetricSummaries", "Metrics", "ResultError", "Summary", "from_json", "omitted_when_none",
    "result_type", "to_json",
]
