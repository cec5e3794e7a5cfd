"""results/memory/planner.csv: predicted per-GPU bytes by category and phase at scale
(predictions); the offload rows (`planner.offload`: FSDP's CPU offload, float32 shards on the
host, bf16 compute) with the node's host bytes and the host-device traffic per update."""
import math
from contextlib import redirect_stderr, redirect_stdout

import pandas as pd
from transformers import AutoConfig

from logra.files import write_csv
from logra.measure.planner import node_setting, predict

with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    p = snakemake.params.planner
    setting = node_setting(p)
    # an offload row stores float32 shards (FSDP2 has no separate master) and computes in the
    # policy's dtype; its traffic is per micro-batch, times each GPU's micro-batches per update
    offloaded = setting | {"policy": "fp32", "compute": p["policy"], "offload": True,
                           "engine": p["policy"]}
    micro_batches = math.ceil(p["batch"] / (p["micro_batch"] * p["gpus"]))
    rows = []
    for model, path in snakemake.params.models.items():
        hf_config = AutoConfig.from_pretrained(path)
        runs = [(m, spec, setting) for m, spec in snakemake.params.methods.items()]
        runs += [(f"{m}+offload", snakemake.params.offloaded[m], offloaded) for m in p["offload"]]
        for method, spec, s in runs:
            rows.append({"model": model, "method": method, "gpus": p["gpus"],
                         "gpu_bytes": p["gpu_gb"] * 1e9, "policy": s["policy"],
                         "sharding": p["sharding"],
                         # bytes by category and phase, fits, the sync columns: the rule's own
                         # transport, full, low_rank and the trained words (delta at any
                         # changed fraction: logra.common.delta_bytes)
                         **predict(hf_config, spec, s, snakemake.params.grpo)})
            if s.get("offload"):
                row = rows[-1]
                row["pcie_bytes_per_step"] = (row.pop("pcie") * micro_batches
                                              + row.pop("pcie_probe"))
                row["pcie_seconds_per_step"] = row["pcie_bytes_per_step"] / (
                    p["pcie_gb_per_s"] * 1e9)
    table = pd.DataFrame(rows)
    write_csv(table, snakemake.output[0])
    print(table.to_string())
