"""The experiment plan: a resolved config (`logra.harness.config.resolve`) expanded once into
every run the workflow's targets make, each derived run checked like a written one.

`build_plan` expands a copy of the config: the lr sweep's points (`add_lr_sweep_methods`), the
sync regimes' lr-scaled methods, the stability controller ablation's cells, the scaling
study's sizes, rank fractions and transfer checks and the study's grids (`add_study_methods`)
each become a method of their own under `methods`. Every derived method then passes the checks a written method passes
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
import json
import re

from logra.harness.config import (ConfigError, check_method, generation_room, hub_models,
                                  job_resources, margin_seeds, method_grpo, run_config,
                                  run_tasks, task_options)
from logra.harness.runs import study_horizons
# the derived methods and their runs; importable from here as before
from logra.harness.derived import (  # noqa: F401
    Grid, Scaling, add_controller_ablation_methods, add_lr_sweep_methods, add_scaling_methods,
    add_sync_regime_methods, controller_cells, controller_runs, declared, grid_points,
    grid_values, lr_scaled, margin_runs, scaling_grid, scaling_runs, stability_runs,
    sweep_knobs, swept, sync_regime_methods, sync_regime_runs, sync_regimes, transfer_factor,
    tuning_grid)
from logra.harness.horizons import add_study_methods, study_seeds  # noqa: F401

BENCH = "results/benchmarks"  # each job's benchmark: BENCH/<stage>/<rule>/<wildcards>.tsv
# results/study/<horizon>/<name>.csv, and results/study/horizons.csv across them
STUDY_TABLES = ("verdicts", "summary", "secondary", "spectrum")
# results/study/<horizon>/<name>.csv where the horizon declares `stability`
STUDY_STABILITY = ("stability", "stability_contrasts")


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
      `swept`), of results/scaling/lr_sweep.csv (`scaling`) and of results/study/tuned/
      (`study`, each arm's at each horizon, by `<arm>_<horizon>`); `regimes`: {sync regime: its methods};
      `scaling`: the scaling study's methods (`Scaling`);
    - `margin_runs`: {task: the lr sweep's run of the reference that sets its margin}, run at
      `margin_seeds`;
    - `runs`: every target's runs as "task/method/seedN": `grid` (run_methods), `ablations`
      (the grid and the ablation methods), `reinforce`, `long` (the default target's stability
      runs), `stability_seeds`, `controller`, `lr_sweep`, `sync_regime`, `scaling_sweep`,
      `scaling_grid`, `scaling_check`, `study_sweep` (the first round, `Grid.first_round`, of
      the study grids `study.tuned` has not adopted; its test runs are known once its plan is
      frozen: workflow/rules/study.smk), and `trained`: every GRPO run of the default target."""
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

    def study_seeds(self, n: int) -> list[int]:
        return study_seeds(self.config, n)

    @property
    def study_horizons(self) -> dict[str, dict[str, str]]:
        """{horizon: {arm: its method there}} (logra.harness.runs.study_horizons)."""
        return study_horizons(self.config)

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
    def plan_spec(self) -> dict:
        """What results/analysis_plan.json is written from (`analysis_plan`'s spec): the
        reference, methods, tasks, seeds, n_test, eval and verdict sections, each method's
        config and steps, and the lr sweep's choices the config adopted for these runs."""
        methods = self.methods + self.ablations
        return {"reference": self.reference, "methods": self.methods,
                "ablation_methods": self.ablations, "tasks": self.tasks, "seeds": self.seeds,
                "n_test": self.config["data"].get("n_test"), "eval": self.config["eval"],
                "verdict": self.config["verdict"],
                "method_config": {m: self.config["methods"][m] for m in methods},
                "steps": {m: self.grpo(m)["steps"] for m in methods},
                "tuned": {t: {m: c for m, c in chosen.items() if m in methods}
                          for t, chosen in self.config["tuned"].items() if t in self.tasks}}

    @property
    def sweep_knobs(self) -> dict[str, str]:
        return sweep_knobs(self.config)

    @functools.cached_property
    def digest(self) -> str:
        """The config's digest (SHA-256 of its canonical JSON, 16 hex digits): what an opt-in
        result is stamped with (`results/stamps/`), so the report tells one made under this
        config from one made under another."""
        config = {k: v for k, v in self.config.items() if k != "amend_plan"}  # not the config
        text = json.dumps(config, sort_keys=True, default=str)
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
            {"study": [f"results/study/{h}/{f}" for h, design in
                       self.config["study"]["horizons"].items()
                       for f in ["analysis_plan.json"] + [f"{t}.csv" for t in STUDY_TABLES]
                       + ([f"{t}.csv" for t in STUDY_STABILITY] if design.get("stability")
                          else [])] + ["results/study/horizons.csv"]}
            if self.config.get("study") else {}) | (
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
    study = add_study_methods(config)
    where = ({n: f"study.horizons.{h}" for h, arms in study_horizons(config).items()
              for m in arms.values() for n in [m, *study[m].points()]}
             | {n: f"lr_sweep.anchors.{m}" for n, (m, _) in sweep.items()}
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
    runs = _runs(config, tasks, methods, ablations, seeds, tuning, scaling, study)
    runs["trained"] = list(dict.fromkeys(runs["grid"] + runs["long"] + [
        f"{task}/{run}/seed{seed}" for task, run in margin.items()
        for seed in margin_seeds(config)]))
    return Plan(config, derived, tasks, methods, ablations, seeds, reference, verdicts,
                {"memory_sweep", "planner", "stability"} <= set(config), sweep,
                {"lr_sweep": tuning, "scaling": scaling.grids, "study": study},
                regimes, scaling, margin,
                margin_seeds(config), runs)


def _cross(tasks, methods, seeds) -> list[str]:
    return [f"{t}/{m}/seed{s}" for t in tasks for m in methods for s in seeds]


def _runs(config, tasks, methods, ablations, seeds, grids, scaling,
          study) -> dict[str, list[str]]:
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
            "scaling_grid": sc["grid"], "scaling_check": sc["check"],
            "study_sweep": [f"{config['study']['task']}/{name}/seed{s}"
                            for arm, g in study.items()
                            if arm not in config["study"].get("tuned", {})
                            for name, s in g.runs(*g.first_round(), lr.get("seeds", [0]))]}


def _default_benchmarks(plan: Plan) -> list[str]:
    """`Plan.benchmarks("all")`."""
    config, runs, margin, mseeds = plan.config, plan.runs, plan.margin_runs, plan.margin_seeds
    bases = sorted({re.fullmatch(r"(\w+)/\w+/seed(\d+)", run).groups()
                    for run in runs["trained"]})
    memory = config.get("memory_sweep") or {"sizes": {}, "methods": []}
    tables = (["summary", "fingerprints", "margin", "analysis_plan"]
              + (["verdicts"] if plan.verdicts else []) + (["stability"] if runs["long"] else []))
    figures = (["reward_curves"] + (["verdicts"] if plan.verdicts else [])
               + (["memory_reduction", "sync_bytes"] if plan.paper else [])
               + (["stability_27b"] if runs["long"] else []))
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
