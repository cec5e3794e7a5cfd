"""Policy synchronisation payloads: what the trainer sends the rollout engine after a step.

A payload is a plain dict, the same for every engine (HF generate in a subprocess here, vLLM
workers on GPUs):

    {"dense":   {param_name: full tensor},                # replaces the engine's tensor
     "lowrank": {param_name: {"side": "left" | "right",   # W += Q @ C  or  W += C @ Q.T
                              "basis": Q or None,         # only when it changed since last sync
                              "coef": C}},                # the applied step's coefficients
     "lora":    {param_name: {"A": A, "B": B,             # W = W_base + (B @ A) * scale
                              "scale": s,                 # (LoRA's alpha / r), a float
                              "base": W_base or None}}}   # only when the engine lacks it

LoRA adapter sync, as vLLM's LoRA runtime takes adapters: the engine keeps each adapted
weight's base (`bases`, taken from its own weights at the first adapter sync, when they are
the base it loaded, or from `base` when the payload carries it: after a resume restored merged
weights) and sets the weight to `lora_merged(base, A, B, scale)`, the function the trainer
merges with, so the engine equals the trainer's merged weights bit for bit.

`apply_payload` is the only code that changes rollout weights, and `payload_bytes` counts what
was actually put into the payload (the bytes a real transport would carry).
"""
from __future__ import annotations

import torch

from logra.sketch import lift_add_


def payload_bytes(payload: dict) -> int:
    """Bytes of every tensor in the payload."""
    total = sum(t.numel() * t.element_size() for t in payload.get("dense", {}).values())
    for section in ("lowrank", "lora"):
        for entry in payload.get(section, {}).values():
            total += sum(v.numel() * v.element_size() for v in entry.values()
                         if isinstance(v, torch.Tensor))
    return total


def lora_merged(base: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                scale: float) -> torch.Tensor:
    """W_base + (B @ A) · scale, as peft merges an fp32 adapter (`get_delta_weight`)."""
    return base + (b @ a) * scale


def payload_to(payload: dict, device: torch.device | str) -> dict:
    """The payload with every tensor on `device` (for a transport, or an engine's GPU)."""
    return {"dense": {k: v.to(device) for k, v in payload.get("dense", {}).items()},
            **{section: {k: {key: v.to(device) if isinstance(v, torch.Tensor) else v
                             for key, v in e.items()}
                         for k, e in payload.get(section, {}).items()}
               for section in ("lowrank", "lora")}}


@torch.no_grad()
def apply_payload(params: dict[str, torch.Tensor], payload: dict,
                  bases: dict[str, torch.Tensor]) -> None:
    """Apply `payload` in place to `params` (name -> tensor of the engine's model).

    `bases` is the engine's cache of the last basis received per low-rank weight, updated when
    a payload carries a new one, and of each LoRA-adapted weight's base (under the key
    `lora_base:<name>`). Low-rank steps are added with `lift_add_`, the same function the
    trainer applies them with; adapters are merged with `lora_merged`, as the trainer merges.
    """
    for name, tensor in payload.get("dense", {}).items():
        params[name].copy_(tensor)
    for name, entry in payload.get("lowrank", {}).items():
        if entry.get("basis") is not None:
            bases[name] = entry["basis"]
        if name not in bases:
            raise KeyError(f"low-rank sync for {name} before any basis was sent")
        lift_add_(params[name], bases[name], entry["coef"], entry["side"])
    for name, entry in payload.get("lora", {}).items():
        key = f"lora_base:{name}"
        if entry.get("base") is not None:
            bases[key] = entry["base"]
        elif key not in bases:  # the first adapter sync: the engine holds the base it loaded
            bases[key] = params[name].detach().clone()
        params[name].copy_(lora_merged(bases[key], entry["A"], entry["B"], entry["scale"]))
