"""The update rules a config names: `methods.<name>.rule` is a name in `RULES`, an import path
`package.module:Class` (importable in every job) or a file `path/to/file.py:Class` (relative to
the working directory), naming a subclass of `logra.optim.rule.UpdateRule`. Rule modules are
plug-ins, imported when a run asks for them, after the known noise of their packages is
filtered (`logra.noise`)."""
from __future__ import annotations

import importlib
import inspect

from logra.files import import_file
from logra.noise import quiet
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
        raise ValueError(f"unknown rule {rule!r}; known: {sorted(RULES)}, an import path "
                         "module:Class or a file path/to/file.py:Class")
    module, name = path.rsplit(":", 1)
    if module in MOVED:
        raise ValueError(f"rule {rule!r}: module {module} has moved to {MOVED[module]}; "
                         f"write {MOVED[module]}:{name}")
    quiet()
    try:
        cls = getattr(import_file(module, f"rule {rule!r}") if module.endswith(".py")
                      else importlib.import_module(module), name)
    except (ImportError, AttributeError, FileNotFoundError) as e:
        hint = ("; a module outside this directory: give its file, path/to/file.py:Class"
                if isinstance(e, ModuleNotFoundError) else "")
        raise ValueError(f"rule {rule!r}: cannot import {path} ({e}){hint}") from None
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
