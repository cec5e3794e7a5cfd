"""Dense AdamW, split into propose/apply so step control can sit between the two phases.

The update is textbook AdamW (decoupled weight decay, bias correction); the one deviation from
`torch.optim.AdamW` is the split: `propose()` updates the moments and writes the step into each
parameter's `.grad` buffer, `apply(step, scale)` adds scale * step and frees the buffers, so
peak memory is that of AdamW itself. A non-finite gradient never reaches the moments (propose
returns a NaN step) and `apply(step, 0)` leaves the weights as they are. `perturbed(step, eta)`
restores θ exactly from a saved copy of the weights (for KL control, one transient copy).

Dense Adam is the reference every other rule is compared with, and LoGRA trains its unsketched
parameters with it (`for_params`). `train_only` (a regex over module names) trains only the
nn.Linear modules it matches: with LoGRA's target pattern it is the control that separates the
update rule from the trainable set (config `dense_adam_targets`).
The two phases, the non-finite case and the memory in full: docs/rules.md, "Dense AdamW".
"""
from __future__ import annotations

import contextlib
import math

import torch

from logra.optim.rule import (ADAM_OPTIONS, DEFAULT_MODULES, Geometry, UpdateRule,
                              low_rank_linears, requires_grad_output)


class DenseAdam(UpdateRule):
    options = ADAM_OPTIONS | {"train_only": {
        "type": ["string", "null"], "description": "regex over module names: train only the "
        "weights of the nn.Linear modules it matches, every other parameter frozen (LoGRA's "
        "trainable set: its targets' pattern); null: every parameter"}}
    shardable = True

    def __init__(self, model: torch.nn.Module, lr: float = 1e-4, betas=(0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, train_only: str | None = None):
        linears = low_rank_linears(model, train_only) if train_only is not None else None
        if linears is not None:
            model.requires_grad_(False)
            for _, module in linears:
                module.weight.requires_grad_(True)
        self.init([(n, p) for n, p in model.named_parameters() if p.requires_grad],
                  lr, betas, eps, weight_decay)
        if linears is not None:  # a frozen embedding: backward must still reach the blocks
            self.hooks.append(model.get_input_embeddings().register_forward_hook(
                requires_grad_output))

    @classmethod
    def for_params(cls, named: list[tuple[str, torch.nn.Parameter]], **options) -> "DenseAdam":
        """Dense Adam on a subset of parameters (LoGRA uses it for the unsketched ones)."""
        rule = cls.__new__(cls)
        rule.init(named, **options)
        return rule

    def init(self, named, lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
             lrs: list[float] | None = None):
        """`lrs`: one lr per parameter of `named` where they differ (LoRA's adapters and its
        densely trained weights); None: `lr` (which a scheduler may change) for every one."""
        self.named = list(named)
        self.lr, self.betas, self.eps, self.weight_decay = lr, tuple(betas), eps, weight_decay
        self.lrs = None if lrs is None else list(lrs)
        if self.lrs is not None and len(self.lrs) != len(self.named):
            raise ValueError(f"lrs: {len(self.lrs)} lrs for {len(self.named)} parameters")
        self.m = [torch.zeros_like(p) for _, p in self.named]
        self.v = [torch.zeros_like(p) for _, p in self.named]
        self.t = 0
        self.grad_norm = float("nan")
        self.hooks = []

    @torch.no_grad()
    def propose(self, skip: bool = False) -> list[torch.Tensor]:
        """The step, written into the gradient buffers. A non-finite gradient (or `skip`, a
        caller's veto) leaves the moments and t as they are and returns a NaN step."""
        params = [p for _, p in self.named]
        if not params:
            self.grad_norm = 0.0
            return []
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        self.grad_norm = torch.linalg.vector_norm(
            torch.stack(torch._foreach_norm(grads))).item()
        if skip or not math.isfinite(self.grad_norm):
            for g in grads:
                g.fill_(math.nan)
            return grads
        b1, b2 = self.betas
        self.t += 1
        torch._foreach_lerp_(self.m, grads, 1 - b1)
        torch._foreach_mul_(self.v, b2)
        torch._foreach_addcmul_(self.v, grads, grads, value=1 - b2)
        # step = -lr * (m / bc1) / (sqrt(v / bc2) + eps) - lr * wd * W, written into grads
        bc1, bc2 = 1 - b1 ** self.t, 1 - b2 ** self.t
        for g, m, v, p, lr in zip(grads, self.m, self.v, params,
                                  self.lrs or [self.lr] * len(params)):
            torch.sqrt(v, out=g).div_(bc2 ** 0.5).add_(self.eps)
            torch.div(m, g, out=g).mul_(-lr / bc1)
            if self.weight_decay:
                g.add_(p, alpha=-lr * self.weight_decay)
        return grads

    @torch.no_grad()
    def apply(self, step: list[torch.Tensor], scale: float = 1.0) -> None:
        """W += scale · step; scale 0 (a skipped step) changes nothing (0 · NaN would)."""
        for (_, p), s in zip(self.named, step):
            if scale != 0:
                p.add_(s, alpha=scale)
            p.grad = None

    @contextlib.contextmanager
    def perturbed(self, step: list[torch.Tensor], eta: float):
        saved = [p.detach().clone() for _, p in self.named]
        try:
            with torch.no_grad():
                for (_, p), s in zip(self.named, step):
                    p.add_(s, alpha=eta)
            yield
        finally:
            with torch.no_grad():
                for (_, p), w in zip(self.named, saved):
                    p.copy_(w)

    def state_tensors(self) -> list[torch.Tensor]:
        return self.m + self.v

    def unwrap(self) -> None:
        for hook in self.hooks:
            hook.remove()
        self.hooks = []

    def state_dict(self) -> dict:
        return {"t": self.t, "m": self.m, "v": self.v}

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        """Copied into the existing moment tensors (shapes checked by logra/rl/checkpoint.py)."""
        self.t = state["t"]
        for dst, src in zip(self.m + self.v, state["m"] + state["v"], strict=True):
            dst.copy_(src)

    @staticmethod
    def modules(options: dict) -> str:
        """`train_only`'s pattern (the planner's `Geometry.low_rank`: the trained weights)."""
        return options.get("train_only") or DEFAULT_MODULES

    @staticmethod
    def planned(geo: Geometry, options: dict, b: int) -> dict:
        """Two fp32 moments and an fp32 gradient per trained weight (every weight, or
        `train_only`'s); the step is written into the gradient buffers; `perturbed` copies every
        trained weight. Under `train_only` the base's Linear weights still train
        (`frozen_base` False): the activations the norms and lm_head keep for their own
        gradients are counted, a few N·H bytes over."""
        f, n = 4, geo.n_low if options.get("train_only") else geo.n_all
        return {"weights": geo.n_all * b, "master": n * f if b < f else 0,
                "grads": n * f, "optimizer": 2 * n * f, "step": 0,
                "perturbed_copy": n * f, "after_apply": 0, "transient": 0,
                "frozen_base": False}
