"""LoGRA as a torch optimizer, for trainers that own the loop (TRL's GRPOTrainer, a plain loop).

    optimizer = LoGRAOptimizer(model, rank=64, update_ratio=1e-3)   # LoGRA's options
    loss.backward(); optimizer.step(); optimizer.zero_grad()

`LoGRAOptimizer(model, **options)` is the update rule of logra/optim/logra_rule.py (`LoGRA`, the
object the harness's GRPO loop drives) behind torch's optimizer API. Building it freezes the model
(LoGRA trains only its target weights, and never through `.grad`) and installs the hooks that
sketch each target's gradient during backward. `param_groups` holds the target weights (its
`lr` is not used: LoGRA's step size is `update_ratio`).

Two phases, as the authors' optimizer (`skzhang1/RL`, `nemo_rl/models/automodel/logra.py`):
`prepare_update()` forms the RowAdam directions from the sketches (and returns ‖S‖),
`step(alpha=...)` applies them at α. Stated deviations from their `step(alpha=...)`:
- `step()` without `alpha` applies α = 1, unless a controller is attached
  (`optimizer.controller = f`, called as `f(optimizer)` after `prepare_update`, returning α;
  the harness's loop runs the authors' predicted-KL controller, logra/optim/kl_control.py, between
  the phases), and prepares first when `prepare_update()` was not called;
- `normalization_tokens` (T: the sketch is divided by it before RowAdam; the authors pass
  their batch's valid-token count) is an input: the number of completion tokens of the batch
  the backward passes saw, set before `step()` (`optimizer.normalization_tokens = T`, or
  `prepare_update(T)`), or counted with `count_tokens(n)` per micro-batch, as
  `LoGRATrainerMixin` does in a transformers/TRL Trainer from each micro-batch's
  `completion_mask`. `step()` without it raises (naming the mixin), then starts it over.

What a generic trainer does with `.grad` sees nothing: no parameter has a gradient.
`clip_grad_norm_(max_norm)` returns ‖S‖ over all targets (the authors' logged grad norm) and
clips nothing: the step's size is set by `update_ratio` whatever S's norm, and the authors
clip nothing. In a Trainer, `LoGRATrainerMixin` routes `max_grad_norm` and the logged
`grad_norm` through it. fp16 with a GradScaler is refused (its inf check sees no gradient);
bf16 autocast needs no scaler and works.

`state_dict()` holds the options, the update count and the row second moments (the
projections are redrawn from the seed and the count; the controller's mismatch EMA is saved by
the harness's loop, which runs it: an attached `controller` keeps its own state); loading a
state saved with other options is refused, and so is saving between `prepare_update()` and
`step()`. Not here: the low-rank sync to a separate rollout engine (the harness's loop). One
process only: under DDP the sketches would need the all-reduce the harness's FSDP loop does.
"""
from __future__ import annotations

import math
import weakref

import torch

from logra.optim.logra_rule import LoGRA

_HOOKED: dict[int, weakref.ref] = {}  # id -> target weight a LoGRAOptimizer updates


class LoGRAOptimizer(torch.optim.Optimizer):
    """The LoGRA rule (logra/optim/logra_rule.py) as a torch optimizer; options are `LoGRA`'s."""

    # GradScaler then hands step() its found_inf instead of unscaling .grad: fp16 is refused
    _step_supports_amp_scaling = True

    def __init__(self, model: torch.nn.Module, **options):
        """Freeze `model` and install LoGRA on it; `options` are
        `logra.optim.logra_rule.LoGRA`'s."""
        if torch.distributed.is_available() and torch.distributed.is_initialized() \
                and torch.distributed.get_world_size() > 1:
            raise RuntimeError("LoGRAOptimizer runs in one process (sharded training: the "
                               "harness's FSDP loop, logra/rl/loop.py)")
        hooked = [n for n, p in model.named_parameters()
                  if id(p) in _HOOKED and _HOOKED[id(p)]() is p]
        if hooked:
            raise RuntimeError(f"a LoGRAOptimizer already updates {hooked[0]} (and others): "
                               "build one LoGRAOptimizer per model")
        self.rule = LoGRA(model, **options)
        self.rule.control = None  # the harness's loop runs the controller; here: `controller`
        self.controller = None
        self.normalization_tokens: int | None = None  # T; None: 1
        self._step = None  # the prepared step, between prepare_update and step
        params = [p for _, p in self.rule.named]
        super().__init__([{"params": params, "lr": 1.0, "name": "targets"}], {"lr": 1.0})
        _HOOKED.update({id(p): weakref.ref(p) for p in params})

    @property
    def state(self) -> dict:
        """Per target weight its projection and row second moment, for inspection."""
        return {t.weight: {"projection": t.a, "row_second_moment": t.v}
                for t in self.rule.targets}

    @state.setter
    def state(self, value) -> None:  # torch's constructor sets an empty one
        if value:
            raise ValueError("LoGRAOptimizer's state is its rule's: use load_state_dict")

    @property
    def update_count(self) -> int:
        return self.rule.count

    @property
    def mismatch(self) -> float | None:
        """The controller's mismatch EMA, as the rule saves it (None without a controller)."""
        return getattr(self.controller, "mismatch", None)

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """‖S‖ over all targets; nothing is clipped (see the module docstring)."""
        return torch.linalg.vector_norm(torch.stack(
            torch._foreach_norm([t.s for t in self.rule.targets])))

    @torch.no_grad()
    def prepare_update(self, normalization_tokens: int | None = None) -> float:
        """The directions of the backward passes since the last step (RowAdam on S / T, scaled
        to update_ratio); returns ‖S‖."""
        if normalization_tokens is not None:
            self.normalization_tokens = normalization_tokens
        if not self.normalization_tokens:
            raise RuntimeError(
                "LoGRAOptimizer: normalization_tokens (T, the completion tokens of the batch "
                "the backward passes saw) is not set: set optimizer.normalization_tokens = T or "
                "call optimizer.count_tokens(n) per micro-batch before step(); a transformers/"
                "TRL Trainer counts them through logra.optim.optimizer.LoGRATrainerMixin: class "
                "Trainer(LoGRATrainerMixin, GRPOTrainer)")
        self.rule.batch_tokens = self.normalization_tokens
        self._step = self.rule.propose()
        return self.rule.grad_norm

    @torch.no_grad()
    def step(self, closure=None, *, alpha: float | None = None):
        """Apply the prepared directions (preparing them first if needed) at `alpha`, else at
        the attached controller's α, else at 1; then T starts over."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if getattr(self, "found_inf", None) is not None:
            raise RuntimeError("LoGRAOptimizer does not support fp16 with a GradScaler (a "
                               "Trainer's `fp16=True`): its inf check sees no gradient; use "
                               "bf16 (`bf16=True`), which needs no scaler")
        if self._step is None:
            self.prepare_update()
        if alpha is None:
            alpha = self.controller(self) if self.controller else 1.0
        if not (math.isfinite(alpha) and alpha >= 0):
            raise ValueError(f"LoGRAOptimizer.step: alpha must be finite and >= 0, got {alpha}")
        step, self._step = self._step, None
        self.rule.apply(step, alpha)
        for t in self.rule.targets:  # no rollout engine to sync: drop the step's factors
            t.applied = None
        self.normalization_tokens = None
        return loss

    def count_tokens(self, n: int) -> None:
        """Add a micro-batch's completion tokens to T (`normalization_tokens`)."""
        self.normalization_tokens = (self.normalization_tokens or 0) + int(n)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The sketches (no parameter has a .grad)."""
        if self._step is not None:
            raise RuntimeError("LoGRAOptimizer.zero_grad: a prepared update was not applied")
        for buffer in self.rule.grad_buffers():
            buffer.zero_()

    def state_bytes(self) -> int:
        """Bytes of the optimizer state: per target A (r x in) and v (out)."""
        return self.rule.state_bytes()

    def state_dict(self) -> dict:
        groups = [{k: v for k, v in g.items() if k != "params"} |
                  {"params": list(range(len(g["params"])))} for g in self.param_groups]
        return {"state": {}, "param_groups": groups, "logra": self.rule.state_dict()}

    def load_state_dict(self, state_dict: dict) -> None:
        """The groups' settings and the rule's state (refused when saved with other options);
        tensors may come back on another device (accelerate moves them)."""
        for g, saved in zip(self.param_groups, state_dict["param_groups"], strict=True):
            g.update({k: v for k, v in saved.items() if k != "params"})
        self.rule.load_state_dict(state_dict["logra"])


class LoGRATrainerMixin:
    """Put before a transformers Trainer class (TRL's GRPOTrainer, SFTTrainer, ...):
    `class Trainer(LoGRATrainerMixin, GRPOTrainer): pass`, built with
    `optimizers=(LoGRAOptimizer(...), scheduler)`. The trainer's clipping (`max_grad_norm`)
    and the `grad_norm` it logs go through `LoGRAOptimizer.clip_grad_norm_` (‖S‖, nothing
    clipped), and each micro-batch's completion tokens (`completion_mask`, TRL's) are added
    to the optimizer's `normalization_tokens` (T). It overrides the methods of transformers'
    Trainer (5.x) that touch `.grad`, and `compute_loss`."""

    def _clip_grad_norm(self, model):
        return logra_optimizer(self.optimizer).clip_grad_norm_(self.args.max_grad_norm)

    def _get_grad_norm(self, model, grad_norm=None):
        if grad_norm is None:
            grad_norm = logra_optimizer(self.optimizer).clip_grad_norm_(math.inf)
        return grad_norm

    def compute_loss(self, model, inputs, *args, **kwargs):
        if model.training and "completion_mask" in inputs:  # step() starts T over
            logra_optimizer(self.optimizer).count_tokens(inputs["completion_mask"].sum())
        return super().compute_loss(model, inputs, *args, **kwargs)


def logra_optimizer(optimizer) -> LoGRAOptimizer:
    """The LoGRAOptimizer inside `optimizer` (accelerate wraps it in `.optimizer`)."""
    inner = optimizer
    while not isinstance(inner, LoGRAOptimizer) and hasattr(inner, "optimizer"):
        inner = inner.optimizer
    if not isinstance(inner, LoGRAOptimizer):
        raise TypeError(f"LoGRATrainerMixin needs a LoGRAOptimizer (optimizers=(LoGRAOptimizer("
                        f"model, ...), scheduler)), got {type(optimizer).__name__}")
    return inner
