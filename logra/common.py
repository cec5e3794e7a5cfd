"""Names and small formulas the trainer, the planner and the analysis share (no torch here: the
analysis imports this, and it loads no torch)."""
from __future__ import annotations

import math

# how the engine receives weights (logra/rl/weight_sync.py), and the per-step sync metrics
TRANSPORTS = ("full", "delta", "low_rank")
SYNC_METRICS = ("sync_bytes", *(f"sync_bytes_{t}" for t in TRANSPORTS), "sync_seconds",
                "sync_changed_fraction")  # `EngineSync.step`'s, per step

# the phases of a training step the meter and the planner report peaks for
PHASES = ("rollout", "forward_backward", "propose", "kl_control", "apply")
POLICIES = {"fp32": 4, "bf16": 2}  # storage dtype -> bytes per weight

INDEX_BYTES = 4  # a delta's flat index: int32 below 2^31 words per tensor (logra/rl/weight_sync.py)
# changed fraction of bf16 words per step reported for production RL at 7B-355B (verl at 72B:
# 2.1-2.6%); reported elsewhere, not measured here: drawn beside the runs' own fractions
REPORTED_CHANGED_FRACTION = (0.01, 0.03)


def warmup_cosine(step: int, warmup: int, decay: int, final: float) -> float:
    """A step-size multiplier at step `step` (from 1): step/W over a linear warmup of W =
    `warmup` steps, then a cosine from 1 to `final` reached at step D = `decay` and kept after,
    final + (1 − final)·(1 + cos πp)/2 with p = min((step − W)/(D − W), 1) (`final` after the
    warmup when D ≤ W: an SFT shorter than its warmup); 1 after the warmup when D is 0. The LoGRA authors' dense schedule is W 9, D 300, final 0.1
    (`research/logra/schedule.py`)."""
    if warmup and step <= warmup:
        return step / warmup
    if not decay:
        return 1.
    p = min((step - warmup) / (decay - warmup), 1.0) if decay > warmup else 1.0
    return final + (1 - final) * (1 + math.cos(math.pi * p)) / 2


def delta_bytes(trained_words: int, changed_fraction: float, b: int) -> int:
    """Predicted bytes of one `delta` sync: changed fraction x trained words x (index bytes +
    engine dtype bytes `b`); generic, whatever the rule."""
    return round(changed_fraction * trained_words * (INDEX_BYTES + b))
