"""Launched by tests/test_training.py under torchrun: train, then save this rank's weights."""

import os
import sys
from pathlib import Path

import safetensors.torch

from windtunnel.run_config import load_run_config
from windtunnel.training.trainer import train

if __name__ == "__main__":
    config_path, run_dir, out_dir = sys.argv[1:4]
    result = train(load_run_config(config_path), Path(run_dir), progress=False)
    weights = {k: v.contiguous() for k, v in result.model.state_dict().items()}
    safetensors.torch.save_file(weights, str(Path(out_dir) / f"rank{os.environ['RANK']}.safetensors"))
