"""An opt-in result's stamp: the digest of the config under which Snakemake brought it up to
date, and the result's own SHA-256 (so a rewritten result changes its stamp, and the report that
reads it is rebuilt; logra.analysis.report.current_opt_in)."""
from contextlib import redirect_stdout

from logra.files import progress, write_json
from logra.repro import file_digest

with open(snakemake.log[0], "w") as log, redirect_stdout(log):
    write_json(snakemake.output[0], {"result": snakemake.input[0],
                                     "config_digest": snakemake.params.digest,
                                     "sha256": file_digest(snakemake.input[0])})
    progress(f"stamp {snakemake.input[0]}", f"config {snakemake.params.digest}")
