"""The RL loop: the GRPO / REINFORCE loss, one update (step), the loop, the rollout engine,
weight sync, checkpoints, SFT, models and tokenizers, FSDP. Imports `logra.optim`, `logra.measure`
and the shared modules; the rules it runs come by name from `logra.rules`."""
