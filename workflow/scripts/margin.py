"""results/margin.csv: each task's non-inferiority margin, from validation runs only."""
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

from logra.analysis.verdict import margin_table
from logra.files import write_csv

with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    def key(path):  # results/lr_sweep/{task}/.../seed{seed}.json or .../base_seed{seed}.json
        p = Path(path)
        return p.parts[p.parts.index("lr_sweep") + 1], int(p.stem.rsplit("seed", 1)[1])
    m = snakemake.params.margin
    table = margin_table({key(p): p for p in snakemake.input.refs},
                         {key(p): p for p in snakemake.input.bases}, snakemake.params.tasks,
                         m["fraction"], m["floor"], snakemake.params.lrs)
    write_csv(table, snakemake.output[0])
    print(table.to_string())
