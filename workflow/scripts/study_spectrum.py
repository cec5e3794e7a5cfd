"""results/study/<horizon>/spectrum/{task}/{method}/seed{seed}.csv: a study test run's update, matrix by
matrix, against its SFT base (logra.measure.spectrum.update_spectrum), at the rank and target
modules of the study's LoGRA arm."""
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pandas as pd
import torch

from logra.files import write_csv
from logra.measure.spectrum import update_spectrum
from logra.optim.logra_rule import TARGET_MODULES

options = snakemake.params.options
with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    torch.set_num_threads(snakemake.threads)
    rows = update_spectrum(snakemake.params.base, Path(snakemake.input.run).parent / "model",
                           list(options.get("target_modules", TARGET_MODULES)), options["rank"])
    table = pd.DataFrame(rows)
    write_csv(table, snakemake.output[0])
    print(table.to_string())
