"""Process-group set-up for ``torchrun``: DDP when launched by it, a single process otherwise.

torchrun sets ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE``; with a world size above 1 the
trainer joins a process group (NCCL on CUDA, gloo on CPU) and wraps the model in DDP.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from windtunnel.config import ConfigError

__all__ = ["Distributed", "pick_device", "setup_distributed"]


@dataclass(frozen=True)
class Distributed:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        """The mean of ``value`` over ranks (identity in one process)."""
        if not self.enabled:
            return value
        value = value.clone()
        dist.all_reduce(value)
        return value / self.world_size

    def close(self) -> None:
        if self.enabled and dist.is_initialized():
            dist.destroy_process_group()


def pick_device(requested: str, local_rank: int = 0, *, option: str = "train.device") -> torch.device:
    """``auto``: CUDA (one GPU per local rank) when available, else CPU. ``option`` names the
    setting in the error for a device this machine lacks or a name that is none."""
    if requested not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"{option} must be one of auto, cpu, cuda; got {requested!r}")
    if requested == "cuda" or (requested == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise ConfigError(f"{option}=cuda but no CUDA device is available here: use {option}=cpu or auto")
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def setup_distributed(device: torch.device) -> Distributed:
    """Join the process group torchrun describes in the environment, if any."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return Distributed()
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return Distributed(rank=rank, local_rank=local_rank, world_size=world_size)
