"""APOLLO and APOLLO-Mini through the method interface: the official `apollo_torch.APOLLOAdamW`.

The weights LoGRA would sketch (same `modules` regex) form APOLLOAdamW's low-rank parameter
group, as its users configure it; every other trained parameter is a plain group of the same
optimizer (plain AdamW at `dense_lr`). APOLLO keeps Adam's moments of a randomly projected
gradient (rank r) and scales the *raw* gradient by the projected update's norm ratio, per
channel (APOLLO) or per tensor (APOLLO-Mini: this rule with `rank: 1, scale_type: tensor,
scale: 128`, config `methods.apollo_mini`). It runs through
`baselines.torch_optimizer.TorchOptimizerRule` (no scaled step, no predicted-KL control).
One deviation: each weight's projector seed gets one draw from torch's generator (seeded by
the run's seed) added at build time, so runs of different seeds draw different projections.

The parameter group, the scaling, the seeding and the deviation in full: docs/baselines.md,
"APOLLO and APOLLO-Mini".
"""
from __future__ import annotations

import torch

from baselines.torch_optimizer import TorchOptimizerRule
from logra.optim.rule import (
    ADAM_OPTIONS,
    DEFAULT_MODULES,
    LR,
    POSINT,
    POSNUM,
    Geometry,
    low_rank_linears,
)


class APOLLO(TorchOptimizerRule):
    options = {**ADAM_OPTIONS,
               "rank": POSINT | {"description": "rank of the auxiliary projection (1: APOLLO-Mini)"},
               "scale_type": {"type": "string", "enum": ["channel", "tensor"],
                              "description": "channel: APOLLO; tensor: APOLLO-Mini"},
               "scale": POSNUM | {"description": "the update is multiplied by sqrt(scale) "
                                                 "(authors: 1 for APOLLO, 128 for APOLLO-Mini)"},
               "proj": {"type": "string", "enum": ["random", "svd"]},
               "proj_type": {"type": "string", "enum": ["std", "reverse_std", "right", "left"]},
               "update_proj_gap": POSINT,
               "scale_front": {"type": "boolean", "description": "norm-growth limiter after "
                               "the scale (authors: for short warm-ups, small models)"},
               "dense_lr": LR, "modules": {"type": "string"}}
    shardable = False  # not run under FSDP here

    def __init__(self, model: torch.nn.Module, lr: float = 1e-3, rank: int = 8,
                 scale_type: str = "channel", scale: float = 1.0, proj: str = "random",
                 proj_type: str = "std", update_proj_gap: int = 200, scale_front: bool = False,
                 betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
                 dense_lr: float | None = None, modules: str = DEFAULT_MODULES):
        # eps 1e-8 as every rule here (the package's default is 1e-6); the package is imported
        # here, not with the module: the config check reads `options` without loading it
        from apollo_torch import APOLLOAdamW
        from apollo_torch.random_projector import GradientProjector
        from apollo_torch.svd_projector import GaLoreProjector
        self.checkpoint_classes = (GradientProjector, GaLoreProjector)  # `proj`: random, svd
        targets = low_rank_linears(model, modules)
        for name, m in targets:
            if rank > min(m.weight.shape):
                raise ValueError(f"rank={rank} exceeds min(shape)={min(m.weight.shape)} of "
                                 f"{name}.weight {tuple(m.weight.shape)}")
        projected = [m.weight for _, m in targets]
        ids = {id(p) for p in projected}
        self.named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        dense = [p for _, p in self.named if id(p) not in ids]
        self.optimizer = APOLLOAdamW(
            [{"params": dense, "lr": dense_lr or lr},
             {"params": projected, "rank": rank, "proj": proj, "scale_type": scale_type,
              "scale": scale, "update_proj_gap": update_proj_gap, "proj_type": proj_type}],
            lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
            scale_front=scale_front)
        offset = int(torch.randint(2**31, ()).item())  # the run's seed decides the projections
        for state in self.optimizer.state.values():
            state["seed"] += offset

    @staticmethod
    def planned(geo: Geometry, options: dict, b: int) -> dict:
        """Per projected weight (m x n), as APOLLOAdamW keeps them: moments of the projected
        gradient 2·r·max(m, n), the random projection r·min(m, n) (proj_type std projects
        the larger side away) and the norm-growth limiter's last norm (one scalar); every other
        weight plain AdamW's two moments; every trained weight's gradient until step(); inside
        step() two tensors of the largest weight's size (the scaled gradient and its limited copy,
        or a dense weight's denominator and update)."""
        f, r = 4, options.get("rank", 8)
        return {"weights": geo.n_all * b, "master": geo.n_all * f if b < f else 0,
                "grads": geo.n_all * f,
                "optimizer": (2 * (geo.n_all - geo.n_low)
                              + sum(2 * r * max(m, n) + r * min(m, n) + 1
                                    for m, n in geo.low_rank)) * f,
                "step": 0, "perturbed_copy": 0, "after_apply": 0,
                "transient": 2 * geo.largest * f, "frozen_base": False}
