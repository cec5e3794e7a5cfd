"""GaLore through the method interface: the official `galore_torch.GaLoreAdamW`, unmodified.

The weights LoGRA would sketch (same `modules` regex) form GaLoreAdamW's projected parameter
group `{'rank', 'update_proj_gap', 'scale', 'proj_type'}`, as its users configure it; every
other trained parameter is a plain group of the same optimizer (lr `dense_lr`).

GaLore's known limits stay visible rather than being worked around: full gradients of every
weight live until `step()`; the update is applied inside it (through
`baselines.torch_optimizer.TorchOptimizerRule`), so predicted-KL control cannot scale it; the
rollout engine receives every trained tensor in full; under FSDP each projected weight's whole
gradient is all-gathered to every rank at every projection refresh (DTensor has no sharded SVD).

Each limit in full: docs/baselines.md, "GaLore".
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


class GaLore(TorchOptimizerRule):
    options = {**ADAM_OPTIONS, "rank": POSINT, "update_proj_gap": POSINT, "scale": POSNUM,
               "proj_type": {"type": "string", "enum": ["std", "reverse_std", "right", "left"]},
               "dense_lr": LR, "modules": {"type": "string"}}
    shardable = True  # but it gathers whole gradients for its SVD (see docs/baselines.md, "GaLore")

    def __init__(self, model: torch.nn.Module, lr: float = 1e-3, rank: int = 8,
                 update_proj_gap: int = 20, scale: float = 1.0, proj_type: str = "std",
                 betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
                 dense_lr: float | None = None, modules: str = DEFAULT_MODULES):
        # eps 1e-8 as every rule here (galore-torch's own default is 1e-6): the rules compared
        # differ in their projection, not in Adam's ε. The package is imported here, not with
        # the module: the config check reads `options` without loading it (or bitsandbytes)
        from galore_torch import GaLoreAdamW
        from galore_torch.galore_projector import GaLoreProjector
        self.checkpoint_classes = (GaLoreProjector,)  # in the optimizer's state, one per weight
        projected = [m.weight for _, m in low_rank_linears(model, modules)]
        ids = {id(p) for p in projected}
        self.named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        dense = [p for _, p in self.named if id(p) not in ids]
        self.optimizer = GaLoreAdamW(
            [{"params": dense, "lr": dense_lr or lr},
             {"params": projected, "rank": rank, "update_proj_gap": update_proj_gap,
              "scale": scale, "proj_type": proj_type}],
            lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)

    @staticmethod
    def planned(geo: Geometry, options: dict, b: int) -> dict:
        """Per projected weight (m x n): moments 2·r·max(m, n) and the projection min(m, n)²
        (galore-torch keeps it as a slice of the full SVD factor; GaLore's paper formula has
        r·min(m, n)); every other weight dense Adam's; every trained weight's gradient until
        step(); inside step() two tensors of the largest weight's size (denominator and
        update; a projected weight's update projected back, then scaled), whole on every rank
        under FSDP."""
        f, r = 4, options.get("rank", 8)
        return {"weights": geo.n_all * b, "master": geo.n_all * f if b < f else 0,
                "grads": geo.n_all * f,
                "optimizer": (2 * (geo.n_all - geo.n_low)
                              + sum(2 * r * max(m, n) + min(m, n) ** 2
                                    for m, n in geo.low_rank)) * f,
                "step": 0, "perturbed_copy": 0, "after_apply": 0,
                "transient": 2 * geo.largest * f,
                "frozen_base": False}
