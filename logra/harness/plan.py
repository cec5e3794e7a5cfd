"""The experiment plan: a resolved config (`logra.harness.config.resolve`) expanded once into
every run the workflow's targets make, each derived run checked like a written one.

`build_plan` expands a copy of the config: the lr sweep's points (`add_lr_sweep_methods`), the
sync regimes' lr-scaled methods, the stability controller ablation's cells and the scaling
study's sizes, rank fractions and transfer checks each become a method of their own under
`methods`. Every derived method then passes the checks a written method passes
(`logra.harness.config.check_method`: its rule's options, its grpo keys, its data, its rule
built on the model it trains, a scaling size's own), so a derived run that cannot work stops
the workflow before any job, naming the config key that made it. The `Plan` holds the
expanded config, the run lists of every target and the benchmark files of the targets that
count their jobs' time; the Snakefile builds it once and its rule files read it.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import inspect
import json
import math
import re

from logra import rules
from logra.harness.config import (ConfigError, check_method, generation_room, hub_models,
                                  job_resources, margin_seeds, method_grpo, run_config,
                                  run_tasks, task_options)

BENCH = "results/benchmarks"  # each job's benchmark: BENCH/<stage>/<rule>/<wildcards>.tsv


def stamp(path: str) -> str:
    """The stamp of opt-in result `path` (results/...): results/stamps/....stamp."""
    return f"results/stamps/{path.removeprefix('results/')}.stamp"


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the workflow runs, from one config (`build_plan`).

    - `config`: the config with every derived method under `methods`; `derived`: {derived
      method: the config key that defines it};
    - `tasks`, `methods`, `ablations`, `seeds`: the grid (`run_tasks`, `run_methods`, the
      `ablation_methods` not among them, `seeds`); `reference`: verdict.reference, and
      `verdicts`: whether the grid compares methods with it;
    - `paper`: the config has the paper's memory sweep, planner and stability runs;
    - `sweep`: {name: (method, lr)}, every point of every anchor's grid; `grids`: {table:
      {method: its Grid}}, the tuning grids of results/lr_sweep.csv (`lr_sweep`: those of
      `swept`) and of results/scaling/lr_sweep.csv (`scaling`); `regimes`: {sync regime: its
      methods};
      `scaling`: the scaling study's methods (`Scaling`);
    - `margin_runs`: {task: the lr sweep's run of the reference that sets its margin}, run at
      `margin_seeds`;
    - `runs`: every target's runs as "task/method/seedN": `grid` (run_methods), `ablations`
      (the grid and the ablation methods), `reinforce`, `long` (the default target's stability
      runs), `stability_seeds`, `controller`, `lr_sweep`, `sync_regime`, `scaling_sweep`,
      `scaling_grid`, `scaling_check`, and `trained`: every GRPO run of the default target."""
    config: dict
    derived: dict[str, str]
    tasks: list[str]
    methods: list[str]
    ablations: list[str]
    seeds: list[int]
    reference: str
    verdicts: bool
    paper: bool
    sweep: dict[str, tuple[str, float]]
    grids: dict[str, dict[str, Grid]]
    regimes: dict[str, list[str]]
    scaling: Scaling
    margin_runs: dict[str, str]
    margin_seeds: list[int]
    runs: dict[str, list[str]]

    def grpo(self, method: str) -> dict:
        return method_grpo(self.config, method)

    def run_config(self, task: str, method: str, seed: int) -> dict:
        return run_config(self.config, task, method, seed)

    def resources(self, stage: str) -> dict:
        return job_resources(self.config, stage)

    def memory_point(self, size: str, method: str) -> dict:
        """A memory point's tiny-model options, batch shape, steps and run config: a size of
        the memory sweep's (default and opt-in) or `real`, memory_real's architecture, whose
        methods run with memory_real's options over their own."""
        cfg = self.run_config(self.tasks[0], method, 0)
        if size == "real":
            real = self.config["memory_real"]
            spec = cfg["method"]
            return {"size": real["model"], "shape": real["shape"], "steps": real["steps"],
                    "method": cfg | {"method": spec | {
                        "options": spec["options"] | real["methods"][method]}}}
        sweep = self.config["memory_sweep"]
        point = (sweep["sizes"] | sweep.get("opt_in_sizes", {}))[size]
        return {"size": {k: v for k, v in point.items() if k != "shape"},
                "shape": sweep.get("shape", {}) | point.get("shape", {}),
                "steps": sweep.get("steps"), "method": cfg}

    def start_model(self, method: str | None = None) -> str | None:
        return start_model(self.config, method)

    def base_input(self, wildcards) -> dict[str, str]:
        return base_input(self.config, wildcards)

    def scaling_grid(self) -> list[tuple[str, str, int, str]]:
        return scaling_grid(self.config, self.scaling)

    def sft(self, task: str) -> dict:
        """SFT's options on `task`."""
        return task_options(self.config["sft"], task)

    @property
    def generation_room(self) -> int:
        return generation_room(self.config)

    @property
    def hub_models(self) -> list[str]:
        return hub_models(self.config)

    def declared(self, table: str) -> list[str]:
        """The methods of the declared points of `table`'s grids (`grids`)."""
        return declared(self.grids[table])

    @property
    def sweep_knobs(self) -> dict[str, str]:
        return sweep_knobs(self.config)

    @functools.cached_property
    def digest(self) -> str:
        """The config's digest (SHA-256 of its canonical JSON, 16 hex digits): what an opt-in
        result is stamped with (`results/stamps/`), so the report tells one made under this
        config from one made under another."""
        text = json.dumps(self.config, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @property
    def opt_in(self) -> dict[str, list[str]]:
        """{opt-in target: the results it makes that the report reads when they exist}."""
        ablations = (["summary.csv", "accuracy.csv"] + (["verdicts.csv"] if self.verdicts else [])
                     + (["memory_sweep.csv"] if (self.config.get("memory_sweep") or {}).get(
                         "ablation_methods") else []))
        return {"lr_sweep": ["results/lr_sweep.csv", "results/tuned.yaml"],
                "ablations": [f"results/ablations/{f}" for f in ablations],
                "stability": ["results/stability_seeds.csv"]
                + (["results/stability_controller.csv"] if self.runs["controller"] else []),
                "trl": [f"results/trl/{task}.json" for task in self.tasks],
                "sync_regime": ["results/sync_regime.csv"],
                "scaling": ["results/scaling.csv"]} | (
            {"memory_real": ["results/memory/real.csv"]} if self.config.get("memory_real")
            else {})

    def stamps(self, target: str) -> list[str]:
        """The stamps of opt-in `target`'s results (`opt_in`): each holds the digest of the
        config under which Snakemake last brought that result up to date."""
        return [stamp(path) for path in self.opt_in[target]]

    @property
    def primary_eval(self) -> dict:
        """The eval section with eval.primary's protocol only: what the lr sweep's choice, the
        margin and the stability runs' held-out curves read (on the validation split)."""
        ev = self.config["eval"]
        return ev | {"protocols": {ev["primary"]: ev["protocols"][ev["primary"]]}}

    def benchmarks(self, target: str, sweep: list[str] | None = None) -> list[str]:
        """The benchmark files of `target`'s jobs, as the rules write them: `all`, every job
        of the default target but the report (results/REPORT.md's time ledger); `scaling`,
        the jobs that are the scaling study's own (its CPU time against scaling.cpu_hours),
        its sweep's runs being `sweep` (those the bracket rule ran; default: the declared)."""
        if target == "all":
            return _default_benchmarks(self)
        return _scaling_benchmarks(self, self.runs["scaling_sweep"] if sweep is None else sweep)


def build_plan(config: dict, fit_rules: bool = True) -> Plan:
    """The plan of a config `resolve` returned (it is not modified). Without `fit_rules` no
    rule is built on a model (`check`): a job Snakemake starts in a process of its own re-reads
    the Snakefile, whose main process checked the same plan in full."""
    config = copy.deepcopy(config)
    written = set(config["methods"])
    grids = add_lr_sweep_methods(config)
    sweep, tuning = grid_points(grids), {m: grids[m] for m in swept(config)}
    regimes = add_sync_regime_methods(config)
    control = add_controller_ablation_methods(config)
    scaling = add_scaling_methods(config)
    where = ({n: f"lr_sweep.anchors.{m}" for n, (m, _) in sweep.items()}
             | {n: f"sync_regime.lr_scales.{r}" for r, names in regimes.items() for n in names}
             | dict.fromkeys(control, "stability.controller_ablation")
             | {n: f"scaling.sizes.{m['size']}" for n, m in config["methods"].items()
                if "size" in m})
    derived = {n: key for n, key in where.items() if n not in written}
    for name, key in derived.items():
        try:
            check_method(config, name, trained=True, fit_rules=fit_rules)
        except ConfigError as e:
            raise ConfigError(f"{key}: its run {name!r} cannot work: {e}") from None
    tasks, methods, seeds = run_tasks(config), config["run_methods"], config["seeds"]
    ablations = [m for m in config["ablation_methods"] if m not in methods]
    reference = config["verdict"]["reference"]
    verdicts = reference in methods and len(methods) > 1
    margin = margin_runs(config, sweep) if verdicts else {}
    runs = _runs(config, tasks, methods, ablations, seeds, tuning, scaling)
    runs["trained"] = list(dict.fromkeys(runs["grid"] + runs["long"] + [
        f"{task}/{run}/seed{seed}" for task, run in margin.items()
        for seed in margin_seeds(config)]))
    return Plan(config, derived, tasks, methods, ablations, seeds, reference, verdicts,
                {"memory_sweep", "planner", "stability"} <= set(config), sweep,
                {"lr_sweep": tuning, "scaling": scaling.grids},
                regimes, scaling, margin,
                margin_seeds(config), runs)


def _cross(tasks, methods, seeds) -> list[str]:
    return [f"{t}/{m}/seed{s}" for t in tasks for m in methods for s in seeds]


def _runs(config, tasks, methods, ablations, seeds, grids, scaling) -> dict[str, list[str]]:
    """`Plan.runs` but `trained`; of a tuning grid, its declared points (those the bracket
    rule adds are known once the round before has run: workflow/rules/sweep.smk)."""
    grid = _cross(tasks, methods, seeds)
    sc = scaling_runs(config, scaling)
    lr = config.get("lr_sweep") or {}
    return {"grid": grid, "ablations": grid + _cross(tasks, ablations, seeds),
            "reinforce": _cross(tasks, config["reinforce_methods"], seeds),
            "long": stability_runs(config), "stability_seeds": stability_runs(config, True),
            "controller": controller_runs(config),
            "lr_sweep": _cross(lr.get("tasks", []), declared(grids), lr.get("seeds", [0])),
            "sync_regime": sync_regime_runs(config), "scaling_sweep": sc["sweep"],
            "scaling_grid": sc["grid"], "scaling_check": sc["check"]}


def _default_benchmarks(plan: Plan) -> list[str]:
    """`Plan.benchmarks("all")`."""
    config, runs, margin, mseeds = plan.config, plan.runs, plan.margin_runs, plan.margin_seeds
    bases = sorted({re.fullmatch(r"(\w+)/\w+/seed(\d+)", run).groups()
                    for run in runs["trained"]})
    memory = config.get("memory_sweep") or {"sizes": {}, "methods": []}
    tables = (["summary", "fingerprints", "margin", "analysis_plan"]
              + (["verdicts"] if plan.verdicts else []) + (["stability"] if runs["long"] else []))
    figures = (["reward_curves"] + (["verdicts"] if plan.verdicts else [])
               + (["memory_reduction", "stability_27b", "sync_bytes"] if plan.paper else []))
    jobs = ([f"data/data/{task}" for task in sorted({task for task, _ in bases})]
            + [f"data/lmeval_task/{task}" for task in plan.tasks]
            + ([] if plan.start_model() else [f"base/base/{t}/seed{s}" for t, s in bases])
            + [f"train/train/{run}" for run in runs["trained"]]
            + [f"eval/eval_run/{run}" for run in runs["grid"]]
            + [f"stability/stability_eval/{run}" for run in runs["long"]]
            + [f"eval/eval_base/{t}/seed{s}" for t in plan.tasks for s in plan.seeds]
            + [f"lr_sweep/lr_sweep_eval/{t}/{run}/seed{s}" for t, run in margin.items()
               for s in mseeds]
            + [f"lr_sweep/lr_sweep_eval_base/{t}/seed{s}" for t in margin for s in mseeds]
            + [f"lr_sweep/{rule}/{t}" for t in margin for rule in ("data_val", "lmeval_task_val")]
            + [f"tables/{name}" for name in tables] + [f"figures/{name}" for name in figures]
            + ([f"memory/memory_point/{z}/{m}" for z in memory["sizes"] for m in memory["methods"]]
               + ["memory/memory_sweep", "memory/planner"] if plan.paper else [])
            + (["memory/paper_setting"] if config.get("paper_setting") else []))
    return [f"{BENCH}/{job}.tsv" for job in jobs]


def _scaling_benchmarks(plan: Plan, sweep: list[str]) -> list[str]:
    """`Plan.benchmarks("scaling")`: each size's bases (the test seeds', the sweep's and the
    check's), their evaluations, every run and its evaluation (not the data, nor the margin's
    validation run, which the default target shares)."""
    config, runs = plan.config, plan.runs
    sc = config["scaling"]
    seeds, val = sc.get("seeds") or config["seeds"], config["lr_sweep"]["seeds"]
    sizes = list(sc["sizes"])
    bases = dict.fromkeys([(z, s) for z in sizes for s in seeds]
                          + [(z, s) for z in (sizes[0], sc["check"]["size"]) for s in val])
    grid = list(dict.fromkeys(run for *_, run in plan.scaling_grid()))
    validation = sweep + runs["scaling_check"]
    jobs = ([f"scaling/base/{sc['task']}/{z}/seed{s}" for z, s in bases]
            + [f"scaling/eval_base/{sc['task']}/{z}/seed{s}" for z in sizes for s in seeds]
            + [f"train/train/{run}" for run in validation + grid]
            + [f"lr_sweep/lr_sweep_eval/{run}" for run in validation]
            + [f"eval/eval_run/{run}" for run in grid])
    return [f"{BENCH}/{job}.tsv" for job in jobs]


@dataclasses.dataclass(frozen=True)
class Grid:
    """One method's tuning grid on the validation split (`tuning_grid`): `values[k]`, the point
    of its knob k steps from its anchor, anchor · factor^(power·k) with power its rule's
    `tuning_power` (an lr 1, LoGRA's KL budget 2: every grid spaced by `factor` in step
    size); `names[k]`, the method that runs it. `declared` = (lo, hi): the points that run
    first; `cap`: how many points the bracket rule (`logra.analysis.tuning.next_window`) may
    add beyond them, one at a time beyond the edge that holds the best point. Every point the
    rule may add is defined here, and checked like a written method."""
    method: str
    names: dict[int, str]
    values: dict[int, float]
    declared: tuple[int, int]
    cap: int

    def points(self, window: tuple[int, int] | None = None) -> dict[str, tuple[str, float]]:
        """{name: (method, value)} of the points of `window` (default: every point)."""
        lo, hi = window or (min(self.names), max(self.names))
        return {self.names[k]: (self.method, self.values[k]) for k in range(lo, hi + 1)}


def grid_values(anchor: float, points: int, factor: float, power: int = 1,
                cap: int = 0) -> dict[int, float]:
    """The grid rule, the same for every method (an equal tuning budget): {k: anchor ·
    factor^(power·k)} for k = -((points - 1) // 2) - cap ... points // 2 + cap (6 points,
    factor 2, power 1: anchor/4 ... anchor·8 declared), rounded to 12 significant digits."""
    ks = range(-((points - 1) // 2) - cap, points // 2 + cap + 1)
    step = factor ** power
    return {k: _round(anchor * step ** k if k >= 0 else anchor / step ** -k) for k in ks}


def tuning_grid(config: dict, method: str, name) -> Grid:
    """`method`'s grid under `lr_sweep` (points, factor, extend, its anchor), each point's
    method named `name(value)`."""
    spec, m = config["lr_sweep"], config["methods"][method]
    power = rules.rule_class(m["rule"]).tuning_power(m.get("options", {}))
    values = grid_values(spec["anchors"][method], spec["points"], spec["factor"], power,
                         spec["extend"])
    lo = -((spec["points"] - 1) // 2)
    return Grid(method, {k: name(v) for k, v in values.items()}, values,
                (lo, lo + spec["points"] - 1), spec["extend"])


def swept(config: dict) -> list[str]:
    """The methods whose grids `snakemake lr_sweep` runs: `lr_sweep.methods`, else every one of
    `lr_sweep.anchors` (every anchor's grid is defined: the margin reads the reference's)."""
    spec = config.get("lr_sweep") or {"anchors": {}}
    return spec.get("methods") or list(spec["anchors"])


def grid_points(grids: dict[str, Grid]) -> dict[str, tuple[str, float]]:
    """{name: (method, value)} of every point of `grids`."""
    return {name: point for grid in grids.values() for name, point in grid.points().items()}


def declared(grids: dict[str, Grid]) -> list[str]:
    """The methods of every grid's declared points."""
    return [name for g in grids.values() for name in g.points(g.declared)]


def add_lr_sweep_methods(config: dict) -> dict[str, Grid]:
    """Add one method per point of each of `lr_sweep.anchors`' grids (`tuning_grid`, with the
    points the bracket rule may add) to config["methods"], a copy at that point of the rule's
    knob (its `tuned` options: the lr; LoGRA's KL budget, its update_ratio following), named
    `<method>_lr<value>` (`dense_adam_lr0p0001`, `logra_lr0p0002`), the configured one too:
    adopting the choice in the config renames no sweep run. The copies measure no memory
    (`grpo.measure_memory`: the weights are the same; what the sweep reads is their validation
    accuracy). Returns {method: its Grid}."""
    grids = {}
    for method in (config.get("lr_sweep") or {"anchors": {}})["anchors"]:
        base = config["methods"][method]
        cls = rules.rule_class(base["rule"])
        grids[method] = grid = tuning_grid(config, method,
                                           lambda v, m=method: f"{m}_lr{_point_name(v)}")
        for name, (_, value) in grid.points().items():
            if name in config["methods"]:
                raise ConfigError(f"lr_sweep.anchors.{method}: the run name {name!r} for "
                                  f"the point {value} is already a method")
            config["methods"][name] = {  # validation runs: their memory is not read
                **copy.deepcopy(base),
                "options": cls.tuned(dict(base.get("options", {})), value),
                "grpo": {**base.get("grpo", {}), "measure_memory": False}}
    return grids


def sweep_knobs(config: dict) -> dict[str, str]:
    """{method: the option its lr sweep's points set} for each of `lr_sweep.anchors`."""
    return {m: rules.rule_class(config["methods"][m]["rule"]).tuning_option(
        config["methods"][m].get("options", {}))
        for m in (config.get("lr_sweep") or {}).get("anchors", {})}


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
    """`stability.controller_ablation`'s cells as (method name, controller on, factor): its
    method with its rule's `controller` on and off at each of `scales` times its step size,
    on the stability task. Off, the step size is the rule's step-size option (LoGRA's
    update_ratio) times the scale, named `<method>_nocontrol_x<scale>`. On, the controller
    absorbs that option (it sets the step's predicted KL to the budget), so the cell moves
    what it does not absorb, its tuning option (LoGRA's KL budget), by scale^tuning_power (the
    same steps: x1, x4, x16 for 1, 2, 4), named `<method>_budget_x<factor>` (the method itself
    at 1); the controller on first."""
    ablation = (config.get("stability") or {}).get("controller_ablation")
    if not ablation:
        return []
    method = ablation["method"]
    m = config["methods"].get(method)
    if m is None:
        raise ConfigError(f"stability.controller_ablation.method: {method!r} is not defined "
                          f"under methods (defined: {sorted(config['methods'])})")
    cls = rules.rule_class(m["rule"])
    if "controller" not in inspect.signature(cls).parameters:
        raise ConfigError(f"stability.controller_ablation.method: {method!r}'s rule "
                          f"{m['rule']!r} has no `controller` option to switch off")
    power = cls.tuning_power({**m.get("options", {}), "controller": True})
    cells = []
    for on in (True, False):
        for scale in ablation["scales"]:
            factor = _round(float(scale) ** power) if on else float(scale)
            cells.append((method if on and factor == 1 else
                          f"{method}_{'budget' if on else 'nocontrol'}_x{_point_name(factor)}",
                          on, factor))
    return cells


def add_controller_ablation_methods(config: dict) -> list[str]:
    """Define the controller ablation's cells (`controller_cells`) in config["methods"], each
    a copy of its method with `controller` set and, on the stability task, its tuning option
    (controller on: `rules.tuned`, LoGRA's budget) or its step size (off: `lr_scaled`) times
    the cell's factor; returns their names."""
    cells = controller_cells(config)
    if not cells:
        return []
    method = config["stability"]["controller_ablation"]["method"]
    task = config["stability"]["task"]
    base = config["methods"][method]
    cls = rules.rule_class(base["rule"])
    for name, on, factor in cells:
        if name == method:
            continue
        if name in config["methods"]:
            raise ConfigError(f"stability.controller_ablation: the run name {name!r} is "
                              "already a method")
        if on:
            here = task_options({**base.get("options", {}), "controller": True}, task)
            option = cls.tuning_option(here)
            value = rules.step_size(cls, here) if option == cls.step_size_option else (
                here.get(option, inspect.signature(cls).parameters[option].default))
            config["methods"][name] = {**copy.deepcopy(base),
                                       "options": cls.tuned(here, _round(value * factor))}
        else:
            config["methods"][name] = lr_scaled(base, factor)
            config["methods"][name]["options"]["controller"] = False
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
      rule and anchors; `grids`: {method: its Grid}), value the point of the method's knob
      (`UpdateRule.tuning_option`: dense AdamW's lr, LoGRA's KL budget);
    - `grid`: {(label, size): name}, every method, and each rank-fraction variant (label
      `<method>_frac`), at every size at its `scaling.tuned` value transferred by
      `scaling.transfer` (empty until every method is tuned);
    - `check`: {name: (method, value)}, the transfer's check: `check.factors` times each
      transferred value at `check.size` (factor 1: the grid's method itself)."""
    sweep: dict = dataclasses.field(default_factory=dict)
    grids: dict = dataclasses.field(default_factory=dict)
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
    sizes, methods = list(sc["sizes"]), config["methods"]

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
        out.grids[method] = grid = tuning_grid(
            config, method, lambda v, m=method: _point_name(m, sizes[0], "lr") + _point_name(v))
        for name, (_, value) in grid.points().items():
            out.sweep[define(name, method, sizes[0], value, validation=True)] = (method, value)
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
    return {"sweep": [f"{sc['task']}/{m}/seed{s}" for m in declared(scaling.grids)
                      for s in val],
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
