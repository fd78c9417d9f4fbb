"""The processes of ``course train``: one, or one per GPU under ``torchrun``.

``join()`` says where this process trains (a ``Dist``, which ``course_utils.train.train`` takes as
``where``), joining the process group when ``torchrun`` started several; ``leave()`` leaves it again
once the run is over. It lives beside the command, not in the library: no lesson teaches it.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from course_utils import runtime
from course_utils.train import Dist


def join() -> Dist:
    """One process: ``runtime.device()``. Under ``torchrun``: join the process group, each process
    on its own GPU ``cuda:LOCAL_RANK`` with NCCL, or on the CPU with gloo (MPS has no DDP backend)."""
    if "RANK" not in os.environ:
        return Dist(device=runtime.device())
    rank, world, local = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return Dist(rank, world, device)


def leave() -> None:
    """Wait for every rank (rank 0 may still be writing the checkpoint), then leave the process group;
    without one, nothing."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
