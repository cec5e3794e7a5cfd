"""Adam-mini through the method interface: the official `adam_mini.Adam_mini`, on every weight.

Adam-mini keeps Adam's first moment per weight but one second-moment value per block, the
blocks found from parameter names as a Llama-style model names them (one per token row of
`embed` / `lm_head`, per attention head of `q_proj` / `k_proj`, per output neuron of
`v_proj`, `o_proj`, `mlp`; `bias`: Adam's own; anything else: one for the whole tensor).
Every trained weight is Adam-mini's, at one lr, as its users run it (it replaces dense Adam,
not a part of it). Deviations are settings of the package's optimizer object, never of its
arithmetic (`world_size` 1, `head_numel` for models such as Gemma-3, verbose=False). As a
torch optimizer that applies its update inside `step()`, it runs through
`baselines.torch_optimizer.TorchOptimizerRule`.

The blocks and each deviation in full: docs/baselines.md, "Adam-mini".
"""
from __future__ import annotations

import math

import torch

from baselines.torch_optimizer import TorchOptimizerRule
from logra.optim.rule import ADAM_OPTIONS, Geometry


class AdamMini(TorchOptimizerRule):
    options = ADAM_OPTIONS
    shardable = False  # the package supports FSDP; not verified here

    def __init__(self, model: torch.nn.Module, lr: float = 1e-3, betas=(0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0):
        from adam_mini import Adam_mini  # here: the config check reads `options` without it
        config = model.config
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        if heads % kv_heads:
            raise ValueError(f"adam_mini: num_attention_heads={heads} is not a multiple of "
                             f"num_key_value_heads={kv_heads}")
        self.named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.optimizer = Adam_mini(self.named, lr=lr, betas=tuple(betas), eps=eps,
                                   weight_decay=weight_decay, dim=config.hidden_size,
                                   n_heads=heads, n_kv_heads=kv_heads, verbose=False)
        self.optimizer.world_size = 1
        self.optimizer.head_numel = head_dim(config) * config.hidden_size

    @staticmethod
    def planned(geo: Geometry, options: dict, b: int) -> dict:
        """The first moment of every weight, and one second-moment value per block (see
        docs/baselines.md, "Adam-mini"; `blocks`, from each parameter's name and shape); every
        weight's gradient until step(); inside step() two tensors of the largest weight's size
        (the update and its negation)."""
        f = 4
        v = sum(blocks(name, shape, geo.head_dim) for name, shape in geo.params)
        return {"weights": geo.n_all * b, "master": geo.n_all * f if b < f else 0,
                "grads": geo.n_all * f, "optimizer": (geo.n_all + v) * f,
                "step": 0, "perturbed_copy": 0, "after_apply": 0,
                "transient": 2 * geo.largest * f, "frozen_base": False}


def head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def blocks(name: str, shape: tuple[int, ...], head: int) -> int:
    """Second-moment values Adam-mini keeps for the parameter `name` of `shape` (its
    partition, in the package's order of checks); `head` is the head size."""
    name, numel = name.lower(), math.prod(shape)
    if "bias" in name:
        return numel
    if any(k in name for k in ("k_proj", "q_proj", "wq", "wk", "query", "key")):
        return numel // (head * shape[-1])  # heads: blocks of head · dim weights
    if any(k in name for k in ("embed", "embd", "wte", "lm_head", "output", "final_layer",
                               "v_proj", "wv", "value", "feed_forward", "linear", "mlp",
                               "o_proj", "wo", "attn.proj")):
        return shape[0]
    return 1
