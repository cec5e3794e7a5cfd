"""results/scaling.csv: each method against the reference at every size, the trend over sizes,
the planner's memory ratio at the hub models' sizes (predictions) and the target's CPU time
(logra/analysis/scaling.py)."""
import json
from contextlib import redirect_stderr, redirect_stdout

import pandas as pd
from transformers import AutoConfig

from logra.analysis.scaling import cost_row, predicted_ratios, scaling_table, validation_rows
from logra.files import write_csv
from logra.measure.planner import geometry, node_setting, predict

with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    i, p = snakemake.input, snakemake.params
    sc = p.scaling
    runs = pd.DataFrame([{"label": label, "size": size, "seed": seed, "eval": e, "summary": s}
                         for (label, size, seed, _), e, s in zip(p.grid, i.evals, i.summaries,
                                                                 strict=True)])
    bases = {tuple(key): b for key, b in zip(p.bases, i.bases, strict=True)}
    margin = json.loads(open(i.plan).read())["margins"][sc["task"]]["margin"]
    table = scaling_table(runs, bases, p.reference, margin, tuple(sc["base_band"]))
    # the planner at the hub models' sizes: the fixed rank, and the rank fraction there
    planned = {}
    for model, path in p.models.items():
        setting = node_setting(p.planner)
        hf_config = AutoConfig.from_pretrained(path)
        hidden = hf_config.get_text_config().hidden_size
        for label in [*sc["methods"], *(f"{m}_frac" for m in sc["rank_fraction"])]:
            spec = dict(p.methods[label.removesuffix("_frac")])
            if label.endswith("_frac"):
                rank = spec["options"]["rank"]
                spec["options"] = spec["options"] | {"rank": round(rank * hidden / p.width)}
            planned[model, label] = predict(hf_config, spec, setting, p.grpo) | {
                "n_params": geometry(hf_config, {}, spec["rule"])[0].n_all}
    checks = validation_rows(*(pd.read_csv(c) for c in i.checks),
                             {m: r["value"] for m, r in sc["tuned"].items()},
                             (next(iter(sc["sizes"])), sc["check"]["size"]),
                             sc["check"]["factors"])
    table = pd.concat([table, checks, predicted_ratios(planned, p.reference),
                       cost_row(i.benchmarks, sc["cpu_hours"])], ignore_index=True)
    write_csv(table, snakemake.output[0])
    print(table.to_string())
