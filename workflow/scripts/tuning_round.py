"""One round of the bracket rule on one grid (logra.analysis.tuning.round_result): its window's
points scored on the validation split, the choice, and the next round's window (and, under
successive halving, the points it runs on every seed) or none."""
from contextlib import redirect_stderr, redirect_stdout

from logra.analysis.tuning import lr_sweep_table, round_result
from logra.files import progress, write_json

w, p = snakemake.wildcards, snakemake.params
with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    table = lr_sweep_table(snakemake.input.runs, snakemake.input.evals, p.sweep, p.knobs)
    window, keep = p.spec
    result = round_result(table, w.task, p.grid.method, p.grid.values, window,
                          p.grid.declared, p.grid.cap, keep, p.grid.halving)
    write_json(snakemake.output[0], result | {"round": int(w.round)})
    print(table.to_string())
    progress(f"tuning {w.table}/{w.task}/{w.method} round {w.round}",
             f"chose {result['chosen']}",
             next="done" if result["next"] is None else result["next"])
