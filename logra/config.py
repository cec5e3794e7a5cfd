"""Configuration: the checks a JSON schema cannot express, and one run's resolved config.

The schema (`workflow/schemas/config.schema.yaml`) validates every key and fills defaults; the
Snakefile runs it and then `check`, so a bad key or value stops the workflow before any job
starts, with the key named. `validate_file` does both for use outside Snakemake.
"""
from __future__ import annotations

from pathlib import Path

import yaml

from logra import methods
from logra.tasks import get_task

SCHEMA = Path(__file__).resolve().parents[1] / "workflow" / "schemas" / "config.schema.yaml"


class ConfigError(ValueError):
    """A configuration value that cannot work; the message names the key."""


def check(config: dict) -> None:
    """Cross-key checks: references between sections, options accepted by the code."""
    for i, name in enumerate(config["run_methods"]):
        if name not in config["methods"]:
            raise ConfigError(f"run_methods[{i}]: {name!r} is not defined under methods "
                              f"(defined: {sorted(config['methods'])})")
    _check_rules_fit_model(config)
    for name, t in config["tasks"].items():
        try:
            get_task(t["type"], **t.get("options", {}))
        except (TypeError, ValueError) as e:
            raise ConfigError(f"tasks.{name}.options: {e}") from None
    g = config["grpo"]
    if g["profile_step"] > g["steps"]:
        raise ConfigError(f"grpo.profile_step={g['profile_step']} is after the last step "
                          f"(grpo.steps={g['steps']})")


def _check_rules_fit_model(config: dict) -> None:
    """Build each update rule on the configured architecture (meta tensors: no memory, no
    weights), so options that cannot work on this model, e.g. a rank above a weight's smaller
    side, stop the workflow here with the rule's own message naming the module."""
    import torch
    from transformers import AutoModelForCausalLM

    from logra.modeling import model_config
    try:
        hf_config = model_config(config["model"])
    except OSError:  # a hub name while offline: the rule is checked when the run starts
        return
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    for name, m in config["methods"].items():
        try:
            methods.build(m["rule"], model, m.get("options", {}))
        except (TypeError, ValueError) as e:
            raise ConfigError(f"methods.{name}.options: {e}") from None


def validate_file(path: str | Path) -> dict:
    """Load a config file, validate it against the schema (filling defaults) and check it."""
    from snakemake.utils import validate
    config = yaml.safe_load(Path(path).read_text())
    validate(config, str(SCHEMA))
    check(config)
    return config


def run_config(config: dict, task: str, method: str, seed: int) -> dict:
    """Everything one (task, method, seed) run needs, as stored in its summary.json."""
    return {
        "run_id": f"{task}/{method}/seed{seed}", "task_name": task, "method_name": method,
        "seed": int(seed), "device": config["device"], "threads": config["threads"],
        "task": {"type": config["tasks"][task]["type"],
                 "options": config["tasks"][task].get("options", {})},
        "method": {"rule": config["methods"][method]["rule"],
                   "options": config["methods"][method].get("options", {}),
                   "kl_control": config["methods"][method].get("kl_control")},
        "model_name": config["model"]["name"], "grpo": dict(config["grpo"]),
        "rollout": dict(config["rollout"]),
    }
