"""The trainer's data-parallel group: joining torchrun's process group (gloo on CPU, NCCL on GPU) and summing
across ranks."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch


@dataclass
class Dist:
    """This process's place in the torchrun group: its rank, the world size and its device."""

    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def main(self) -> bool:
        return self.rank == 0


def setup_distributed(device: str) -> Dist:
    """Join the torchrun process group when ``WORLD_SIZE > 1`` (gloo on CPU, NCCL on GPU)."""
    want_cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if world > 1 and not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if want_cuda else "gloo")
    if want_cuda:
        dev = torch.device(f"cuda:{local}" if device in ("auto", "cuda") else device)
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")
    return Dist(rank, world, dev)


def all_sum(t: torch.Tensor, dist: Dist) -> torch.Tensor:
    """``t`` summed over every rank (itself alone without a group), returned on the CPU."""
    if dist.world > 1:
        t = t.to(dist.device)
        torch.distributed.all_reduce(t)
    return t.cpu()
