"""A torch optimizer as an update rule: the optimizer's own `step()` is the update.

GaLore, APOLLO, Adam-mini and 8-bit AdamW are used as their packages ship them: each is a
`torch.optim.Optimizer` whose `step()` both forms and applies the update. `TorchOptimizerRule`
is what they share through the method interface: `propose()` runs `optimizer.step()` (the
weights change here; the step it returns is None); `apply(step, scale)` frees the gradients
and accepts only the loop's schedule scale (`lr_scale`, applied to every param group's lr for
the one `step()`), so `scalable` is False and predicted-KL control cannot scale these rules'
steps; the state is the optimizer's `state_dict()`; `state_tensors()` counts a quantized state
by the plain tensors inside it; the rollout engine receives every trained tensor in full.

A subclass builds `self.optimizer` and `self.named` (the trained (name, parameter) pairs) in
its constructor. Each point in full: docs/baselines.md, "A torch optimizer as an update rule".
"""
from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor

from logra.optim.rule import UpdateRule


class TorchOptimizerRule(UpdateRule):
    scalable = False  # the optimizer applies its update inside step()
    optimizer: torch.optim.Optimizer

    @property
    def optimizers(self) -> tuple[torch.optim.Optimizer, ...]:
        """Every optimizer the rule steps (Muon's: two; state_dict is then the rule's own)."""
        return (self.optimizer,)

    @torch.no_grad()
    def propose(self) -> None:
        """Runs the optimizers' step(): the weights change here (see docs/baselines.md)."""
        grads = [p.grad for _, p in self.named if p.grad is not None]
        self.grad_norm = torch.linalg.vector_norm(
            torch.stack(torch._foreach_norm(grads))).item() if grads else 0.0
        for optimizer in self.optimizers:
            groups = optimizer.param_groups
            lrs = [g["lr"] for g in groups]
            for g in groups:
                g["lr"] = g["lr"] * self.lr_scale
            try:
                optimizer.step()
            finally:
                for g, lr in zip(groups, lrs, strict=True):
                    g["lr"] = lr

    def apply(self, step, scale: float = 1.0) -> None:
        if scale != self.lr_scale:
            raise ValueError(f"{type(self).__name__}: {type(self.optimizer).__name__} applies "
                             "its update inside step(); the step cannot be scaled "
                             f"(got scale={scale}, its lr's schedule factor {self.lr_scale})")
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=True)

    def state_tensors(self) -> list[torch.Tensor]:
        """Every tensor in the optimizer's state (a subclass: the tensors it stores), and the
        tensors of objects kept there (`ortho_matrix` of a projector)."""
        out = []
        for state in (s for o in self.optimizers for s in o.state.values()):
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    out += stored(value)
                elif isinstance(getattr(value, "ortho_matrix", None), torch.Tensor):
                    out.append(value.ortho_matrix)
        return out

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state)


def stored(t: torch.Tensor) -> list[torch.Tensor]:
    """The plain tensors that hold `t`'s data: `t` itself, or, for a wrapper subclass
    (`__tensor_flatten__`, e.g. a quantized optimizer state), its inner tensors, recursively;
    a DTensor (FSDP) as it is, which `tensor_bytes` counts by this rank's shard."""
    if (type(t) in (torch.Tensor, torch.nn.Parameter) or isinstance(t, DTensor)
            or not hasattr(t, "__tensor_flatten__")):
        return [t]
    names, _ = t.__tensor_flatten__()
    return [inner for name in names for inner in stored(getattr(t, name))]
