"""The CPU peak of live tensor bytes, replayed from the torch profiler's memory timeline
(`analyze_memory_profile`): the private `torch.profiler._memory_profiler` API, confined here;
if it changes, `MemoryProfilerAPIError` names the torch version. docs/memory.md says how the
absolute peak and its categories are read off the timeline and how that was checked."""
from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

import torch


CATEGORY_KEYS = ("weights", "grads", "optimizer", "activations", "other")


class MemoryProfilerAPIError(RuntimeError):
    """The private `torch.profiler._memory_profiler` API is not what this module expects."""


def import_memory_profiler():
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
            f"the API logra.measure.timeline relies on ({e!r}); update logra/measure/timeline.py"
        ) from e


@contextlib.contextmanager
def native_stderr_to_python_stderr():
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


def new_profiler(with_stack: bool):
    from torch.profiler import ProfilerActivity, profile

    return profile(
        activities=[ProfilerActivity.CPU],
        profile_memory=True,
        record_shapes=True,
        with_stack=with_stack,
    )


def _allocator_net_peak(memory_profile, device: torch.device) -> int | None:
    """Peak of the allocator's own `total_allocated` counter relative to the region start.

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
    timeline (`analyze_memory_profile` says how): the running total by raw category, sampled
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


def analyze_memory_profile(prof, device: torch.device,
                            labels: dict[int, str] | None = None,
                            phases: list[tuple[str, int]] = (),
                            label_bytes: dict[int, int] | None = None) -> dict[str, Any]:
    """Read peak / category breakdown off the profiler's memory timeline for `device`.

    Walks `MemoryProfile.timeline` (sorted by (time, action)): PREEXISTING (t=-1) and CREATE
    add bytes, DESTROY removes them, INCREMENT_VERSION moves bytes between the categories of two
    versions of one tensor.  The running total is sampled after all events sharing one timestamp.
    `phases` [(name, end time in ns)] splits the timeline: each phase's peak is the largest
    sample up to its end time after the previous phase's (the timeline's times are
    `time.time_ns()`'s clock).

    A labelled tensor (`label_bytes`: storage address -> bytes) that no recorded op touches
    is alive throughout all the same (its owner holds it): it counts as pre-existing. The
    profiler misses tensors that only a compiled kernel reads and writes, e.g. torchao's 8-bit
    optimizer moments, updated inside one `torch.compile`d function per parameter.
    """
    mp = import_memory_profiler()
    try:
        memory_profile = mp.MemoryProfile(prof.profiler.kineto_results)
        timeline = memory_profile.timeline
        get_category = memory_profile._categories.get
    except (AttributeError, TypeError) as e:
        raise MemoryProfilerAPIError(
            f"torch {torch.__version__}: unexpected torch.profiler memory-profile API ({e!r}); "
            "update logra/measure/timeline.py"
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
