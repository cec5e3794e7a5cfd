"""Atomic outputs: every result is written under a temporary name beside its final path and
renamed into place only once complete, so a job killed mid-write leaves nothing that Snakemake
(or a reader) would take as a finished result.

`atomic_path(path)` yields the temporary path (`.<name>.tmp` in the same directory) for a file
or a directory; on success it is renamed over `path` (a directory replaces the old one), on any
error it is removed. A leftover from a killed writer has the same name and is cleared by the next
write. One writer per path is assumed (Snakemake runs one job per output).

`progress` prints the one line a finished job reports: into the job's log and onto the console
Snakemake shows (the process's own stderr, which the scripts' log redirection leaves alone).
`ticker` reports a long job's progress the same way while it runs, at most every 30 s.
`import_file` imports a Python file a config names by its path (task files, rule modules).
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Iterator


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary sibling of `path` to write; rename it to `path` when the block ends."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    _remove(tmp)
    try:
        yield tmp
        if path.is_symlink() or (path.exists() and (path.is_dir() or tmp.is_dir())):
            _remove(path)  # os.replace cannot put a directory over a file or a non-empty one
        os.replace(tmp, path)
    finally:
        _remove(tmp)  # nothing left after a successful rename


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Atomic JSON write; values JSON cannot hold are written as strings."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=1, default=str))


def save_pretrained(model, tokenizer, out_dir: str | os.PathLike) -> None:
    """Atomic HF checkpoint: model and tokenizer saved into one directory, renamed into place."""
    with atomic_path(out_dir) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)


def mib(n_bytes: float | None) -> str | None:
    """Bytes as MiB for a progress line (None stays None: not measured)."""
    return None if n_bytes is None else f"{n_bytes / 2**20:.1f} MiB"


def progress(job: str, *notes: str, **measured) -> str:
    """The one line a finished job reports, `<job>: <notes>, <name> <value>, ...`, e.g.
    `train arithmetic/logra/seed1: ok, steps 80, reward 0.438, peak 13.3 MiB` (floats to three
    significant digits, None as "n/a"). Printed to stdout (the job's log, where the scripts
    redirect it) and to the console Snakemake shows (this process's own stderr)."""
    values = {k: "n/a" if v is None else f"{v:.3g}" if isinstance(v, float) else v
              for k, v in measured.items()}
    line = f"{job}: " + ", ".join([*notes, *(f"{k} {v}" for k, v in values.items())])
    print(line, flush=True)
    if sys.stdout is not sys.__stdout__:  # one write: jobs side by side share the console
        sys.__stderr__.write(line + "\n")
        sys.__stderr__.flush()
    return line


def ticker(job: str, total: int, every_s: float = 30.0):
    """`tick(step, **measured)`, which reports `<job>: step <step>/<total>, elapsed <s> s, ETA
    <s> s, <measured>` through `progress` when `every_s` seconds have passed since the last report
    (not at step `total`: the job's own last line follows): the console line of a long job
    while it runs (the log gets it too).
    Elapsed time and the ETA count this process's steps (a resumed run's too)."""
    start = last = time.monotonic()
    first = None

    def tick(step: int, **measured) -> None:
        nonlocal last, first
        now = time.monotonic()
        first = step if first is None else first
        if now - last < every_s or step >= total:
            return
        last = now
        eta = (now - start) / (step - first + 1) * (total - step)
        progress(job, f"step {step}/{total}", f"elapsed {now - start:.0f} s",
                 f"ETA {eta:.0f} s", **measured)
    return tick


def import_file(path: str | os.PathLike, key: str):
    """The module of the Python file at `path` (relative to the working directory), imported
    once per process under a name derived from its resolved path. A missing file raises
    FileNotFoundError, an import that raises anything (SystemExit included: it would end the
    workflow with rc 0) ValueError; each names `key`, the config key that named the file."""
    path = Path(path).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"{key}: {path} is not a file")
    name = f"logra_file_{hashlib.sha1(str(path).encode()).hexdigest()[:12]}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except (Exception, SystemExit) as e:
            del sys.modules[name]
            raise ValueError(f"{key}: importing {path} raised {type(e).__name__}"
                             f"{f': {e}' if str(e) else ''}") from e
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[name]


def write_csv(df, path: str | Path) -> None:
    """Atomic CSV write of a pandas DataFrame (temp file + rename), without its index."""
    with atomic_path(path) as tmp:
        df.to_csv(tmp, index=False)


def iter_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, dict]]:
    """Yield (1-based line number, object) for each non-blank line."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise ValueError(f"{path}:{lineno}: not UTF-8 (byte 0x{raw[error.start]:02x} at "
                                 f"column {error.start + 1}); JSONL files are UTF-8") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{lineno}: invalid JSON ({error.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            yield lineno, row


def read_jsonl(path: str | os.PathLike, required: Iterable[str] = ()) -> list[dict]:
    """Read a JSONL file of objects (blank lines skipped).

    Raises ValueError naming the file and 1-based line number for a malformed
    line, a non-object or a row without one of the `required` fields, and
    naming the file when it holds no rows.
    """
    rows = []
    for lineno, row in iter_jsonl(path):
        missing = [f for f in required if f not in row]
        if missing:
            raise ValueError(f"{path}:{lineno}: missing field {missing[0]!r}")
        rows.append(row)
    if not rows:
        raise ValueError(f"{path}: empty JSONL file (no rows)")
    return rows


def write_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> None:
    """Atomically write `rows` as JSONL (see logra/files.py)."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
