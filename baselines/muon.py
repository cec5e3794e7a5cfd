"""Muon through the method interface: `torch.optim.Muon` on the blocks' 2-D weights, AdamW on
the rest, as Muon's users run it.

Muon keeps one momentum buffer per weight instead of Adam's two moments and steps along the
orthogonalized (Newton–Schulz) momentum. The weights LoGRA would sketch (`modules`) form the
`torch.optim.Muon` group; every other trained parameter is `torch.optim.AdamW`'s at `dense_lr`,
one weight at a time. `adjust_lr_fn` defaults to "match_rms_adamw", so the lr lives on AdamW's
scale; weight decay 0, as every rule here. Both optimizers step inside `propose()`
(`baselines.torch_optimizer.TorchOptimizerRule`): the step cannot be scaled by predicted-KL
control. The rollout engine receives every trained tensor in full. Not run under FSDP.

The update, each setting and its reason: docs/baselines.md, "Muon".
"""
from __future__ import annotations

import math
import re

import torch

from baselines.torch_optimizer import TorchOptimizerRule
from logra.optim.rule import (
    BETAS,
    DEFAULT_MODULES,
    LR,
    POSINT,
    POSNUM,
    Geometry,
    low_rank_linears,
)


class Muon(TorchOptimizerRule):
    options = {"lr": LR, "dense_lr": LR, "momentum": POSNUM, "nesterov": {"type": "boolean"},
               "ns_steps": POSINT,
               "adjust_lr_fn": {"type": "string", "enum": ["match_rms_adamw", "original"]},
               "betas": BETAS, "eps": POSNUM, "weight_decay": {"type": "number", "minimum": 0},
               "modules": {"type": "string"}}

    def __init__(self, model: torch.nn.Module, lr: float = 1e-3, dense_lr: float | None = None,
                 momentum: float = 0.95, nesterov: bool = True, ns_steps: int = 5,
                 adjust_lr_fn: str = "match_rms_adamw", betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, modules: str = DEFAULT_MODULES):
        matrices = [m.weight for _, m in low_rank_linears(model, modules)]
        ids = {id(p) for p in matrices}
        self.named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.optimizer = torch.optim.Muon(matrices, lr=lr, weight_decay=weight_decay,
                                          momentum=momentum, nesterov=nesterov,
                                          ns_steps=ns_steps, adjust_lr_fn=adjust_lr_fn)
        rest = [p for _, p in self.named if id(p) not in ids]
        self.adamw = torch.optim.AdamW(rest, lr=dense_lr or lr, betas=tuple(betas), eps=eps,
                                       weight_decay=weight_decay, foreach=False)

    @property
    def optimizers(self) -> tuple[torch.optim.Optimizer, ...]:
        return self.optimizer, self.adamw

    def state_dict(self) -> dict:
        return {"muon": self.optimizer.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["muon"])
        self.adamw.load_state_dict(state["adamw"])

    @staticmethod
    def planned(geo: Geometry, options: dict, b: int) -> dict:
        """One fp32 momentum buffer per Muon weight, AdamW's two fp32 moments and 0-d fp32 step
        count per other weight; every trained weight's gradient until step(). Inside step(),
        per Muon weight (m × n, k = min(m, n)), torch's `_single_tensor_muon`: the Nesterov
        update U in fp32 (4mn), kept while `_zeropower_via_newtonschulz` runs on a bf16 copy,
        and in each iteration the Gram matrix and its update (bf16 k × k each) and the next
        iterate (bf16 m × n) beside the last: 8mn + 4k² bytes at the largest Muon weight;
        AdamW's single-tensor step, two tensors of its largest weight, if that is larger."""
        f = 4
        modules = options.get("modules", DEFAULT_MODULES)
        dense = [math.prod(s) for n, s in geo.params
                 if not (len(s) == 2 and re.search(modules, n.removesuffix(".weight")))]
        muon = max((8 * m * n + 4 * min(m, n) ** 2 for m, n in geo.low_rank), default=0)
        return {"weights": geo.n_all * b, "master": geo.n_all * f if b < f else 0,
                "grads": geo.n_all * f,
                "optimizer": (geo.n_low + 2 * sum(dense) + len(dense)) * f,
                "step": 0, "perturbed_copy": 0, "after_apply": 0,
                "transient": max(muon, 2 * max(dense, default=0) * f), "frozen_base": False}
