"""What the workflow derives from a checked config: one run's resolved config (`run_config`),
a method's grpo settings, the tasks that run, the hub models to fetch, the margin's seeds and
each stage's job resources."""
from __future__ import annotations

from logra import rules
from logra.harness.schema import config_schema
from logra.rl import weight_sync
from logra.rl.settings import Grpo


def method_grpo(config: dict, name: str) -> dict:
    """Method `name`'s grpo keys: its own `grpo` over the grpo section's."""
    return config["grpo"] | config["methods"][name].get("grpo", {})


def grpo_settings(values: dict | None = None) -> Grpo:
    """Grpo settings from `values` over the schema's defaults (what a config that sets only
    these grpo keys resolves to): an update step outside a run (the canary, a memory point)."""
    props = config_schema()["properties"]["grpo"]["properties"]
    return Grpo.from_dict({k: p["default"] for k, p in props.items() if "default" in p}
                          | (values or {}))


def study_horizons(config: dict) -> dict[str, dict[str, str]]:
    """{horizon: {arm: its method there}} of `study.horizons` (each `h<updates>`): the arms a
    horizon names (default: every one of `study.arms`), each as the method `<arm>_<horizon>`,
    the arm on that horizon's schedule (logra.harness.horizons.add_study_methods)."""
    st = config.get("study") or {}
    return {h: {arm: f"{arm}_{h}" for arm in spec.get("arms") or st["arms"]}
            for h, spec in (st.get("horizons") or {}).items()}


def horizon_steps(horizon: str) -> int:
    """A study horizon's updates: `h200` -> 200."""
    return int(horizon.removeprefix("h"))


def run_tasks(config: dict) -> list[str]:
    """The tasks the grid runs on: `run_tasks`, else every task."""
    return list(config.get("run_tasks") or config["tasks"])


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


def margin_seeds(config: dict) -> list[int]:
    """The seeds of the validation runs that set the margins: `verdict.margin.seeds`, else the
    three after every seed of the grid and the lr sweep (a mean gain over three seeds, not one
    seed's)."""
    seeds = config["verdict"]["margin"].get("seeds")
    if seeds is not None:
        return list(seeds)
    last = max([*config["seeds"], *(config.get("lr_sweep") or {}).get("seeds", [0])])
    return [last + 1, last + 2, last + 3]


DEVICE_STAGES = ("base", "train", "eval", "memory")


def gpus_per_run(config: dict, method: str) -> int:
    """GPUs one run of `method` needs: 0 on CPU."""
    gpus = method_grpo(config, method)["nproc_per_node"]
    return gpus if config["device"].startswith("cuda") else 0


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
        "grpo": _run_grpo(method_grpo(config, method)),
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
