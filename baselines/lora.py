"""LoRA through the method interface: `peft` adapters injected into the model in place.

`peft.inject_adapter_in_model` adds LoRA adapters to the same nn.Linear weights LoGRA sketches
(`modules` regex); every other weight is frozen, as in LoRA fine-tuning, unless `dense_modules`
names it (trained in full at `dense_lr`). The adapters and the dense weights are trained by
dense AdamW (this class is `DenseAdam` on them), so propose/apply/perturbed, predicted-KL
control, checkpoints and memory labels work as for dense Adam. Sync sends the adapters'
factors (`low_rank`, the rule's own), the merged weights (`full`) or the words that changed
(`delta`); frozen weights are never sent. `unwrap()` merges the adapters into the base
weights and removes them, so the saved checkpoint is a plain HF model.

The learning rate and each transport in full: docs/baselines.md, "LoRA".
"""
from __future__ import annotations

import math
import re

import torch

from logra.optim.dense_adam import DenseAdam
from logra.optim.rule import (
    ADAM_OPTIONS,
    DEFAULT_MODULES,
    LR,
    POSINT,
    POSNUM,
    Geometry,
    low_rank_linears,
)
from logra.optim.sketch import lora_merged

ADAPTER = "default"


class LoRA(DenseAdam):
    options = {**ADAM_OPTIONS, "rank": POSINT | {"description": "adapter rank r"},
               "alpha": POSNUM | {"description": "the adapter output is scaled by alpha / r "
                                                "(alpha / sqrt(r) with use_rslora)"},
               "dropout": {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
               "use_rslora": {"type": "boolean"},
               "weight_decay": {"type": "number", "minimum": 0, "description": "on the adapters"},
               "modules": {"type": "string", "description": "regex over module names: the "
                           "nn.Linear modules that get adapters"},
               "dense_modules": {"type": "string", "description": "regex over parameter "
                                 "names: weights (not adapted) trained in full at dense_lr"},
               "dense_lr": LR}
    shardable = False  # the merge (engine_weights, unwrap) is not written for sharded weights
    transports = ("low_rank", "full", "delta")  # its own: the adapters

    def __init__(self, model: torch.nn.Module, lr: float = 1e-3, rank: int = 8,
                 alpha: float = 32.0, dropout: float = 0.0, use_rslora: bool = False,
                 betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
                 modules: str = DEFAULT_MODULES, dense_modules: str | None = None,
                 dense_lr: float | None = None):
        targets = low_rank_linears(model, modules)
        for name, m in targets:
            if rank > min(m.weight.shape):
                raise ValueError(f"rank={rank} exceeds min(shape)={min(m.weight.shape)} of "
                                 f"{name}.weight {tuple(m.weight.shape)}")
        adapted = {id(m.weight) for _, m in targets}
        dense = ([(n, p) for n, p in model.named_parameters()
                  if re.search(dense_modules, n) and id(p) not in adapted]
                 if dense_modules else [])
        if dense_modules and not dense:
            raise ValueError(f"dense_modules: pattern {dense_modules!r} matches no parameter "
                             "that is not adapted")
        from peft import LoraConfig, inject_adapter_in_model  # here: the config check reads
        model.requires_grad_(False)                            # `options` without loading peft
        inject_adapter_in_model(LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout,
                                           use_rslora=use_rslora,
                                           target_modules=[n for n, _ in targets]), model)
        self.model, self.dense_named = model, dense
        self.layers = {name: model.get_submodule(name) for name, _ in targets}
        adapters = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        for _, p in dense:
            p.requires_grad_(True)
        self.init(adapters + dense, lr, betas, eps, weight_decay,
                  lrs=[lr] * len(adapters) + [dense_lr or lr] * len(dense))
        # a fresh engine loads the base weights this model starts from; after a resume it
        # holds merged weights and is sent each base once (load_state_dict)
        self.engine_has_base = True

    def _factors(self, name: str) -> tuple[torch.Tensor, torch.Tensor, float]:
        layer = self.layers[name]
        return (layer.lora_A[ADAPTER].weight.detach(), layer.lora_B[ADAPTER].weight.detach(),
                layer.scaling[ADAPTER])

    def engine_weights(self) -> dict[str, torch.Tensor]:
        """Merged W + (α/r)·BA of each adapted module, under the base model's names, and the
        densely trained weights."""
        with torch.no_grad():
            merged = {f"{name}.weight": lora_merged(layer.get_base_layer().weight,
                                                    *self._factors(name))
                      for name, layer in self.layers.items()}
        return merged | {n: p.detach() for n, p in self.dense_named}

    def sync_payload(self) -> dict:
        """Each module's factors and scale (its base too when the engine lacks it); the dense
        weights in full."""
        lora = {}
        for name, layer in self.layers.items():
            a, b, scale = self._factors(name)
            lora[f"{name}.weight"] = {"A": a, "B": b, "scale": scale, "base": (
                None if self.engine_has_base else layer.get_base_layer().weight.detach())}
        self.engine_has_base = True
        return {"dense": {n: p.detach() for n, p in self.dense_named}, "lora": lora}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.engine_has_base = False  # a resumed run's engine holds merged weights

    def unwrap(self) -> None:
        """Merge the adapters into the base weights and put the base Linear modules back."""
        from peft.tuners.lora import LoraLayer
        for name, layer in self.layers.items():
            assert isinstance(layer, LoraLayer)
            layer.merge(adapter_names=[ADAPTER])
            parent, _, child = name.rpartition(".")
            setattr(self.model.get_submodule(parent), child, layer.get_base_layer())
        self.layers = {}

    @staticmethod
    def planned(geo: Geometry, options: dict, b: int) -> dict:
        """The frozen base in the policy dtype (no master copy), r·(m + n) fp32 adapter weights
        per module (as PeftModel's autocast keeps them; peft's bare injection keeps the base
        dtype) and the `dense_modules` weights (fp32 master under a bf16 policy), with dense
        Adam's gradients, moments and perturbed copy for both. With dense weights the base is
        not frozen: the output layer's input activations are kept for their gradients."""
        f, r = 4, options.get("rank", 8)
        adapters = sum(r * (m + n) for m, n in geo.low_rank)
        dense = _dense_numel(geo, options)
        trained = adapters + dense
        return {"weights": geo.n_all * b + adapters * f,
                "master": dense * f if b < f else 0, "grads": trained * f,
                "optimizer": 2 * trained * f, "step": 0, "perturbed_copy": trained * f,
                "after_apply": 0, "transient": 0, "frozen_base": not dense}

    @staticmethod
    def planned_sync(geo: Geometry, options: dict, b: int) -> int:
        """The `low_rank` transport: r·(m + n) per adapted module (fp32, as trained), and the
        dense weights in the policy dtype."""
        adapted = sum(options.get("rank", 8) * (m + n) for m, n in geo.low_rank) * 4
        return adapted + _dense_numel(geo, options) * b

    @staticmethod
    def planned_trained(geo: Geometry, options: dict) -> int:
        """The merged adapted weights and the `dense_modules` weights (`engine_weights`)."""
        return geo.n_low + _dense_numel(geo, options)


def _dense_numel(geo: Geometry, options: dict) -> int:
    """Weights `dense_modules` trains in full (every matching parameter; the adapted ones are
    the planner's `low_rank` shapes and are matched by the pattern only if it names them)."""
    pattern = options.get("dense_modules")
    return sum(math.prod(s) for n, s in geo.params if pattern and re.search(pattern, n)
               and not re.search(options.get("modules", DEFAULT_MODULES), n.removesuffix(".weight")))
