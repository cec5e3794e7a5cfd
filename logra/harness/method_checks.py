"""The checks of one method (`check_method`): its rule's options, its sync and rollout
settings, its grpo keys, its prompts against the context and its rule built on the model it
trains. `logra.harness.checks.check` runs them on every written method and
`logra.harness.plan.build_plan` on every derived one."""
from __future__ import annotations

import inspect
import re

from logra import rules
from logra.harness.runs import method_grpo, task_options
from logra.harness.schema import ConfigError, config_schema, grpo_validator, number_hint
from logra.rl import weight_sync
from logra.rl.settings import Grpo


def check_method(config: dict, name: str, trained: bool = True, fit_rules: bool = True) -> None:
    """The checks of `check` that concern one method (`name`, under `methods`): its rule's
    options and sync, its grpo keys (`trained`: it runs, so the sharding checks apply), its
    batch against the train split and, with `fit_rules`, its rule built on the model it trains.
    `logra.harness.plan.build_plan` runs them on every method it derives."""
    check_method_options(config, name)
    check_method_grpo(config, name, trained)
    check_prompts(config, name)
    if fit_rules:
        check_rule_fits(config, name)


def trained_methods(config: dict) -> set[str]:
    """The written methods that run GRPO (those only predicted or measured do not)."""
    sweep = config.get("lr_sweep") or {"anchors": {}}
    return {*config["run_methods"], *config.get("ablation_methods", []), *sweep["anchors"],
            *config.get("reinforce_methods", []),
            *(config.get("stability") or {}).get("methods", []),
            *(config.get("stability") or {}).get("opt_in_methods", []),
            *(config.get("sync_regime") or {}).get("methods", [])}


def check_method_grpo(config: dict, name: str, trained: bool) -> None:
    """Method `name`'s grpo keys (merged over grpo) exist, take the grpo section's values and
    fit together: the cosine diagnostic off the profiled steps, the estimator's own keys
    (`logra.rl.loss.estimator`), a decay that ends after the warmup, bf16 storage in one
    process, and, for a method that is `trained`, sharded runs (grpo.nproc_per_node > 1)
    with a rule that shards, a batch that splits over the ranks and no checkpoints."""
    from jsonschema.exceptions import best_match

    from logra.rl.loss import ESTIMATORS, estimator
    m = config["methods"][name]
    unknown = sorted(set(m.get("grpo", {})) - set(config["grpo"]))
    if unknown:
        raise ConfigError(f"methods.{name}.grpo: unknown key {unknown[0]!r} "
                          f"(grpo keys: {sorted(config['grpo'])})")
    error = best_match(grpo_validator().iter_errors(m.get("grpo", {})))
    if error is not None:  # a method's grpo values as the grpo section's (no defaults)
        raise ConfigError(f"methods.{name}.grpo."
                          f"{'.'.join(map(str, error.absolute_path))}: {error.message}")
    merged = method_grpo(config, name)

    def key(k: str) -> str:  # the method's own grpo key, else the global one
        return f"methods.{name}.grpo.{k}" if k in m.get("grpo", {}) else f"grpo.{k}"
    if merged["cosine_step"] in (1, min(merged["profile_step"], merged["steps"])):
        raise ConfigError(f"{key('cosine_step')}={merged['cosine_step']} is a memory-profiled "
                          f"step (step 1 and grpo.profile_step, method {name}): the "
                          "diagnostic's copies would count in the measured peak")
    settings = Grpo.from_dict(merged)
    try:
        estimator(settings).check(settings)
    except ValueError as e:  # "grpo.<key>...": the method's own key where it sets it
        k = re.match(r"grpo\.(\w+)", str(e)).group(1)
        raise ConfigError(f"{key(k)}{str(e)[len('grpo.' + k):]} ({name})") from None
    own = estimator(settings).keys
    for k in m.get("grpo", {}):  # the method's own keys: the global section serves them all
        readers = [n for n, e in ESTIMATORS.items() if k in e.keys and k not in own]
        if readers:
            raise ConfigError(f"methods.{name}.grpo.{k}: does nothing under grpo.estimator "
                              f"{merged['estimator']} (read by {', '.join(readers)}); drop it")
    if merged["decay_steps"] and merged["decay_steps"] <= merged["warmup_steps"]:
        raise ConfigError(f"{key('decay_steps')}={merged['decay_steps']}: the decay ends "
                          f"after the warmup ({key('warmup_steps')}="
                          f"{merged['warmup_steps']}; method {name})")
    if merged["param_dtype"] != "float32" and merged["nproc_per_node"] > 1:
        raise ConfigError(f"{key('param_dtype')}={merged['param_dtype']}: weights stored "
                          "in bf16 run in one process; under FSDP set compute_dtype "
                          f"instead ({key('nproc_per_node')}={merged['nproc_per_node']}, "
                          f"method {name})")
    world = merged["nproc_per_node"]
    if not trained or world == 1:
        return
    if merged["cosine_step"]:
        raise ConfigError(f"{key('cosine_step')}={merged['cosine_step']}: the diagnostic "
                          f"runs in one process only; set 0 with grpo.nproc_per_node > 1 ({name})")
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


def check_options(where: str, m: dict) -> None:
    """A method's `rule` names a rule and its `options` are those the rule declares
    (`UpdateRule.options`, validated as JSON schema); `where` names the method's key."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import best_match
    try:
        rule = rules.rule_class(m["rule"])
    except ValueError as e:
        raise ConfigError(f"{where}.rule: {e}") from None
    schema = {"$defs": config_schema()["$defs"], "type": "object", "additionalProperties": False,
              "properties": rule.options}
    error = best_match(Draft202012Validator(schema).iter_errors(m.get("options", {})))
    if error is not None:
        key = ".".join(map(str, error.absolute_path))
        raise ConfigError(f"{where}.options{'.' + key if key else ''}: "
                          f"{error.message}{number_hint(error.instance)} (rule "
                          f"{m['rule']!r} takes {sorted(rule.options)})")


def check_method_options(config: dict, name: str) -> None:
    """`check_options` for method `name`, whose sync transport (`sync`, else `rollout.sync`)
    applies to its rule and whose KL control asks for a rule whose step can be scaled."""
    m = config["methods"][name]
    check_options(f"methods.{name}", m)
    rule = rules.rule_class(m["rule"])
    key = f"methods.{name}.sync" if "sync" in m else "rollout.sync"
    try:
        weight_sync.transport(m.get("sync", (config.get("rollout") or {}).get("sync", "auto")),
                              rule)
    except ValueError as e:
        raise ConfigError(f"{key}: {e} (method {name})") from None
    if m.get("kl_control") and not rule.scalable:
        raise ConfigError(f"methods.{name}.kl_control: rule {m['rule']!r} cannot scale its "
                          "step (it applies the update inside propose)")
    _check_rollout_options(config, name)


def _check_rollout_options(config: dict, name: str) -> None:
    """Method `name`'s `rollout.options` (its own over the rollout section's) are keyword
    arguments its engine takes, besides those the run sets from the rollout section (dtype,
    threads, timeouts)."""
    from logra.rl.engines import engine_class
    m = config["methods"][name]
    rollout = dict(config["rollout"]) | m.get("rollout", {})
    taken = inspect.signature(engine_class(rollout["engine"]).__init__).parameters
    known = set(taken) - {"self", "model_dir", "dtype", "threads", "timeout_s", "timeout_factor"}
    for k in rollout.get("options", {}):
        if k not in known:
            key = "rollout.options" if "options" not in m.get("rollout", {}) else \
                f"methods.{name}.rollout.options"
            raise ConfigError(f"{key}.{k}: not an option of rollout.engine "
                              f"{rollout['engine']!r} (its options: {sorted(known)}; method "
                              f"{name})")


def check_rule_fits(config: dict, name: str, size: str | None = None,
                     on: tuple[str, dict] | None = None) -> None:
    """Build method `name`'s update rule on the model it trains (meta tensors: no memory, no
    weights): `on` (where, a tiny model's options), else `scaling.sizes[size]`'s, else its
    method's `size`'s, else its own `model`, else the configured one; so options that cannot
    work on that model, e.g. a rank above a weight's smaller side, stop the workflow here with
    the rule's own message naming the module (a hub name offline is checked when the run
    starts)."""
    import torch

    from logra.rl.models import model_config
    from transformers import AutoModelForCausalLM  # after logra.rl.models (its docstring)
    m = config["methods"][name]
    size = size or m.get("size")
    spec = ({"name": "tiny", "tiny": on[1]} if on else
            {"name": "tiny", "tiny": config["scaling"]["sizes"][size]["model"]} if size
            else m.get("model") or config["model"])
    try:
        hf_config = model_config(spec)
    except OSError:  # a hub name while offline: the rule is checked when the run starts
        return
    task = next(iter(config["tasks"]))  # only lrs differ per task: they fit any model
    grpo = method_grpo(config, name)
    with torch.device("meta"):  # a fresh model each: a rule may change it (LoRA adapters)
        model = AutoModelForCausalLM.from_config(hf_config, dtype=getattr(torch,
                                                                          grpo["param_dtype"]))
    where = f" (on {on[0]})" if on else f" (on scaling.sizes.{size})" if size else ""
    try:
        rule = rules.build(m["rule"], model, task_options(m.get("options", {}), task))
    except (TypeError, ValueError) as e:
        raise ConfigError(f"methods.{name}.options{where}: {e}") from None
    if rule.control is not None and m.get("kl_control"):
        raise ConfigError(f"methods.{name}.kl_control: rule {m['rule']!r} controls its own "
                          "step (its options); remove kl_control, or switch its own off")
    half = grpo["probe_size"] // 2
    if getattr(rule.control, "probe_responses", 0) > half:
        raise ConfigError(f"methods.{name}.options.probe_responses: "
                          f"{rule.control.probe_responses} sequences exceed the probe's "
                          f"prediction half (grpo.probe_size // 2 = {half}; the other half "
                          "measures the realized KL)")


def check_prompts(config: dict, name: str) -> None:
    """Method `name`'s GRPO step draws its prompts from the train split without replacement:
    data.n_train holds them."""
    n = (config.get("data") or {}).get("n_train")
    prompts = method_grpo(config, name)["prompts_per_step"]
    if n is not None and prompts > n:
        key = (f"methods.{name}.grpo.prompts_per_step" if "prompts_per_step" in
               config["methods"][name].get("grpo", {}) else "grpo.prompts_per_step")
        raise ConfigError(f"{key}: {prompts} prompts per step are drawn from the train "
                          f"split without replacement, which holds data.n_train: {n}")
