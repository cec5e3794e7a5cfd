"""results/memory/planner.csv: predicted per-GPU bytes by category and phase at scale
(predictions)."""
from contextlib import redirect_stderr, redirect_stdout

import pandas as pd
from transformers import AutoConfig

from logra.analysis.report import write_csv
from logra.measure.planner import predict

with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    p = snakemake.params.planner
    setting = {k: p[k] for k in ("micro_batch", "seq_len", "policy", "gpus", "sharding",
                                 "checkpointing", "rollout_share", "gpu_gb")}
    setting["completion_len"] = p.get("completion_len")
    rows = []
    for model, path in snakemake.params.models.items():
        hf_config = AutoConfig.from_pretrained(path)
        for method, spec in snakemake.params.methods.items():
            rows.append({"model": model, "method": method, "gpus": p["gpus"],
                         "gpu_bytes": p["gpu_gb"] * 1e9, "policy": p["policy"],
                         "sharding": p["sharding"],
                         # bytes by category and phase, fits, the sync columns: the rule's own
                         # transport, full, low_rank and the trained words (delta at any
                         # changed fraction: logra.common.delta_bytes)
                         **predict(hf_config, spec, setting, snakemake.params.grpo)})
    table = pd.DataFrame(rows)
    write_csv(table, snakemake.output[0])
    print(table.to_string())
