"""Resume checkpoints of a GRPO run: everything needed to continue it as if never stopped.

One file, `<checkpoint dir>/<config hash>/state.pt` (`path`), written atomically (logra/files.py)
every `grpo.checkpoint_every` steps, with its SHA-256 digest beside it (`state.pt.sha256`), read
by `torch.load(weights_only=True)`: no load runs code. A file whose digest is not there, or that
does not read, raises `CorruptCheckpoint`; `load` refuses, with `CheckpointError`, a checkpoint
that belongs to another run. With a fixed seed on CPU a resumed run's weights and metrics equal
an uninterrupted run's (tests/e2e/test_resume.py).

What a checkpoint holds and how it is verified: docs/loop.md, "Resume checkpoints".
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import pickle
import random
import re
from pathlib import Path

import torch

from logra.files import atomic_path

# keys of the run config that may change between the killed run and its resumption (where it
# runs, and how it is supervised: not what it computes)
MAY_DIFFER = ("threads", "device", "memory_budget_bytes", "grpo.on_bad_checkpoint",
              "rollout.timeout_s", "rollout.timeout_factor", "grpo.max_kl_per_step",
              "grpo.max_weight_norm_ratio", "grpo.max_zero_grad_steps", "grpo.cosine_step")


class CheckpointError(ValueError):
    """A checkpoint that cannot resume this run; the message names why."""


class CorruptCheckpoint(CheckpointError):
    """A checkpoint that cannot be trusted: no matching digest, unreadable, or holding objects
    a weights-only load refuses."""


def path(checkpoint_dir: str | Path, cfg: dict) -> Path:
    """Where the checkpoint of the run `cfg` lives under `checkpoint_dir`."""
    kept = _without(cfg, MAY_DIFFER)
    digest = hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()
    return Path(checkpoint_dir) / digest[:12] / "state.pt"


def digest_path(path: str | Path) -> Path:
    return Path(f"{path}.sha256")


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


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _digests(path: Path) -> list[str]:
    """The digests `path` is accepted with (the newest first, lowercase); [] without a digest
    file. Every line must be one SHA-256 in hex (either case), then the file's name, as `save`
    (and sha256sum) writes it: anything else raises `CorruptCheckpoint`."""
    try:
        text = digest_path(path).read_bytes()
    except OSError:
        return []
    try:
        lines = text.decode("ascii").splitlines()
    except UnicodeDecodeError:
        lines = [None]
    parsed = [re.fullmatch(r"([0-9a-fA-F]{64}) [ *]?\S.*", line or "") for line in lines]
    if not lines or not all(parsed):
        raise CorruptCheckpoint(f"{path}: corrupt digest file {digest_path(path).name} (a line "
                                "that is not a SHA-256 in hex and a file name)")
    return [hit.group(1).lower() for hit in parsed]


def save(path: str | Path, state: dict) -> None:
    """Atomic torch.save of `state` (must hold `cfg` and `model`, a state dict), then its
    digest beside it (docs/loop.md)."""
    path = Path(path)
    # the file it replaces stays accepted until the rename: when it verifies, its digest (a
    # corrupt digest file is replaced, and keeps nothing accepted)
    current = []
    with contextlib.suppress(CorruptCheckpoint):
        if path.exists() and (digest := _sha256(path)) in _digests(path):
            current = [digest]
    with atomic_path(path) as tmp:
        torch.save(state, tmp)
        digests = [_sha256(tmp), *current]
        with atomic_path(digest_path(path)) as tmp_digest:  # renamed before the state is
            tmp_digest.write_text("".join(f"{d}  {path.name}\n" for d in digests))


def verify(path: str | Path) -> None:
    """Raise `CorruptCheckpoint` unless `path`'s content matches its digest."""
    path = Path(path)
    accepted = _digests(path)
    if not accepted:
        raise CorruptCheckpoint(f"{path}: no digest beside it ({digest_path(path).name}): "
                                "not a checkpoint this code wrote, or one cut short")
    if _sha256(path) not in accepted:
        raise CorruptCheckpoint(f"{path}: its SHA-256 does not match {digest_path(path).name} "
                                "(corrupted or truncated)")


def read(path: str | Path, allowed: tuple[type, ...] = ()) -> dict:
    """The verified checkpoint at `path`, loaded weights-only with the classes `allowed`."""
    verify(path)
    try:
        with torch.serialization.safe_globals(list(allowed)):
            return torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, KeyError,
            AttributeError) as e:  # refused or unreadable; nothing in it ran
        first = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise CorruptCheckpoint(f"{path}: refused by the weights-only load ({first[:300]})") \
            from None


def set_aside(path: str | Path) -> Path:
    """Rename a checkpoint and its digest to `<name>.bad` (`.bad1`, ... if taken), kept for
    inspection; returns the new path of the checkpoint."""
    path = Path(path)
    n = 0
    while (bad := path.with_name(f"{path.name}.bad{n or ''}")).exists():
        n += 1
    path.rename(bad)
    with contextlib.suppress(FileNotFoundError):
        digest_path(path).rename(digest_path(bad))
    return bad


def remove(path: str | Path, levels: int = 4) -> None:
    """Delete a finished run's checkpoint and its digest, then its directory and up to
    `levels` - 1 parents while they are empty (`<task>/<method>/seed<k>/<hash>`)."""
    path = Path(path)
    path.unlink(missing_ok=True)
    digest_path(path).unlink(missing_ok=True)
    folder = path.parent
    for _ in range(levels):
        try:
            folder.rmdir()
        except OSError:  # not empty (or gone): the ones above are not empty either
            return
        folder = folder.parent


def load(path: str | Path, cfg: dict, model: torch.nn.Module,
         allowed: tuple[type, ...] = ()) -> dict:
    """The checkpoint at `path` (`read`), after checking it belongs to this run and this
    model. On the CPU: the model and rule copy what they need onto their device."""
    state = read(path, allowed)
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


def _without(cfg: dict, keys: tuple[str, ...], prefix: str = "") -> dict:
    """`cfg` without the dotted `keys`."""
    return {k: _without(v, keys, f"{prefix}{k}.") if isinstance(v, dict) else v
            for k, v in cfg.items() if f"{prefix}{k}" not in keys}


def _config_diff(old: dict, new: dict, prefix: str = "") -> list[tuple[str, object, object]]:
    out = []
    for key in sorted(set(old) | set(new), key=str):
        if f"{prefix}{key}" in MAY_DIFFER:
            continue
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _config_diff(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append((f"{prefix}{key}", a, b))
    return out
