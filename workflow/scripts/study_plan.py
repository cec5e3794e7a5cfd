"""results/study/<horizon>/analysis_plan.json: each arm's choice at the horizon
(results/study/tuned/<arm>_<horizon>.yaml, or as `study.tuned` adopted it), the margin from the
reference's chosen point on the margin seeds, the test seeds and the analysis, frozen before any
test run of the horizon (logra.analysis.study.study_plan)."""
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import yaml

from logra.analysis.study import adopted_choice, study_plan
from logra.analysis.verdict import margin_table
from logra.files import progress, write_json
from logra.harness.freeze import amendments

i, p = snakemake.input, snakemake.params
with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    spec, study = p.spec, p.spec["study"]
    records = {**study["tuned"]}
    for path in i.tuned:
        records |= yaml.safe_load(Path(path).read_text())
    arms = {name: adopted_choice(record, spec["sweep"], name)
            for name, record in records.items()}
    ref = arms[study["arms"][study["reference"]]]

    def key(path):  # results/lr_sweep/{task}/.../seed{seed}.json or .../base_seed{seed}.json
        return study["task"], int(Path(path).stem.rsplit("seed", 1)[1])
    margins = margin_table({key(q): q for q in i.margin_refs},
                           {key(q): q for q in i.margin_bases}, [study["task"]],
                           p.margin["fraction"], p.margin["floor"], {study["task"]: ref["value"]})
    print(margins.to_string())
    plan = study_plan(arms, study, spec["pool"], margins, spec["spec"])
    # what it was written from, for freeze.guard (an adopted choice is no change), and its
    # amendments, if any
    plan["spec"] = spec | {"study": {k: v for k, v in study.items() if k != "tuned"}}
    plan["amendments"] = amendments(snakemake.output.plan)
    write_json(snakemake.output.plan, plan)
    rule = plan["seeds_rule"]
    progress(f"study plan {study['horizon']}", **{arm: f"{c['option']} {c['value']:g}"
                                                 for arm, c in plan["arms"].items()},
             margin=f"{plan['margins'][study['task']]['margin']:.4f}",
             seeds=f"{rule['n']} (needed {rule['needed']}{', capped' if rule['capped'] else ''})")
