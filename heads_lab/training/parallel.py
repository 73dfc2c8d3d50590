"""Data-parallel training on PyTorch's own engine: DistributedDataParallel over gloo (CPU) or
NCCL (GPU), one process per rank, launched by torchrun:

    torchrun --nproc_per_node=4 -m heads_lab train model.heads=8 ...

Every rank reads the same token-budget batch order; an update takes `update_freq × world`
consecutive batches and rank r trains on batches r, r + world, ... of them, so the global batch
(and the gradient: each rank scales its loss by world / tokens of the whole update, DDP averages)
equals a single process's with `update_freq × world` (a rank left without a batch in an
epoch's short last update runs one with weight 0). Rank 0 alone logs, writes checkpoints and
results and evaluates; all ranks resume from the same checkpoint. Multi-node: torchrun's
rendezvous (`--nnodes=N --rdzv-backend=c10d --rdzv-endpoint=HOST:PORT`) or SLURM via submitit.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


@dataclass
class Parallel:
    rank: int
    world: int
    local_rank: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        on_gpu = next(model.parameters()).device.type == "cuda"
        with warnings.catch_warnings():  # torch 2.13 deprecates it for forward_sync_buffers,
            # which would still sync at init; the model has no buffers that differ across ranks
            warnings.filterwarnings("ignore", "`broadcast_buffers` is deprecated", FutureWarning)
            return DistributedDataParallel(model, device_ids=[self.local_rank] if on_gpu else None,
                                           broadcast_buffers=False)

    def no_sync(self, net: torch.nn.Module, last: bool):
        """Gradient accumulation: all-reduce only on the last micro-batch of an update."""
        return contextlib.nullcontext() if last else net.no_sync()

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def any_stop(self, signal_name: str | None) -> str | None:
        """A stop signal on any rank stops every rank after the same update."""
        flag = torch.tensor([1.0 if signal_name else 0.0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() and not signal_name:
            return "a signal on another rank"
        return signal_name

    def barrier(self) -> None:
        dist.barrier()

    def broadcast(self, obj):
        """rank 0's `obj` on every rank."""
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]


def backend() -> str:
    """gloo on CPU; with CUDA, NCCL for the GPU tensors (DDP's gradients) and gloo for the CPU
    ones (the loss sums, stop flags and broadcast objects): NCCL alone takes CUDA tensors only.
    The rank's GPU is made current first, as NCCL's collectives need."""
    if not torch.cuda.is_available():
        return "gloo"
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    return "cpu:gloo,cuda:nccl"


def from_env(timeout_s: float = 1800) -> Parallel | None:
    """The data-parallel group torchrun describes (WORLD_SIZE > 1), initialised once; None for
    a single process. A collective that waits `timeout_s` for a peer (trainer.dist_timeout_s)
    raises instead of hanging."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return None
    if not dist.is_initialized():
        dist.init_process_group(backend(), timeout=timedelta(seconds=timeout_s))
    return Parallel(rank=dist.get_rank(), world=dist.get_world_size(),
                    local_rank=int(os.environ.get("LOCAL_RANK", "0")))


def is_peer_failure(err: BaseException) -> bool:
    """A collective that failed because another rank died, froze or lost its connection (gloo
    and NCCL raise RuntimeErrors or torch.distributed's DistError subclasses)."""
    if isinstance(err, dist.DistError):
        return True
    text = str(err)
    return isinstance(err, RuntimeError) and any(s in text for s in (
        "gloo", "NCCL", "Connection closed by peer", "Connection reset", "Timed out", "timed out"))
