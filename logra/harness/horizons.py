"""The study's methods (`snakemake study`): each arm on each horizon's schedule
(`horizon_method`), its tuning grid there (`add_study_methods`), the adopted choice checked
against that grid, and the test seeds (`study_seeds`). `logra.harness.plan.build_plan` adds
them to a copy of the config and checks each as a written method."""
from __future__ import annotations

import copy
import math

from logra import rules
from logra.harness.config import ConfigError, margin_seeds
from logra.harness.derived import Grid, adopted_point, point_name, tuning_grid
from logra.harness.runs import horizon_steps, study_horizons


def horizon_method(method: dict, steps: int, schedule: dict, snapshot: int | None) -> dict:
    """`method` on a study horizon of `steps` updates, its schedule by `study.schedule`'s rule
    (the LoGRA authors' proportions at 200 updates: warmup 9, cosine to a tenth over 300, their
    KL budget's cosine over 300): a rule with its own schedule (`UpdateRule.schedule_option`,
    LoGRA's budget) spans `decay` x steps; any other warms its lr up over `warmup` x steps and
    decays it by a cosine to `final` over `decay` x steps (both rounded to the nearest update,
    halves up), so every run ends at 1/decay of its schedule. 80 updates: 4 and 120; 1,100:
    50 and 1,650. `snapshot`: grpo.snapshot_every, where the horizon scores a snapshot too
    or judges a stability curve.
    Whatever schedule or snapshot the method itself sets is replaced."""
    cls = rules.rule_class(method["rule"])
    out = copy.deepcopy(method)
    def updates(x: float) -> int:  # halves up, after the float's noise (0.045 x 1,100 = 49.5)
        return math.floor(round(x, 9) + 0.5)
    decay = updates(schedule["decay"] * steps)
    grpo = {k: v for k, v in out.get("grpo", {}).items() if k not in (
        "warmup_steps", "decay_steps", "decay_final", "snapshot_every")} | {"steps": steps}
    if cls.schedule_option:
        out["options"] = {**out.get("options", {}), cls.schedule_option: decay}
    else:
        grpo |= {"warmup_steps": updates(schedule["warmup"] * steps),
                 "decay_steps": decay, "decay_final": schedule["final"]}
    if snapshot:
        grpo["snapshot_every"] = snapshot
    out["grpo"] = grpo
    return out


def add_study_methods(config: dict) -> dict[str, Grid]:
    """Define `snakemake study`'s methods in config["methods"]: per horizon (`study_horizons`)
    and arm (`study.arms`: {arm: anchor}), the arm on the horizon's schedule
    (`horizon_method`) as `<arm>_<horizon>`, and one method per point of its grid under
    `lr_sweep`'s rule about the arm's anchor, a copy at that point of its knob named
    `<arm>_<horizon>_lr<value>`: every horizon tunes its arms itself. The points keep the arm's
    memory measurement: the chosen one's test runs report their measured peaks. Returns {the
    arm at its horizon: its Grid}."""
    st, grids = config.get("study") or {}, {}
    for h, arms in study_horizons(config).items():
        for arm, name in arms.items():
            base = config["methods"].get(arm)
            if base is None:
                raise ConfigError(f"study.arms.{arm}: not defined under methods")
            if name in config["methods"]:
                raise ConfigError(f"study.horizons.{h}: the method name {name!r} for {arm} at "
                                  "this horizon is already a method")
            design = st["horizons"][h]
            config["methods"][name] = method = horizon_method(
                base, horizon_steps(h), st["schedule"],
                (design.get("stability") or {}).get("every") or design.get("snapshot"))
            cls = rules.rule_class(method["rule"])
            grids[name] = grid = tuning_grid(
                config, name, lambda v, m=name: f"{m}_lr{point_name(v)}", st["arms"][arm],
                (design.get("halving") or {}).get("keep", 0))
            for point, (_, value) in grid.points().items():
                if point in config["methods"]:
                    raise ConfigError(f"study.arms.{arm}: the run name {point!r} for the point "
                                      f"{value} at {h} is already a method")
                config["methods"][point] = {
                    **copy.deepcopy(method),
                    "options": cls.tuned(dict(method.get("options", {})), value)}
            _check_study_tuned(config, name, grid)
    return grids


def _check_study_tuned(config: dict, arm: str, grid: Grid) -> None:
    """An arm's adopted choice at a horizon (`study.tuned.<arm>_<horizon>`,
    results/study/tuned/<arm>_<horizon>.yaml as its grid wrote it) is a point of its grid
    (`adopted_point`), chosen under the method config that point has now: else an error that
    names the key and says to run the grid again."""
    record = (config["study"].get("tuned") or {}).get(arm)
    if record is None:
        return
    name = adopted_point(config, f"study.tuned.{arm}", record, arm, grid)
    now = config["methods"][name]
    if record["config"] != now:
        differ = [k for k in sorted(set(record["config"]) | set(now))
                  if record["config"].get(k) != now.get(k)]
        raise ConfigError(f"study.tuned.{arm}: chosen under another config of {name} (it differs "
                          f"in {', '.join(differ)}): remove the entry to run the arm's grid again")


def study_seeds(config: dict, n: int) -> list[int]:
    """The study's n test seeds: the first n seeds that neither chose a value (`lr_sweep.seeds`)
    nor set a margin (`margin_seeds`), so no test run is a validation run."""
    taken = set(config["lr_sweep"]["seeds"]) | set(margin_seeds(config))
    seeds, s = [], 0
    while len(seeds) < n:
        if s not in taken:
            seeds.append(s)
        s += 1
    return seeds
