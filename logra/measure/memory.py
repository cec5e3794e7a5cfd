"""Peak memory of a region of code (one update), measured: `MemoryMeter`.

- CUDA: `torch.cuda.reset_peak_memory_stats()` on enter, `torch.cuda.max_memory_allocated()` on
  exit: the caching allocator's absolute peak of allocated bytes, everything alive included.
- CPU: the region runs under `torch.profiler.profile(profile_memory=True)` and the peak of live
  tensor bytes, with each tensor's category (weights, grads, optimizer, activations, other),
  is replayed from the profiler's memory timeline (`logra.measure.timeline`; docs/memory.md
  says how, and how it was checked against independent sizes); beside it the process's RSS
  high-water mark.
`MemoryMeter.phase` splits the region into phases, each with its own peak. The analytic side,
what the peak should be from tensor shapes, is `logra.measure.activations` (re-exported here).
"""
from __future__ import annotations

import dataclasses
import resource
import sys
import time
from collections.abc import Iterable

import torch

from logra.measure.activations import (  # noqa: F401  (re-exported)
    activation_breakdown, activation_bytes_estimate, analytic_breakdown, saved_tensor_bytes)
from logra.measure.timeline import (  # noqa: F401  (MemoryProfilerAPIError re-exported)
    MemoryProfilerAPIError, analyze_memory_profile, import_memory_profiler,
    native_stderr_to_python_stderr, new_profiler)
from logra.optim.collectives import local
from logra.optim.rule import tensor_bytes

__all__ = ["MemoryReport", "MemoryMeter", "MemoryProfilerAPIError", "tensor_bytes",
           "optimizer_state_bytes", "analytic_breakdown", "activation_bytes_estimate",
           "activation_breakdown", "saved_tensor_bytes"]


@dataclasses.dataclass
class MemoryReport:
    peak_bytes: int
    """Measured absolute peak of live tensor bytes during the region (CPU: profiler timeline,
    CUDA: `max_memory_allocated`)."""
    by_category: dict[str, int]
    """Bytes per category at the peak moment; keys weights/grads/optimizer/activations/other
    (CPU, sums to `peak_bytes`).  `{}` on CUDA."""
    rss_peak_bytes: int | None
    """Process RSS high-water mark in bytes (CPU; `rss_scope` says region or process), None on CUDA."""
    method: str
    """How it was measured."""
    device: str = "cpu"
    preexisting_bytes: int = 0
    """CPU: bytes of tensors alive before the region that the region touched.
    CUDA: `memory_allocated()` on enter."""
    net_peak_bytes: int = 0
    """`peak_bytes - preexisting_bytes`: the peak of net new allocations."""
    end_bytes: int = 0
    """Live bytes (same accounting as `peak_bytes`) when the region ended."""
    allocator_net_peak_bytes: int | None = None
    """CPU cross-check from the allocator's own running `total_allocated` counter."""
    by_profiler_category: dict[str, int] = dataclasses.field(default_factory=dict)
    """Raw profiler categories at the peak (INPUT split into INPUT / INPUT_NEW)."""
    category_max: dict[str, int] = dataclasses.field(default_factory=dict)
    """Max over the region of each `by_category` key taken separately."""
    phase_peaks: dict[str, int] = dataclasses.field(default_factory=dict)
    """The peak within each phase ended by `MemoryMeter.phase`, in order (CUDA: the
    allocator's; CPU: the timeline's, split at the times the phases ended)."""
    peak_time_frac: float | None = None
    """Where in the region (0 = start, 1 = end) the peak happened (CPU)."""
    rss_scope: str | None = None
    """'region' when the RSS high-water mark was reset on enter, 'process' otherwise."""
    rss_before_bytes: int | None = None
    elapsed_s: float = 0.0
    """Wall time of the measured region (includes profiler overhead on CPU)."""
    analysis_s: float = 0.0
    """Time to build the memory profile after the region (CPU)."""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of all tensors in `optimizer.state` (unique storages)."""
    return tensor_bytes(
        v for st in optimizer.state.values() for v in st.values() if isinstance(v, torch.Tensor)
    )


def _read_rss_hwm_bytes() -> int:
    # ru_maxrss is KiB on Linux, bytes on macOS.
    v = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(v) if sys.platform == "darwin" else int(v) * 1024


def _read_rss_now_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        return None


def _reset_rss_hwm() -> bool:
    """Reset the RSS high-water mark to the current RSS (Linux >= 4.0). True on success."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class MemoryMeter:
    """Context manager measuring the peak memory of the code it wraps (one training step).

    >>> with MemoryMeter("cpu") as mm:
    ...     loss = model(**batch).loss; loss.backward(); opt.step(); opt.zero_grad()
    >>> mm.report.peak_bytes, mm.report.by_category

    CPU runs the region under the torch profiler: for a ~1M-parameter Qwen2 step on 256 tokens
    the region took ~1 s (plain step: ~0.05-0.1 s) plus ~1 s of analysis on a shared 2-core box
    (`report.elapsed_s` / `report.analysis_s`).  Use it on a
    *representative* step (after a warm-up step, so optimizer state exists), not on every step.
    If the region raises, the profiler/allocator state is cleaned up and `report` stays None.
    """

    def __init__(self, device: torch.device | str = "cpu",
                 labels: dict[str, Iterable[torch.Tensor]] | None = None) -> None:
        """`labels` names tensors the profiler cannot categorise itself, e.g. the state of an
        update rule that is not a `torch.optim.Optimizer`: {"optimizer": tensors}. They must
        stay alive through the region (they are matched by storage address). Labelled
        "weights" (the model's parameters) spare the CPU profiler its Python tracer, through
        whose module calls it otherwise finds them: seconds a profiled step where Python hooks
        run (LoGRA's sketches, torch.compile'd optimizers; the default config's tiny model on
        a 2-core CPU), the same breakdown (tests/measure/test_memory.py)."""
        self.device = torch.device(device)
        self._with_stack = "weights" not in (labels or {})
        self._labels = {local(t).untyped_storage().data_ptr(): name
                        for name, ts in (labels or {}).items() for t in ts if t is not None}
        self._label_bytes = {local(t).untyped_storage().data_ptr(): local(t).untyped_storage().nbytes()
                             for ts in (labels or {}).values() for t in ts
                             if t is not None and local(t).device.type == torch.device(device).type}
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        if self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"MemoryMeter supports cpu and cuda, got {self.device}")
        self.report: MemoryReport | None = None
        self._prof = None
        self._t0 = 0.0
        self._rss_reset = False
        self._rss_before: int | None = None
        self._cuda_before = 0
        self._cuda_peak = 0
        self._phase_peaks: dict[str, int] = {}
        self._phase_ends: list[tuple[str, int]] = []

    def phase(self, name: str) -> None:
        """Ends a phase of the region (forward/backward, propose, ...): the peak since the
        previous phase ended goes into `report.phase_peaks[name]`; the region's peak is still
        the largest. CUDA: the allocator's peak, whose counter restarts. CPU: the time is noted
        and the profiler's timeline is split there."""
        if self.device.type != "cuda":
            self._phase_ends.append((name, time.time_ns()))
            return
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device)
        self._phase_peaks[name], self._cuda_peak = int(peak), max(self._cuda_peak, peak)
        torch.cuda.reset_peak_memory_stats(self.device)

    def __enter__(self) -> MemoryMeter:
        self.report = None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._cuda_before = torch.cuda.memory_allocated(self.device)
            self._cuda_peak, self._phase_peaks = 0, {}
            self._t0 = time.perf_counter()
            return self
        import_memory_profiler()  # fail before running the step if the API is gone
        self._rss_before = _read_rss_now_bytes()
        self._rss_reset = _reset_rss_hwm()
        self._phase_ends = []
        self._prof = new_profiler(self._with_stack)
        self._t0 = time.perf_counter()
        with native_stderr_to_python_stderr():
            self._prof.__enter__()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            elapsed = time.perf_counter() - self._t0
            peak = max(self._cuda_peak, torch.cuda.max_memory_allocated(self.device))
            if exc_type is None:
                self.report = MemoryReport(
                    peak_bytes=int(peak),
                    by_category={},
                    rss_peak_bytes=None,
                    method="cuda:max_memory_allocated (reset_peak_memory_stats on enter)",
                    device=str(self.device),
                    preexisting_bytes=int(self._cuda_before),
                    net_peak_bytes=int(peak - self._cuda_before),
                    end_bytes=int(torch.cuda.memory_allocated(self.device)),
                    elapsed_s=elapsed,
                    phase_peaks=dict(self._phase_peaks),
                )
            return False

        prof, self._prof = self._prof, None
        with native_stderr_to_python_stderr():
            prof.__exit__(exc_type, exc, tb)
        elapsed = time.perf_counter() - self._t0
        rss_peak = _read_rss_hwm_bytes()
        if exc_type is not None:
            return False
        t1 = time.perf_counter()
        res = analyze_memory_profile(prof, self.device, self._labels, self._phase_ends,
                                      self._label_bytes)
        analysis_s = time.perf_counter() - t1
        del prof
        self.report = MemoryReport(
            rss_peak_bytes=rss_peak,
            method="cpu:torch.profiler memory timeline (live tensor bytes, incl. pre-existing "
            "tensors used by the region)",
            device=str(self.device),
            rss_scope="region" if self._rss_reset else "process",
            rss_before_bytes=self._rss_before,
            elapsed_s=elapsed,
            analysis_s=analysis_s,
            **res,
        )
        return False
