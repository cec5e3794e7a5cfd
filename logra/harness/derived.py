"""The methods a config derives from its written ones, and their runs: each tuning grid's
points (`add_lr_sweep_methods`, spaced alike in step size; the bracket rule extends them), the
stability controller ablation's cells, the scaling study's sizes and transfers and the sync
regimes' lr-scaled copies (the study's horizons: logra/harness/horizons.py).
`logra.harness.plan.build_plan` adds them to a copy of the config and checks each as a written
method."""
from __future__ import annotations

import copy
import dataclasses
import inspect
import math

from logra import rules
from logra.harness.checks import check_choice
from logra.harness.config import ConfigError, task_options
from logra.harness.runs import study_horizons


@dataclasses.dataclass(frozen=True)
class Grid:
    """One method's tuning grid on the validation split (`tuning_grid`): `values[k]`, the point
    of its knob k steps from its anchor, anchor · factor^(power·k) with power its rule's
    `tuning_power` (an lr 1, LoGRA's KL budget 2: every grid spaced by `factor` in step
    size); `names[k]`, the method that runs it. `declared` = (lo, hi): the points that run
    first; `cap`: how many points the bracket rule (`logra.analysis.tuning.next_window`) may
    add beyond them, one at a time beyond the edge that holds the best point. Every point the
    rule may add is defined here, and checked like a written method. `halving`: 0, every
    point runs on every validation seed; n, successive halving (a study horizon's `halving`):
    the declared points run on the first seed, the n best of them on every seed, and the
    choice is among those (`logra.analysis.tuning.round_result`)."""
    method: str
    names: dict[int, str]
    values: dict[int, float]
    declared: tuple[int, int]
    cap: int
    halving: int = 0

    def points(self, window: tuple[int, int] | None = None) -> dict[str, tuple[str, float]]:
        """{name: (method, value)} of the points of `window` (default: every point)."""
        lo, hi = window or (min(self.names), max(self.names))
        return {self.names[k]: (self.method, self.values[k]) for k in range(lo, hi + 1)}

    def runs(self, window: tuple[int, int], keep: tuple[int, ...] | None,
             seeds: list[int]) -> list[tuple[str, int]]:
        """[(point's method, seed)] a tuning round over `window` runs: every point on every one
        of `seeds` (`keep` None), else the points of `keep` on every seed and the others on
        the first only (successive halving's screen; `keep` () in its first round)."""
        return [(self.names[k], s) for k in range(window[0], window[1] + 1)
                for s in (seeds if keep is None or k in keep else seeds[:1])]

    def first_round(self) -> tuple[tuple[int, int], tuple[int, ...] | None]:
        """(window, keep) of the grid's first round: its declared points, screened on the first
        seed under successive halving."""
        return self.declared, (() if self.halving else None)


def grid_values(anchor: float, points: int, factor: float, power: int = 1,
                cap: int = 0) -> dict[int, float]:
    """The grid rule, the same for every method (an equal tuning budget): {k: anchor ·
    factor^(power·k)} for k = -((points - 1) // 2) - cap ... points // 2 + cap (6 points,
    factor 2, power 1: anchor/4 ... anchor·8 declared), rounded to 12 significant digits."""
    ks = range(-((points - 1) // 2) - cap, points // 2 + cap + 1)
    step = factor ** power
    return {k: _round(anchor * step ** k if k >= 0 else anchor / step ** -k) for k in ks}


def tuning_grid(config: dict, method: str, name, anchor: float | None = None,
                halving: int = 0) -> Grid:
    """`method`'s grid under `lr_sweep`'s rule (points, factor, extend) about `anchor`
    (default: its `lr_sweep.anchors` entry), each point's method named `name(value)`;
    `halving`: `Grid.halving`."""
    spec, m = config["lr_sweep"], config["methods"][method]
    power = rules.rule_class(m["rule"]).tuning_power(m.get("options", {}))
    values = grid_values(spec["anchors"][method] if anchor is None else anchor, spec["points"],
                         spec["factor"], power, spec["extend"])
    lo = -((spec["points"] - 1) // 2)
    return Grid(method, {k: name(v) for k, v in values.items()}, values,
                (lo, lo + spec["points"] - 1), spec["extend"], halving)


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


def point_name(*parts) -> str:
    """A method name from its parts, numbers as %g with '.', '-' and '+' spelled p, m, ''."""
    return "_".join(f"{p:g}" if isinstance(p, float) else str(p) for p in parts).replace(
        "-", "m").replace("+", "").replace(".", "p")


def adopted_point(config: dict, key: str, record: dict, method: str, grid: Grid) -> str:
    """The point of `method`'s `grid` an adopted record (at config key `key`) chose, checked:
    the grid's rule's choice among the record's own scores (checks.check_choice) and a point of
    the grid; else a ConfigError naming the key."""
    try:
        check_choice(key, record, sweep_knobs(config)[method], config["eval"]["primary"])
    except ValueError as e:
        raise ConfigError(str(e)) from None
    name = next((n for n, (_, v) in grid.points().items()
                 if math.isclose(v, record["value"], rel_tol=1e-9)), None)
    if name is None:
        raise ConfigError(f"{key}.value: {record['value']!r} is not a point of its grid "
                          f"({', '.join(repr(v) for v in grid.values.values())})")
    return name


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
                                           lambda v, m=method: f"{m}_lr{point_name(v)}")
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
    """{method: the option its grid's points set} for each of `lr_sweep.anchors` and each
    study arm at each horizon (`study_horizons`)."""
    def knob(m: str) -> str:
        return rules.rule_class(config["methods"][m]["rule"]).tuning_option(
            config["methods"][m].get("options", {}))
    return {m: knob(m) for m in (config.get("lr_sweep") or {}).get("anchors", {})} | {
        name: knob(arm) for arms in study_horizons(config).values()
        for arm, name in arms.items()}


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
        if not match:  # named by the key that gave the lr: an adopted choice, or the method's
            adopted = reference in ((config.get("tuned") or {}).get(task) or {})
            key = (f"tuned.{task}.{reference}.value" if adopted
                   else f"methods.{reference}.options.{knob}")
            raise ConfigError(f"{key}: {reference}'s {knob} on {task} ({lr!r}) is not a point "
                              f"of its lr_sweep grid ({', '.join(map(repr, sorted(points)))}), "
                              "and verdict.margin is set on the sweep's validation run of the "
                              f"reference at its configured {knob}: "
                              + ("adopt a choice of this grid (rerun the lr sweep)" if adopted
                                 else f"give it a point of the grid, or move lr_sweep.anchors."
                                      f"{reference}"))
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
                          f"{method}_{'budget' if on else 'nocontrol'}_x{point_name(factor)}",
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
            config, method, lambda v, m=method: point_name(m, sizes[0], "lr") + point_name(v))
        for name, (_, value) in grid.points().items():
            out.sweep[define(name, method, sizes[0], value, validation=True)] = (method, value)
    records = sc.get("tuned") or {}
    for method, record in records.items():
        adopted_point(config, f"scaling.tuned.{method}", record, method, out.grids[method])
    if any(m not in records for m in sc["methods"]):
        return out  # the grid waits for the sweep's choices
    tuned = {m: records[m]["value"] for m in sc["methods"]}
    width = config["model"]["tiny"]["hidden_size"]
    for method in sc["methods"]:
        for size in sizes:
            value = _round(tuned[method] * transfer_factor(config, method, size))
            name = out.grid[method, size] = define(point_name(method, size), method, size,
                                                   value)
            if method in sc["rank_fraction"]:
                rank = methods[method]["options"]["rank"]
                frac = max(1, round(rank * sc["sizes"][size]["model"]["hidden_size"] / width))
                out.grid[f"{method}_frac", size] = name if frac == rank else define(
                    point_name(method, "frac", size), method, size, value, rank=frac)
            if size == sc["check"]["size"]:
                for factor in sc["check"]["factors"]:
                    point = _round(value * factor)
                    out.check[name if factor == 1 else define(
                        f"{name}_{point_name('x', float(factor))}", method, size, point,
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
                          "`snakemake scaling_sweep` and adopt its choices at the first size "
                          "(results/scaling/tuned.yaml: `python -m logra.harness.adopt`) before "
                          "the test runs")
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
