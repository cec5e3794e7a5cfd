"""LoGRA as a torch optimizer, for trainers that own the loop (TRL's GRPOTrainer, a plain loop).

`LoGRAOptimizer(model, lr=..., rank=..., refresh_every=..., ...)` is the update rule of
logra/logra.py (`LoGRA`, the same object the harness's GRPO loop drives) behind torch's
optimizer API: `step()` is `rule.apply(rule.propose())`, `zero_grad()`, `state_dict()` /
`load_state_dict()`, and `param_groups` — group 0 the sketched weights (lr), group 1 the dense
parameters (`dense_lr`) — so an LR scheduler scales both. The rule installs its backward hooks
when the optimizer is built: each sketched weight's gradient is sketched and freed as it is
produced, so full gradients of sketched weights are never all alive, over micro-batches too.

What a generic trainer does with `.grad` after backward sees only the dense parameters: the
sketched weights' gradients are gone (their sketches S hold what LoGRA uses). So
- clipping and its norm: `clip_grad_norm_(max_norm)` clips on the norm of the sketches and the
  dense gradients together, the norm of the gradient LoGRA steps on, and returns it (pre-clip,
  as `torch.nn.utils.clip_grad_norm_` does). Deviation from clipping the full gradient: the
  sketch's norm ‖QᵀG‖ is at most ‖G‖ (the full gradient is never whole), so it clips less often.
  In a transformers / TRL Trainer, `LoGRATrainerMixin` routes the trainer's clipping
  (`max_grad_norm`) and the `grad_norm` it logs through it.
- anything else that changes the dense `.grad` in place between backward and `step()` (torch's
  `clip_grad_norm_` over `model.parameters()`, which a Trainer without the mixin calls for
  `max_grad_norm` and for its logged `grad_norm`, or a GradScaler's `unscale_`) makes `step()`
  raise, naming the setting: the sketched weights would have escaped that clipping or that
  norm silently. It is seen from the version counters of the dense gradients, noted when
  backward accumulates them; a model whose every trainable parameter is sketched has none, and
  then the check cannot see it.
- fp16 with a GradScaler is refused (`step()` raises): the sketches were taken of scaled
  gradients and the scaler's inf check cannot see them. bf16 autocast needs no scaler and works.

Not here (the harness's loop, logra/train.py): predicted-KL step control (it needs the step
between propose and apply) and the low-rank policy sync to a separate rollout engine. One
process only: DDP would average gradients the hooks have already consumed.
"""
from __future__ import annotations

import math
import weakref

import torch

from logra.logra import LoGRA

_HOOKED: dict[int, weakref.ref] = {}  # id -> weight whose gradients a LoGRAOptimizer consumes

NOT_UNTOUCHED = (
    "LoGRAOptimizer.step(): the dense parameters' .grad was changed in place after backward "
    "({names}), by gradient clipping or a gradient-norm computation (torch's clip_grad_norm_; a "
    "transformers/TRL Trainer calls it for `max_grad_norm` and for the `grad_norm` it logs) or a "
    "mixed-precision scaler's unscale_. LoGRA's hooks consumed the sketched weights' gradients, "
    "so they escaped that clipping and that norm. Clip with optimizer.clip_grad_norm_(max_norm) "
    "(the norm of the sketches and dense gradients), and in a Trainer subclass it through "
    "logra.optimizer.LoGRATrainerMixin: class Trainer(LoGRATrainerMixin, GRPOTrainer)")


class LoGRAOptimizer(torch.optim.Optimizer):
    """The LoGRA rule (logra/logra.py) as a torch optimizer; options are `LoGRA`'s."""

    # GradScaler then hands step() its found_inf instead of unscaling .grad: fp16 is refused
    _step_supports_amp_scaling = True

    def __init__(self, model: torch.nn.Module, lr: float = 1e-4, dense_lr: float | None = None,
                 **options):
        if torch.distributed.is_available() and torch.distributed.is_initialized() \
                and torch.distributed.get_world_size() > 1:
            raise RuntimeError("LoGRAOptimizer runs in one process: DDP averages gradients "
                               "that LoGRA's hooks have already consumed (sharded training: "
                               "the harness's FSDP loop, logra/train.py)")
        hooked = [n for n, p in model.named_parameters()
                  if id(p) in _HOOKED and _HOOKED[id(p)]() is p]
        if hooked:
            raise RuntimeError(f"a LoGRAOptimizer already consumes the gradients of {hooked[0]} "
                               "(and others): build one LoGRAOptimizer per model")
        self.rule = LoGRA(model, lr=lr, dense_lr=dense_lr, **options)
        dense = [p for _, p in self.rule.dense.named]
        groups = [{"params": [st.param for st in self.rule.sketched], "lr": lr,
                   "name": "sketched"}]
        if dense:
            groups.append({"params": dense, "lr": dense_lr or lr, "name": "dense"})
        super().__init__(groups, {"lr": lr})
        _HOOKED.update({id(p): weakref.ref(p) for p in groups[0]["params"]})
        self._versions: dict[int, int] = {}  # id(dense param) -> its .grad's version after backward
        for p in dense:
            p.register_post_accumulate_grad_hook(self._note_version)

    def _note_version(self, p: torch.Tensor) -> None:
        self._versions[id(p)] = p.grad._version

    @property
    def state(self) -> dict:
        """Per parameter the rule's state tensors, for inspection: a sketched weight's basis Q
        (once it has one) and Adam moments M, V in sketch space; a dense parameter's moments."""
        out = {st.param: {"exp_avg": st.m, "exp_avg_sq": st.v} | ({"basis": st.q} if st.q
                                                                 is not None else {})
               for st in self.rule.sketched}
        dense = self.rule.dense
        return out | {p: {"exp_avg": m, "exp_avg_sq": v}
                      for (_, p), m, v in zip(dense.named, dense.m, dense.v)}

    @state.setter
    def state(self, value) -> None:  # torch's constructor sets an empty one
        if value:
            raise ValueError("LoGRAOptimizer's state is its rule's: use load_state_dict")

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Scale the sketches and the dense gradients by min(1, max_norm / (‖·‖ + 1e-6)), as
        torch's clip_grad_norm_ does to gradients, and return their total 2-norm before it.
        `max_norm=math.inf` only measures."""
        tensors = [st.s for st in self.rule.sketched] + \
            [p.grad for _, p in self.rule.dense.named if p.grad is not None]
        total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(tensors)))
        if max_norm != math.inf:
            torch._foreach_mul_(tensors, (max_norm / (total + 1e-6)).clamp(max=1.0))
            for _, p in self.rule.dense.named:
                if p.grad is not None:
                    self._note_version(p)
        return total

    @torch.no_grad()
    def step(self, closure=None):
        """One LoGRA update from the sketches and dense gradients of the backward passes since
        the last step, at the param groups' current lrs. A non-finite gradient skips the step
        (weights and moments unchanged), as in the harness."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if getattr(self, "found_inf", None) is not None:
            raise RuntimeError("LoGRAOptimizer does not support fp16 with a GradScaler (a "
                               "Trainer's `fp16=True`): the sketches are of scaled gradients "
                               "and its inf check cannot see them; use bf16 (`bf16=True`), "
                               "which needs no scaler")
        touched = [n for n, p in self.rule.dense.named
                   if p.grad is not None and p.grad._version != self._versions.get(id(p))]
        if touched:
            raise RuntimeError(NOT_UNTOUCHED.format(names=", ".join(touched[:3]) + (
                ", ..." if len(touched) > 3 else "")))
        self.rule.lr = self.param_groups[0]["lr"]
        if len(self.param_groups) > 1:
            self.rule.dense.lr = self.param_groups[1]["lr"]
        self.rule.apply(self.rule.propose())
        for st in self.rule.sketched:  # no rollout engine to sync: drop the step's factors
            st.applied = None
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The dense gradients, and the sketches and range-finder sketches of the sketched
        weights' (their .grad is always None)."""
        super().zero_grad(set_to_none=set_to_none)
        for buffer in self.rule.grad_buffers():
            buffer.zero_()
        for _, p in self.rule.dense.named:
            if p.grad is not None:
                self._note_version(p)

    def state_bytes(self) -> int:
        """Bytes of the optimizer state: r·(min + 2·max) floats per sketched weight (Q, M, V),
        two moments per dense parameter (logra/logra.py)."""
        return self.rule.state_bytes()

    def state_dict(self) -> dict:
        groups = []
        start = 0
        for g in self.param_groups:
            groups.append({k: v for k, v in g.items() if k != "params"} |
                          {"params": list(range(start, start + len(g["params"])))})
            start += len(g["params"])
        return {"state": {}, "param_groups": groups, "logra": self.rule.state_dict()}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restores the groups' settings (lr, ...) and the rule's state; tensors may come back
        on another device (accelerate moves them), the basis generators' states to the CPU."""
        groups = state_dict["param_groups"]
        if [len(g["params"]) for g in groups] != [len(g["params"]) for g in self.param_groups]:
            raise ValueError("load_state_dict: the saved param groups "
                             f"({[len(g['params']) for g in groups]} parameters) do not match "
                             f"this optimizer's ({[len(g['params']) for g in self.param_groups]})")
        for g, saved in zip(self.param_groups, groups):
            g.update({k: v for k, v in saved.items() if k != "params"})
        rule = dict(state_dict["logra"])
        rule["sketched"] = {name: s | {"generator": s["generator"].cpu()}
                            for name, s in rule["sketched"].items()}
        self.rule.load_state_dict(rule)


class LoGRATrainerMixin:
    """Put before a transformers Trainer class (TRL's GRPOTrainer, SFTTrainer, ...):
    `class Trainer(LoGRATrainerMixin, GRPOTrainer): pass`, built with
    `optimizers=(LoGRAOptimizer(...), scheduler)`. The trainer's gradient clipping
    (`max_grad_norm`) and the `grad_norm` it logs then go through
    `LoGRAOptimizer.clip_grad_norm_`: the norm of the sketches and dense gradients, before
    clipping. It overrides the two methods of transformers' Trainer (5.x) that touch `.grad`."""

    def _clip_grad_norm(self, model):
        return logra_optimizer(self.optimizer).clip_grad_norm_(self.args.max_grad_norm)

    def _get_grad_norm(self, model, grad_norm=None):
        if grad_norm is None:
            grad_norm = logra_optimizer(self.optimizer).clip_grad_norm_(math.inf)
        return grad_norm


def logra_optimizer(optimizer) -> LoGRAOptimizer:
    """The LoGRAOptimizer inside `optimizer` (accelerate wraps it in `.optimizer`)."""
    inner = optimizer
    while not isinstance(inner, LoGRAOptimizer) and hasattr(inner, "optimizer"):
        inner = inner.optimizer
    if not isinstance(inner, LoGRAOptimizer):
        raise TypeError(f"LoGRATrainerMixin needs a LoGRAOptimizer (optimizers=(LoGRAOptimizer("
                        f"model, ...), scheduler)), got {type(optimizer).__name__}")
    return inner
