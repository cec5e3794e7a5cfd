"""The config's cross-key checks, those a JSON schema cannot express (`check`): references
between sections, options each rule accepts, data sizes against batch sizes, stability and
scaling settings, and each method's own checks (logra/harness/method_checks.py). Each raises
`ConfigError` naming the key."""
from __future__ import annotations

import difflib
import math

from logra.harness.method_checks import (check_method_grpo, check_method_options, check_options,
                                         check_prompts, check_rule_fits, trained_methods)
from logra.harness.runs import horizon_steps, margin_seeds, method_grpo, study_horizons
from logra.harness.schema import SCHEMA, ConfigError
from logra.rl.tasks import TASKS, HubTask, SyntheticTask, get_task, load_task_files
from logra.rl.tiny import POSITIONS, tiny_shape


def check(config: dict, fit_rules: bool = True) -> None:
    """Cross-key checks: references between sections, options accepted by the code, data
    sizes against batch sizes; with `fit_rules`, each rule built on each model it will train
    (`check_rule_fits`: the costly part, which imports transformers and the rules' packages).
    The `task_files` are imported first, so the tasks they register are checked like the
    others."""
    try:
        load_task_files(config.get("task_files", []))
    except (OSError, ValueError) as e:  # each message starts "task_files: <the file>"
        raise ConfigError(str(e)) from None
    for name in config["methods"]:  # first: memory_real and paper_setting combine with them
        check_method_options(config, name)
    paper = config.get("paper_setting") or {}
    for name, m in paper.get("methods", {}).items():
        check_options(f"paper_setting.methods.{name}", m)  # predicted only: no runs
    for setting, s in paper.get("settings", {}).items():
        for name, options in s.get("method_options", {}).items():
            where = f"paper_setting.settings.{setting}.method_options.{name}"
            if name not in paper["methods"]:
                raise ConfigError(f"{where}: not one of paper_setting.methods "
                                  f"({sorted(paper['methods'])})")
            m = paper["methods"][name]
            check_options(where, m | {"options": m.get("options", {}) | options})
    for name, options in ((config.get("memory_real") or {}).get("methods") or {}).items():
        if name in config["methods"]:  # else named by _check_references
            m = config["methods"][name]
            check_options(f"memory_real.methods.{name}",
                           m | {"options": m.get("options", {}) | options})
    _check_data_sizes(config)
    if config["device"] == "cpu" and config["reproducible"] and config["threads"] != 1:
        raise ConfigError(f"threads: {config['threads']}; reproducible CPU runs use one thread "
                          "per job (set threads: 1, or reproducible: false)")
    _check_references(config)
    _check_per_task_values(config)
    trained = trained_methods(config)
    for name in config["methods"]:  # before the rules are built in each method's param_dtype
        check_method_grpo(config, name, name in trained)
    _check_stability(config)
    _check_tiny_models(config)
    _check_model_files(config)
    _check_scaling(config, fit_rules)
    _check_study(config)
    for name in config["methods"] if fit_rules else []:
        check_rule_fits(config, name)
    _check_memory_sweep(config, fit_rules)
    _check_tasks(config)


def _tiny_models(config: dict) -> list[tuple[str, dict]]:
    """(key, options) of every tiny model the config builds: the configured one, each memory
    sweep point's, memory_real's, each scaling size's."""
    sweep = config.get("memory_sweep") or {}
    return ([("model.tiny", config["model"]["tiny"])] if config["model"]["name"] == "tiny"
            else []) + [
        (f"memory_sweep.{part}.{name}", {k: v for k, v in point.items() if k != "shape"})
        for part in ("sizes", "opt_in_sizes") for name, point in sweep.get(part, {}).items()] + [
        ("memory_real.model", real["model"]) for real in [config.get("memory_real")] if real] + [
        (f"scaling.sizes.{name}.model", size["model"])
        for name, size in ((config.get("scaling") or {}).get("sizes") or {}).items()]


def _check_tiny_models(config: dict) -> None:
    """Every tiny model's options build a config (its heads divide its width, its architecture
    is known), before any job builds it."""
    for key, options in _tiny_models(config):
        try:
            tiny_shape(**options)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{key}: {e}") from None


def _check_model_files(config: dict) -> None:
    """Every model config file the planner, the paper setting and the scaling predictions read
    exists (paths relative to the repository)."""
    root = SCHEMA.parents[2]
    files = [*[(f"planner.models.{n}", p)
               for n, p in ((config.get("planner") or {}).get("models") or {}).items()],
             *[(f"paper_setting.settings.{n}.model", s["model"]) for n, s in
               ((config.get("paper_setting") or {}).get("settings") or {}).items()],
             *[(f"scaling.predict_models.{n}", p) for n, p in
               ((config.get("scaling") or {}).get("predict_models") or {}).items()]]
    for key, path in files:
        if not (root / path).is_file():
            raise ConfigError(f"{key}: {path} is not a file (paths are relative to the "
                              f"repository, {root})")


def _check_memory_sweep(config: dict, fit_rules: bool) -> None:
    """With `fit_rules`, each rule the default sizes of the memory sweep measure fits each of
    their models (`methods` and `ablation_methods`: a rank above a point's width stops here,
    not inside its job). The opt-in sizes are not built here (every rule on every point of
    config.yaml took 6 s on this project's 2-core CPU, against under a second for the default
    points): a rule that does not fit one stops its job with an error naming the point."""
    sweep = config.get("memory_sweep") or {}
    for part in ("sizes", "opt_in_sizes"):
        if "real" in sweep.get(part, {}):
            raise ConfigError(f"memory_sweep.{part}.real: `real` is memory_real's folder "
                              "(results/memory/real/); name the size otherwise")
    for part in ("sizes", "opt_in_sizes"):  # what each point measures is what it says
        for name, point in sweep.get(part, {}).items():
            shape = {**sweep.get("shape", {}), **point.get("shape", {})}
            key = f"memory_sweep.{part}.{name}"
            if shape.get("micro_batch", 0) > shape.get("batch", 0):
                raise ConfigError(f"{key}: micro_batch {shape['micro_batch']} is larger than "
                                  f"the batch {shape['batch']} (memory_sweep.shape or the "
                                  "point's shape): the step would measure a smaller one")
            room, length = point.get("max_position_embeddings", POSITIONS), (
                shape.get("prompt_len", 0) + shape.get("completion_len", 0))
            if room < length:
                raise ConfigError(f"{key}.max_position_embeddings: {room} positions, shorter "
                                  f"than the measured sequence (prompt_len + completion_len = "
                                  f"{length})")
    methods = dict.fromkeys([*sweep.get("methods", []), *sweep.get("ablation_methods", [])])
    for name, point in (sweep.get("sizes", {}) if fit_rules else {}).items():
        options = {k: v for k, v in point.items() if k != "shape"}
        for method in methods:
            check_rule_fits(config, method, on=(f"memory_sweep.sizes.{name}", options))


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
                       ("memory_real.methods",
                        list((config.get("memory_real") or {}).get("methods", {}))),
                       ("planner.offload", (config.get("planner") or {}).get("offload", [])),
                       ("sync_regime.methods",
                        (config.get("sync_regime") or {}).get("methods", []))]:
        for i, name in enumerate(names):
            if name not in config["methods"]:
                raise ConfigError(f"{key}[{i}]: {name!r} is not defined under methods "
                                  f"(defined: {sorted(config['methods'])})")
    for i, name in enumerate(sweep.get("methods", [])):
        if name not in sweep["anchors"]:
            raise ConfigError(f"lr_sweep.methods[{i}]: {name!r} has no grid: it is not one of "
                              f"lr_sweep.anchors ({sorted(sweep['anchors'])})")
    # verdicts compare run_methods with the reference: a name that matches no method is a typo
    if len(config["run_methods"]) > 1 and config["verdict"]["reference"] not in config["methods"]:
        raise ConfigError(f"verdict.reference: {config['verdict']['reference']!r} is not "
                          f"defined under methods (defined: {sorted(config['methods'])})")
    for i, pair in enumerate(config["verdict"]["contrasts"]):
        for name in pair:
            if name not in config["methods"]:
                raise ConfigError(f"verdict.contrasts[{i}]: {name!r} is not defined under "
                                  f"methods (defined: {sorted(config['methods'])})")
        if pair[0] == pair[1]:
            raise ConfigError(f"verdict.contrasts[{i}]: {pair[0]!r} against itself")
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
    """Every stability run has a held-out point between its base and its last step: a
    snapshot (grpo.snapshot_every below its steps), where the criterion finds the curve's best
    and checks the entropy."""
    st = config.get("stability")
    if not st:
        return
    spikes = st["criterion"]["spikes"]
    if spikes["min_history"] > spikes["window"]:
        raise ConfigError(f"stability.criterion.spikes.min_history: {spikes['min_history']} "
                          f"steps of history, but the window holds {spikes['window']}")
    names = {*st["methods"], *st.get("opt_in_methods", []),
             *([st["controller_ablation"]["method"]] if st.get("controller_ablation") else [])}
    for name in sorted(names & set(config["methods"])):  # the plan names an undefined one
        g = method_grpo(config, name)
        if not g["snapshot_every"] or g["snapshot_every"] >= g["steps"]:
            raise ConfigError(
                f"methods.{name}.grpo.snapshot_every: {g['snapshot_every']}, but a stability "
                f"run needs a snapshot before its last step (steps {g['steps']})")


def _check_study(config: dict) -> None:
    """`study`'s arms are tuned on one of lr_sweep's tasks; each horizon runs arms of
    `study.arms`, its reference among them, and scores its snapshot before its last update
    (one of its stability curve's, where it has one);
    its seed bounds are ordered; an adopted choice (`tuned`) is an arm's at a horizon, made by
    the primary metric on lr_sweep's seeds; `stability.criterion` is declared (its prompts
    measure each test run's drift)."""
    st = config.get("study")
    if not st:
        return
    if not (config.get("stability") or {}).get("criterion"):
        raise ConfigError("study: needs stability.criterion (its collapse.prompts are the "
                          "fixed prompts each test run's drift from its base is measured on)")
    if st["task"] not in (config.get("lr_sweep") or {}).get("tasks", []):
        raise ConfigError(f"study.task: {st['task']!r} is not one of lr_sweep.tasks (its "
                          "validation split tunes the arms)")
    if st["reference"] not in st["arms"]:
        raise ConfigError(f"study.reference: {st['reference']!r} is not one of study.arms "
                          f"({', '.join(st['arms'])})")
    for arm in st["arms"]:
        if arm not in config["methods"]:
            raise ConfigError(f"study.arms.{arm}: not defined under methods (defined: "
                              f"{sorted(config['methods'])})")
    horizons = study_horizons(config)
    for h, spec in st["horizons"].items():
        key = f"study.horizons.{h}"
        unknown = [a for a in horizons[h] if a not in st["arms"]]
        if unknown:
            raise ConfigError(f"{key}.arms: {', '.join(unknown)} not among study.arms "
                              f"({', '.join(st['arms'])})")
        if st["reference"] not in horizons[h]:
            raise ConfigError(f"{key}.arms: leaves out the reference {st['reference']!r}")
        if spec["seeds"]["min"] > spec["seeds"]["max"]:
            raise ConfigError(f"{key}.seeds: min {spec['seeds']['min']} > max "
                              f"{spec['seeds']['max']}")
        if spec.get("snapshot") and spec["snapshot"] >= horizon_steps(h):
            raise ConfigError(f"{key}.snapshot: {spec['snapshot']}, not before the horizon's "
                              f"last update ({horizon_steps(h)})")
        every = (spec.get("stability") or {}).get("every")
        if every and spec.get("snapshot") and spec["snapshot"] % every:
            raise ConfigError(f"{key}.snapshot: {spec['snapshot']}, not a multiple of "
                              f"{key}.stability.every ({every}): the runs snapshot every "
                              f"{every} updates")
    named = {name for arms in horizons.values() for name in arms.values()}
    for arm, record in st.get("tuned", {}).items():
        if arm not in named:
            raise ConfigError(f"study.tuned.{arm}: not an arm at a horizon (<arm>_<horizon>: "
                              f"{', '.join(sorted(named))})")
        if record["metric"] != config["eval"]["primary"]:
            raise ConfigError(f"study.tuned.{arm}.metric: chosen by {record['metric']!r}, but "
                              f"eval.primary is {config['eval']['primary']!r}")
        by_seed = record.get("by_seed")
        if not (isinstance(by_seed, dict) and all(
                isinstance(k, int) and isinstance(v, (int, float)) for k, v in by_seed.items())):
            raise ConfigError(f"study.tuned.{arm}.by_seed: {by_seed!r} is not a map of seed "
                              "(an integer, unquoted) to accuracy, as the grid wrote it")
        if sorted(by_seed) != sorted(config["lr_sweep"]["seeds"]):
            raise ConfigError(f"study.tuned.{arm}.by_seed: chosen on seeds "
                              f"{sorted(by_seed)}, not lr_sweep.seeds "
                              f"{config['lr_sweep']['seeds']}")
        if not math.isclose(record.get("val_accuracy", math.nan),
                            sum(by_seed.values()) / len(by_seed), rel_tol=1e-9):
            raise ConfigError(f"study.tuned.{arm}.val_accuracy: {record.get('val_accuracy')!r} "
                              f"is not the mean of its by_seed accuracies")


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
    for name in sc.get("tuned") or {}:
        if name not in sc["methods"]:
            raise ConfigError(f"scaling.tuned.{name}: not one of scaling.methods "
                              f"({', '.join(sc['methods'])})")
    if sc["check"]["size"] not in sc["sizes"]:
        raise ConfigError(f"scaling.check.size: {sc['check']['size']!r} is not one of "
                          f"scaling.sizes ({', '.join(sc['sizes'])})")
    if sc["predict_models"] and not config.get("planner"):
        raise ConfigError("scaling.predict_models: the predictions are made in the planner's "
                          "setting (`planner:`), which this config does not have")
    lo, hi = sc["base_band"]
    if lo > hi:
        raise ConfigError(f"scaling.base_band: [{lo}, {hi}] is empty (low above high)")
    for size in (sc["sizes"] if fit_rules else {}):
        for m in sc["methods"]:
            check_rule_fits(config, m, size)


def _check_per_task_values(config: dict) -> None:
    """A value given per task names only known tasks (those under `tasks`, the registered task
    types, or `default`: a misspelt task would be dropped silently), and names every task, or
    has a `default`; every value that falls short is listed in one error."""
    per_task = [(f"methods.{name}.options.{key}", value)
                for name, m in config["methods"].items()
                for key, value in m.get("options", {}).items()]
    known = {*config["tasks"], *TASKS, "default"}
    missing = {}
    for key, value in [*per_task, ("sft.steps", config["sft"]["steps"])]:
        for task in (value if isinstance(value, dict) else {}):
            if task not in known:
                close = difflib.get_close_matches(task, known, n=1)
                raise ConfigError(f"{key}.{task}: not a task of this config "
                                  f"({', '.join(config['tasks'])}), a registered task type or "
                                  f"`default`{f'; did you mean {close[0]!r}?' if close else ''}")
        if isinstance(value, dict) and "default" not in value and set(config["tasks"]) - set(value):
            missing[key] = (sorted(set(config["tasks"]) - set(value)), sorted(value))
    if missing:
        raise ConfigError(f"per-task values: {len(missing)} name no value for a task of this "
                          "config; give each that task, or a `default`:\n" + "\n".join(
                              f"  {key}: no value for {', '.join(map(repr, tasks))} (given for: "
                              f"{given})" for key, (tasks, given) in missing.items()))


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
        _check_task_data(config, name, task, sweep)


def _check_task_data(config: dict, name: str, task, sweep: dict) -> None:
    """Task `name`'s splits, drawn as the data job will (a synthetic task's, a dataset task's
    from local files; a fraction of a second for thousands): a synthetic task has the distinct
    questions data.n_train + data.n_test (+ lr_sweep.n_val) need, and on the tiny model, whose
    tokens are characters, grpo.max_new_tokens and eval.max_gen_toks each hold at least half
    of the train split's targets (with <eos>): else no completion could reach the answer. The
    stability task's test split holds the collapse clause's prompts."""
    data = config.get("data") or {}
    local = isinstance(task, HubTask) and all(task.paths.values())
    if not (isinstance(task, SyntheticTask) or local) or data.get("n_train") is None:
        return
    n_val = sweep.get("n_val", 0) if name in sweep.get("tasks", []) else 0
    try:
        splits = task.splits(data["seed"], data["n_train"], data["n_test"], n_val)
    except OSError as e:  # a local file that is missing or unreadable
        raise ConfigError(f"tasks.{name}.options: {e}") from None
    except ValueError as e:
        if not isinstance(task, SyntheticTask):
            return  # the data job names the file and line
        raise ConfigError(
            f"data.n_train: task {name!r} cannot fill data.n_train {data['n_train']} + "
            f"data.n_test {data['n_test']}{f' + lr_sweep.n_val {n_val}' if n_val else ''}"
            f" distinct questions ({e}); lower them, or widen tasks.{name}.options") from None
    st, train = config.get("stability") or {}, splits["train"]
    prompts = st.get("criterion", {}).get("collapse", {}).get("prompts", 0)
    if st.get("task") == name and len(splits["test"]) < prompts:
        raise ConfigError(f"stability.criterion.collapse.prompts: {prompts}, but task {name!r}'s "
                          f"test split has {len(splits['test'])} problems")
    if config["model"]["name"] != "tiny" or not train:
        return
    lengths = sorted(len(task.target(e)) + 1 for e in train)
    for key, room in (("grpo.max_new_tokens", config["grpo"]["max_new_tokens"]),
                      ("eval.max_gen_toks", config["eval"]["max_gen_toks"])):
        held = sum(n <= room for n in lengths) / len(lengths)
        if held < 0.5:
            raise ConfigError(
                f"{key}: {room} tokens hold {held:.0%} of the train targets of task {name!r} (on "
                f"the tiny model a token is a character: median {lengths[len(lengths) // 2]}, 90th "
                f"percentile {lengths[int(0.9 * len(lengths))]}, with <eos>), so its "
                f"completions cannot reach their answers; raise {key}")


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


def _check_data_sizes(config: dict) -> None:
    """The train split must fill SFT's held-out slice plus one batch, and every method's GRPO
    step (`check_prompts`)."""
    n = (config.get("data") or {}).get("n_train")
    if n is None:  # every row of a dataset: its size is known to the data job
        return
    sft = config["sft"]
    steps = sft["steps"].values() if isinstance(sft["steps"], dict) else [sft["steps"]]
    if any(steps) and n < sft["eval_examples"] + sft["batch_size"]:
        raise ConfigError(f"data.n_train: {n} train examples cannot hold SFT's held-out slice "
                          f"(sft.eval_examples: {sft['eval_examples']}) plus one batch "
                          f"(sft.batch_size: {sft['batch_size']})")
    for name in config["methods"]:
        check_prompts(config, name)


def check_choice(key: str, record: dict, option: str, metric: str) -> None:
    """A tuned record as adopted (config/tuned.yaml's `tuned.<task>.<method>`, the study's
    `study.tuned.<arm>`) is what the grids' rule (logra.analysis.tuning.lr_sweep_table, which
    wrote it) chooses among the record's own `scores` ([value, mean validation accuracy or
    null]): the best accuracy, the smaller value on a tie, within a float tolerance;
    `bracketed` as its position says (not the smallest or largest value scored, successive
    halving's `screen` too); its knob is `option` and its metric `metric`. Else a ValueError
    naming `key`, the field and both values (repr)."""
    def fail(field, why):
        raise ValueError(f"{key}.{field}: {why}; rerun its grid, or adopt the record as it "
                         "wrote it")

    if record.get("option") != option:
        fail("option", f"{record.get('option')!r}, but the method's knob is {option!r}")
    if record.get("metric") != metric:
        fail("metric", f"{record.get('metric')!r}, but eval.primary is {metric!r}")
    scores = record.get("scores")
    if not (isinstance(scores, list) and scores and all(
            isinstance(p, (list, tuple)) and len(p) == 2 and _number(p[0])
            and (p[1] is None or _number(p[1])) for p in scores)):
        fail("scores", f"{scores!r} is not a list of [value, accuracy or null] pairs of numbers")
    if not _number(record.get("value")):
        fail("value", f"{record.get('value')!r} is not a number")
    done = sorted((float(v), float(a)) for v, a in scores if a is not None)
    if not done:
        fail("scores", "no point has an accuracy")
    best = max(done, key=lambda p: p[1])  # the first, i.e. smaller, value of a tie
    if not math.isclose(record["value"], best[0], rel_tol=1e-9):
        fail("value", f"{record['value']!r} is not the rule's choice among its scores: "
                      f"{best[0]!r} scores {best[1]!r}")
    screen = record.get("screen", [])
    if not (isinstance(screen, list) and all(
            isinstance(p, (list, tuple)) and len(p) == 2 and _number(p[0])
            and (p[1] is None or _number(p[1])) for p in screen)):
        fail("screen", f"{screen!r} is not a list of [value, accuracy or null] pairs")
    values = [float(v) for v, _ in scores + screen]
    inside = min(values) < best[0] < max(values)
    if record.get("bracketed") is not inside:
        fail("bracketed", f"{record.get('bracketed')!r}, but its value {best[0]!r} is "
                          + ("inside its scored points" if inside else "on an edge of them"))


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
