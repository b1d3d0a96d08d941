"""Training phases of each run: when the error leaves its plateau, when the frame forms, how
fast precision improves after, and the geometry at the end (the paper's future work: "when
the frame forms, how fast precision improves, and how these dynamics depend on depth, width
and data complexity").

Per run, from its training history (the held-out evaluations of ``metrics.jsonl``, every
``train.eval_every`` steps) and its log-spaced weight snapshots:

- **plateau and exit** (:func:`plateau_exit`): the *plateau* is the highest held-out
  ``mae_bits`` once the warm-up is over (a model first learns what needs no in-context
  inference, then sits there); the run has *left* it when its final error is at most
  :data:`LEFT_FACTOR` times lower, and its *exit step* is the first evaluation at which the
  error has come half of the way down from the plateau to the final error, on a log scale
  (below the geometric mean of the two). The definition needs no per-tunnel threshold, so it
  reads alike on every tunnel and size of the grid;
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
from collections.abc import Sequence
from typing import Any

from windtunnel.analysis.base import ANALYSES, Run, model_device, register
from windtunnel.analysis.dynamics import _has_history, training_dynamics
from windtunnel.analysis.keys import expected_abs_cosine
from windtunnel.history import read_metrics

__all__ = ["DISSOCIATION_FACTOR", "LEFT_FACTOR", "MIN_EVALUATIONS", "dissociates", "log_log_slope", "plateau_exit"]

#: Held-out evaluations a run's history needs for its error curve to be read.
MIN_EVALUATIONS = 3
#: A run has left its plateau when its final error is at least this many times below it.
LEFT_FACTOR = 4.0
#: The frame-precision dissociation holds in a run when the error at the frame step is at
#: least this many times the final error (precision still had that far to go).
DISSOCIATION_FACTOR = 2.0


def plateau_exit(
    steps: Sequence[int], errors: Sequence[float], warmup_steps: int, left_factor: float = LEFT_FACTOR
) -> dict[str, Any]:
    """The plateau of an error curve and the step at which it was left.

    Args:
        steps: the evaluation steps, ascending.
        errors: the error (``mae_bits``) at each, positive.
        warmup_steps: evaluations before this step are not the plateau (the model is still
            learning what needs no inference); when none is at or after it, all count.
        left_factor: how many times below the plateau the final error must be.

    Returns:
        ``plateau`` (the highest error from the warm-up's end on), ``final`` (the last
        error), ``left`` (``final * left_factor <= plateau``) and ``exit_step``: the first
        step at or after the plateau's own at which the error is below
        ``sqrt(plateau * final)``; None when the run has not left.
    """
    if len(steps) != len(errors) or not steps:
        raise ValueError(f"need one error per step and at least one of each; got {len(steps)} steps, {len(errors)} errors")
    after = [i for i, step in enumerate(steps) if step >= warmup_steps] or list(range(len(steps)))
    peak = max(after, key=lambda i: errors[i])
    plateau, final = float(errors[peak]), float(errors[-1])
    left = final * left_factor <= plateau
    exit_step = None
    if left:
        halfway = math.sqrt(plateau * final)
        exit_step = next(int(steps[i]) for i in range(peak, len(steps)) if errors[i] < halfway)
    return {"plateau": plateau, "final": final, "left": left, "exit_step": exit_step}


def log_log_slope(steps: Sequence[int], errors: Sequence[float], start_step: int) -> float | None:
    """Least-squares slope of ``log10 error`` on ``log10 step`` over the points from
    ``start_step`` on (steps > 0, errors > 0); None with fewer than three such points."""
    points = [(math.log10(s), math.log10(e)) for s, e in zip(steps, errors) if s >= start_step and s > 0 and e > 0]
    if len(points) < 3:
        return None
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    if spread == 0:
        return None
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / spread


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
        "run_dir": str(run.directory),
        "seed": config.train.seed,
        "eval_steps": steps,
        "eval_mae_bits": errors,
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
        "left_factor": LEFT_FACTOR,
        "dissociation_factor": DISSOCIATION_FACTOR,
        "runs": [_phases_of_run(run) for run in runs],
    }
