"""results/memory/sweep.csv: every sweep point, with ratios vs the reference method per size."""
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

from logra.analysis.tables import memory_sweep_table
from logra.files import write_csv

with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    points = {(Path(p).parent.name, Path(p).stem): json.loads(Path(p).read_text())
              for p in snakemake.input}
    table = memory_sweep_table(points, snakemake.params.reference)
    write_csv(table, snakemake.output[0])
    print(table.to_string())
