"""What stops a run besides out-of-memory: `divergence` after each step (non-finite values, a
realized KL or weight norm past its bound, a gradient stuck at zero while rewards vary), with
the weight norm it watches, and the engine's drift from the trainer's weights."""
from __future__ import annotations

import math

import torch

from logra.optim import collectives
from logra.optim.collectives import local
from logra.rl.settings import Grpo


def weight_norm(model) -> float:
    """‖θ‖ over every parameter (sharded ones over all ranks), in float64."""
    sq = sum(torch.linalg.vector_norm(local(p.detach()), dtype=torch.float64) ** 2
             for p in model.parameters())
    return math.sqrt(collectives.all_reduce(torch.as_tensor(sq, dtype=torch.float64)).item())


def divergence(loss: float, grad_norm: float, kl_real: float, weight_ratio: float,
               zero_grad_steps: int, grpo: Grpo) -> str | None:
    """Why a run has diverged after this step, or None: a non-finite loss, gradient norm
    (LoGRA: sketch norm) or realized KL; a realized KL on the probe above
    `grpo.max_kl_per_step`; ‖θ‖ / ‖θ_base‖ above `grpo.max_weight_norm_ratio`; or
    `grpo.max_zero_grad_steps` steps in a row with a zero gradient while some group's rewards
    varied (a step whose groups all have equal rewards has no gradient, rightly)."""
    if not all(map(math.isfinite, (loss, grad_norm, kl_real, weight_ratio))):
        return (f"non-finite loss {loss}, gradient norm {grad_norm}, realized KL {kl_real} or "
                f"weight norm ratio {weight_ratio}")
    if kl_real > grpo.max_kl_per_step:
        return (f"realized KL {kl_real:.3g} nats on the probe > grpo.max_kl_per_step "
                f"{grpo.max_kl_per_step:g}")
    if weight_ratio > grpo.max_weight_norm_ratio:
        return (f"weight norm {weight_ratio:.3g}x the base's > grpo.max_weight_norm_ratio "
                f"{grpo.max_weight_norm_ratio:g}")
    if grpo.max_zero_grad_steps and zero_grad_steps >= grpo.max_zero_grad_steps:
        return (f"zero gradient for {zero_grad_steps} steps in a row while rewards varied "
                f"within groups (grpo.max_zero_grad_steps {grpo.max_zero_grad_steps})")
    return None


def diverged(step: int, why: str) -> dict:
    print(f"diverged at step {step}: {why}")
    return {"status": "diverged", "diverged_at_step": step, "diverged_because": why}


def sync_drift(remote: dict[str, torch.Tensor], params: dict[str, torch.Tensor]) -> float:
    """max |W_engine - W_trainer| / max |W_trainer| over all weights (0 = in sync), compared
    on the engine's device."""
    with torch.no_grad():
        diff = max((remote[n].float() - p.float().to(remote[n].device)).abs().max().item()
                   for n, p in params.items())
        return diff / max(p.abs().max().item() for p in params.values())
