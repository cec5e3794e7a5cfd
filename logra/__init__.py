"""LoGRA reproduction harness: tasks, tiny models, GRPO, update rules, memory, evaluation."""


def __getattr__(name: str):
    """`logra.LoGRAOptimizer`, imported on first use: importing the package loads no torch
    (tests pin the CPU path before torch loads, logra/repro.py)."""
    if name == "LoGRAOptimizer":
        from logra.optim.optimizer import LoGRAOptimizer
        return LoGRAOptimizer
    raise AttributeError(f"module 'logra' has no attribute {name!r}")
