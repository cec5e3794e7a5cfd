"""The config's JSON schema (`workflow/schemas/config.schema.yaml`) and its validators, and the
error every config check raises (`ConfigError`, its message naming the key)."""
from __future__ import annotations

import functools
import re
from pathlib import Path

import yaml


SCHEMA = Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "config.schema.yaml"


class ConfigError(ValueError):
    """A configuration value that cannot work; the message names the key."""


def number_hint(value) -> str:
    """For a string YAML 1.1 reads where a number was meant (`1e-3`), how to write it."""
    hit = (re.fullmatch(r"([+-]?)(\d+)(?:\.(\d*))?[eE]([+-]?)(\d+)", value.strip())
           if isinstance(value, str) else None)
    if not hit:
        return ""
    sign, whole, frac, exp_sign, exp = hit.groups()
    return (f" ({value!r} was read as a string: YAML 1.1 reads an exponent only after a dot "
            f"and with a sign; write {sign}{whole}.{frac or '0'}e{exp_sign or '+'}{exp})")


@functools.cache
def config_schema() -> dict:
    """workflow/schemas/config.schema.yaml, read once (callers do not modify it)."""
    return yaml.safe_load(SCHEMA.read_text())


@functools.cache
def validator():
    """Draft 2020-12 with `integer` meaning a Python int: JSON Schema counts 2.0 as one, which
    then fails as a step count or a seed inside a job (bool is refused as well)."""
    from jsonschema import Draft202012Validator
    from jsonschema.validators import extend

    return extend(Draft202012Validator, type_checker=Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _, value: isinstance(value, int) and not isinstance(value, bool)))


@functools.cache
def grpo_validator():
    """The grpo section's schema without defaults: a method's own grpo values are checked
    against it (once built, for every method, derived ones too)."""
    from jsonschema import Draft202012Validator
    schema = config_schema()
    return Draft202012Validator({"$defs": schema["$defs"], **schema["properties"]["grpo"]})
