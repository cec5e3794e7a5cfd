"""The collectives an update rule needs under FSDP2 (logra/rl/fsdp.py): this rank's shard, the
whole tensor, sums over the ranks. With one process each is the identity, so a rule's
single-process code path is the same code."""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def is_sharded(t: torch.Tensor) -> bool:
    return isinstance(t, DTensor)


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (a view); any other tensor as it is."""
    return t.to_local() if isinstance(t, DTensor) else t


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor, for rank 0 to send or save (a collective: all ranks must call it):
    gathered and moved to rank 0's CPU memory, one tensor at a time, so no GPU ever holds the
    whole model; the other ranks keep a meta tensor of the same shape (its bytes still count).
    Any other tensor as it is."""
    if not isinstance(t, DTensor):
        return t
    whole = t.full_tensor()
    return whole.cpu() if rank() == 0 else whole.to("meta")


def all_reduce(t: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """Sum (or max) `t` over the ranks, in place; identity with one process."""
    if world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    return t


def broadcast(obj):
    """Rank 0's `obj` on every rank (pickled); identity with one process."""
    if world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def row_block(like: DTensor) -> tuple[int, int]:
    """(first row, number of rows) of this rank's shard of `like`, sharded on dim 0 by
    FSDP2's rule (torch.chunk: ceil(rows / world) rows per rank, the last ones fewer)."""
    rows = like.shape[0]
    per = math.ceil(rows / world_size())
    start = min(rank() * per, rows)
    return start, min(per, rows - start)


def gather_rows(t: torch.Tensor, like: DTensor) -> torch.Tensor:
    """The full matrix whose row block on this rank is `t`, blocks laid out as `like`'s."""
    shape = (like.shape[0], *t.shape[1:])
    return DTensor.from_local(t, like.device_mesh, like.placements, run_check=False,
                              shape=shape, stride=torch.empty(shape, device="meta").stride()
                              ).full_tensor()
