"""Configuration: the checks a JSON schema cannot express, and one run's resolved config.

The schema (`workflow/schemas/config.schema.yaml`) validates every key and fills defaults; the
Snakefile runs it and then `check`, so a bad key or value stops the workflow before any job
starts, with the key named. `validate_file` does both for use outside Snakemake.
"""
from __future__ import annotations

import inspect
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
    for name, m in config["methods"].items():
        rule = methods.RULES[m["rule"]]
        module, cls = rule.split(":")
        params = inspect.signature(getattr(__import__(module, fromlist=[cls]), cls)).parameters
        for key in m.get("options", {}):
            if key not in params or key == "model":
                raise ConfigError(f"methods.{name}.options.{key}: not an option of rule "
                                  f"{m['rule']!r} (options: {[p for p in params if p != 'model']})")
    for name, t in config["tasks"].items():
        try:
            get_task(t["type"], **t.get("options", {}))
        except (TypeError, ValueError) as e:
            raise ConfigError(f"tasks.{name}.options: {e}") from None
    g = config["grpo"]
    if g["profile_step"] > g["steps"]:
        raise ConfigError(f"grpo.profile_step={g['profile_step']} is after the last step "
                          f"(grpo.steps={g['steps']})")


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
                   "options": config["methods"][method].get("options", {})},
        "model_name": config["model"]["name"], "grpo": dict(config["grpo"]),
        "rollout": dict(config["rollout"]),
    }
