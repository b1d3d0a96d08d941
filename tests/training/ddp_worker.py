"""Launched by tests/training/test_training.py under torchrun: train, then save this rank's weights and
the token batches this rank trained on (``rank<r>_batches.safetensors``, one tensor per step)."""

import os
import sys
from pathlib import Path

import safetensors.torch

from windtunnel.run_config import load_run_config
from windtunnel.training.trainer import train
from windtunnel.tunnels import BijectionTunnel

if __name__ == "__main__":
    config_path, run_dir, out_dir = sys.argv[1:4]
    config = load_run_config(config_path)
    local_batch = config.train.batch_size // int(os.environ["WORLD_SIZE"])
    batches = []
    sample = BijectionTunnel.sample

    def recording_sample(self, batch_size, **kwargs):
        episode = sample(self, batch_size, **kwargs)
        if batch_size == local_batch and kwargs.get("horizon") is None:  # a training batch, not the held-out set
            batches.append(episode.tokens.clone())
        return episode

    BijectionTunnel.sample = recording_sample
    result = train(config, Path(run_dir), progress=False)
    weights = {k: v.contiguous() for k, v in result.model.state_dict().items()}
    rank = os.environ["RANK"]
    safetensors.torch.save_file(weights, str(Path(out_dir) / f"rank{rank}.safetensors"))
    safetensors.torch.save_file({f"step{i}": b for i, b in enumerate(batches)}, str(Path(out_dir) / f"rank{rank}_batches.safetensors"))
