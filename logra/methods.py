"""The method interface: every update rule (dense Adam, LoGRA, GaLore, ...) is built the same way.

`build(rule, model, options)` returns an object with

    propose() -> step        candidate step from the gradients (or sketches) of this batch;
                             advances the optimizer's moments; gradients are consumed
    apply(step, scale)       W += scale * step, for every parameter the rule owns
    perturbed(step, eta)     context in which forwards see θ + eta * step (KL prediction);
                             θ is restored exactly on exit
    sync_payload() -> dict   what the rollout engine needs to match the trainer after the
                             last apply (see logra/sync.py)
    engine_weights() -> dict every trained weight in full, as the rollout engine names it
                             (full resync, drift check, resume)
    unwrap()                 leave the model as the plain architecture with the training
                             merged in (LoRA merges its adapters); called once, at the end
    state_tensors() -> list  the optimizer state tensors (labelled "optimizer" when measured)
    grad_buffers() -> list   gradient buffers the rule owns besides .grad (labelled "grads")
    state_bytes() -> int     bytes of the state tensors
    peak_grad_bytes() -> int analytic bytes of gradients alive at the peak
    grad_norm: float         norm of the gradient consumed by the last propose()
    state_dict() -> dict     everything the rule needs to resume (logra/checkpoint.py)
    load_state_dict(state)   restore it on the same model

Rules install whatever hooks they need on the model in their constructor. The RL loop calls only
these, so it never branches on a method's name; new rules register here by import path.
"""
from __future__ import annotations

import importlib

RULES = {
    "dense_adam": "baselines.dense_adam:DenseAdam",
    "logra": "logra.logra:LoGRA",
    "galore": "baselines.galore:GaLore",
    "lora": "baselines.lora:LoRA",
}


def build(rule: str, model, options: dict):
    """Instantiate update rule `rule` (config `methods.<name>.rule`) on `model`."""
    if rule not in RULES:
        raise ValueError(f"methods.*.rule: unknown {rule!r}; known: {sorted(RULES)}")
    module, cls = RULES[rule].split(":")
    return getattr(importlib.import_module(module), cls)(model, **options)
