"""Resume checkpoints of a GRPO run: everything needed to continue it as if never stopped.

One file, `<checkpoint dir>/state.pt`, written atomically (logra/io.py) every
`grpo.checkpoint_every` steps: the trained weights, the update rule's state (moments; for LoGRA
also bases, sketch accumulators and basis-sampling generators), the RNG states of the loop, the
step, the metrics rows so far and the measured memory report. With a fixed seed on CPU a resumed
run's weights and metrics equal an uninterrupted run's (tests/test_resume.py); the rollout
engine, which starts from the base weights, is brought level by one full sync on resume.

`load` refuses a checkpoint that belongs to another run: different parameter names or shapes
(another architecture), or a different run config. The message names the difference; the file is
left untouched, so nothing computed is lost.
"""
from __future__ import annotations

import random
from pathlib import Path

import torch

from logra.io import atomic_path

# keys of the run config that may change between the killed run and its resumption
MAY_DIFFER = ("threads", "device", "memory_budget_bytes")


class CheckpointError(ValueError):
    """A checkpoint that cannot resume this run; the message names why."""


def rng_states(loop_rng: random.Random, shuffle_gen: torch.Generator) -> dict:
    return {"loop": loop_rng.getstate(), "shuffle": shuffle_gen.get_state(),
            "python": random.getstate(), "torch": torch.get_rng_state()}


def set_rng_states(states: dict, loop_rng: random.Random, shuffle_gen: torch.Generator) -> None:
    loop_rng.setstate(states["loop"])
    shuffle_gen.set_state(states["shuffle"])
    random.setstate(states["python"])
    torch.set_rng_state(states["torch"])


def save(path: str | Path, state: dict) -> None:
    """Atomic torch.save of `state` (must hold `cfg` and `model`, a state dict)."""
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def load(path: str | Path, cfg: dict, model: torch.nn.Module) -> dict:
    """The checkpoint at `path`, after checking it belongs to this run and this model."""
    # our own file, holding optimizer objects (e.g. galore-torch's projectors): not weights-only
    state = torch.load(path, map_location=next(model.parameters()).device, weights_only=False)
    ours = {n: tuple(t.shape) for n, t in model.state_dict().items()}
    theirs = {n: tuple(t.shape) for n, t in state["model"].items()}
    if ours != theirs:
        diff = sorted(set(ours) ^ set(theirs)) or [n for n in ours if ours[n] != theirs[n]]
        n = diff[0]
        raise CheckpointError(
            f"{path}: checkpoint of a different architecture: parameter {n!r} has shape "
            f"{theirs.get(n, 'absent')} in the checkpoint and {ours.get(n, 'absent')} in the "
            f"model ({len(diff)} parameters differ). Delete the checkpoint to start over.")
    differ = _config_diff(state["cfg"], cfg)
    if differ:
        key, old, new = differ[0]
        raise CheckpointError(
            f"{path}: checkpoint of a different run config: {key} is {old!r} in the checkpoint "
            f"and {new!r} now ({len(differ)} keys differ). Restore the config to resume, or "
            f"delete the checkpoint to start over.")
    return state


def _config_diff(old: dict, new: dict, prefix: str = "") -> list[tuple[str, object, object]]:
    out = []
    for key in sorted(set(old) | set(new), key=str):
        if not prefix and key in MAY_DIFFER:
            continue
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _config_diff(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append((f"{prefix}{key}", a, b))
    return out
