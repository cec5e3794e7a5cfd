"""Peak-memory measurement of one training step, plus an analytic breakdown.

Two independent views of the same quantity, so they can be checked against each other:

* :class:`MemoryMeter` *measures* the peak of live tensor bytes while a region of code
  (one forward + backward + optimizer update) runs.

  - CUDA: ``torch.cuda.reset_peak_memory_stats()`` on enter, ``torch.cuda.max_memory_allocated()``
    on exit.  This is the caching allocator's absolute peak of *allocated* (not reserved) bytes
    and includes every tensor that was alive before the region.  ``by_category`` is ``{}``
    (the allocator does not know what a block is for).
  - CPU: the region runs under ``torch.profiler.profile(activities=[CPU], profile_memory=True,
    record_shapes=True, with_stack=True)`` (``with_stack=False`` where the caller labels the
    weights: see ``MemoryMeter``).  Every CPU allocation/free inside the region is
    recorded by the c10 CPU allocator's memory reporter; ``torch.profiler._memory_profiler.
    MemoryProfile`` turns those events into a timeline of
    ``(time_ns, Action, (key, version), nbytes)`` and assigns each tensor a category
    (PARAMETER, GRADIENT, OPTIMIZER_STATE, ACTIVATION, INPUT, TEMPORARY, AUTOGRAD_DETAIL, or
    None).  See :func:`_analyze_memory_profile` for how the peak is read off that timeline.
    In addition the process RSS high-water mark is read with ``getrusage(RUSAGE_SELF).ru_maxrss``
    (KiB on Linux); where the kernel allows it (``/proc/self/clear_refs`` <- ``"5"``, Linux >= 4.0)
    the high-water mark is reset on enter so the number belongs to the region, otherwise it is the
    whole process's high-water mark (``MemoryReport.rss_scope`` says which).

* :func:`analytic_breakdown` / :func:`activation_bytes_estimate` *compute* what the peak should
  be from tensor sizes and the model config.

How the absolute CPU peak is computed (pre-existing tensors)
-----------------------------------------------------------
``MemoryProfile.timeline`` emits one ``Action.PREEXISTING`` event at time ``-1`` for every
tensor that the region *uses* but did not allocate (weights, optimizer state, the input batch,
gradients left over from a previous step, ...), sized from the tensor's shape/strides, and
``CREATE``/``DESTROY`` events with the allocator's sizes for tensors born/freed inside the
region (a pre-existing tensor freed inside the region gets PREEXISTING at -1 and a DESTROY
later).  Allocations the profiler cannot tie to a tensor are kept under a plain ``Key`` and
category ``None`` ("other").  Hence the running sum over the sorted timeline, *starting from the
PREEXISTING events*, is at every moment the bytes live among {tensors the region touched} and
its maximum is the absolute peak:

    peak = preexisting_bytes + max_t (net bytes allocated since the region began)

Each pre-existing tensor is counted exactly once: tensors are keyed by storage (TensorKey id +
allocation id), so tied weights / views count once.  This was checked (see
``tests/measure/test_memory.py``) against sizes known independently: at the peak, PARAMETER bytes equal
``tensor_bytes(model.parameters())`` and OPTIMIZER_STATE bytes equal the AdamW state bytes
exactly, and ``peak - preexisting`` equals the CPU allocator's own ``total_allocated`` counter
(reported with every allocation event) maximum minus its value at region start
(``MemoryReport.allocator_net_peak_bytes``), which is an independent allocator-level number.
The alternative "bytes live before + max net-new" with an *independent* baseline is wrong
whenever a pre-existing tensor is freed before the peak: e.g. with ``opt.zero_grad()`` at the
start of the step, last step's gradients are freed first and new ones allocated later; the
baseline approach counts both sets (checked: it over-reports by exactly the gradient bytes).
Caveats: a CPU tensor that is alive but never touched inside the region (e.g. a frozen reference
model not used in this step) is invisible to the profiler and not counted, whereas CUDA's
``max_memory_allocated`` counts everything; and a pre-existing tensor freed without ever being
used in the region (the old-grads case above; torch warns "Memory block of unknown size was
allocated before the profiling started") is never counted, which only matters if the peak
happens before it is freed (it does not in that case: it is freed first).

Category mapping (``MemoryReport.by_category``, CPU, values at the peak moment, sum == peak):

    weights     <- PARAMETER
    grads       <- GRADIENT
    optimizer   <- OPTIMIZER_STATE
    activations <- ACTIVATION, plus INPUT tensors *created inside the region* (the profiler
                   labels some forward tensors that do not depend on a parameter gradient, e.g.
                   the GQA ``repeat_kv`` copies, as INPUT)
    other       <- INPUT that pre-existed (the token batch), TEMPORARY, AUTOGRAD_DETAIL
                   (gradients w.r.t. activations during backward), uncategorised allocations.

The raw profiler categories at the peak are kept in ``MemoryReport.by_profiler_category`` and
the per-category maxima over the whole region (e.g. activations peak at the end of forward,
grads at the end of backward) in ``MemoryReport.category_max``.

All use of the private profiler API is confined to this module; if it changes,
:class:`MemoryProfilerAPIError` is raised with the torch version in the message.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import resource
import sys
import time
from collections.abc import Iterable
from typing import Any

import torch

from logra.optim.collectives import local
from logra.optim.rule import tensor_bytes

__all__ = [
    "MemoryReport",
    "MemoryMeter",
    "MemoryProfilerAPIError",
    "tensor_bytes",
    "analytic_breakdown",
    "activation_bytes_estimate",
    "activation_breakdown",
    "saved_tensor_bytes",
]

CATEGORY_KEYS = ("weights", "grads", "optimizer", "activations", "other")


class MemoryProfilerAPIError(RuntimeError):
    """The private ``torch.profiler._memory_profiler`` API is not what this module expects."""


# ----------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class MemoryReport:
    peak_bytes: int
    """Measured absolute peak of live tensor bytes during the region (CPU: profiler timeline,
    CUDA: ``max_memory_allocated``)."""
    by_category: dict[str, int]
    """Bytes per category at the peak moment; keys weights/grads/optimizer/activations/other
    (CPU, sums to ``peak_bytes``).  ``{}`` on CUDA."""
    rss_peak_bytes: int | None
    """Process RSS high-water mark in bytes (CPU; ``rss_scope`` says region or process), None on CUDA."""
    method: str
    """How it was measured."""
    device: str = "cpu"
    preexisting_bytes: int = 0
    """CPU: bytes of tensors alive before the region that the region touched.
    CUDA: ``memory_allocated()`` on enter."""
    net_peak_bytes: int = 0
    """``peak_bytes - preexisting_bytes``: the peak of net new allocations."""
    end_bytes: int = 0
    """Live bytes (same accounting as ``peak_bytes``) when the region ended."""
    allocator_net_peak_bytes: int | None = None
    """CPU cross-check from the allocator's own running ``total_allocated`` counter."""
    by_profiler_category: dict[str, int] = dataclasses.field(default_factory=dict)
    """Raw profiler categories at the peak (INPUT split into INPUT / INPUT_NEW)."""
    category_max: dict[str, int] = dataclasses.field(default_factory=dict)
    """Max over the region of each ``by_category`` key taken separately."""
    phase_peaks: dict[str, int] = dataclasses.field(default_factory=dict)
    """The peak within each phase ended by ``MemoryMeter.phase``, in order (CUDA: the
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


# ----------------------------------------------------------------------------------------------
# Small helpers
# ----------------------------------------------------------------------------------------------


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of all tensors in ``optimizer.state`` (unique storages)."""
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


# ----------------------------------------------------------------------------------------------
# Private profiler API, confined here
# ----------------------------------------------------------------------------------------------


def _import_memory_profiler():
    try:
        from torch.profiler import _memory_profiler as mp

        for name in ("MemoryProfile", "Action", "Category", "TensorKey", "Key"):
            getattr(mp, name)
        for name in ("PREEXISTING", "CREATE", "INCREMENT_VERSION", "DESTROY"):
            getattr(mp.Action, name)
        for name in (
            "PARAMETER",
            "GRADIENT",
            "OPTIMIZER_STATE",
            "ACTIVATION",
            "INPUT",
            "TEMPORARY",
            "AUTOGRAD_DETAIL",
        ):
            getattr(mp.Category, name)
        return mp
    except (ImportError, AttributeError) as e:
        raise MemoryProfilerAPIError(
            f"torch {torch.__version__}: torch.profiler._memory_profiler no longer provides "
            f"the API logra.measure.memory relies on ({e!r}); update logra/measure/memory.py"
        ) from e


@contextlib.contextmanager
def _native_stderr_to_python_stderr():
    """The profiler's native log lines (kineto's `USDT ... profiler_start`/`profiler_stop`) go to
    file descriptor 2; while Python's stderr is another file (a workflow job's log), they go
    there too for the block, not to the console."""
    try:
        target = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file: leave descriptor 2 alone
        target = 2
    if target == 2:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(target, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _new_profiler(with_stack: bool):
    from torch.profiler import ProfilerActivity, profile

    return profile(
        activities=[ProfilerActivity.CPU],
        profile_memory=True,
        record_shapes=True,
        with_stack=with_stack,
    )


def _allocator_net_peak(memory_profile, device: torch.device) -> int | None:
    """Peak of the allocator's own ``total_allocated`` counter relative to the region start.

    The counter is global to the process (it keeps counting blocks allocated under earlier
    profiling sessions), so only its differences are meaningful.
    """
    try:
        from torch._C._profiler import _EventType

        events = [
            e
            for e in memory_profile._op_tree.dfs()
            if e.typed[0] == _EventType.Allocation and e.typed[1].device == device
        ]
        if not events:
            return 0
        events.sort(key=lambda e: e.start_time_ns)
        first = events[0].typed[1]
        base = first.total_allocated - first.alloc_size
        return int(max(0, max(e.typed[1].total_allocated for e in events) - base))
    except Exception:  # pure cross-check; never fail a measurement over it
        return None


class _TimelineReplay:
    """The live bytes on one device, replayed event by event from the profiler's memory
    timeline (`_analyze_memory_profile` says how): the running total by raw category, sampled
    after all events sharing one timestamp, with the peak, the per-category maxima and the
    per-phase peaks."""

    def __init__(self, mp, get_category, labels: dict[int, str], phases):
        self.mp, self.get_category, self.labels = mp, get_category, labels
        self.raw_to_bucket = {
            mp.Category.PARAMETER: "weights", mp.Category.GRADIENT: "grads",
            mp.Category.OPTIMIZER_STATE: "optimizer", mp.Category.ACTIVATION: "activations",
            mp.Category.TEMPORARY: "other", mp.Category.AUTOGRAD_DETAIL: "other", None: "other"}
        self.preexisting_keys: set = set()
        self.live_raw: dict[str, int] = {}
        self.total = self.preexisting = 0
        self.peak, self.peak_raw, self.peak_t = -1, {}, None
        self.cat_max = {k: 0 for k in CATEGORY_KEYS}
        self.t_first = self.t_last = None
        self.phase_ends, self.phase_peaks = list(phases), {}
        self.level = 0  # the live total at the previous sample: where the next phase starts

    def classify(self, key, version) -> str:
        mp = self.mp
        if isinstance(key, mp.TensorKey) and key.storage.ptr in self.labels:
            return "LABEL:" + self.labels[key.storage.ptr]
        cat = self.get_category(key, version) if isinstance(key, mp.TensorKey) else None
        if cat == mp.Category.INPUT:
            return "INPUT" if key in self.preexisting_keys else "INPUT_NEW"
        return "UNKNOWN" if cat is None else cat.name

    def bucket(self, raw: str) -> str:
        if raw.startswith("LABEL:"):
            return raw.removeprefix("LABEL:")
        if raw in ("INPUT", "UNKNOWN"):
            return "other"
        if raw == "INPUT_NEW":
            return "activations"
        return self.raw_to_bucket[self.mp.Category[raw]]

    def add(self, raw: str, n: int, *, live: int = 0, preexisting: bool = False) -> None:
        """`n` bytes more under `raw`; `live` bytes more in the total (pre-existing ones)."""
        self.live_raw[raw] = self.live_raw.get(raw, 0) + n
        self.total += live
        if preexisting:
            self.preexisting += live

    def event(self, t, action, key, version, nbytes) -> None:
        A = self.mp.Action
        if t >= 0:
            self.t_first = t if self.t_first is None else self.t_first
            self.t_last = t
        if action == A.PREEXISTING:
            self.preexisting_keys.add(key)
            self.add(self.classify(key, version), nbytes, live=nbytes, preexisting=True)
        elif action == A.CREATE:
            self.add(self.classify(key, version), nbytes, live=nbytes)
        elif action == A.INCREMENT_VERSION:
            self.add(self.classify(key, version), -nbytes)
            self.add(self.classify(key, version + 1), nbytes)
        elif action == A.DESTROY:
            self.add(self.classify(key, version), -nbytes, live=-nbytes)
        else:
            raise MemoryProfilerAPIError(
                f"torch {torch.__version__}: unknown memory action {action}")

    def sample(self, t) -> None:
        ends, peaks = self.phase_ends, self.phase_peaks
        while len(ends) > 1 and t > ends[0][1]:  # the last phase takes the rest
            ends.pop(0)
            peaks[ends[0][0]] = max(peaks.get(ends[0][0], 0), self.level)
        if ends:
            peaks[ends[0][0]] = max(peaks.get(ends[0][0], 0), self.total)
        self.level = self.total
        if self.total > self.peak:
            self.peak, self.peak_raw, self.peak_t = self.total, dict(self.live_raw), t
        for b, n in self.by_bucket(self.live_raw).items():
            self.cat_max[b] = max(self.cat_max[b], n)

    def by_bucket(self, raw_bytes: dict[str, int]) -> dict[str, int]:
        buckets: dict[str, int] = {}
        for raw, n in raw_bytes.items():
            b = self.bucket(raw)
            buckets[b] = buckets.get(b, 0) + n
        return buckets

    def peak_time_frac(self) -> float | None:
        """Where the peak falls between the first and the last event (0 to 1)."""
        first, last = self.t_first, self.t_last
        if self.peak_t is None or first is None or last is None or last <= first:
            return None
        return min(1.0, max(0.0, (max(self.peak_t, first) - first) / (last - first)))


def _analyze_memory_profile(prof, device: torch.device,
                            labels: dict[int, str] | None = None,
                            phases: list[tuple[str, int]] = (),
                            label_bytes: dict[int, int] | None = None) -> dict[str, Any]:
    """Read peak / category breakdown off the profiler's memory timeline for ``device``.

    Walks ``MemoryProfile.timeline`` (sorted by (time, action)): PREEXISTING (t=-1) and CREATE
    add bytes, DESTROY removes them, INCREMENT_VERSION moves bytes between the categories of two
    versions of one tensor.  The running total is sampled after all events sharing one timestamp.
    ``phases`` [(name, end time in ns)] splits the timeline: each phase's peak is the largest
    sample up to its end time after the previous phase's (the timeline's times are
    ``time.time_ns()``'s clock).

    A labelled tensor (``label_bytes``: storage address -> bytes) that no recorded op touches
    is alive throughout all the same (its owner holds it): it counts as pre-existing. The
    profiler misses tensors that only a compiled kernel reads and writes, e.g. torchao's 8-bit
    optimizer moments, updated inside one ``torch.compile``d function per parameter.
    """
    mp = _import_memory_profiler()
    try:
        memory_profile = mp.MemoryProfile(prof.profiler.kineto_results)
        timeline = memory_profile.timeline
        get_category = memory_profile._categories.get
    except (AttributeError, TypeError) as e:
        raise MemoryProfilerAPIError(
            f"torch {torch.__version__}: unexpected torch.profiler memory-profile API ({e!r}); "
            "update logra/measure/memory.py"
        ) from e

    labels = labels or {}
    replay = _TimelineReplay(mp, get_category, labels, phases)
    seen = {key.storage.ptr for _, _, (key, _), _ in timeline
            if isinstance(key, mp.TensorKey) and key.device == device}
    for ptr, nbytes in (label_bytes or {}).items():
        if ptr not in seen:
            replay.add("LABEL:" + labels[ptr], nbytes, live=nbytes, preexisting=True)
    prev_t = None
    for t, action, (key, version), nbytes in timeline:
        if key.device != device:
            continue
        if prev_t is not None and t != prev_t:
            replay.sample(prev_t)
        prev_t = t
        replay.event(t, action, key, version, nbytes)
    if prev_t is not None:
        replay.sample(prev_t)
    peak = max(replay.peak, 0)
    by_category = {k: 0 for k in CATEGORY_KEYS} | replay.by_bucket(replay.peak_raw)
    return dict(
        peak_bytes=int(peak),
        by_category={k: int(v) for k, v in by_category.items()},
        by_profiler_category={k: int(v) for k, v in sorted(replay.peak_raw.items()) if v},
        category_max={k: int(v) for k, v in replay.cat_max.items()},
        preexisting_bytes=int(replay.preexisting),
        net_peak_bytes=int(peak - replay.preexisting),
        end_bytes=int(replay.total),
        peak_time_frac=replay.peak_time_frac(),
        allocator_net_peak_bytes=_allocator_net_peak(memory_profile, device),
        # a phase without events holds the level it started at
        phase_peaks={name: int(replay.phase_peaks.get(name, replay.level))
                     for name, _ in phases},
    )


# ----------------------------------------------------------------------------------------------
# Meter
# ----------------------------------------------------------------------------------------------


class MemoryMeter:
    """Context manager measuring the peak memory of the code it wraps (one training step).

    >>> with MemoryMeter("cpu") as mm:
    ...     loss = model(**batch).loss; loss.backward(); opt.step(); opt.zero_grad()
    >>> mm.report.peak_bytes, mm.report.by_category

    CPU runs the region under the torch profiler: for a ~1M-parameter Qwen2 step on 256 tokens
    the region took ~1 s (plain step: ~0.05-0.1 s) plus ~1 s of analysis on a shared 2-core box
    (``report.elapsed_s`` / ``report.analysis_s``).  Use it on a
    *representative* step (after a warm-up step, so optimizer state exists), not on every step.
    If the region raises, the profiler/allocator state is cleaned up and ``report`` stays None.
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
        previous phase ended goes into ``report.phase_peaks[name]``; the region's peak is still
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
        _import_memory_profiler()  # fail before running the step if the API is gone
        self._rss_before = _read_rss_now_bytes()
        self._rss_reset = _reset_rss_hwm()
        self._phase_ends = []
        self._prof = _new_profiler(self._with_stack)
        self._t0 = time.perf_counter()
        with _native_stderr_to_python_stderr():
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
        with _native_stderr_to_python_stderr():
            prof.__exit__(exc_type, exc, tb)
        elapsed = time.perf_counter() - self._t0
        rss_peak = _read_rss_hwm_bytes()
        if exc_type is not None:
            return False
        t1 = time.perf_counter()
        res = _analyze_memory_profile(prof, self.device, self._labels, self._phase_ends,
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


# ----------------------------------------------------------------------------------------------
# Analytic side
# ----------------------------------------------------------------------------------------------


def analytic_breakdown(
    *,
    param_bytes: int,
    grad_bytes_at_peak: int,
    optimizer_bytes: int,
    activation_bytes: int,
    rollout_bytes: int = 0,
    other_bytes: int = 0,
) -> dict[str, int]:
    """Analytic peak = weights + grads alive at the peak + optimizer state + activations alive at
    the peak + rollout buffers + anything else.  Keys: weights, grads, optimizer, activations,
    rollout, other, total."""
    d = {
        "weights": int(param_bytes),
        "grads": int(grad_bytes_at_peak),
        "optimizer": int(optimizer_bytes),
        "activations": int(activation_bytes),
        "rollout": int(rollout_bytes),
        "other": int(other_bytes),
    }
    d["total"] = sum(d.values())
    return d


def _cfg(config, name: str, default=None):
    v = getattr(config, name, None)
    return default if v is None else v


def activation_breakdown(
    config,
    batch: int | None = None,
    seq_len: int | None = None,
    *,
    n_tokens: int | None = None,
    dtype_bytes: int = 4,
    checkpointing: bool = False,
    attn_implementation: str | None = None,
    attention_mask: bool = False,
    include_head: bool = True,
    frozen: bool = False,
    sketch_rank: int = 0,
    loss: str = "hf",
) -> dict[str, int]:
    """Bytes autograd saves for backward in ONE forward of an HF Llama/Qwen2-style decoder.
    (Longer than 80 lines for this docstring: the derivation, term by term, beside the code.)

    Derived op by op from the eager HF Qwen2 code (transformers 5.x) and verified *exactly* (to
    the byte, fp32 and bf16, eager and sdpa) against the storages captured by
    ``torch.autograd.graph.saved_tensors_hooks`` (:func:`saved_tensor_bytes`).  Notation: N =
    batch*seq_len tokens, H hidden, A = heads*head_dim, Akv = kv_heads*head_dim, I intermediate,
    b = dtype_bytes, f = 4 (fp32).  Per decoder layer:

    * 2 x RMSNorm (``x.to(fp32)``; ``x.pow(2)``; ``x * rsqrt``; ``w * y.to(dtype)``): each
      saves its input as fp32 (N*H*f; when b == 4 the cast is a no-op and the residual-stream
      tensor itself is saved, when b < 4 only the fp32 copy is), rsqrt (N*f) and the normalised
      ``y`` in dtype (N*H*b).  The norm outputs ``w*y`` are saved by the q/k/v and gate/up
      projections (2*N*H*b).
    * rotary: ``q*cos + rotate_half(q)*sin`` saves only cos/sin (shared across layers,
      2*T*hd*b per forward; 2*B*T*hd*b with ``loss="chunked"``, whose forward passes per-row
      position ids for left padding), not the projections' outputs.
    * eager attention: the matmuls save q_rot and the GQA-repeated k, v (3*N*A*b), softmax saves
      its fp32 output (B*h*T^2*f) and, if dtype != fp32, the second matmul the cast probs
      (B*h*T^2*b); o_proj saves its input (N*A*b).
      sdpa (flash / efficient kernels): q (N*A*b), k and v (2*N*Akv*b, or 2*N*A*b when a padding
      mask makes HF repeat_kv), output (N*A*b; laid out (B,T,h,hd), so it *is* o_proj's input),
      logsumexp (B*h*T*f), and with ``attention_mask=True`` the additive mask (B*T^2*b, a fresh
      copy per layer).
    * residual adds save nothing.
    * SiLU-gated MLP saves gate, silu(gate), up and their product (4*N*I*b).

    Head (``include_head``): final norm (as above) + lm_head input (N*H*b) + the fp32
    log_softmax output (N*V*f; HF's loss upcasts logits) + int64 targets (N*8) + a scalar.  The
    logits themselves are not saved (they are alive while the model output holds them: not
    counted).  A GRPO loss of the form ``logits.float().log_softmax(-1).gather(...)`` saves the
    same N*V*f.  ``loss="chunked"`` (``logra.rl.loss.token_logprobs``, the trainer's loss): final
    norm + the output layer's input (N*H*b, saved for the recomputed logits even when frozen) +
    int64 targets (N*8) + each token's fp32 logsumexp (N*f); nothing of vocabulary size.
    Caller-owned input_ids (saved by the embedding) are not counted.

    ``frozen=True``: the base weights do not train (LoRA): the RMSNorms' normalised values and
    the lm_head input, saved only for those weights' gradients, are not saved (the adapters'
    own rank-r tensors are not counted: N·r per adapted module).

    ``sketch_rank=r`` (LoGRA, logra/optim/logra_rule.py; implies ``frozen``): no weight has a
    gradient, so the seven projections of each layer save no input (not the norm outputs 2*N*H*b,
    not o_proj's, not down_proj's: the MLP saves 3*N*I*b) and keep X·Aᵀ instead, N*r*b each
    (all seven targeted, LoGRA's default).

    With ``checkpointing=True`` (HF per-layer gradient checkpointing) only each layer's input
    (N*H*b) is kept from the forward; during backward one layer is recomputed, so the peak of
    saved activations is L*N*H*b + max(head, one layer).
    """
    if seq_len is None:
        raise TypeError("seq_len is required (attention terms scale with seq_len**2)")
    if batch is None:
        if n_tokens is None or n_tokens % seq_len:
            raise TypeError("give batch, or n_tokens divisible by seq_len")
        batch = n_tokens // seq_len
    elif n_tokens is not None and n_tokens != batch * seq_len:
        raise ValueError(f"n_tokens={n_tokens} != batch*seq_len={batch * seq_len}")
    L = int(config.num_hidden_layers)
    H = int(config.hidden_size)
    I = int(config.intermediate_size)
    nh = int(config.num_attention_heads)
    nkv = int(_cfg(config, "num_key_value_heads", nh))
    hd = int(_cfg(config, "head_dim", H // nh))
    V = int(config.vocab_size)
    B, T = int(batch), int(seq_len)
    N = B * T
    b = int(dtype_bytes)
    f = 4
    A, Akv = nh * hd, nkv * hd
    impl = attn_implementation or getattr(config, "_attn_implementation", None) or "sdpa"

    frozen = frozen or sketch_rank > 0

    def rmsnorm() -> int:
        # fp32 input copy (when b == 4 the .to() is a no-op and the input itself is saved),
        # rsqrt, normalised value cast back to dtype (saved for the weight's gradient only).
        return N * H * f + N * f + (0 if frozen else N * H * b)

    if impl == "eager":
        attn = 3 * N * A * b + B * nh * T * T * f + (B * nh * T * T * b if b != f else 0)
        o_in = N * A * b
    else:  # sdpa / flash / efficient kernels
        kv = 2 * N * (A if attention_mask else Akv) * b
        attn = N * A * b + kv + N * A * b + B * nh * T * f
        o_in = 0  # sdpa output is laid out (B, T, h, hd): the o_proj input shares its storage
        # sdpa saves the additive float mask (B, 1, T, T) in model dtype, a fresh copy per layer
        attn += B * T * T * b if attention_mask else 0
    if sketch_rank:
        per_layer = 2 * rmsnorm() + attn + 3 * N * I * b + 7 * N * sketch_rank * b
    else:
        per_layer = 2 * rmsnorm() + N * H * b + attn + o_in + N * H * b + 4 * N * I * b
    rope = 2 * (B if loss == "chunked" else 1) * T * hd * b
    if loss not in ("hf", "chunked"):
        raise ValueError(f"loss: unknown {loss!r}; known: hf, chunked")
    if not include_head:
        head = 0
    elif loss == "hf":  # + fp32 scalar total_weight saved by nll_loss
        head = rmsnorm() + (0 if frozen else N * H * b) + N * V * f + N * 8 + f
    else:
        head = rmsnorm() + N * H * b + N * 8 + N * f

    if not checkpointing:
        layers, head_part = L * per_layer, head
    else:
        # Forward keeps only each layer's input; the head's saved tensors are freed by the time
        # the first layer is recomputed, so the peak holds max(head, one recomputed layer).
        layers, head_part = L * N * H * b + max(per_layer, head), 0
    out = {
        "per_layer": per_layer,
        "layers": layers,
        "rope": rope,
        "head": head_part,
    }
    out["total"] = layers + rope + head_part
    return out


def activation_bytes_estimate(
    config,
    batch: int | None = None,
    seq_len: int | None = None,
    *,
    n_tokens: int | None = None,
    dtype_bytes: int = 4,
    checkpointing: bool = False,
    **kw,
) -> int:
    """Bytes saved for backward by one forward over ``batch x seq_len`` tokens (or ``n_tokens``
    tokens in rows of ``seq_len``).  See :func:`activation_breakdown` for the derivation and the
    keyword options (``attn_implementation``, ``attention_mask``, ``include_head``, ``frozen``,
    ``loss``).  Options after ``seq_len`` are keyword-only so a positional ``dtype_bytes`` cannot
    be mistaken for a sequence length."""
    return activation_breakdown(
        config,
        batch,
        seq_len,
        n_tokens=n_tokens,
        dtype_bytes=dtype_bytes,
        checkpointing=checkpointing,
        **kw,
    )["total"]


def saved_tensor_bytes(fn, *args, exclude: Iterable[torch.Tensor] = (), **kwargs):
    """Run ``fn(*args, **kwargs)`` and return ``(result, bytes)`` where bytes is the size of the
    unique storages autograd saved for backward, excluding storages of ``exclude`` (parameters).
    Used to verify :func:`activation_bytes_estimate` exactly."""
    skip = {(str(t.device), t.untyped_storage().data_ptr()) for t in exclude}
    seen: dict[tuple[str, int], int] = {}

    def pack(t: torch.Tensor):
        st = t.untyped_storage()
        k = (str(st.device), st.data_ptr())
        if k not in skip and k not in seen:
            seen[k] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        result = fn(*args, **kwargs)
    return result, sum(seen.values())
