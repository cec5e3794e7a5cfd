"""LoGRA as a torch optimizer, for trainers that own the loop (TRL's GRPOTrainer, a plain loop).

    optimizer = LoGRAOptimizer(model, rank=64, update_ratio=1e-3)   # LoGRA's options
    loss.backward(); optimizer.step(); optimizer.zero_grad()

`LoGRAOptimizer(model, **options)` is the update rule of logra/optim/logra_rule.py (`LoGRA`, the
object the harness's GRPO loop drives) behind torch's optimizer API. Building it freezes the model
(LoGRA trains only its target weights, and never through `.grad`) and installs the hooks that
sketch each target's gradient during backward. `prepare_update()` forms the RowAdam directions
from the sketches, `step(alpha=...)` applies them at α; `step()` without `alpha` sets α, by
default by the authors' predicted-KL controller on the sequences given by `set_probe`.
`clip_grad_norm_` returns ‖S‖ and clips nothing. `LoGRATrainerMixin` fits it to a Trainer.

Each deviation from the authors' optimizer, the step's inputs, state and guards: docs/optimizer.md.
"""
from __future__ import annotations

import math
import weakref

import torch

from logra.optim.kl_control import at_cap
from logra.optim.logra_rule import LoGRA

_HOOKED: dict[int, weakref.ref] = {}  # id -> target weight a LoGRAOptimizer updates


class LoGRAOptimizer(torch.optim.Optimizer):
    """The LoGRA rule (logra/optim/logra_rule.py) as a torch optimizer; options are `LoGRA`'s."""

    # GradScaler then hands step() its found_inf instead of unscaling .grad: fp16 is refused
    _step_supports_amp_scaling = True

    def __init__(self, model: torch.nn.Module, max_step_ratio: float | None = 0.1, **options):
        """Freeze `model` and install LoGRA on it; `options` are
        `logra.optim.logra_rule.LoGRA`'s, `max_step_ratio` bounds a step's α·update_ratio."""
        if max_step_ratio is not None and not (
                isinstance(max_step_ratio, (int, float)) and not isinstance(max_step_ratio, bool)
                and math.isfinite(max_step_ratio) and max_step_ratio > 0):
            raise ValueError(f"max_step_ratio: a finite number > 0 or None, got "
                             f"{max_step_ratio!r}")
        if torch.distributed.is_available() and torch.distributed.is_initialized() \
                and torch.distributed.get_world_size() > 1:
            raise RuntimeError("LoGRAOptimizer runs in one process (sharded training: the "
                               "harness's FSDP loop, logra/rl/loop.py)")
        hooked = [n for n, p in model.named_parameters()
                  if id(p) in _HOOKED and _HOOKED[id(p)]() is p]
        if hooked:
            raise RuntimeError(f"a LoGRAOptimizer already updates {hooked[0]} (and others): "
                               "build one LoGRAOptimizer per model")
        self.rule, self.model = LoGRA(model, **options), model
        self.controller = None  # a function f(optimizer) -> α, in place of the rule's own
        self.probe: tuple | None = None  # (input_ids, attention_mask, loss_mask): set_probe
        self.temperature, self.observed_mismatch = 1.0, math.nan
        self.last_control: dict = {}
        self.normalization_tokens: int | None = None  # T; None: 1
        self._step = None  # the prepared step, between prepare_update and step
        self.max_step_ratio = max_step_ratio
        params = [p for _, p in self.rule.named]
        super().__init__([{"params": params, "lr": 1.0, "name": "targets"}], {"lr": 1.0})
        _HOOKED.update({id(p): weakref.ref(p) for p in params})
        self._built = True

    def add_param_group(self, param_group: dict) -> None:
        if getattr(self, "_built", False):
            raise TypeError("LoGRAOptimizer: its parameters are LoGRA's target weights, fixed "
                            "when it is built (option target_modules); add_param_group is not "
                            "supported")
        super().add_param_group(param_group)

    def __reduce_ex__(self, protocol):
        raise TypeError("LoGRAOptimizer cannot be pickled or copied: it holds its model's hooks. "
                        "Save optimizer.state_dict() and load it into a LoGRAOptimizer built on "
                        "the model")

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
        return getattr(self.controller or self.rule.control, "mismatch", None)

    def set_probe(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                  loss_mask: torch.Tensor | None = None, *, temperature: float = 1.0,
                  mismatch: float = math.nan) -> None:
        """The sequences the next step's predicted KL is measured on (the controller uses the
        first `probe_responses`): `loss_mask` (batch, T−1) marks the positions whose next
        token was sampled (default: every position the attention mask keeps), `temperature`
        the sampling temperature, `mismatch` the signed engine − trainer log-prob mean over
        completed responses (nan: none observed)."""
        if not (isinstance(input_ids, torch.Tensor) and input_ids.dim() == 2
                and not input_ids.is_floating_point() and input_ids.dtype != torch.bool):
            raise ValueError(f"set_probe: input_ids must be a 2-D tensor of token ids (batch, T), "
                             f"got {getattr(input_ids, 'dtype', type(input_ids).__name__)} of "
                             f"shape {tuple(getattr(input_ids, 'shape', ()))}")
        attn = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        mask = attn[:, 1:] if loss_mask is None else loss_mask
        if attn.shape != input_ids.shape or mask.shape != (input_ids.shape[0],
                                                           input_ids.shape[1] - 1):
            raise ValueError(f"set_probe: input_ids {tuple(input_ids.shape)} needs an attention "
                             f"mask of that shape and a loss mask (batch, T-1); got "
                             f"{tuple(attn.shape)} and {tuple(mask.shape)}")
        self.probe, self.temperature, self.observed_mismatch = (input_ids, attn, mask), \
            float(temperature), float(mismatch)

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """‖S‖ over all targets; nothing is clipped (docs/optimizer.md)."""
        return torch.linalg.vector_norm(torch.stack(
            torch._foreach_norm([t.s for t in self.rule.targets])))

    @torch.no_grad()
    def prepare_update(self, normalization_tokens: int | None = None) -> float:
        """The directions of the backward passes since the last step (RowAdam on S / T, scaled
        to update_ratio); returns ‖S‖."""
        if normalization_tokens is not None:
            self.normalization_tokens = normalization_tokens
        self._check_tokens()
        self.rule.batch_tokens = self.normalization_tokens
        self._step = self.rule.propose()
        return self.rule.grad_norm

    def _check_tokens(self) -> None:
        tokens = self.normalization_tokens
        if tokens is not None and (isinstance(tokens, bool) or not float(tokens).is_integer()
                                   or tokens < 0):
            raise ValueError(f"LoGRAOptimizer: normalization_tokens is a count of tokens, got "
                             f"{tokens!r}")
        if not tokens:
            raise RuntimeError(
                "LoGRAOptimizer: normalization_tokens (T, the completion tokens of the batch "
                "the backward passes saw) is not set: set optimizer.normalization_tokens = T or "
                "call optimizer.count_tokens(n) per micro-batch before step(); a transformers/"
                "TRL Trainer counts them through logra.optim.optimizer.LoGRATrainerMixin: class "
                "Trainer(LoGRATrainerMixin, GRPOTrainer)")

    @torch.no_grad()
    def step(self, closure=None, *, alpha: float | None = None):
        """Apply the prepared directions (preparing them first if needed) at `alpha`, else at
        the attached function's α, else at the rule's controller's on the probe (`set_probe`),
        else (controller=False) at 1; then T and the probe start over."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if getattr(self, "found_inf", None) is not None:
            raise RuntimeError("LoGRAOptimizer does not support fp16 with a GradScaler (a "
                               "Trainer's `fp16=True`): its inf check sees no gradient; use "
                               "bf16 (`bf16=True`), which needs no scaler")
        if self._step is None:
            self._check_tokens()
            if not any(t.backwards for t in self.rule.targets):
                raise RuntimeError("LoGRAOptimizer.step: no backward pass reached LoGRA's target "
                                   "weights since the last step (call loss.backward() first); "
                                   "nothing was changed")
        needs_probe = alpha is None and not self.controller and self.rule.control is not None
        if needs_probe and self.probe is None:  # nothing is consumed: set it, step again
            raise RuntimeError(
                "LoGRAOptimizer.step: LoGRA's predicted-KL controller (option controller, on "
                "by default) needs the sequences to predict on: call optimizer.set_probe("
                "input_ids, attention_mask, loss_mask) before step() (a transformers/TRL "
                "Trainer with LoGRATrainerMixin does), or build it with controller=False for "
                "α = 1")
        if self._step is None:
            self.prepare_update()
        if alpha is None:
            alpha = self._alpha(self._step)
        if not (math.isfinite(alpha) and alpha >= 0):
            raise ValueError(f"LoGRAOptimizer.step: alpha must be finite and >= 0, got {alpha}")
        self._check_step(alpha)  # the prepared step is kept: step(alpha=...) may follow
        step, self._step = self._step, None
        self.rule.apply(step, alpha)
        for t in self.rule.targets:  # no rollout engine to sync: drop the step's factors
            t.applied = None
        self.normalization_tokens, self.probe = None, None
        return loss

    def _check_step(self, alpha: float) -> None:
        """Refuse a step larger than `max_step_ratio` (‖ΔW‖/‖W‖ = α·update_ratio), or whose
        factor α·D, rounded as `apply` rounds it, could make a weight non-finite: each entry of
        (α·D)·A is a sum of `rank` products, so |W| + rank·max|α·D|·max|A| must stay below
        float32's largest value."""
        ratio = alpha * self.rule.update_ratio
        if self.max_step_ratio is not None and ratio > self.max_step_ratio:
            raise ValueError(f"LoGRAOptimizer.step: a step of relative size {ratio:.3g} "
                             f"(alpha {alpha:.3g} x update_ratio {self.rule.update_ratio:.3g}) "
                             f"exceeds max_step_ratio {self.max_step_ratio:g}; nothing was "
                             "changed")
        directions = self._step["directions"]
        for t, d in zip(self.rule.targets, directions if directions is not None and alpha
                        else []):
            factor = (d * alpha).to(self.rule.factor_dtype).float()
            bound = (t.weight.detach().abs().max() + self.rule.rank * factor.abs().max()
                     * t.a.abs().max()).item()
            if not math.isfinite(bound) or bound >= torch.finfo(torch.float32).max:
                raise ValueError(f"LoGRAOptimizer.step: the step at alpha {alpha:.3g} could "
                                 f"make {t.name}.weight non-finite; nothing was changed")

    def _alpha(self, step: dict) -> float:
        """α from the attached function, else the rule's controller on the probe, else 1."""
        if self.controller:
            return self.controller(self)
        control = self.rule.control
        if control is None:
            return 1.0
        alpha, predicted, info = control.scale(self.model, self.rule, step, self.probe,
                                               temperature=self.temperature,
                                               mismatch=self.observed_mismatch)
        self.last_control = {"alpha": alpha, "predicted_kl": predicted,
                             "at_alpha_max": at_cap(control, alpha), **info}
        return alpha

    def count_tokens(self, n: int) -> None:
        """Add a micro-batch's completion tokens to T (`normalization_tokens`)."""
        if n < 0:
            raise ValueError(f"LoGRAOptimizer.count_tokens: a count of tokens, got {n!r}")
        self.normalization_tokens = (self.normalization_tokens or 0) + int(n)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The sketches (no parameter has a .grad)."""
        if self._step is not None:
            raise RuntimeError("LoGRAOptimizer.zero_grad: a prepared update was not applied")
        for buffer in self.rule.grad_buffers():
            buffer.zero_()
        for t in self.rule.targets:
            t.backwards = 0

    def state_bytes(self) -> int:
        """Bytes of the optimizer state: per target A (r x in) and v (out)."""
        return self.rule.state_bytes()

    def state_dict(self) -> dict:
        groups = [{k: v for k, v in g.items() if k != "params"} |
                  {"params": list(range(len(g["params"])))} for g in self.param_groups]
        return {"state": {}, "param_groups": groups, "logra": self.rule.state_dict()}

    def load_state_dict(self, state_dict: dict) -> None:
        """The groups' settings and the rule's state (refused when saved with other options);
        tensors may come back on another device (accelerate moves them). A state that is not a
        LoGRAOptimizer's, or is another model's, is refused before anything changes."""
        rule_state = state_dict.get("logra") if isinstance(state_dict, dict) else None
        if not (isinstance(rule_state, dict)
                and len(state_dict.get("param_groups", [])) == len(self.param_groups)):
            raise ValueError("LoGRAOptimizer.load_state_dict: not a LoGRAOptimizer's state "
                             f"(keys {sorted(state_dict) if isinstance(state_dict, dict) else ''})"
                             ": load what LoGRAOptimizer.state_dict() returned")
        self.rule.load_state_dict(rule_state)
        for g, saved in zip(self.param_groups, state_dict["param_groups"], strict=True):
            g.update({k: v for k, v in saved.items() if k != "params"})


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
        if model.training and "completion_mask" in inputs:  # step() starts T and the probe over
            optimizer = logra_optimizer(self.optimizer)
            optimizer.count_tokens(inputs["completion_mask"].sum())
            if optimizer.probe is None and "prompt_ids" in inputs:  # the step's first
                optimizer.set_probe(*grpo_probe(inputs),  # micro-batch (TRL's GRPO inputs)
                                    temperature=getattr(self.args, "temperature", 1.0))
        return super().compute_loss(model, inputs, *args, **kwargs)


def grpo_probe(inputs: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, loss_mask) of TRL's GRPO micro-batch `inputs`: left-padded
    prompts then completions, the loss mask marking the positions whose next token is a
    completion token."""
    prompt, completion = inputs["prompt_ids"], inputs["completion_ids"]
    ids = torch.cat([prompt, completion], 1)
    attn = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    loss_mask = torch.zeros(ids.shape[0], ids.shape[1] - 1, dtype=attn.dtype, device=ids.device)
    loss_mask[:, prompt.shape[1] - 1:] = inputs["completion_mask"]
    return ids, attn, loss_mask


def logra_optimizer(optimizer) -> LoGRAOptimizer:
    """The LoGRAOptimizer inside `optimizer` (accelerate wraps it in `.optimizer`)."""
    inner = optimizer
    while not isinstance(inner, LoGRAOptimizer) and hasattr(inner, "optimizer"):
        inner = inner.optimizer
    if not isinstance(inner, LoGRAOptimizer):
        raise TypeError(f"LoGRATrainerMixin needs a LoGRAOptimizer (optimizers=(LoGRAOptimizer("
                        f"model, ...), scheduler)), got {type(optimizer).__name__}")
    return inner
