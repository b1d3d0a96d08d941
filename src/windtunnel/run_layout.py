"""Where everything lives on disk: the files of a run directory and of a reproduction folder.

A leaf module (it imports nothing of windtunnel), so that every module that reads or writes
these folders, from the trainer to the report, names them from one place::

    RUN_DIR/                      windtunnel train --out RUN_DIR
      config.json                 the resolved run config
      metrics.jsonl               one JSON record per logged step and evaluation
      eval.json                   windtunnel eval's last result
      provenance.json             where and how each start trained
      resume.safetensors          the training state to resume from
      checkpoints/step_N/         snapshots (the training-dynamics analysis reads them)
      weights/                    the final weights alone, where the training state was dropped
        model.safetensors.index.json   their index (tensor -> shard), written last
      tracking.json               the W&B / MLflow run ids
      analysis/<name>.json|png    windtunnel analyze RUN_DIR

    OUT/                          windtunnel reproduce --out OUT
      reproduce.json              the manifest (report.folder.Manifest)
      runs/<run>/                 a run directory per planned run; runs/logs/<run>.log its output
      analysis/<group>/           the analyses of each group; analysis_at_init/<group>/ the same of
                                  the runs' initial weights
      report/                     index.html, report.md, figures/
"""

from __future__ import annotations

__all__ = [
    "ANALYSIS_DIR", "CONFIG_FILE", "EVAL_FILE", "INIT_DIR", "LOGS_DIR", "MANIFEST_FILE", "METRICS_FILE",
    "PROVENANCE_FILE", "REPORT_DIR", "RESUME_FILE", "RUNS_DIR", "SNAPSHOT_DIR", "TRACKING_FILE", "WEIGHTS_DIR",
    "WEIGHTS_INDEX",
]

# --- a run directory -----------------------------------------------------------------
CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
EVAL_FILE = "eval.json"
PROVENANCE_FILE = "provenance.json"
RESUME_FILE = "resume.safetensors"
SNAPSHOT_DIR = "checkpoints"
WEIGHTS_DIR = "weights"
#: The sharded-safetensors index that Hugging Face's tools read (``weight_map``: tensor -> file).
WEIGHTS_INDEX = "model.safetensors.index.json"
TRACKING_FILE = "tracking.json"
#: Analyses: a run directory's own (windtunnel analyze), or a reproduction's, one folder per group.
ANALYSIS_DIR = "analysis"

# --- a reproduction folder -----------------------------------------------------------
MANIFEST_FILE = "reproduce.json"
RUNS_DIR = "runs"
LOGS_DIR = "logs"  # under RUNS_DIR
INIT_DIR = "analysis_at_init"
REPORT_DIR = "report"
