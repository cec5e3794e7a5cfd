"""One memory/speed sweep point: results/memory/{size}/{method}.json."""
from contextlib import redirect_stderr, redirect_stdout

import torch

from logra.files import mib, progress, write_json
from logra.harness.memory_point import measure

with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    torch.set_num_threads(snakemake.threads)
    p = snakemake.params.point
    cfg = p["method"]
    try:
        point = measure(p["size"], cfg["method"], p["shape"],
                        cfg["grpo"], steps=p["steps"], device=cfg["device"],
                        budget_bytes=cfg["memory_budget_bytes"],
                        compute_dtype=cfg["grpo"]["compute_dtype"])
    except (TypeError, ValueError) as e:  # a rule that does not fit the point's model
        raise ValueError(f"memory sweep point {snakemake.wildcards.size}: methods."
                         f"{snakemake.wildcards.method}.options: {e}") from None
    except Exception as e:  # any other failure, named with its point (a CUDA OOM is a result)
        raise RuntimeError(f"memory sweep point {snakemake.wildcards.size} (memory_sweep sizes), "
                           f"method {snakemake.wildcards.method}: {type(e).__name__}: {e}") from e
    point.update(size=snakemake.wildcards.size, method=snakemake.wildcards.method,
                 threads=snakemake.threads)
    write_json(snakemake.output[0], point)
    progress(f"memory {point['size']}/{point['method']}", point["status"],
             params=point["n_params"], peak=mib(point["peak_mem_bytes"]),
             planner_error=point.get("planned_error"))
