"""Configuration: how config files combine, the checks a JSON schema cannot express, and one
run's resolved config.

`resolve` is what the Snakefile calls. It reads `config/config.yaml`, then every
`--configfile` in order, then `--config key=value`: each merged over what came before as
Snakemake merges configs (nested maps merge key by key; any other value, a list too,
replaces), except that a file with `complete: true` replaces everything before it (the
default included): a config written whole, such as `config/paper.yaml`. Files are read
strictly (a key given twice is an error naming the file and line). The merged config is then
validated by the schema (`workflow/schemas/config.schema.yaml`, which fills defaults) and by
`check`, so a bad key or value stops the workflow before any job starts, naming the key and the
file that set it. `validate_file` does the same for one complete file, outside Snakemake.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import difflib
import functools
import inspect
import math
import re
from collections.abc import Mapping
from pathlib import Path

import yaml

from logra import rules
from logra.rl import weight_sync
from logra.rl.tasks import TASKS, HubTask, get_task, load_task_files

SCHEMA = Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "config.schema.yaml"



DEFAULT = SCHEMA.parents[2] / "config" / "config.yaml"


class ConfigError(ValueError):
    """A configuration value that cannot work; the message names the key."""


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
    for path in ([default] if default else []) + list(files):
        data = read_yaml(path)
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
    validate(config, sources, how)
    try:
        check(config, fit_rules)
    except ConfigError as e:  # "key: message": say who set the key, and how files combine
        key = re.split(r"[:= ]", str(e), maxsplit=1)[0]
        path = tuple(re.sub(r"\[\d+\]$", "", key).split("."))
        raise ConfigError(f"{e}{_set_by(sources, path)}{'; ' + how if how else ''}") from None
    return config


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


def _set_by(sources: dict, path: tuple) -> str:
    """Which config file set the key at `path` (or the nearest map holding it)."""
    for n in range(len(path), 0, -1):
        if path[:n] in sources:
            return f" (set by {sources[path[:n]]})"
    return ""


def _number_hint(value) -> str:
    """For a string YAML 1.1 reads where a number was meant (`1e-3`), how to write it."""
    hit = (re.fullmatch(r"([+-]?)(\d+)(?:\.(\d*))?[eE]([+-]?)(\d+)", value.strip())
           if isinstance(value, str) else None)
    if not hit:
        return ""
    sign, whole, frac, exp_sign, exp = hit.groups()
    return (f" ({value!r} was read as a string: YAML 1.1 reads an exponent only after a dot "
            f"and with a sign; write {sign}{whole}.{frac or '0'}e{exp_sign or '+'}{exp})")


@functools.cache
def _schema() -> dict:
    """workflow/schemas/config.schema.yaml, read once (callers do not modify it)."""
    return yaml.safe_load(SCHEMA.read_text())


@functools.cache
def _validator():
    """Draft 2020-12 with `integer` meaning a Python int: JSON Schema counts 2.0 as one, which
    then fails as a step count or a seed inside a job (bool is refused as well)."""
    from jsonschema import Draft202012Validator
    from jsonschema.validators import extend

    return extend(Draft202012Validator, type_checker=Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _, value: isinstance(value, int) and not isinstance(value, bool)))


def validate(config: dict, sources: dict | None = None, how: str = "") -> None:
    """Validate `config` against the schema, filling defaults in place, then refuse any
    non-finite number. An error names the key, the value, the file that set it and `how` the
    files combined, without the schema dump."""
    from jsonschema.exceptions import best_match
    from snakemake.utils import validate as fill_defaults

    sources = sources or {}
    error = best_match(_validator()(_schema()).iter_errors(config))
    if error is not None:
        path = tuple(error.absolute_path)
        by = _set_by(sources, path)
        missing = re.match(r"'(.+)' is a required property", error.message)
        if missing:
            key = ".".join(map(str, (*path, missing.group(1))))
            raise ConfigError(f"config: {key} is required and no file sets it{by}; "
                              f"{how or 'a config read alone must be complete'}")
        raise ConfigError(f"config: {'.'.join(map(str, path)) or '(top level)'}: "
                          f"{error.message}{_number_hint(error.instance)}{by}"
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


def check(config: dict, fit_rules: bool = True) -> None:
    """Cross-key checks: references between sections, options accepted by the code, data
    sizes against batch sizes; with `fit_rules`, each rule built on each model it will train
    (`_check_rule_fits`: the costly part, which imports transformers and the rules' packages).
    The `task_files` are imported first, so the tasks they register are checked like the
    others."""
    try:
        load_task_files(config.get("task_files", []))
    except (OSError, ValueError) as e:  # each message starts "task_files: <the file>"
        raise ConfigError(str(e)) from None
    _check_rule_options(config)
    _check_data_sizes(config)
    if config["device"] == "cpu" and config["reproducible"] and config["threads"] != 1:
        raise ConfigError(f"threads: {config['threads']}; reproducible CPU runs use one thread "
                          "per job (set threads: 1, or reproducible: false)")
    _check_references(config)
    _check_per_task_values(config)
    _check_method_grpo(config)  # before the rules are built in each method's param_dtype
    _check_stability(config)
    _check_scaling(config, fit_rules)
    if fit_rules:
        _check_rules_fit_model(config)
    _check_tasks(config)


def _check_references(config: dict) -> None:
    """Every method and task a section names is defined; sync regimes differ."""
    sweep = config.get("lr_sweep") or {"anchors": {}}
    for key, names in [("run_methods", config["run_methods"]),
                       ("ablation_methods", config.get("ablation_methods", [])),
                       ("reinforce_methods", config.get("reinforce_methods", [])),
                       ("lr_sweep.anchors", list(sweep["anchors"])),
                       *[(f"{k}.methods", config[k]["methods"])
                         for k in ("memory_sweep", "planner", "stability") if k in config],
                       ("memory_sweep.ablation_methods",
                        (config.get("memory_sweep") or {}).get("ablation_methods", [])),
                       ("planner.offload", (config.get("planner") or {}).get("offload", [])),
                       ("sync_regime.methods",
                        (config.get("sync_regime") or {}).get("methods", []))]:
        for i, name in enumerate(names):
            if name not in config["methods"]:
                raise ConfigError(f"{key}[{i}]: {name!r} is not defined under methods "
                                  f"(defined: {sorted(config['methods'])})")
    # verdicts compare run_methods with the reference: a name that matches no method is a typo
    if len(config["run_methods"]) > 1 and config["verdict"]["reference"] not in config["methods"]:
        raise ConfigError(f"verdict.reference: {config['verdict']['reference']!r} is not "
                          f"defined under methods (defined: {sorted(config['methods'])})")
    _check_eval_and_margin(config)
    for key, tasks in [("run_tasks", config.get("run_tasks") or []),
                       ("stability.task", [(config.get("stability") or {}).get("task")]),
                       ("sync_regime.task", [(config.get("sync_regime") or {}).get("task")]),
                       ("lr_sweep.tasks", sweep.get("tasks", []))]:
        for task in tasks:
            if task is not None and task not in config["tasks"]:
                raise ConfigError(f"{key}: {task!r} is not defined under tasks "
                                  f"(defined: {sorted(config['tasks'])})")
    unscaled = [r for r, scale in (config.get("sync_regime") or {}).get("lr_scales", {}).items()
                if scale == 1]
    if len(unscaled) > 1:
        raise ConfigError(f"sync_regime.lr_scales: regimes {unscaled} all run the methods as "
                          "they are (scale 1), the same runs; keep one")


def _check_stability(config: dict) -> None:
    """Every stability run has a held-out point at the criterion's from_step before its last
    step: a snapshot there (grpo.snapshot_every divides it)."""
    st = config.get("stability")
    if not st:
        return
    frm = st["criterion"]["from_step"]
    names = {*st["methods"], *st.get("opt_in_methods", []),
             *([st["controller_ablation"]["method"]] if st.get("controller_ablation") else [])}
    for name in sorted(names):
        g = config["grpo"] | config["methods"].get(name, {}).get("grpo", {})
        if not g["snapshot_every"] or frm % g["snapshot_every"] or frm >= g["steps"]:
            raise ConfigError(
                f"stability.criterion.from_step: {frm} is not a snapshot of {name!r} before its "
                f"last step (its grpo.snapshot_every {g['snapshot_every']}, steps {g['steps']})")


def _check_scaling(config: dict, fit_rules: bool = True) -> None:
    """`scaling` compares tiny models of its own sizes, tuned by the lr sweep's rule on a task
    it validates on: its methods are defined, start with verdict.reference, each has a sweep
    anchor and a transfer rule; a rank-fraction method has a rank; the check's size is one of
    its sizes; with `fit_rules`, every rule fits every size (a rank above a size's hidden size
    stops here)."""
    sc = config.get("scaling")
    if not sc:
        return
    if config["model"]["name"] != "tiny":
        raise ConfigError("scaling: its sizes are tiny models built here; model.name is "
                          f"{config['model']['name']!r}")
    if sc["task"] not in (config.get("lr_sweep") or {}).get("tasks", []):
        raise ConfigError(f"scaling.task: {sc['task']!r} is not one of lr_sweep.tasks (its "
                          "validation split, sized with theirs, tunes and checks the methods)")
    if sc["methods"][0] != config["verdict"]["reference"]:
        raise ConfigError(f"scaling.methods: the first is the reference every other is "
                          f"compared with, verdict.reference {config['verdict']['reference']!r}"
                          f" (given: {sc['methods'][0]!r})")
    anchors = (config.get("lr_sweep") or {}).get("anchors", {})
    for i, m in enumerate(sc["methods"]):
        for key, there in [("is not defined under methods", config["methods"]),
                           ("has no lr_sweep.anchors entry (its sweep at the first size)",
                            anchors),
                           ("has no scaling.transfer rule", sc["transfer"])]:
            if m not in there:
                raise ConfigError(f"scaling.methods[{i}]: {m!r} {key}")
    for m in sc["rank_fraction"]:
        if m not in sc["methods"] or "rank" not in config["methods"][m].get("options", {}):
            raise ConfigError(f"scaling.rank_fraction: {m!r} is not one of scaling.methods "
                              "with a `rank` option")
    if sc["check"]["size"] not in sc["sizes"]:
        raise ConfigError(f"scaling.check.size: {sc['check']['size']!r} is not one of "
                          f"scaling.sizes ({', '.join(sc['sizes'])})")
    if sc["predict_models"] and not config.get("planner"):
        raise ConfigError("scaling.predict_models: the predictions are made in the planner's "
                          "setting (`planner:`), which this config does not have")
    lo, hi = sc["base_band"]
    if lo > hi:
        raise ConfigError(f"scaling.base_band: [{lo}, {hi}] is empty (low above high)")
    for size, spec in (sc["sizes"] if fit_rules else {}).items():
        for m in sc["methods"]:
            _check_rule_fits(config, f"methods.{m}", config["methods"][m],
                             {"name": "tiny", "tiny": spec["model"]},
                             f" (on scaling.sizes.{size})")


def run_tasks(config: dict) -> list[str]:
    """The tasks the grid runs on: `run_tasks`, else every task."""
    return list(config.get("run_tasks") or config["tasks"])


def _check_per_task_values(config: dict) -> None:
    """A value given per task names only known tasks (those under `tasks`, the registered task
    types, or `default`: a misspelt task would be dropped silently), and names every task, or
    has a `default`."""
    per_task = [(f"methods.{name}.options.{key}", value)
                for name, m in config["methods"].items()
                for key, value in m.get("options", {}).items()]
    known = {*config["tasks"], *TASKS, "default"}
    for key, value in [*per_task, ("sft.steps", config["sft"]["steps"])]:
        for task in (value if isinstance(value, dict) else {}):
            if task not in known:
                close = difflib.get_close_matches(task, known, n=1)
                raise ConfigError(f"{key}.{task}: not a task of this config "
                                  f"({', '.join(config['tasks'])}), a registered task type or "
                                  f"`default`{f'; did you mean {close[0]!r}?' if close else ''}")
        missing = (sorted(set(config["tasks"]) - set(value))
                   if isinstance(value, dict) and "default" not in value else [])
        if missing:
            raise ConfigError(f"{key}: no value for task {missing[0]!r} (given for: "
                              f"{sorted(value)}; add it, or a `default`)")


def _check_tasks(config: dict) -> None:
    """Every task's type is registered and takes its options; a dataset task swept for its lr
    has a validation split."""
    sweep = config.get("lr_sweep") or {"anchors": {}}
    for name, t in config["tasks"].items():
        if t["type"] not in TASKS:
            raise ConfigError(f"tasks.{name}.type: {t['type']!r} is not a registered task "
                              f"(registered: {sorted(TASKS)}; see logra.rl.tasks.register_task)")
        try:
            task = get_task(t["type"], **t.get("options", {}))
        except (TypeError, ValueError) as e:
            raise ConfigError(f"tasks.{name}.options: {e}") from None
        if (name in sweep.get("tasks", []) and isinstance(task, HubTask)
                and config.get("data", {}).get("n_train") is None):
            raise ConfigError(f"lr_sweep.n_val: the validation split of dataset task {name!r} is "
                              "the train rows after the first data.n_train; set data.n_train "
                              "(it is null: every row trains)")


def _check_method_grpo(config: dict) -> None:
    """Each method's grpo keys (merged over grpo) exist, take the grpo section's values and
    fit together: the cosine diagnostic off the profiled steps, GRPO's groups of two or more
    (REINFORCE's keys only with it), a decay that ends after the warmup, bf16 storage in one
    process, and sharded runs
    (grpo.nproc_per_node > 1) with a rule that shards, a batch that splits over the ranks and
    no checkpoints."""
    sweep = config.get("lr_sweep") or {"anchors": {}}
    trained = {*config["run_methods"], *config.get("ablation_methods", []), *sweep["anchors"],
               *config.get("reinforce_methods", []),
               *(config.get("stability") or {}).get("methods", []),
               *(config.get("stability") or {}).get("opt_in_methods", []),
               *(config.get("sync_regime") or {}).get("methods", [])}
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import best_match
    schema = _schema()
    grpo_values = Draft202012Validator({"$defs": schema["$defs"],
                                        **schema["properties"]["grpo"]})
    for name, m in config["methods"].items():
        unknown = sorted(set(m.get("grpo", {})) - set(config["grpo"]))
        if unknown:
            raise ConfigError(f"methods.{name}.grpo: unknown key {unknown[0]!r} "
                              f"(grpo keys: {sorted(config['grpo'])})")
        error = best_match(grpo_values.iter_errors(m.get("grpo", {})))
        if error is not None:  # a method's grpo values as the grpo section's (no defaults)
            raise ConfigError(f"methods.{name}.grpo."
                              f"{'.'.join(map(str, error.absolute_path))}: {error.message}")
        merged = config["grpo"] | m.get("grpo", {})
        def key(k: str, name=name, m=m) -> str:  # the method's own grpo key, else the global
            return f"methods.{name}.grpo.{k}" if k in m.get("grpo", {}) else f"grpo.{k}"
        if merged["cosine_step"] in (1, min(merged["profile_step"], merged["steps"])):
            raise ConfigError(f"{key('cosine_step')}={merged['cosine_step']} is a memory-profiled "
                              f"step (step 1 and grpo.profile_step, method {name}): the "
                              "diagnostic's copies would count in the measured peak")
        if merged["estimator"] == "grpo" and merged["group_size"] < 2:
            raise ConfigError(f"{key('group_size')}={merged['group_size']}: GRPO's advantages "
                              "compare the responses of one prompt (at least 2), or set "
                              f"grpo.estimator: reinforce_baseline ({name})")
        if merged["estimator"] == "grpo" and merged["length_reference"] is not None:
            raise ConfigError(f"{key('length_reference')}: weighs REINFORCE's advantages; set "
                              f"grpo.estimator: reinforce_baseline or drop it ({name})")
        if merged["decay_steps"] and merged["decay_steps"] <= merged["warmup_steps"]:
            raise ConfigError(f"{key('decay_steps')}={merged['decay_steps']}: the decay ends "
                              f"after the warmup ({key('warmup_steps')}="
                              f"{merged['warmup_steps']}; method {name})")
        if merged["param_dtype"] != "float32" and merged["nproc_per_node"] > 1:
            raise ConfigError(f"{key('param_dtype')}={merged['param_dtype']}: weights stored "
                              "in bf16 run in one process; under FSDP set compute_dtype "
                              f"instead ({key('nproc_per_node')}={merged['nproc_per_node']}, "
                              f"method {name})")
        if merged["cosine_step"] and merged["nproc_per_node"] > 1 and name in trained:
            raise ConfigError(f"{key('cosine_step')}={merged['cosine_step']}: the diagnostic "
                              f"runs in one process only; set 0 with grpo.nproc_per_node > 1 ({name})")
        world = merged["nproc_per_node"]
        if world > 1 and name in trained:
            if not rules.rule_class(m["rule"]).shardable:
                can = [r for r in rules.RULES if rules.rule_class(r).shardable]
                raise ConfigError(f"methods.{name}.rule: {m['rule']!r} cannot run sharded "
                                  f"(grpo.nproc_per_node={world}); rules that can: {can}")
            batch = merged["prompts_per_step"] * merged["group_size"]
            if batch % (merged["micro_batch_size"] * world):
                raise ConfigError(
                    f"grpo: a batch of prompts_per_step x group_size = {batch} sequences does "
                    f"not split into global micro-batches of micro_batch_size x nproc_per_node "
                    f"= {merged['micro_batch_size']} x {world} (method {name})")
            if merged["checkpoint_every"]:
                raise ConfigError(f"grpo.checkpoint_every={merged['checkpoint_every']}: resume "
                                  "checkpoints are single-process; set 0 when "
                                  f"grpo.nproc_per_node={world} (method {name})")


def _check_rule_options(config: dict) -> None:
    """Each method's `rule` names a rule, its `options` are those the rule declares
    (`UpdateRule.options`, validated as JSON schema; the paper setting's methods too), its
    sync transport (`sync`, else `rollout.sync`) applies to the rule, and KL control asks for
    a rule whose step can be scaled."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import best_match
    defs = _schema()["$defs"]
    specs = [(f"methods.{n}", n, m) for n, m in config["methods"].items()]
    specs += [(f"paper_setting.methods.{n}", n, m)  # predicted only: no sync, no runs
              for n, m in (config.get("paper_setting") or {}).get("methods", {}).items()]
    for where, name, m in specs:
        try:
            rule = rules.rule_class(m["rule"])
        except ValueError as e:
            raise ConfigError(f"{where}.rule: {e}") from None
        schema = {"$defs": defs, "type": "object", "additionalProperties": False,
                  "properties": rule.options}
        error = best_match(Draft202012Validator(schema).iter_errors(m.get("options", {})))
        if error is not None:
            key = ".".join(map(str, error.absolute_path))
            raise ConfigError(f"{where}.options{'.' + key if key else ''}: "
                              f"{error.message}{_number_hint(error.instance)} (rule "
                              f"{m['rule']!r} takes "
                              f"{sorted(rule.options)})")
        if where.startswith("paper_setting"):
            continue
        key = f"methods.{name}.sync" if "sync" in m else "rollout.sync"
        try:
            weight_sync.transport(m.get("sync", (config.get("rollout") or {}).get("sync", "auto")),
                           rule)
        except ValueError as e:
            raise ConfigError(f"{key}: {e} (method {name})") from None
        if m.get("kl_control") and not rule.scalable:
            raise ConfigError(f"methods.{name}.kl_control: rule {m['rule']!r} cannot scale its "
                              "step (it applies the update inside propose)")


def _check_rules_fit_model(config: dict) -> None:
    """Build each update rule on the configured architecture (meta tensors: no memory, no
    weights), so options that cannot work on this model, e.g. a rank above a weight's smaller
    side, stop the workflow here with the rule's own message naming the module."""
    for name, m in config["methods"].items():
        _check_rule_fits(config, f"methods.{name}", m, config["model"])


def _check_rule_fits(config: dict, key: str, m: dict, model_spec: dict,
                     where: str = "") -> None:
    """`_check_rules_fit_model` for one method `m` (named by `key` in the messages) on the
    model `model_spec` describes (`where`, if not the configured one; a hub name offline:
    checked when the run starts)."""
    import torch
    from transformers import AutoModelForCausalLM

    from logra.rl.models import model_config
    try:
        hf_config = model_config(model_spec)
    except OSError:  # a hub name while offline: the rule is checked when the run starts
        return
    task = next(iter(config["tasks"]))  # only lrs differ per task: they fit any model
    dtype = getattr(torch, (config["grpo"] | m.get("grpo", {}))["param_dtype"])
    with torch.device("meta"):  # a fresh model each: a rule may change it (LoRA adapters)
        model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype)
    try:
        rule = rules.build(m["rule"], model, task_options(m.get("options", {}), task))
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{key}.options{where}: {e}") from None
    if rule.control is not None and m.get("kl_control"):
        raise ConfigError(f"{key}.kl_control: rule {m['rule']!r} controls its own "
                          "step (its options); remove kl_control, or switch its own off")
    half = (config["grpo"] | m.get("grpo", {}))["probe_size"] // 2
    if getattr(rule.control, "probe_responses", 0) > half:
        raise ConfigError(f"{key}.options.probe_responses: "
                          f"{rule.control.probe_responses} sequences exceed the probe's "
                          f"prediction half (grpo.probe_size // 2 = {half}; the other half "
                          "measures the realized KL)")


def generation_room(config: dict) -> int:
    """Tokens a model must have room to generate after a prompt: the longest of lm-eval's
    `eval.max_gen_toks` and every method's `grpo.max_new_tokens`."""
    return max(config["eval"]["max_gen_toks"], config["grpo"]["max_new_tokens"],
               *(m.get("grpo", {}).get("max_new_tokens", 0) for m in config["methods"].values()))


def hub_models(config: dict) -> list[str]:
    """The hub models (names or directories) runs of this config load: `model.name` unless it
    is `tiny`, and every method's own `model`."""
    names = [config["model"]["name"]] + [m["model"]["name"] for m in config["methods"].values()
                                         if m.get("model")]
    return [n for n in dict.fromkeys(names) if n != "tiny"]


def task_options(options: dict, task: str) -> dict:
    """A method's (or SFT's) options on one task: a value given per task ({task: value}, e.g.
    the lr `lr_sweep` chose on each task's validation split, or SFT's steps) takes that task's
    value, or its `default` for a task it does not name."""
    return {k: v.get(task, v.get("default")) if isinstance(v, dict) else v
            for k, v in options.items()}


def lr_grid(anchor: float, points: int, factor: float) -> list[float]:
    """The lr sweep's grid rule, the same for every method (an equal tuning budget): `points`
    lrs spaced by `factor` around the method's declared `anchor`, anchor·factor^k for
    k = -((points - 1) // 2) ... points // 2 (6 points, factor 2: anchor/4 ... anchor·8)."""
    ks = range(-((points - 1) // 2), points // 2 + 1)
    return [float(f"{anchor * factor ** k if k >= 0 else anchor / factor ** -k:.12g}") for k in ks]


def add_lr_sweep_methods(config: dict) -> dict[str, tuple[str, float]]:
    """Add one method per (method, lr) of `lr_sweep` (each anchor's `lr_grid`) to
    config["methods"], a copy at that point of the rule's knob (its `tuned` options: the lr;
    LoGRA's KL budget, its update_ratio following), named `<method>_lr<lr>`
    (`dense_adam_lr0p0001`, `logra_lr0p0002`), the configured one too: adopting the choice
    in the config renames no sweep run. The copies measure no memory (`grpo.measure_memory`:
    the weights are the same; what the sweep reads is their validation accuracy). Returns
    {name: (method, lr)}, lr the point of the knob."""
    sweep, spec = {}, config.get("lr_sweep") or {"anchors": {}}
    for method, anchor in spec["anchors"].items():
        base = config["methods"][method]
        for lr in lr_grid(anchor, spec.get("points", 6), spec.get("factor", 2.0)):
            name = f"{method}_lr{_point_name(lr)}"
            if name in config["methods"]:
                raise ConfigError(f"lr_sweep.anchors.{method}: the run name {name!r} for "
                                  f"lr={lr} is already a method")
            cls = rules.rule_class(base["rule"])
            config["methods"][name] = {  # validation runs: their memory is not read
                **copy.deepcopy(base), "options": cls.tuned(dict(base.get("options", {})), lr),
                "grpo": {**base.get("grpo", {}), "measure_memory": False}}
            sweep[name] = (method, lr)
    return sweep


def sweep_knobs(config: dict) -> dict[str, str]:
    """{method: the option its lr sweep's points set} for each of `lr_sweep.anchors`."""
    return {m: rules.rule_class(config["methods"][m]["rule"]).tuning_option(
        config["methods"][m].get("options", {}))
        for m in (config.get("lr_sweep") or {}).get("anchors", {})}


def _check_eval_and_margin(config: dict) -> None:
    """eval.primary names a protocol, a greedy protocol draws one sample, and the margin's
    seeds are neither the grid's nor the lr sweep's."""
    protocols = config["eval"]["protocols"]
    if config["eval"]["primary"] not in protocols:
        raise ConfigError(f"eval.primary: {config['eval']['primary']!r} is not one of "
                          f"eval.protocols ({', '.join(protocols)})")
    for name, p in protocols.items():
        if p["temperature"] == 0 and p["samples"] != 1:
            raise ConfigError(f"eval.protocols.{name}: greedy decoding (temperature 0) gives "
                              f"one answer per problem, not samples: {p['samples']}")
    taken = set(config["seeds"]) | set((config.get("lr_sweep") or {}).get("seeds", [0]))
    clash = sorted(set(margin_seeds(config)) & taken)
    if clash:
        raise ConfigError(f"verdict.margin.seeds: {clash} are seeds of the grid or of the lr "
                          "sweep: the margin's validation runs take part in neither the lr's "
                          "choice nor the test comparison")


def margin_seeds(config: dict) -> list[int]:
    """The seeds of the validation runs that set the margins: `verdict.margin.seeds`, else the
    one after every seed of the grid and the lr sweep."""
    seeds = config["verdict"]["margin"].get("seeds")
    if seeds is not None:
        return list(seeds)
    return [max([*config["seeds"], *(config.get("lr_sweep") or {}).get("seeds", [0])]) + 1]


def margin_runs(config: dict, sweep: dict[str, tuple[str, float]]) -> dict[str, str]:
    """{task: the lr sweep's run name of the reference at the lr it is configured with on that
    task}, for the tasks the lr sweep validates on (`add_lr_sweep_methods`'s `sweep`): run at
    `margin_seeds`, the validation runs that set the task's margin (none when the reference has
    no grid). The configured lr must be a point of the reference's grid."""
    reference = config["verdict"]["reference"]
    tasks = [t for t in (config.get("lr_sweep") or {}).get("tasks", []) if t in config["tasks"]]
    if not tasks:
        return {}
    method = config["methods"][reference]
    knob = rules.rule_class(method["rule"]).tuning_option(method.get("options", {}))
    points = {lr: name for name, (m, lr) in sweep.items() if m == reference}
    if not points:  # the reference is not swept: every margin is the floor
        return {}
    runs = {}
    for task in tasks:
        lr = method.get("options", {}).get(knob)
        lr = lr.get(task, lr.get("default")) if isinstance(lr, dict) else lr
        match = [name for point, name in points.items() if lr is not None
                 and math.isclose(point, lr, rel_tol=1e-9)]
        if not match:
            raise ConfigError(f"verdict.margin: {reference}'s {knob} on {task} ({lr}) is not a "
                              f"point of its lr_sweep grid ({sorted(points)}): the margin is set "
                              "on the sweep's validation run at the configured lr")
        runs[task] = match[0]
    return runs


def validate_file(path: str | Path) -> dict:
    """One complete config file, read, validated (filling defaults) and checked (`resolve`
    without the default config under it)."""
    return resolve([path], default=None)


def _check_data_sizes(config: dict) -> None:
    """The train split must fill SFT's held-out slice plus one batch, and every method's GRPO
    step (each draws its prompts without replacement)."""
    n = (config.get("data") or {}).get("n_train")
    if n is None:  # every row of a dataset: its size is known to the data job
        return
    sft = config["sft"]
    steps = sft["steps"].values() if isinstance(sft["steps"], dict) else [sft["steps"]]
    if any(steps) and n < sft["eval_examples"] + sft["batch_size"]:
        raise ConfigError(f"data.n_train: {n} train examples cannot hold SFT's held-out slice "
                          f"(sft.eval_examples: {sft['eval_examples']}) plus one batch "
                          f"(sft.batch_size: {sft['batch_size']})")
    for name, m in config["methods"].items():
        prompts = (config["grpo"] | m.get("grpo", {}))["prompts_per_step"]
        if prompts > n:
            key = (f"methods.{name}.grpo.prompts_per_step" if "prompts_per_step" in
                   m.get("grpo", {}) else "grpo.prompts_per_step")
            raise ConfigError(f"{key}: {prompts} prompts per step are drawn from the train "
                              f"split without replacement, which holds data.n_train: {n}")


def stability_runs(config: dict, opt_in: bool = False) -> list[str]:
    """The long runs of figures/stability_27b as "task/method/seedN": `stability.methods` on its
    task over `stability.seeds`, or `opt_in_methods` over `opt_in_seeds` (defaults: methods,
    every seed)."""
    st = config.get("stability") or {}
    if not st:
        return []
    methods = (st.get("opt_in_methods") if opt_in else None) or st["methods"]
    seeds = st.get("opt_in_seeds" if opt_in else "seeds") or config["seeds"]
    return [f"{st['task']}/{m}/seed{s}" for m in methods for s in seeds]


def controller_cells(config: dict) -> list[tuple[str, bool, float]]:
    """`stability.controller_ablation`'s cells as (method name, controller on, scale): its
    method with its rule's `controller` on and off at each of `scales` times its step size,
    named `<method>_x<s>` and `<method>_nocontrol_x<s>` (on at scale 1: the method itself);
    the controller on first, by scale."""
    ablation = (config.get("stability") or {}).get("controller_ablation")
    if not ablation:
        return []
    method = ablation["method"]
    return [(method if on and scale == 1 else
             f"{method}{'' if on else '_nocontrol'}_x{_point_name(float(scale))}", on, scale)
            for on in (True, False) for scale in ablation["scales"]]


def add_controller_ablation_methods(config: dict) -> list[str]:
    """Define the controller ablation's cells (`controller_cells`) in config["methods"], each
    a copy of its method at that multiple of its step size (`lr_scaled`) with `controller` set;
    returns their names."""
    cells = controller_cells(config)
    if not cells:
        return []
    method = config["stability"]["controller_ablation"]["method"]
    if method not in config["methods"]:
        raise ConfigError(f"stability.controller_ablation.method: {method!r} is not defined "
                          f"under methods (defined: {sorted(config['methods'])})")
    base = config["methods"][method]
    if "controller" not in inspect.signature(rules.rule_class(base["rule"])).parameters:
        raise ConfigError(f"stability.controller_ablation.method: {method!r}'s rule "
                          f"{base['rule']!r} has no `controller` option to switch off")
    for name, on, scale in cells:
        if name == method:
            continue
        if name in config["methods"]:
            raise ConfigError(f"stability.controller_ablation: the run name {name!r} is "
                              "already a method")
        config["methods"][name] = lr_scaled(base, scale)
        config["methods"][name]["options"]["controller"] = on
    return [name for name, _, _ in cells]


def controller_runs(config: dict) -> list[str]:
    """The controller ablation's runs as "task/method/seedN": its cells on `stability.task`
    over `stability.opt_in_seeds` (default: every seed)."""
    st = config.get("stability") or {}
    return [f"{st['task']}/{name}/seed{s}" for name, _, _ in controller_cells(config)
            for s in st.get("opt_in_seeds") or config["seeds"]]


@dataclasses.dataclass
class Scaling:
    """`snakemake scaling`'s methods (`add_scaling_methods`):
    - `sweep`: {name: (method, value)}, the tuning sweep at the first size (`lr_sweep`'s grid
      rule and anchors), value the point of the method's knob (`UpdateRule.tuning_option`:
      dense AdamW's lr, LoGRA's KL budget);
    - `grid`: {(label, size): name}, every method, and each rank-fraction variant (label
      `<method>_frac`), at every size at its `scaling.tuned` value transferred by
      `scaling.transfer` (empty until every method is tuned);
    - `check`: {name: (method, value)}, the transfer's check: `check.factors` times each
      transferred value at `check.size` (factor 1: the grid's method itself)."""
    sweep: dict = dataclasses.field(default_factory=dict)
    grid: dict = dataclasses.field(default_factory=dict)
    check: dict = dataclasses.field(default_factory=dict)


def _point_name(*parts) -> str:
    """A method name from its parts, numbers as %g with '.', '-' and '+' spelled p, m, ''."""
    return "_".join(f"{p:g}" if isinstance(p, float) else str(p) for p in parts).replace(
        "-", "m").replace("+", "").replace(".", "p")


def _round(x: float) -> float:
    """`x` to 12 significant digits (so 5e-5 x 0.02 is 1e-6, not 1.0000000000000002e-06)."""
    return float(f"{x:.12g}")


def transfer_factor(config: dict, method: str, size: str) -> float:
    """The factor on `method`'s tuned knob at `size` (`scaling.transfer`): `inverse_width`, the
    first size's hidden size over this size's (µP's rule for Adam's hidden-layer lr, applied
    here to every weight: the models are not reparametrised); `none`, 1 (a KL budget is a
    per-step move of the policy, whatever the model's size)."""
    sc = config["scaling"]
    if sc["transfer"][method] == "none":
        return 1.0
    first = next(iter(sc["sizes"].values()))["model"]["hidden_size"]
    return first / sc["sizes"][size]["model"]["hidden_size"]


def add_scaling_methods(config: dict) -> Scaling:
    """Define `snakemake scaling`'s methods (`Scaling`) in config["methods"]: copies of each of
    `scaling.methods` with the key `size` (their runs start from that size's SFT base,
    `base_input`) and their knob set by the rule's `tuned`. A rank-fraction variant
    (`scaling.rank_fraction`) takes rank x hidden / model.tiny.hidden_size (the fraction its
    configured rank is of the configured model); where that is the configured rank, it is the
    fixed-rank method itself. Validation runs (sweep, check) measure no memory. Names:
    `<method>_<size>`, `<method>_frac_<size>`, `<method>_<size>_lr<value>`,
    `<method>_<size>_x<factor>`."""
    sc, out = config.get("scaling"), Scaling()
    if not sc:
        return out
    sizes, methods, sweep = list(sc["sizes"]), config["methods"], config["lr_sweep"]

    def define(name, method, size, value, validation=False, **overrides):
        if name in methods:
            raise ConfigError(f"scaling: the run name {name!r} is already a method")
        base = methods[method]
        options = rules.rule_class(base["rule"]).tuned(dict(base.get("options", {})), value)
        grpo = {**base.get("grpo", {}), **({"measure_memory": False} if validation else {})}
        methods[name] = {**copy.deepcopy(base), "size": size, "grpo": grpo,
                         "options": options | overrides}
        return name

    for method in sc["methods"]:
        for value in lr_grid(sweep["anchors"][method], sweep["points"], sweep["factor"]):
            out.sweep[define(_point_name(method, sizes[0], "lr") + _point_name(value),
                             method, sizes[0], value, validation=True)] = (method, value)
    tuned = sc.get("tuned") or {}
    if any(tuned.get(m) is None for m in sc["methods"]):
        return out  # the grid waits for the sweep's choice
    width = config["model"]["tiny"]["hidden_size"]
    for method in sc["methods"]:
        for size in sizes:
            value = _round(tuned[method] * transfer_factor(config, method, size))
            name = out.grid[method, size] = define(_point_name(method, size), method, size,
                                                   value)
            if method in sc["rank_fraction"]:
                rank = methods[method]["options"]["rank"]
                frac = max(1, round(rank * sc["sizes"][size]["model"]["hidden_size"] / width))
                out.grid[f"{method}_frac", size] = name if frac == rank else define(
                    _point_name(method, "frac", size), method, size, value, rank=frac)
            if size == sc["check"]["size"]:
                for factor in sc["check"]["factors"]:
                    point = _round(value * factor)
                    out.check[name if factor == 1 else define(
                        f"{name}_{_point_name('x', float(factor))}", method, size, point,
                        validation=True)] = (method, point)
    return out


def scaling_runs(config: dict, scaling: Scaling) -> dict[str, list[str]]:
    """`snakemake scaling`'s runs as "task/method/seedN", by part: `sweep` and `check` at
    `lr_sweep.seeds` (validation), `grid` at `scaling.seeds` (default: every seed)."""
    sc = config.get("scaling") or {}
    if not sc:
        return {"sweep": [], "grid": [], "check": []}
    val, test = config["lr_sweep"]["seeds"], sc.get("seeds") or config["seeds"]
    return {"sweep": [f"{sc['task']}/{m}/seed{s}" for m in scaling.sweep for s in val],
            "grid": [f"{sc['task']}/{m}/seed{s}" for m in dict.fromkeys(scaling.grid.values())
                     for s in test],
            "check": [f"{sc['task']}/{m}/seed{s}" for m in scaling.check for s in val]}


def scaling_grid(config: dict, scaling: Scaling) -> list[tuple[str, str, int, str]]:
    """The grid's test runs as (label, size, seed, "task/method/seedN"), every label at every
    size over `scaling.seeds`; a clear stop while `scaling.tuned` lacks a method."""
    if not scaling.grid:
        raise ConfigError("scaling.tuned: not every method of scaling.methods has a value: run "
                          "`snakemake scaling_sweep` and adopt each method's choice at the "
                          "first size (results/scaling/lr_sweep.csv) before the test runs")
    sc = config["scaling"]
    return [(label, size, seed, f"{sc['task']}/{name}/seed{seed}")
            for (label, size), name in scaling.grid.items()
            for seed in sc.get("seeds") or config["seeds"]]


def scaling_jobs(config: dict, scaling: Scaling) -> list[str]:
    """The jobs of `snakemake scaling` that are its own, as their benchmarks' paths under
    results/benchmarks/ (no suffix): each size's bases (the test seeds', the sweep's and the
    check's), their evaluations, every run and its evaluation (not the data, nor the analysis
    plan's validation run, which the default target shares)."""
    sc, runs = config["scaling"], scaling_runs(config, scaling)
    seeds, val = sc.get("seeds") or config["seeds"], config["lr_sweep"]["seeds"]
    sizes = list(sc["sizes"])
    bases = dict.fromkeys([(z, s) for z in sizes for s in seeds]
                          + [(z, s) for z in (sizes[0], sc["check"]["size"]) for s in val])
    grid = list(dict.fromkeys(run for *_, run in scaling_grid(config, scaling)))
    return ([f"scaling/base/{sc['task']}/{z}/seed{s}" for z, s in bases]
            + [f"scaling/eval_base/{sc['task']}/{z}/seed{s}" for z in sizes for s in seeds]
            + [f"train/train/{run}" for run in runs["sweep"] + runs["check"] + grid]
            + [f"lr_sweep/lr_sweep_eval/{run}" for run in runs["sweep"] + runs["check"]]
            + [f"eval/eval_run/{run}" for run in grid])


def lr_scaled(method: dict, scale: float) -> dict:
    """A copy of a `methods` entry with every step-size option (the rule's
    `step_size_option`, `lr` or LoGRA's `update_ratio`, and each `*_lr`, per task where given
    per task) multiplied by `scale`, rounded to 12 significant digits (so 5e-5 x 0.02 is 1e-6,
    not 1.0000000000000002e-06)."""
    def times(value):
        return ({k: times(v) for k, v in value.items()} if isinstance(value, dict)
                else _round(value * scale))
    cls = rules.rule_class(method["rule"])
    options = dict(method.get("options", {}))
    if cls.step_size_option not in options and rules.step_size(cls, options) is not None:
        options[cls.step_size_option] = rules.step_size(cls, options)  # its default, scaled
    return {**copy.deepcopy(method), "options": {**options, **{
        k: times(v) for k, v in options.items()
        if k == cls.step_size_option or k.endswith("_lr")}}}


def sync_regimes(config: dict) -> dict[str, list[str]]:
    """`snakemake sync_regime`'s regimes, {regime: its method names}: each of
    `sync_regime.methods` with its lrs times the regime's `lr_scales` value, named
    `<method>_<regime>` (the method itself at scale 1; `add_sync_regime_methods` defines them)."""
    st = config.get("sync_regime") or {}
    return {regime: [m if scale == 1 else f"{m}_{regime}" for m in st["methods"]]
            for regime, scale in st.get("lr_scales", {}).items()}


def add_sync_regime_methods(config: dict) -> dict[str, list[str]]:
    """Define the lr-scaled methods of `sync_regimes` in config["methods"]; returns them."""
    regimes = sync_regimes(config)
    st = config.get("sync_regime") or {}
    for regime, names in regimes.items():
        for method, name in zip(st["methods"], names):
            if name == method:
                continue
            if name in config["methods"]:
                raise ConfigError(f"sync_regime.lr_scales.{regime}: the run name {name!r} is "
                                  "already a method")
            config["methods"][name] = lr_scaled(config["methods"][method],
                                                st["lr_scales"][regime])
    return regimes


def sync_regime_methods(config: dict) -> list[str]:
    """The methods of `snakemake sync_regime`, every regime's."""
    return list(dict.fromkeys(m for names in sync_regimes(config).values() for m in names))


def sync_regime_runs(config: dict) -> list[str]:
    """The runs of `snakemake sync_regime` as "task/method/seedN": every regime's methods on
    its task over `sync_regime.seeds` (default: every seed)."""
    st = config.get("sync_regime") or {}
    return [f"{st['task']}/{m}/seed{s}" for m in sync_regime_methods(config)
            for s in st.get("seeds") or config["seeds"]] if st else []


def start_model(config: dict, method: str | None = None) -> str | None:
    """The hub model (name or directory) a run of `method` (None: the task's base model) starts
    from as it is, or None when it starts from its seed's SFT base
    `results/base/{task}/seed{seed}/model`: a method's own `model`, or the configured hub model
    when `sft.steps` is 0."""
    own = config["methods"][method].get("model") if method else None
    if own:
        return own["name"]
    steps = config["sft"]["steps"]
    if config["model"]["name"] != "tiny" and not any(
            steps.values() if isinstance(steps, dict) else [steps]):
        return config["model"]["name"]
    return None


def base_input(config: dict, wildcards) -> dict[str, str]:
    """Snakemake input {"base": SFT base directory} of a run (`wildcards.method`) or of a base
    evaluation (no method), or {} when it starts from a hub model. Each seed has its own base,
    shared by every method of that seed: a seed replicates the whole pipeline. A run of a
    method with a `size` (`add_scaling_methods`), or a base evaluation with a `size` wildcard,
    starts from that size's base, `results/base/{task}/{size}/seed{seed}/model`."""
    method = getattr(wildcards, "method", None)
    if start_model(config, method):
        return {}
    size = config["methods"][method].get("size") if method else getattr(wildcards, "size", None)
    return {"base": f"results/base/{wildcards.task}/{size + '/' if size else ''}"
                    f"seed{wildcards.seed}/model"}


# the stages (rule files) whose jobs compute on `device`: on CUDA each takes one GPU, a GRPO run
# grpo.nproc_per_node of them
DEVICE_STAGES = ("base", "train", "eval", "memory")


def gpus_per_run(config: dict, method: str) -> int:
    """GPUs one run of `method` needs: 0 on CPU."""
    grpo = config["grpo"] | config["methods"][method].get("grpo", {})
    return grpo["nproc_per_node"] if config["device"].startswith("cuda") else 0


def job_resources(config: dict, stage: str) -> dict:
    """Snakemake resources of one job of `stage` (its rule file), what a cluster scheduler is
    asked for (workflow/profiles/slurm): `mem_mb` and `runtime` (minutes) from the config's
    `cluster.mem_gb` and `cluster.runtime_min` (the stage's value, or `default`), and `gpu`,
    which follows `device`: none on CPU; on CUDA one per job of a DEVICE_STAGES stage, and for
    a GRPO run its method's grpo.nproc_per_node."""
    cluster = {key: values.get(stage, values["default"])
               for key, values in config["cluster"].items()}
    resources = {"mem_mb": round(cluster["mem_gb"] * 1024),
                 "runtime": round(cluster["runtime_min"])}
    if stage == "train":
        resources["gpu"] = lambda wildcards: gpus_per_run(config, wildcards.method)
    elif stage in DEVICE_STAGES:
        resources["gpu"] = int(config["device"].startswith("cuda"))
    return resources


def run_config(config: dict, task: str, method: str, seed: int) -> dict:
    """Everything one (task, method, seed) run needs, as stored in its summary.json."""
    return {
        "run_id": f"{task}/{method}/seed{seed}", "task_name": task, "method_name": method,
        "seed": int(seed), "device": config["device"], "threads": config["threads"],
        "memory_budget_bytes": (int(config["memory_budget_gb"] * 2**30)
                                if config.get("memory_budget_gb") else None),
        "task": {"type": config["tasks"][task]["type"],
                 "options": config["tasks"][task].get("options", {})},
        "method": {"rule": config["methods"][method]["rule"],
                   "options": _seeded(config["methods"][method], task, int(seed)),
                   "kl_control": config["methods"][method].get("kl_control")},
        "model_name": (config["methods"][method].get("model") or config["model"])["name"],
        "grpo": _run_grpo(config["grpo"] | config["methods"][method].get("grpo", {})),
        "rollout": (dict(config["rollout"]) | config["methods"][method].get("rollout", {})
                    | {"sync": sync_transport(config, method)}),
    }


def _seeded(method: dict, task: str, seed: int) -> dict:
    """A method's options on `task`; a rule with a `seed` option (LoGRA's projections) gets
    the run's seed unless the method sets one, as the LoGRA authors' configs do."""
    options = task_options(method.get("options", {}), task)
    if "seed" in rules.rule_class(method["rule"]).options and "seed" not in options:
        options["seed"] = seed
    return options


def _run_grpo(g: dict) -> dict:
    """A run's grpo keys: a run shorter than `profile_step` profiles its last step."""
    return g | {"profile_step": min(g["profile_step"], g["steps"])}


def sync_transport(config: dict, method: str) -> str:
    """The sync transport of `method`'s runs: its own `sync`, else `rollout.sync`, `auto`
    resolved to the rule's own (`logra.rl.weight_sync.transport`)."""
    m = config["methods"][method]
    return weight_sync.transport(m.get("sync", config["rollout"].get("sync", "auto")),
                          rules.rule_class(m["rule"]))
