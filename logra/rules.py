"""The update rules a config names: `methods.<name>.rule` is a name in `RULES` or an import path
`package.module:Class` (a subclass of `logra.optim.rule.UpdateRule`, importable in every job).
Rule modules are plug-ins, imported by path when a run asks for them."""
from __future__ import annotations

import importlib
import inspect

from logra.optim.rule import UpdateRule

RULES = {
    "dense_adam": "logra.optim.dense_adam:DenseAdam",
    "logra": "logra.optim.logra_rule:LoGRA",
    "sketch_adam": "baselines.sketch_adam:SketchAdam",
    "galore": "baselines.galore:GaLore",
    "lora": "baselines.lora:LoRA",
    "apollo": "baselines.apollo:APOLLO",
    "adam_mini": "baselines.adam_mini:AdamMini",
    "adamw_8bit": "baselines.adamw_8bit:AdamW8bit",
    "muon": "baselines.muon:Muon",
}

# import paths of rules that have moved: a config naming one gets an error naming the new path
MOVED = {"logra.dense_adam": "logra.optim.dense_adam",
         "logra.logra": "logra.optim.logra_rule",
         "logra.sketch_adam": "baselines.sketch_adam"}


def rule_class(rule: str) -> type[UpdateRule]:
    """The class of update rule `rule` (config `methods.<name>.rule`): a name in `RULES` or an
    import path `module:Class`."""
    path = RULES.get(rule, rule)
    if ":" not in path:
        raise ValueError(f"unknown rule {rule!r}; known: {sorted(RULES)}, or an import path "
                         "module:Class")
    module, name = path.split(":", 1)
    if module in MOVED:
        raise ValueError(f"rule {rule!r}: module {module} has moved to {MOVED[module]}; "
                         f"write {MOVED[module]}:{name}")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"rule {rule!r}: cannot import {path} ({e})") from None
    if not (isinstance(cls, type) and issubclass(cls, UpdateRule)):
        raise ValueError(f"rule {rule!r}: {path} is not a subclass of logra.optim.rule.UpdateRule")
    return cls


def step_size(cls: type[UpdateRule], options: dict):
    """The step size a rule of class `cls` runs with under `options` (its `step_size_option`,
    given or its constructor's default), or None when it has no such option."""
    knob = cls.step_size_option
    if knob in options:
        return options[knob]
    parameter = inspect.signature(cls).parameters.get(knob)
    return None if parameter is None or parameter.default is parameter.empty \
        else parameter.default


def build(rule: str, model, options: dict) -> UpdateRule:
    """Instantiate update rule `rule` (config `methods.<name>.rule`) on `model`."""
    return rule_class(rule)(model, **options)
