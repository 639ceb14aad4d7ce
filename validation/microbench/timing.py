"""Timing primitives of the harness, free of torch so they can be tested with a fake clock.

A measurement is: ``warmup`` untimed calls, then ``repeats`` timed calls, each on the next input
set of a rotation (so consecutive calls do not find their operands in L2), and the median of the
per-call seconds. ``Timer`` implementations: ``PerfCounterTimer`` (host clock, after a device
synchronize; the CPU device) and, in ``harness``, a CUDA-event timer.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence


class Timer(Protocol):
    def time_call(self, fn: Callable[[], object]) -> float:
        """Seconds of one call of ``fn`` on the device."""


@dataclass
class PerfCounterTimer:
    """Host wall clock around one call, with an optional synchronize before and after."""

    synchronize: Callable[[], None] = lambda: None
    clock: Callable[[], float] = time.perf_counter

    def time_call(self, fn: Callable[[], object]) -> float:
        self.synchronize()
        start = self.clock()
        fn()
        self.synchronize()
        return self.clock() - start


@dataclass(frozen=True, kw_only=True)
class TimingStats:
    median_s: float
    min_s: float
    max_s: float
    repeats: int


def summarize(samples: Sequence[float]) -> TimingStats:
    if not samples:
        raise ValueError("no timing samples")
    if min(samples) < 0:
        raise ValueError(f"negative timing sample {min(samples)}")
    return TimingStats(median_s=statistics.median(samples), min_s=min(samples), max_s=max(samples), repeats=len(samples))


def rotation_count(bytes_per_set: float, cache_bytes: float, max_sets: int = 64) -> int:
    """Input sets to rotate through so that the rotation spans at least twice the last-level cache."""
    if bytes_per_set <= 0:
        return 1
    return int(max(1, min(max_sets, -(-2 * cache_bytes // bytes_per_set))))


def measure(
    make_call: Callable[[int], Callable[[], object]], *, sets: int, timer: Timer, warmup: int, repeats: int
) -> TimingStats:
    """Median seconds of ``make_call(i % sets)()`` over ``repeats`` calls after ``warmup`` calls."""
    if repeats < 1 or warmup < 0 or sets < 1:
        raise ValueError(f"repeats = {repeats} >= 1, warmup = {warmup} >= 0, sets = {sets} >= 1 required")
    calls = [make_call(i) for i in range(sets)]
    for i in range(warmup):
        calls[i % sets]()
    return summarize([timer.time_call(calls[(warmup + i) % sets]) for i in range(repeats)])
