"""Training phases of each run: when the error leaves its plateau, when the frame forms, how
fast precision improves after, and the geometry at the end (the paper's future work: "when
the frame forms, how fast precision improves, and how these dynamics depend on depth, width
and data complexity").

Per run, from its training history (the held-out evaluations of ``metrics.jsonl``, every
``train.eval_every`` steps) and its log-spaced weight snapshots:

- **learning step** (:func:`learning_step`): the first evaluation at which the error has come
  half of the way down (on a log scale) from the first evaluation's to the final one's;
- **plateau and exit** (:func:`plateau_exit`): the *plateau* is the first stretch of
  :data:`PLATEAU_WINDOW` evaluations after the warm-up over which the error is flat (its
  log-log slope above :data:`FLAT_SLOPE`; a model that first learns what needs no in-context
  inference sits there), at the stretch's median error; the run has *left* it when its final
  error is at least :data:`LEFT_FACTOR` times lower, and its *exit step* is the first evaluation
  at which the error has come half of the way down from the plateau to the final error, on a
  log scale. A curve that falls from the start has no plateau. The definitions need no
  per-tunnel threshold, so they read alike on every tunnel and size of the grid;
- **precision after exit** (:func:`log_log_slope`): the least-squares slope of
  ``log10 mae_bits`` against ``log10 step`` over the evaluations from the exit on (a power
  law's exponent; more negative is faster);
- **frame formation**: the first snapshot after which the mean attention-row Jensen-Shannon
  divergence to the final model stays below its threshold
  (:func:`windtunnel.analysis.dynamics.training_dynamics`, the dissociation measure), in a run
  whose attention moved (its initial attention is not already within the threshold of its final);
- **dissociation** (:func:`dissociates`): the frame has formed while the error still had at
  least :data:`DISSOCIATION_FACTOR` times to fall (``mae_bits`` at the frame step over the
  final ``mae_bits``): attention settled before precision did;
- **geometry at the end**: layer 0's key orthogonality (mean |off-diagonal cosine| of the
  token keys, :mod:`windtunnel.analysis.keys`) against the chance level for the head width,
  the last block's residual PC1 (variance share and |Spearman rho| with the exact entropy),
  and each attention layer's entropy and lift on the evidence (:mod:`windtunnel.analysis.attention`).

    from windtunnel.analysis import ANALYSES, load_runs
    result = ANALYSES["training_phases"].run(load_runs(["runs/a_seed0", "runs/a_seed1"]))
    [run.exit_step for run in result.runs]
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from windtunnel.analysis.base import ANALYSES, Run, model_device, register
from windtunnel.analysis.dynamics import _has_history, training_dynamics
from windtunnel.analysis.keys import expected_abs_cosine
from windtunnel.history import read_metrics

__all__ = ["DISSOCIATION_FACTOR", "FLAT_SLOPE", "LEFT_FACTOR", "MIN_EVALUATIONS", "PLATEAU_WINDOW", "dissociates", "learning_step", "log_log_slope", "plateau_exit"]

#: Held-out evaluations a run's history needs for its error curve to be read.
MIN_EVALUATIONS = 3
#: A plateau spans at least this many consecutive held-out evaluations ...
PLATEAU_WINDOW = 6
#: ... over which the error falls by less than this per decade of steps (log-log slope): a power
#: law's tail falls faster (the bijection's: about -1), a plateau drifts (the HMM's: about -0.15).
FLAT_SLOPE = -0.25
#: A run has left its plateau when its final error is at least this many times below it.
LEFT_FACTOR = 2.0
#: The frame-precision dissociation holds in a run when the error at the frame step is at
#: least this many times the final error (precision still had that far to go).
DISSOCIATION_FACTOR = 2.0


def _slope(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of y on x; None with fewer than three points or no spread in x."""
    if len(points) < 3:
        return None
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    if spread == 0:
        return None
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / spread


def log_log_slope(steps: Sequence[int], errors: Sequence[float], start_step: int = 0) -> float | None:
    """Least-squares slope of ``log10 error`` on ``log10 step`` over the points from
    ``start_step`` on (steps > 0, errors > 0); None with fewer than three such points."""
    return _slope([(math.log10(s), math.log10(e)) for s, e in zip(steps, errors) if s >= start_step and s > 0 and e > 0])


def plateau_exit(
    steps: Sequence[int],
    errors: Sequence[float],
    warmup_steps: int,
    *,
    window: int = PLATEAU_WINDOW,
    flat_slope: float = FLAT_SLOPE,
    left_factor: float = LEFT_FACTOR,
) -> dict[str, Any]:
    """The plateau of an error curve and the step at which it was left.

    Args:
        steps: the evaluation steps, ascending.
        errors: the error (``mae_bits``) at each, positive.
        warmup_steps: a plateau starts at or after this step (during the warm-up the model is
            still learning what needs no inference).
        window: evaluations a plateau spans at least.
        flat_slope: a stretch of ``window`` evaluations is flat when the slope of log10 error on
            log10 step over it is above this (it falls by less than this per decade of steps).
        left_factor: how many times below the plateau the final error must be for the run to
            have left it.

    Returns:
        ``plateau_step``: where the first flat stretch from the warm-up's end on starts;
        ``plateau``: its median error; ``final``: the last error; ``left``: ``final *
        left_factor <= plateau``; ``exit_step``: the first step from the plateau's start at which
        the error is below ``sqrt(plateau * final)`` (half of the way down on a log scale). A
        curve with no flat stretch (it falls from the start, as a power law's tail does) has no
        plateau: ``plateau_step``, ``plateau`` and ``left`` are None, and so is ``exit_step``, as
        it is for a run that has not left.
    """
    if len(steps) != len(errors) or not steps:
        raise ValueError(f"need one error per step and at least one of each; got {len(steps)} steps, {len(errors)} errors")
    final = float(errors[-1])
    start = None
    for i, step in enumerate(steps):
        if step < warmup_steps or step <= 0 or i + window > len(steps):
            continue
        slope = log_log_slope(steps[i:i + window], errors[i:i + window])
        if slope is not None and slope > flat_slope:
            start = i
            break
    if start is None:
        return {"plateau_step": None, "plateau": None, "final": final, "left": None, "exit_step": None}
    plateau = float(statistics.median(errors[start:start + window]))
    left = final * left_factor <= plateau
    exit_step = None
    if left:
        halfway = math.sqrt(plateau * final)
        exit_step = next(int(steps[i]) for i in range(start, len(steps)) if errors[i] < halfway)
    return {"plateau_step": int(steps[start]), "plateau": plateau, "final": final, "left": left, "exit_step": exit_step}


def learning_step(steps: Sequence[int], errors: Sequence[float], left_factor: float = LEFT_FACTOR) -> int | None:
    """The first step at which the error has come half of the way (on a log scale) from the first
    evaluation's to the last one's; None where it fell by less than ``left_factor`` in all."""
    first, final = float(errors[0]), float(errors[-1])
    if final * left_factor > first:
        return None
    halfway = math.sqrt(first * final)
    return next(int(step) for step, error in zip(steps, errors) if error < halfway)


def dissociates(error_at_frame: float | None, final_error: float, factor: float = DISSOCIATION_FACTOR) -> bool | None:
    """Whether the frame formed while precision still had ``factor`` times to improve: the
    error at the frame step is at least ``factor`` times the final error. None when the frame
    never formed (no frame step to read)."""
    if error_at_frame is None:
        return None
    return error_at_frame >= factor * final_error


def _geometry(run: Run) -> dict[str, Any]:
    """Layer 0's key orthogonality against chance, and each attention layer's entropy and
    evidence lift, of the final weights (None where the analysis does not apply)."""
    geometry: dict[str, Any] = {"key_cos_layer0": None, "key_cos_chance": None, "d_head": None,
                                "attention_entropy_bits_by_layer": None, "uniform_attention_entropy_bits": None,
                                "evidence_lift_by_layer": None}
    keys = ANALYSES["key_orthogonality"]
    if keys.applies_to([run]) is None:
        result = keys.compute([run])
        measure = result["layers"][0]
        d_head = run.model.d_head
        geometry.update(key_cos_layer0=measure["mean_abs_offdiag_cos"]["mean"], key_cos_chance=expected_abs_cosine(d_head),
                        d_head=d_head)
    sharpening = ANALYSES["qk_sharpening"]
    if sharpening.applies_to([run]) is None:
        result = sharpening.compute([run])
        geometry.update(
            attention_entropy_bits_by_layer=[row["entropy_bits"]["mean"] for row in result["layers"]],
            uniform_attention_entropy_bits=result["uniform_entropy_bits"],
            evidence_lift_by_layer=[row["lift"].get("evidence") for row in result["layers"]]
            if "evidence" in result["categories"] else None,
        )
    return geometry


def _phases_of_run(run: Run) -> dict[str, Any]:
    config = run.config
    evals = [r for r in read_metrics(run.directory) if "eval_mae_bits" in r]
    steps = [int(r["step"]) for r in evals]
    errors = [float(r["eval_mae_bits"]) for r in evals]
    exit_ = plateau_exit(steps, errors, config.train.warmup_steps)
    slope = log_log_slope(steps, errors, exit_["exit_step"]) if exit_["exit_step"] is not None else None
    dynamics = training_dynamics(run.directory, device=model_device(run.model))
    # A frame forms only where the attention moved: one still within the threshold of the final
    # model's at initialization never left its random-init pattern, and "settled at step 0" would
    # say nothing.
    moved = dynamics["attention_jsd_bits"][0] >= dynamics["jsd_threshold_bits"]
    frame = dynamics["stabilization_step"] if moved else None
    at_frame = dynamics["mae_bits_at_stabilization"] if moved else None
    return {
        "run": run.label,
        "run_dir": run.recorded_dir,
        "seed": config.train.seed,
        "eval_steps": steps,
        "eval_mae_bits": errors,
        "learning_step": learning_step(steps, errors),
        "plateau_step": exit_["plateau_step"],
        "plateau_mae_bits": exit_["plateau"],
        "final_mae_bits": exit_["final"],
        "final_kl_bits": float(evals[-1]["eval_kl_bits"]),
        "left_plateau": exit_["left"],
        "exit_step": exit_["exit_step"],
        "slope_after_exit": slope,
        "attention_moved": moved,
        "frame_step": frame,
        "mae_bits_at_frame": at_frame,
        "frame_before_exit": None if frame is None or exit_["exit_step"] is None else frame <= exit_["exit_step"],
        "dissociation": dissociates(at_frame, dynamics["mae_bits_final"]),
        "pc1_variance_explained": dynamics["pc1_variance_explained"][-1],
        "pc1_entropy_spearman_abs": dynamics["pc1_entropy_spearman_abs"][-1],
        **_geometry(run),
    }


def _requires(runs: Sequence[Run]) -> str | None:
    if not runs[0].model.attention_heads:
        return "it reads when attention settles, and these models have none"
    # A curve needs points: the final evaluation alone (train.eval_every = 0) has no plateau to leave.
    few = [run.directory.name for run in runs if sum("eval_mae_bits" in r for r in read_metrics(run.directory)) < MIN_EVALUATIONS]
    if few:
        return (f"it reads the held-out error over training, and {few[0]} has fewer than {MIN_EVALUATIONS} evaluations "
                "(train.eval_every = 0, or too large)")
    return _has_history(runs)


@register("training_phases", needs_attention=True, requires=_requires)
def training_phases(runs: Sequence[Run]) -> dict[str, Any]:
    """Per run: plateau, exit step, slope after it, frame step, dissociation, final geometry."""
    model = runs[0].config.model
    return {
        "n_layers": model.n_layers,
        "d_model": model.d_model,
        "plateau_window": PLATEAU_WINDOW,
        "flat_slope": FLAT_SLOPE,
        "left_factor": LEFT_FACTOR,
        "dissociation_factor": DISSOCIATION_FACTOR,
        "runs": [_phases_of_run(run) for run in runs],
    }
