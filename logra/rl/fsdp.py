"""One run over the GPUs of a node: torch.distributed under `torchrun`, FSDP2 (`fully_shard`).

`grpo.nproc_per_node` > 1 starts the run as `torchrun --nproc-per-node N -m logra.rl.loop ...`
(workflow/scripts/train.py does). Every rank then holds a row shard (dim 0) of every weight, as
DTensors, and of every optimizer tensor built from them. Only rank 0 reads the checkpoint and
owns the rollout engine; every global micro-batch is split between the ranks and gradients are
reduce-scattered; sync payloads and the saved checkpoint are gathered to full tensors, and
rank 0 sends/writes.

With one process nothing here does anything: `init` returns None and the helpers are identities,
so the single-process code path is the same code.

Each piece in full: docs/running.md, "One run over a node's GPUs".
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from logra.optim.collectives import broadcast, rank
from logra.rl.models import load


def init(device: torch.device):
    """Under torchrun (WORLD_SIZE > 1): join the process group (gloo on CPU, nccl on CUDA) and
    return (1-D device mesh, this rank's device); else (None, device)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return None, device
    from torch.distributed.device_mesh import init_device_mesh
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return init_device_mesh(device.type, (world,)), device


def shard(model: torch.nn.Module, mesh, compute_dtype: torch.dtype) -> None:
    """FSDP2: each decoder layer, then the root (embeddings, norm, lm_head), sharded on dim 0.
    Parameters stay float32 (master weights; optimizer state follows them); forwards and
    backwards compute in `compute_dtype`, gradients are reduced in float32. FSDP averages them
    over the ranks; the loop multiplies each rank's loss by the world size (a divide factor of
    1 needs PREMUL_SUM, which gloo lacks), so the reduced gradient is the batch's sum."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    model.register_forward_hook(_reshard_after_no_grad_forward)


def load_sharded(name_or_path, mesh, device: torch.device, compute_dtype: torch.dtype):
    """(model, tokenizer) with the model built on the meta device, sharded, then filled from
    the checkpoint, which only rank 0 reads (into CPU memory) and broadcasts shard by shard:
    host memory holds one copy of the weights per node, not one per rank. Buffers that are
    not in the state dict (rotary frequencies) are broadcast from rank 0's copy."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from transformers import AutoModelForCausalLM

    full, tokenizer = load(name_or_path) if rank() == 0 else (None, None)
    tokenizer = broadcast(tokenizer)
    config = broadcast(full.config if full is not None else None)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    shard(model, mesh, compute_dtype)
    model.to_empty(device=device)
    set_model_state_dict(model, full.state_dict() if full is not None else {},
                         options=StateDictOptions(full_state_dict=True,
                                                  broadcast_from_rank0=True))
    own = dict(full.named_buffers()) if full is not None else {}
    with torch.no_grad():
        for name, buf in model.named_buffers():
            value = own[name].to(device) if full is not None else torch.empty_like(buf)
            dist.broadcast(value, src=0)
            buf.copy_(value)
    return model, tokenizer


def _reshard_after_no_grad_forward(module, args, output) -> None:
    """FSDP2 keeps the root's parameters (embeddings, norm, lm_head) gathered after its forward,
    for the backward that usually follows. After a no-grad forward (probe, KL prediction) the
    update rules change the *sharded* parameters next, and the stale gathered copy would be
    used by the following forward: reshard, so that forward gathers the updated shards."""
    if not torch.is_grad_enabled():
        module.reshard()
