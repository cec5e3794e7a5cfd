"""results/memory/paper_setting.csv: dense AdamW and LoGRA predicted in the settings of the
published memory reductions, beside the published numbers (predictions), with logits formed
as this project forms them and as LoGRA's authors do (`plan(logits=...)`)."""
from contextlib import redirect_stderr, redirect_stdout

import pandas as pd
from transformers import AutoConfig

from logra.analysis.report import write_csv
from logra.measure.planner import LOGITS, geometry, predict

with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    p = snakemake.params.paper_setting
    common = {k: v for k, v in p.items() if k not in ("methods", "settings")}
    rows = []
    for name, s in p["settings"].items():
        hf_config = AutoConfig.from_pretrained(snakemake.params.models[name])
        setting = common | {k: v for k, v in s.items() if k not in ("model", "published")}
        for logits, method in ((x, m) for x in LOGITS for m in p["methods"]):
            spec = p["methods"][method]
            geo = geometry(hf_config, spec.get("options", {}), spec["rule"])[0]
            rows.append({"setting": name, "method": method, "rule": spec["rule"],
                         "model": s["model"], "n_params": geo.n_all,
                         "low_rank_params": geo.n_low, **setting, "logits": logits,
                         **predict(hf_config, spec, setting | {"logits": logits},
                                   snakemake.params.grpo),
                         # the published GiB of this method, the setting's reduction
                         "published_gib": s["published"].get("gib", {}).get(method),
                         "published_reduction": s["published"].get("reduction"),
                         "published_source": s["published"]["source"]})
    table = pd.DataFrame(rows)
    write_csv(table, snakemake.output[0])
    print(table.to_string())
