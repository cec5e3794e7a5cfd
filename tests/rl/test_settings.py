"""A run's typed settings (logra/rl/settings.py): the schema's keys exactly, built from a
validated run config and back to it unchanged, refusing an unknown or a missing key."""
import dataclasses
import json

import pytest
import yaml
from conftest import ROOT

from logra.harness.config import grpo_settings, run_config, validate_file
from logra.rl.settings import Grpo, Rollout, RunSettings

SCHEMA = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())


@pytest.mark.parametrize("cls, section", [(Grpo, "grpo"), (Rollout, "rollout")])
def test_the_fields_are_the_schemas_keys(cls, section):
    """The schema stays the one source of keys and defaults: a key added there and not here
    (or the reverse) fails here, not in a run."""
    assert {f.name for f in dataclasses.fields(cls)} == set(
        SCHEMA["properties"][section]["properties"])
    assert all(f.default is dataclasses.MISSING for f in dataclasses.fields(cls))


def test_a_run_config_round_trips_and_the_settings_are_frozen():
    config = validate_file(ROOT / "config/config.yaml")
    for method in ("dense_adam", "logra"):
        cfg = run_config(config, "countdown", method, 1)
        settings = RunSettings.from_dict(json.loads(json.dumps(cfg)))  # as torchrun reads it
        assert settings.to_dict() == cfg
        assert settings.grpo.steps == cfg["grpo"]["steps"] and settings.seed == 1
        assert settings.rollout.sync == cfg["rollout"]["sync"]
        with pytest.raises(dataclasses.FrozenInstanceError):
            settings.grpo.steps = 3
    assert grpo_settings({"steps": 7}) == Grpo.from_dict(
        {k: p["default"] for k, p in SCHEMA["properties"]["grpo"]["properties"].items()}
        | {"steps": 7})


def test_an_unknown_or_missing_key_is_named():
    cfg = run_config(validate_file(ROOT / "config/config.yaml"), "countdown", "logra", 0)
    with pytest.raises(KeyError, match=r"run config.grpo: unknown key\(s\) \['stpes'\]"):
        RunSettings.from_dict(cfg | {"grpo": cfg["grpo"] | {"stpes": 3}})
    rollout = {k: v for k, v in cfg["rollout"].items() if k != "dtype"}
    with pytest.raises(KeyError, match=r"run config.rollout: missing key\(s\) \['dtype'\]"):
        RunSettings.from_dict(cfg | {"rollout": rollout})
