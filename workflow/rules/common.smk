# The Snakemake glue shared by every file of workflow/rules (each job's inputs that depend on its
# method, i.e. its SFT base, and the resources a stage's jobs ask a cluster for). All else they
# read is the plan (PLAN, logra/harness/plan.py) or `config`, its config.


def base_input(wildcards):
    """{"base": the SFT base a job of `wildcards` starts from}, or {} for a hub model."""
    return PLAN.base_input(wildcards)


def stage_resources(stage):
    """The resources of a job of `stage` (logra.harness.config.job_resources): a rule that asks
    none runs beside Snakemake under a cluster executor (the Snakefile's local rules)."""
    return PLAN.resources(stage)
