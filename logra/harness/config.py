"""Configuration: how config files combine into the config the workflow runs (`resolve`).

`resolve`, what the Snakefile calls, reads `config/config.yaml`, then every `--configfile` in
order, then `--config key=value`: each merged over what came before as Snakemake merges configs
(nested maps merge key by key; any other value, a list too, replaces), except that a file with
`complete: true` replaces everything before it (the default included): a config written whole,
such as `config/paper.yaml`. Files are read strictly (a key given twice is an error naming the
file and line); `config/tuned.yaml`, every grid's adopted choices (logra.harness.adopt), is
read after the default. The merged config is then validated by the schema
(logra/harness/schema.py, which fills defaults) and by the cross-key checks
(logra/harness/checks.py), so a bad key or value stops the workflow before any job starts,
naming the key and the file that set it. `validate_file` does the same for one complete file.
What runs derive from a config is logra/harness/runs.py; all of it is importable from here.
"""
from __future__ import annotations

import contextlib
import copy
import difflib
import inspect
import math
import re
import sys
from collections.abc import Mapping
from pathlib import Path

import yaml

from logra import rules
# the config's API, one import for its users: the checks and what runs derive from a config
from logra.harness.checks import check, check_choice
from logra.harness.method_checks import check_method, trained_methods  # noqa: F401
from logra.harness.runs import (  # noqa: F401
    DEVICE_STAGES, generation_room, gpus_per_run, grpo_settings, hub_models, job_resources,
    margin_seeds, method_grpo, run_config, run_tasks, sync_transport, task_options)
from logra.harness.schema import SCHEMA, ConfigError, config_schema, number_hint, validator

DEFAULT = SCHEMA.parents[2] / "config" / "config.yaml"
# values (scalars, lists, maps) a merged config may hold, YAML aliases expanded: config.yaml
# holds about 800 as written; a few nested aliases can expand to millions
MAX_VALUES = 100_000


class _StrictLoader(yaml.SafeLoader):
    """YAML's safe loader that refuses a mapping key written twice, checked as the document is
    composed, before merge keys (`<<`, whose keys may be overridden, as they are meant to be)
    are flattened into it."""

    def compose_mapping_node(self, anchor):
        node = super().compose_mapping_node(anchor)
        seen: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node,
                                                                           yaml.ScalarNode):
                continue
            key, line = (key_node.tag, key_node.value), key_node.start_mark.line + 1
            if key in seen:
                raise ConfigError(f"{self.name}:{line}: key {key_node.value!r} is given twice "
                                  f"in one mapping (first on line {seen[key]}); keep one")
            seen[key] = line
        return node


def read_yaml(path: str | Path) -> dict:
    """One config file, read strictly (`_StrictLoader`); it must hold a mapping."""
    path = Path(path)
    with open(path, encoding="utf-8") as f:
        loader = _StrictLoader(f)
        loader.name = str(path)
        try:
            data = loader.get_single_data()
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML ({e})") from None
        finally:
            loader.dispose()
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config file holds a mapping of keys at its top level")
    return data


def merge(config: dict, sources: dict, overlay: Mapping, source: str, prefix=()) -> None:
    """Merge `overlay` into `config` in place, as Snakemake's `update_config` does (maps key by
    key, anything else replaced), recording in `sources` which `source` set each key."""
    for key, value in overlay.items():
        path = (*prefix, key)
        if isinstance(value, Mapping) and isinstance(config.get(key), dict):
            merge(config[key], sources, value, source, path)
        else:
            config[key] = copy.deepcopy(dict(value) if isinstance(value, Mapping) else value)
            for known in [k for k in sources if k[:len(path)] == path]:
                del sources[known]
            sources[path] = source


def resolve(files: list[str | Path], overrides: Mapping | None = None,
            default: str | Path | None = DEFAULT, fit_rules: bool = True) -> dict:
    """The config the workflow runs: `default`, then `files` in order, then `overrides`
    (`--config`), merged as the module docstring says, validated (defaults filled) and
    checked; an error names the key, the file that set it and how files combine. Without
    `fit_rules` the rules are not built on the models (`check`): a job Snakemake starts in a
    process of its own (a slurm job) re-reads the Snakefile, whose main process checked the
    same config in full before any job ran."""
    config: dict = {}
    sources: dict[tuple, str] = {}
    order = []
    tuned = Path(default).with_name("tuned.yaml") if default else None
    for path in ([default] if default else []) + ([tuned] if tuned and tuned.exists() else []) \
            + list(files):
        data = read_yaml(path)
        if _values(data, MAX_VALUES) <= MAX_VALUES:  # else _check_size stops it, naming the key
            data = _unaliased(data)
        complete = data.get("complete") is True  # else the schema names a non-boolean
        if complete:  # a config written whole: what came before is dropped
            config, sources, order = {}, {}, []
        order.append(str(path) + (" (complete)" if complete else ""))
        merge(config, sources, data, str(path))
    if overrides:
        order.append("--config")
        merge(config, sources, _typed(overrides), "--config")
    how = ("" if default is None and len(files) == 1 and not overrides else
           f"config merged from {' < '.join(order)}: later files override the keys they name, "
           "nested maps merge, and a file with `complete: true` replaces all before it")
    _check_size(config, sources)
    validate(config, sources, how)
    try:
        apply_tuned(config, sources)
        check(config, fit_rules)
        if fit_rules:  # checked in full (once, by Snakemake's main process): say it once
            for note in _grpo_not_reaching(config, sources, str(default)):
                print(f"note: {note}", file=sys.stderr)
    except ConfigError as e:  # "key: message" (a line each): who set each key, how files combine
        lines = [line + _named_by(sources, config, line) for line in str(e).split("\n")]
        raise ConfigError("\n".join(lines) + (f"\n{how}" if how and len(lines) > 1 else
                                              f"; {how}" if how else "")) from None
    return config


def _grpo_not_reaching(config: dict, sources: dict, default: str) -> list[str]:
    """Each grpo key a file after `default` (or --config) sets that a method run by this config
    overrides with its own grpo value from another file: e.g. `grpo: {steps: 2}` in an overlay
    does not shorten a stability run whose own grpo.steps the default config sets."""
    notes = []
    for key, value in config.get("grpo", {}).items():
        source = sources.get(("grpo", key)) or sources.get(("grpo",))
        if source in (None, default):
            continue
        beaten = [f"{name} ({config['methods'][name]['grpo'][key]})" for name in sorted(
                      trained_methods(config) & set(config["methods"]))
                  if key in config["methods"][name].get("grpo", {})
                  and _set_by(sources, ("methods", name, "grpo", key)) != f" (set by {source})"]
        if beaten:
            notes.append(f"grpo.{key}={value} ({source}) does not reach the methods that set "
                         f"their own grpo.{key}: {', '.join(beaten)}; set "
                         f"methods.<name>.grpo.{key} for those too")
    return notes


def _unaliased(value):
    """`value` with every map and list its own: a YAML alias (`grpo: *regime` in two methods)
    reads as one shared object, and a later file merged into one method's would change the
    other's too (copy.deepcopy keeps the sharing)."""
    if isinstance(value, dict):
        return {k: _unaliased(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unaliased(v) for v in value]
    return value


def _values(value, limit: int) -> int:
    """How many values `value` holds (itself, and within it), counting up to `limit` + 1."""
    count, todo = 0, [value]
    while todo and count <= limit:
        v = todo.pop()
        count += 1
        todo.extend(v.values() if isinstance(v, dict) else v if isinstance(v, list) else ())
    return count


def _check_size(config: dict, sources: dict) -> None:
    """The merged config holds at most MAX_VALUES values, before the schema walks it: YAML
    anchors and aliases are copied where they are used, and a few nested ones expand to
    millions (a slow check, a run config of megabytes)."""
    if _values(config, MAX_VALUES) <= MAX_VALUES:
        return
    path, value = (), config
    while isinstance(value, dict):  # down to the map entry that alone is too large
        big = [k for k, v in value.items() if _values(v, MAX_VALUES) > MAX_VALUES]
        if not big:
            break
        path, value = (*path, big[0]), value[big[0]]
    raise ConfigError(f"config: {'.'.join(map(str, path)) or '(top level)'} expands to more "
                      f"than {MAX_VALUES:,} values (YAML anchors and aliases are copied where "
                      f"they are used){_set_by(sources, path)}")


def _typed(value):
    """`--config` values as a YAML file would hold them: Snakemake reads a nested value
    (`grpo={steps: 2}`) with YAML's base loader, every scalar a string; numbers, booleans and
    null are restored here (a number in Python's syntax, `1e-3` too)."""
    if isinstance(value, Mapping):
        return {k: _typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_typed(v) for v in value]
    if isinstance(value, str):
        for parse in (int, float):
            with contextlib.suppress(ValueError):
                return parse(value)
        if value.lower() in ("true", "false", "null", "~"):
            return yaml.safe_load(value)
    return value


def _source(sources: dict, path: tuple) -> str | None:
    """Which config file set the key at `path` (or the nearest map holding it)."""
    for n in range(len(path), 0, -1):
        if path[:n] in sources:
            return sources[path[:n]]
    return None


def _set_by(sources: dict, path: tuple) -> str:
    source = _source(sources, path)
    return f" (set by {source})" if source else ""


def _named_by(sources: dict, config: dict, line: str) -> str:
    """Which files set what an error line names: its key (the text before its first `:`, `=`
    or space) and the config's other keys it names (`data.n_test`), each with the keys under
    it that another file set (model.tiny's num_attention_heads, from an overlay), e.g.
    " (set by config/config.yaml; data.n_test by my.yaml)"."""
    first = re.sub(r"\[\d+\]$", "", re.split(r"[:= ]", line.strip(), maxsplit=1)[0])
    named = [first] + [k for k in re.findall(r"\b[a-z_]\w*(?:\.\w+)+", line) if k != first]
    by: dict[str, list[str]] = {}  # file -> the keys it set, in the order they are named
    for key in named:
        path = tuple(key.split("."))
        if key != first and not _holds(config, path):
            continue
        found = {".".join(map(str, k)): v for k, v in sources.items()
                 if k[:len(path)] == path and len(k) > len(path)}
        source = _source(sources, path)
        for k, v in [(key, source)] * bool(source) + list(found.items()):
            if k not in by.setdefault(v, []):
                by[v].append(k)
    if not by:
        return ""
    (own, _), *others = sorted(by.items(), key=lambda item: first not in item[1])
    if first not in by[own]:  # nothing set the line's own key: name each file with its keys
        return " (set by " + "; ".join(f"{', '.join(keys)} by {f}" for f, keys in by.items()) + ")"
    return f" (set by {own}" + "".join(f"; {', '.join(keys)} by {f}" for f, keys in others) + ")"


def _holds(config: dict, path: tuple) -> bool:
    """Whether `path` names a key of the config."""
    node = config
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return True


def apply_tuned(config: dict, sources: dict) -> None:
    """Adopt `tuned` (config/tuned.yaml, read after config/config.yaml: results/tuned.yaml as the
    lr sweep wrote it, logra.analysis.tuning.tuned_file, adopted by logra.harness.adopt): per
    task and method, the chosen point of its knob through its rule's `tuned` (LoGRA's
    update_ratio and final budget follow), each option it changes given that value for that
    task (a per-task map; the value it had is the map's `default` where it had one value). A
    method whose `tuned_as` names it (a variant: an ablation, a longer run) takes the same
    values. A choice made for another knob, an unknown task or method, or a variant that names
    an undefined method, one of another rule, or is itself chosen, stops the config."""
    methods = config["methods"]
    for name, m in methods.items():
        leader = m.get("tuned_as")
        if leader is None:
            continue
        if leader not in methods or methods[leader].get("tuned_as"):
            raise ConfigError(f"methods.{name}.tuned_as: {leader!r} is not a method whose choice "
                              f"it can take (defined without tuned_as: "
                              f"{sorted(k for k, v in methods.items() if 'tuned_as' not in v)})")
        if methods[leader]["rule"] != m["rule"]:
            raise ConfigError(f"methods.{name}.tuned_as: {leader!r} runs rule "
                              f"{methods[leader]['rule']!r}, {name!r} runs {m['rule']!r}")
    for task, chosen in config.get("tuned", {}).items():
        if task not in config["tasks"]:
            raise ConfigError(f"tuned.{task}: not a task of this config (tasks: "
                              f"{sorted(config['tasks'])})")
        for name, entry in chosen.items():
            if name not in methods:
                raise ConfigError(f"tuned.{task}.{name}: not defined under methods (defined: "
                                  f"{sorted(methods)})")
            if methods[name].get("tuned_as"):
                raise ConfigError(f"tuned.{task}.{name}: the method takes "
                                  f"{methods[name]['tuned_as']!r}'s choice (its tuned_as)")
            method = methods[name]
            cls = rules.rule_class(method["rule"])
            defaults = inspect.signature(cls).parameters
            here = task_options(method.get("options", {}), task)
            if cls.tuning_option(here) != entry["option"]:
                raise ConfigError(f"tuned.{task}.{name}.option: {entry['option']!r}, but the "
                                  f"method's knob is {cls.tuning_option(here)!r}: the choice was "
                                  "made for another setting of it; rerun the lr sweep")
            try:  # the sweep's rule's choice among the record's own scores
                check_choice(f"tuned.{task}.{name}", entry, entry["option"],
                             config["eval"]["primary"])
            except ValueError as e:
                raise ConfigError(f"{e}{_set_by(sources, ('tuned', task, name))}") from None
            if set(entry.get("seeds") or []) & set(config["seeds"]):
                raise ConfigError(f"tuned.{task}.{name}.seeds: chosen on seeds {entry['seeds']}, "
                                  f"of which {sorted(set(entry['seeds']) & set(config['seeds']))}"
                                  " are test seeds (seeds): a choice is made on validation "
                                  f"runs alone{_set_by(sources, ('tuned', task, name))}")
            tuned = cls.tuned(here, entry["value"])
            # the options the choice sets: those `tuned` moves when the value moves
            moved = {o for o, v in cls.tuned(here, 2 * entry["value"]).items()
                     if v != tuned.get(o)} | {entry["option"]}
            for target in [name, *(k for k, v in methods.items() if v.get("tuned_as") == name)]:
                options = methods[target].get("options", {})
                mine = task_options(options, task)
                new = dict(options)
                for option in sorted(moved):
                    value = tuned[option]
                    if option in mine and mine[option] == value:
                        continue
                    old = options.get(option, defaults[option].default)
                    new[option] = {**(old if isinstance(old, dict) else {"default": old}),
                                   task: value}
                    sources[("methods", target, "options", option, task)] = _source(
                        sources, ("tuned", task, name))
                methods[target]["options"] = new


def validate(config: dict, sources: dict | None = None, how: str = "") -> None:
    """Validate `config` against the schema, filling defaults in place, then refuse any
    non-finite number. An error names the key, the value, the file that set it and `how` the
    files combined, without the schema dump."""
    from jsonschema.exceptions import best_match
    from snakemake.utils import validate as fill_defaults

    sources = sources or {}
    error = best_match(validator()(config_schema()).iter_errors(config))
    if error is not None:
        path = tuple(error.absolute_path)
        by = _set_by(sources, path)
        missing = re.match(r"'(.+)' is a required property", error.message)
        if missing:
            key = ".".join(map(str, (*path, missing.group(1))))
            raise ConfigError(f"config: {key} is required and no file sets it{by}; "
                              f"{how or 'a config read alone must be complete'}")
        unknown = re.findall(r"'([^']+)'", error.message.split("(")[-1]) if (
            error.validator == "additionalProperties") else []
        if unknown:  # the file that wrote the unknown key, and the valid key it is closest to
            valid = sorted(error.schema.get("properties", {}))
            close = difflib.get_close_matches(unknown[0], valid, n=1)
            hint = f"did you mean {close[0]!r}?" if close else "valid: " + ", ".join(valid)
            raise ConfigError(f"config: {'.'.join(map(str, (*path, unknown[0])))}: unknown key"
                              f"; {hint}{_set_by(sources, (*path, unknown[0]))}"
                              f"{'; ' + how if how else ''}")
        raise ConfigError(f"config: {'.'.join(map(str, path)) or '(top level)'}: "
                          f"{error.message}{number_hint(error.instance)}{by}"
                          f"{'; ' + how if how else ''}")
    fill_defaults(config, str(SCHEMA))
    for path, value in _numbers(config):
        if not math.isfinite(value):
            raise ConfigError(f"config: {'.'.join(map(str, path))}: {value} is not a finite "
                              f"number{_set_by(sources, path)}")


def _numbers(value, path=()):
    """(path, number) of every float in a config."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _numbers(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _numbers(v, (*path, i))
    elif isinstance(value, float):
        yield path, value


def validate_file(path: str | Path) -> dict:
    """One complete config file, read, validated (filling defaults) and checked (`resolve`
    without the default config under it)."""
    return resolve([path], default=None)

