"""LoRA through the method interface: `peft` adapters injected into the model in place.

`peft.inject_adapter_in_model` adds LoRA adapters (rank r, α, dropout, rsLoRA, as `LoraConfig`
takes them) to the same nn.Linear weights LoGRA sketches (`modules` regex); every other weight is
frozen, as in LoRA fine-tuning. The adapters are trained by dense AdamW (this class is
`DenseAdam` on the adapter parameters), so propose/apply/perturbed, predicted-KL control,
checkpoints and memory labels work as for dense Adam.

Learning rate: LoRA-for-RL practice trains adapters with α = 32 at about 10× the full
fine-tuning learning rate; the default config does so (lr = 10 × dense_adam's) and the lr sweep
(`snakemake lr_sweep`) checks the choice.

Sync: the rollout engine holds the base architecture and receives the merged weight
W + (α/r)·BA of every adapted module in full (what TRL sends vLLM for a PEFT model: merge,
send, unmerge); frozen weights never change and are never sent. `unwrap()` merges the adapters
into the base weights and removes them, so the saved checkpoint is a plain HF model.
"""
from __future__ import annotations

import torch
from peft import LoraConfig, inject_adapter_in_model
from peft.tuners.lora import LoraLayer

from logra.dense_adam import DenseAdam
from logra.logra import DEFAULT_MODULES, low_rank_linears
from logra.methods import ADAM_OPTIONS, POSINT, POSNUM, Geometry

ADAPTER = "default"


class LoRA(DenseAdam):
    options = {**ADAM_OPTIONS, "rank": POSINT | {"description": "adapter rank r"},
               "alpha": POSNUM | {"description": "the adapter output is scaled by alpha / r "
                                                "(alpha / sqrt(r) with use_rslora)"},
               "dropout": {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
               "use_rslora": {"type": "boolean"},
               "weight_decay": {"type": "number", "minimum": 0, "description": "on the adapters"},
               "modules": {"type": "string", "description": "regex over module names: the "
                           "nn.Linear modules that get adapters"}}
    shardable = False  # the merged-weight sync is not written for sharded weights

    def __init__(self, model: torch.nn.Module, lr: float = 1e-3, rank: int = 8,
                 alpha: float = 32.0, dropout: float = 0.0, use_rslora: bool = False,
                 betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
                 modules: str = DEFAULT_MODULES):
        targets = low_rank_linears(model, modules)
        for name, m in targets:
            if rank > min(m.weight.shape):
                raise ValueError(f"rank={rank} exceeds min(shape)={min(m.weight.shape)} of "
                                 f"{name}.weight {tuple(m.weight.shape)}")
        model.requires_grad_(False)
        inject_adapter_in_model(LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout,
                                           use_rslora=use_rslora,
                                           target_modules=[n for n, _ in targets]), model)
        self.model = model
        self.layers = {name: model.get_submodule(name) for name, _ in targets}
        adapters = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.init(adapters, lr, betas, eps, weight_decay)

    def engine_weights(self) -> dict[str, torch.Tensor]:
        """Merged W + (α/r)·BA of each adapted module, under the base model's names."""
        with torch.no_grad():
            return {f"{name}.weight":
                    layer.get_base_layer().weight + layer.get_delta_weight(ADAPTER)
                    for name, layer in self.layers.items()}

    def unwrap(self) -> None:
        """Merge the adapters into the base weights and put the base Linear modules back."""
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
        dtype) with dense Adam's gradients, moments and perturbed copy."""
        f, r = 4, options.get("rank", 8)
        adapters = sum(r * (m + n) for m, n in geo.low_rank)
        return {"weights": geo.n_all * b + adapters * f, "master": 0, "grads": adapters * f,
                "optimizer": 2 * adapters * f, "step": 0, "perturbed_copy": adapters * f,
                "after_apply": 0, "transient": 0, "frozen_base": True}

    @staticmethod
    def planned_sync(geo: Geometry, options: dict, b: int) -> int:
        """The merged adapted weights in the policy dtype."""
        return geo.n_low * b
