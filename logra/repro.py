"""Reproducible CPU runs: one instruction path and one thread, and fingerprints that show it.

PyTorch, MKL and oneDNN each pick their CPU kernels by the instruction set they find, and the
kernels round differently: a last-bit difference can turn into a different run. `PIN` fixes
all three to AVX2 (MKL in its strict conditional numerical reproducibility mode) and every
thread pool to one thread. The settings must be in the environment before torch is imported:
the Snakefile puts them there for CPU configs (`reproducible: true`, the default), and
`tests/conftest.py` for the tests. Covered: the same code, the same pinned library versions and
data on any x86 CPU with AVX2 (other vendors' results are compared but not promised); not GPUs,
other library versions, or `threads` > 1.

Fingerprints are SHA-256 digests of what a stage computed, never of how long it took or how
much memory it used. Why, what is covered and what each fingerprint digests: docs/running.md,
"Reproducible CPU runs".
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
from pathlib import Path

PIN = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2,STRICT", "ONEDNN_MAX_CPU_ISA": "AVX2",
       "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

# measurements of the machine, not results of the computation
MACHINE_COLUMNS = ("step_time_s", "peak_mem_bytes", "sync_seconds", "control_seconds")


def pin_cpu() -> None:
    """Put `PIN` into this process's environment. The libraries read it when they load, so
    every process started from here on computes on the pinned path, and this one does if torch
    is not imported yet.

    Kernels that torch.compile builds (torchao's 8-bit AdamW) are cached on disk under a key
    that does not include ATEN_CPU_CAPABILITY: a kernel compiled on the pinned path and loaded
    by an unpinned process crashed it with a double free (torch 2.13.0), and the reverse would
    run unpinned kernels here. So the pinned path keeps its own cache, unless one is set."""
    os.environ.update(PIN)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(
        tempfile.gettempdir(), f"torchinductor_{os.getuid()}_{PIN['ATEN_CPU_CAPABILITY']}"))


def machine() -> dict:
    """What the bits of a CPU run depend on: the CPU, the kernels torch chose, the pinned
    settings as set in this process, the library versions."""
    import torch
    import transformers
    cpu = {}
    if Path("/proc/cpuinfo").exists():
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("vendor_id", "model name", "flags") and key.strip() not in cpu:
                cpu[key.strip()] = value.strip()
    flags = set(cpu.get("flags", "").split())
    return {"cpu_vendor": cpu.get("vendor_id", platform.machine()),
            "cpu_model": cpu.get("model name", platform.processor()),
            "cpu_flags": sorted(f for f in flags if f.startswith(("avx", "amx", "fma"))),
            "torch_capability": torch.backends.cpu.get_cpu_capability(),
            "pinned": {k: os.environ.get(k) for k in PIN},
            "reproducible": all(os.environ.get(k) == v for k, v in PIN.items()),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "threads": torch.get_num_threads()}


def covered(info: dict) -> str | None:
    """None if bit-for-bit reproduction is promised on the machine `info` describes, else why
    not."""
    if not info["reproducible"]:
        return "the CPU pin is not set (reproducible: false, or run outside the workflow)"
    if "avx2" not in info["cpu_flags"]:
        return f"{info['cpu_model']} has no AVX2"
    if info["cpu_vendor"] != "GenuineIntel":
        return (f"{info['cpu_vendor']} ({info['cpu_model']}): MKL documents its reproducible "
                "modes for Intel processors only")
    return None


def _digest(parts) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part if isinstance(part, bytes) else str(part).encode())
        h.update(b"\0")
    return h.hexdigest()


def file_digest(path: str | Path) -> str:
    return _digest([Path(path).read_bytes()])


def _tensor_parts(name: str, t) -> list:
    import torch
    flat = t.detach().cpu().contiguous().view(-1)
    return [name, t.dtype, tuple(t.shape), flat.view(torch.uint8).numpy().tobytes()]


def tensors_digest(state: dict) -> str:
    """Names, dtypes, shapes and bytes of every tensor, in name order."""
    return _digest(p for name in sorted(state) for p in _tensor_parts(name, state[name]))


def model_digest(model_dir: str | Path) -> str:
    """The tensors of a saved HF checkpoint (every *.safetensors file in it), read one at a
    time (a 32B checkpoint is never whole in memory twice); equal to `tensors_digest` of them."""
    from safetensors import safe_open
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir}: no *.safetensors file to fingerprint")
    where = {}
    for f in files:
        with safe_open(f, "pt") as sf:
            where.update(dict.fromkeys(sf.keys(), f))

    def parts():
        for name in sorted(where):
            with safe_open(where[name], "pt") as sf:
                yield from _tensor_parts(name, sf.get_tensor(name))
    return _digest(parts())


def metrics_digest(rows: list[dict]) -> str:
    """A metrics table without its machine columns; floats by their exact repr (nan too)."""
    return _digest(json.dumps({k: (repr(v) if isinstance(v, float) else v)
                               for k, v in row.items() if k not in MACHINE_COLUMNS},
                              sort_keys=True) for row in rows)


def eval_digest(result: dict) -> str:
    """An evaluation: its accuracy and every problem's prompt, responses and scores under every
    protocol (logra.harness.evaluate)."""
    return _digest([repr(result["accuracy"]), result["n"],
                    *(json.dumps(p, sort_keys=True) for p in result["problems"])])
