"""Per-request result records and the serving metrics of INTERFACE.md, defined as vLLM's benchmark
(vllm/benchmarks/serve.py, summarized in ../shared/reference/formulas.md "Queueing / SLO / goodput"):

- TTFT = first_token_s - arrival_s; E2E = finish_s - arrival_s;
- TPOT = (E2E - TTFT) / (output_tokens - 1), only for requests with more than one output token;
- ITL = gaps between consecutive token emissions of a request, pooled over all requests (one gap per
  emission, so a speculative step that emits several tokens contributes one gap);
- duration = last finish - first arrival unless given; throughputs count completed requests only;
- goodput = completed requests meeting every given SLO (value <= limit; a one-token request meets the
  TPOT limit, as vLLM sets its TPOT to 0 for goodput) / duration.

Requests are *completed* (finished, not rejected), *rejected* (never served, with a reason) or
*unfinished* (still in flight when the simulation stopped). Latency statistics use completed requests
only. ``slo_attainment`` = good requests / all requests: rejected and unfinished ones count as misses,
since their users were not served within the SLO. Statistics over an empty set are ``None``.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from sim.errors import ConfigError

STAT_PERCENTILES = (50, 90, 99)
_SLO_KEYS = ("ttft_s", "tpot_s", "e2e_s", "percentile")
# Saturation thresholds (see `saturated`). An overload rho = offered rate / service rate makes the
# queueing delay grow at (1 - 1/rho) seconds per second, so between the centres of the first and last
# thirds of the arrivals (2/3 of the span apart) it rises by (2/3)(1 - 1/rho) of the span: 2 % of the
# span is the rise of rho = 1.03. Completions must also fall short of the offered rate: below 98 %
# (rho = 1/0.98 = 1.02); measured on M/D/1 records (tests/sim/test_serving_metrics.py helper, 50 seeds,
# 1,000 requests): detected in 0 % of runs at rho 0.95 and 0.98, 66 % at 1.03, 76 % at 1.05, 98 % at 1.1.
_THROUGHPUT_FRACTION = 0.98
_WAIT_RISE_FRACTION_OF_SPAN = 0.02
_MIN_RECORDS_FOR_SATURATION = 6


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestRecord:
    """What happened to one request; times in simulated seconds, ``None`` where it never happened."""

    request_id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    finish_s: float | None = None
    token_times_s: tuple[float, ...] = ()  # time of each emission of output tokens
    token_counts: tuple[int, ...] = ()  # tokens emitted at each of those times (> 1 with speculation)
    preemptions: int = 0
    cached_prompt_tokens: int = 0
    rejected: bool = False
    reject_reason: str = ""
    replica: int = 0

    def __post_init__(self) -> None:
        if len(self.token_times_s) != len(self.token_counts):
            raise ValueError(
                f"request {self.request_id}: {len(self.token_times_s)} token_times_s but "
                f"{len(self.token_counts)} token_counts"
            )
        if self.rejected and not self.reject_reason:
            raise ValueError(f"request {self.request_id}: rejected without a reject_reason")
        previous = self.arrival_s
        for name in ("first_scheduled_s", "first_token_s", "finish_s"):
            value = getattr(self, name)
            if value is not None:
                if value < previous:
                    raise ValueError(f"request {self.request_id}: {name} = {value} precedes {previous}")
                previous = value

    @property
    def completed(self) -> bool:
        return not self.rejected and self.finish_s is not None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> float | None:
        return None if self.finish_s is None else self.finish_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        """(E2E - TTFT) / (output_tokens - 1); None for one-token or unfinished requests."""
        if self.finish_s is None or self.first_token_s is None or self.output_tokens < 2:
            return None
        return (self.finish_s - self.first_token_s) / (self.output_tokens - 1)

    @property
    def queue_s(self) -> float | None:
        """Queueing delay: first_scheduled_s - arrival_s."""
        return None if self.first_scheduled_s is None else self.first_scheduled_s - self.arrival_s


@dataclass(frozen=True, slots=True, kw_only=True)
class SloSpec:
    """Latency limits (s); a request is good when it meets every limit given. ``percentile``: the
    share of requests (in %) that must be good for the SLO to count as met (DistServe's attainment)."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    percentile: float = 90

    def __post_init__(self) -> None:
        for name in ("ttft_s", "tpot_s", "e2e_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ConfigError(f"slo.{name} = {value!r} must be > 0")
        if not 0 < self.percentile <= 100:
            raise ConfigError(f"slo.percentile = {self.percentile!r} must be in (0, 100]")

    def is_good(self, record: RequestRecord) -> bool:
        """Completed and within every given limit (a one-token request has TPOT 0, as in vLLM)."""
        if not record.completed:
            return False
        if self.ttft_s is not None and (record.ttft_s is None or record.ttft_s > self.ttft_s):
            return False
        if self.tpot_s is not None and (record.tpot_s or 0.0) > self.tpot_s:
            return False
        return self.e2e_s is None or record.e2e_s <= self.e2e_s  # type: ignore[operator]


def parse_slo(table: Mapping[str, Any] | None) -> SloSpec | None:
    """The ``[slo]`` table, or None when absent or empty."""
    if not table:
        return None
    unknown = sorted(set(table) - set(_SLO_KEYS))
    if unknown:
        raise ConfigError(f"slo: unknown keys {unknown}; allowed: {', '.join(_SLO_KEYS)}")
    values: dict[str, float] = {}
    for key, value in table.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ConfigError(f"slo.{key} = {value!r} must be a finite number")
        values[key] = float(value)
    if not any(key in values for key in ("ttft_s", "tpot_s", "e2e_s")):
        raise ConfigError("slo: give at least one of ttft_s, tpot_s, e2e_s")
    return SloSpec(**values)


def latency_stats(values: Sequence[float] | np.ndarray, extra_percentiles: Sequence[float] = ()) -> dict[str, float] | None:
    """{mean, p50, p90, p99 (+ extra)} in seconds with numpy's linear percentiles; None when empty."""
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        return None
    stats = {"mean": float(data.mean())}
    for q in (*STAT_PERCENTILES, *extra_percentiles):
        stats[f"p{q:g}"] = float(np.percentile(data, q))
    return stats


def _itl_gaps(records: Sequence[RequestRecord]) -> np.ndarray:
    chunks = [np.diff(r.token_times_s) for r in records if len(r.token_times_s) > 1]
    return np.concatenate(chunks) if chunks else np.empty(0)


def summarize(
    records: Sequence[RequestRecord],
    *,
    duration_s: float | None = None,
    slo: SloSpec | None = None,
    offered_rate_per_s: float | None = None,
) -> dict[str, Any]:
    """The serving JSON fields of INTERFACE.md (plus extras) for one run's records."""
    done = [r for r in records if r.completed]
    rejected = [r for r in records if r.rejected]
    if duration_s is None:
        duration_s = (max(r.finish_s for r in done) - min(r.arrival_s for r in records)) if done else 0.0  # type: ignore[type-var]
    per_s = (lambda count: count / duration_s) if duration_s > 0 else (lambda count: 0.0)
    output_tokens = sum(r.output_tokens for r in done)
    prompt_tokens = sum(r.prompt_tokens for r in done)
    extra = (slo.percentile,) if slo is not None and slo.percentile not in STAT_PERCENTILES else ()
    good = [r for r in records if slo.is_good(r)] if slo is not None else []
    cached = sum(r.cached_prompt_tokens for r in done)
    return {
        "num_requests": len(records),
        "completed": len(done),
        "rejected": len(rejected),
        "reject_reasons": dict(sorted(Counter(r.reject_reason for r in rejected).items())),
        "unfinished": len(records) - len(done) - len(rejected),
        "duration_s": float(duration_s),
        "request_throughput_per_s": per_s(len(done)),
        "output_tokens_per_s": per_s(output_tokens),
        "total_tokens_per_s": per_s(prompt_tokens + output_tokens),
        "ttft_s": latency_stats([r.ttft_s for r in done if r.ttft_s is not None], extra),
        "tpot_s": latency_stats([r.tpot_s for r in done if r.output_tokens > 1], extra),
        "itl_s": latency_stats(_itl_gaps(done), extra),
        "e2e_s": latency_stats([r.e2e_s for r in done], extra),
        "queue_s": latency_stats([r.queue_s for r in done if r.queue_s is not None], extra),
        "goodput_requests_per_s": per_s(len(good)) if slo is not None else None,
        "slo_attainment": len(good) / len(records) if slo is not None and records else None,
        "slo_met": (len(good) / len(records) >= slo.percentile / 100) if slo is not None and records else None,
        "saturated": saturated(records, offered_rate_per_s),
        "preemptions": sum(r.preemptions for r in records),
        "prefix_cache_hit_rate": cached / prompt_tokens if prompt_tokens else 0.0,
    }


def saturated(records: Sequence[RequestRecord], offered_rate_per_s: float | None) -> bool:
    """True when the queue grows without bound at the offered rate.

    Over the served (non-rejected) requests, ordered by arrival, with arrival span T:
    (a) completions whose finish lies in the second half of the arrival window, per second, are
        below 98 % of the offered rate (the realized arrival rate (n - 1) / T when not given), and
    (b) the mean queueing delay (first_scheduled - arrival; for a request never scheduled, the time
        from its arrival to the last event seen, a lower bound) of the last third of arrivals exceeds
        that of the first third by more than 2 % of T, or the requests in the system (arrived, not
        finished) grow over the second half of the window by more than three Poisson standard
        deviations of its arrivals (3 sqrt(n)). An iteration-level scheduler admits requests at once,
        so its overload shows as a growing batch rather than a growing waiting queue.
    A stable system fails (b) whatever its load, an overloaded one satisfies both. Offline streams
    (T = 0) and fewer than 6 requests are never saturated: a finite batch always drains.
    """
    served = sorted((r for r in records if not r.rejected), key=lambda r: r.arrival_s)
    if len(served) < _MIN_RECORDS_FOR_SATURATION:
        return False
    first_s, last_s = served[0].arrival_s, served[-1].arrival_s
    span_s = last_s - first_s
    if span_s <= 0:
        return False
    rate = offered_rate_per_s if offered_rate_per_s is not None else (len(served) - 1) / span_s
    half_s = first_s + span_s / 2
    finished = sum(1 for r in served if r.finish_s is not None and half_s <= r.finish_s <= last_s)
    if finished / (span_s / 2) >= _THROUGHPUT_FRACTION * rate:
        return False
    horizon_s = max(
        max((t for t in (r.finish_s, r.first_token_s, r.first_scheduled_s) if t is not None), default=r.arrival_s)
        for r in served
    )
    waits = [(r.first_scheduled_s if r.first_scheduled_s is not None else horizon_s) - r.arrival_s for r in served]
    third = len(waits) // 3
    rise_s = float(np.mean(waits[-third:]) - np.mean(waits[:third]))
    if rise_s > _WAIT_RISE_FRACTION_OF_SPAN * span_s:
        return True
    arrived_second_half = sum(1 for r in served if half_s < r.arrival_s <= last_s)
    backlog_growth = arrived_second_half - finished
    return backlog_growth > 3.0 * math.sqrt(arrived_second_half)


_FRAME_COLUMNS = (
    "request_id", "replica", "arrival_s", "prompt_tokens", "output_tokens", "cached_prompt_tokens",
    "first_scheduled_s", "first_token_s", "finish_s", "queue_s", "ttft_s", "tpot_s", "e2e_s",
    "emissions", "preemptions", "rejected", "reject_reason",
)


def records_frame(records: Sequence[RequestRecord]) -> pd.DataFrame:
    """One row per request with unit-suffixed columns (NaN where a time does not exist), for ``--out`` CSV."""
    nan = math.nan

    def row(r: RequestRecord) -> tuple[Any, ...]:
        return (
            r.request_id, r.replica, r.arrival_s, r.prompt_tokens, r.output_tokens, r.cached_prompt_tokens,
            nan if r.first_scheduled_s is None else r.first_scheduled_s,
            nan if r.first_token_s is None else r.first_token_s,
            nan if r.finish_s is None else r.finish_s,
            nan if r.queue_s is None else r.queue_s,
            nan if r.ttft_s is None else r.ttft_s,
            nan if r.tpot_s is None else r.tpot_s,
            nan if r.e2e_s is None else r.e2e_s,
            len(r.token_times_s), r.preemptions, r.rejected, r.reject_reason,
        )

    return pd.DataFrame([row(r) for r in records], columns=list(_FRAME_COLUMNS))
