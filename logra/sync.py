"""Policy synchronisation payloads: what the trainer sends the rollout engine after a step.

A payload is a plain dict, the same for every engine (HF generate in a subprocess here, vLLM
workers on GPUs):

    {"dense":   {param_name: full tensor},                # replaces the engine's tensor
     "lowrank": {param_name: {"side": "left" | "right",   # W += Q @ C  or  W += C @ Q.T
                              "basis": Q or None,         # only when it changed since last sync
                              "coef": C}}}                # the applied step's coefficients

`apply_payload` is the only code that changes rollout weights, and `payload_bytes` counts what
was actually put into the payload (the bytes a real transport would carry).
"""
from __future__ import annotations

import torch

from logra.sketch import lift_add_


def payload_bytes(payload: dict) -> int:
    """Bytes of every tensor in the payload."""
    total = sum(t.numel() * t.element_size() for t in payload.get("dense", {}).values())
    for entry in payload.get("lowrank", {}).values():
        for key in ("basis", "coef"):
            if entry.get(key) is not None:
                total += entry[key].numel() * entry[key].element_size()
    return total


def payload_to(payload: dict, device: torch.device | str) -> dict:
    """The payload with every tensor on `device` (for a transport, or an engine's GPU)."""
    return {"dense": {k: v.to(device) for k, v in payload.get("dense", {}).items()},
            "lowrank": {k: {key: v.to(device) if isinstance(v, torch.Tensor) else v
                            for key, v in e.items()}
                        for k, e in payload.get("lowrank", {}).items()}}


@torch.no_grad()
def apply_payload(params: dict[str, torch.Tensor], payload: dict,
                  bases: dict[str, torch.Tensor]) -> None:
    """Apply `payload` in place to `params` (name -> tensor of the engine's model).

    `bases` is the engine's cache of the last basis received per low-rank weight; it is updated
    when a payload carries a new one. Low-rank steps are added with `lift_add_`, the same
    function the trainer applies them with.
    """
    for name, tensor in payload.get("dense", {}).items():
        params[name].copy_(tensor)
    for name, entry in payload.get("lowrank", {}).items():
        if entry.get("basis") is not None:
            bases[name] = entry["basis"]
        if name not in bases:
            raise KeyError(f"low-rank sync for {name} before any basis was sent")
        lift_add_(params[name], bases[name], entry["coef"], entry["side"])
