"""What the workflow runs around the loop: config resolution and checks, grid expansion and
job resources, fingerprints and the canary, lm-eval evaluation, one memory sweep point, the TRL
comparison. May import every other layer except `logra.analysis`."""
