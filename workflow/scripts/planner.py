"""results/memory/planner.csv: predicted per-GPU bytes by category and phase at scale
(predictions)."""
from contextlib import redirect_stderr, redirect_stdout

import pandas as pd
from transformers import AutoConfig

from logra.analysis.report import write_csv
from logra.measure.planner import plan, sync_columns
from logra.rules import rule_class

with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    p = snakemake.params.planner
    rows = []
    for model, path in snakemake.params.models.items():
        hf_config = AutoConfig.from_pretrained(path)
        for method, spec in snakemake.params.methods.items():
            bytes_ = plan(hf_config, spec["rule"], spec.get("options", {}),
                          micro_batch=p["micro_batch"], seq_len=p["seq_len"], policy=p["policy"],
                          gpus=p["gpus"], sharding=p["sharding"],
                          probe_size=snakemake.params.grpo["probe_size"],
                          completion_len=p.get("completion_len"),
                          kl_control=bool(spec.get("kl_control")) or rule_class(
                              spec["rule"]).has_control(spec.get("options", {})),
                          chunk_tokens=snakemake.params.grpo.get("chunk_tokens"),
                          rollout_share=p["rollout_share"], gpu_bytes=p["gpu_gb"] * 1e9,
                          checkpointing=p["checkpointing"])
            rows.append({"model": model, "method": method, "gpus": p["gpus"],
                         "gpu_bytes": p["gpu_gb"] * 1e9, "policy": p["policy"],
                         "sharding": p["sharding"], **bytes_,
                         "fits": bytes_["total"] <= p["gpu_gb"] * 1e9,
                         # the rule's own transport, full, low_rank, and the trained
                         # words: delta at any changed fraction (logra.common.delta_bytes)
                         **sync_columns(hf_config, spec["rule"], spec.get("options", {}),
                                        p["policy"]),
                         "kind": "prediction"})
    table = pd.DataFrame(rows)
    write_csv(table, snakemake.output[0])
    print(table.to_string())
