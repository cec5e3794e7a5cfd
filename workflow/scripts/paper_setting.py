"""results/memory/paper_setting.csv: dense AdamW and LoGRA predicted in the settings of the
published memory reductions, beside the published numbers (predictions), with logits formed
as this project forms them and as LoGRA's authors do (`plan(logits=...)`). Two statistics:
one update at the setting's longest sequence (`longest_len` = its seq_len, every column of the
prediction), and the authors' mean over updates of each update's peak
(`planner.mean_over_updates`) with every update's longest sequence at each of
paper_setting.lengths (`total` only), the curve that says which typical length would give the
published number."""
import json
from contextlib import redirect_stderr, redirect_stdout

import pandas as pd
from transformers import AutoConfig

from logra.files import write_csv
from logra.measure.planner import LOGITS, geometry, mean_over_updates, predict

with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    p, grpo = snakemake.params.paper_setting, snakemake.params.grpo
    common = {k: v for k, v in p.items() if k not in ("methods", "settings", "lengths")}
    rows = []
    for name, s in p["settings"].items():
        hf_config = AutoConfig.from_pretrained(snakemake.params.models[name])
        setting = common | {k: v for k, v in s.items()
                            if k not in ("model", "published", "method_options")}
        prompt = setting["seq_len"] - (setting.get("completion_len") or setting["seq_len"])
        lengths = [n for n in p.get("lengths", []) if prompt < n < setting["seq_len"]]
        for logits, method in ((x, m) for x in LOGITS for m in p["methods"]):
            spec = p["methods"][method]
            spec = spec | {"options": spec.get("options", {})
                           | s.get("method_options", {}).get(method, {})}
            geo = geometry(hf_config, spec.get("options", {}), spec["rule"])[0]
            here = setting | {"logits": logits}
            row = {"setting": name, "method": method, "rule": spec["rule"], "model": s["model"],
                   "options": json.dumps(spec["options"], sort_keys=True),
                   "n_params": geo.n_all, "low_rank_params": geo.n_low, **setting,
                   "logits": logits,
                   # the published GiB of this method, the setting's reduction
                   "published_gib": s["published"].get("gib", {}).get(method),
                   "published_reduction": s["published"].get("reduction"),
                   "published_source": s["published"]["source"]}
            rows.append(row | {"statistic": "one update", "longest_len": setting["seq_len"],
                               **predict(hf_config, spec, here, grpo)})
            rows += [row | {"statistic": "mean over updates", "longest_len": n,
                            "total": mean_over_updates(hf_config, spec, here, grpo, [n]),
                            "kind": "prediction"} for n in lengths]
    table = pd.DataFrame(rows)
    write_csv(table, snakemake.output[0])
    print(table.to_string())
