"""Resume checkpoints of a GRPO run: everything needed to continue it as if never stopped.

One file, `<checkpoint dir>/<config hash>/state.pt` (`path`), written atomically (logra/io.py)
every `grpo.checkpoint_every` steps: the trained weights, the update rule's state (moments; for
LoGRA also bases, sketch accumulators and basis-sampling generators), the rollout engine's
weights, the RNG states of the loop, the step, the metrics rows so far and the measured memory
report. With a fixed seed on CPU a resumed run's weights and metrics equal an uninterrupted
run's (tests/test_resume.py). The directory is keyed by a hash of the run config, so a run
whose config was edited starts fresh and the old checkpoint stays where it was. A checkpoint
holds the state the code of its day produced: after a code change, delete it to start over.

`load` refuses a checkpoint that belongs to another run: different parameter names or shapes
(another architecture, e.g. a rebuilt base model), or a different run config. The message names
the difference; the file is left untouched, so nothing computed is lost.
"""
from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import torch

from logra.io import atomic_path

# keys of the run config that may change between the killed run and its resumption
MAY_DIFFER = ("threads", "device", "memory_budget_bytes")


class CheckpointError(ValueError):
    """A checkpoint that cannot resume this run; the message names why."""


def path(checkpoint_dir: str | Path, cfg: dict) -> Path:
    """Where the checkpoint of the run `cfg` lives under `checkpoint_dir`."""
    kept = {k: v for k, v in cfg.items() if k not in MAY_DIFFER}
    digest = hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()
    return Path(checkpoint_dir) / digest[:12] / "state.pt"


def rng_states(loop_rng: random.Random, shuffle_gen: torch.Generator) -> dict:
    return {"loop": loop_rng.getstate(), "shuffle": shuffle_gen.get_state(),
            "python": random.getstate(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_states(states: dict, loop_rng: random.Random, shuffle_gen: torch.Generator) -> None:
    loop_rng.setstate(states["loop"])
    shuffle_gen.set_state(states["shuffle"])
    random.setstate(states["python"])
    torch.set_rng_state(states["torch"])
    if states.get("cuda") is not None:
        torch.cuda.set_rng_state_all(states["cuda"])


def save(path: str | Path, state: dict) -> None:
    """Atomic torch.save of `state` (must hold `cfg` and `model`, a state dict)."""
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def load(path: str | Path, cfg: dict, model: torch.nn.Module) -> dict:
    """The checkpoint at `path`, after checking it belongs to this run and this model."""
    # our own file, holding optimizer objects (e.g. galore-torch's projectors): not weights-only.
    # On the CPU: the model and rule copy what they need onto their device.
    state = torch.load(path, map_location="cpu", weights_only=False)
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
