"""Serving metrics: a hand-computed example for every field, SLO/goodput rules, saturation detection."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sim.errors import ConfigError
from sim.serving.metrics import RequestRecord, SloSpec, parse_slo, records_frame, saturated, summarize

EXACT = 1e-12  # pure arithmetic


def _three_requests() -> list[RequestRecord]:
    """Three completed requests and one rejected one; every metric below is worked out by hand."""
    return [
        # TTFT 1.0, E2E 2.0, TPOT (2.0 - 1.0) / 2 = 0.5, gaps 0.5, 0.5, queue 0.5
        RequestRecord(request_id=0, arrival_s=0.0, prompt_tokens=10, output_tokens=3, first_scheduled_s=0.5,
                      first_token_s=1.0, finish_s=2.0, token_times_s=(1.0, 1.5, 2.0), token_counts=(1, 1, 1)),
        # one output token: TTFT 0.5, E2E 0.5, no TPOT, no gap; 10 prompt tokens from the prefix cache
        RequestRecord(request_id=1, arrival_s=1.0, prompt_tokens=20, output_tokens=1, first_scheduled_s=1.0,
                      first_token_s=1.5, finish_s=1.5, token_times_s=(1.5,), token_counts=(1,),
                      preemptions=1, cached_prompt_tokens=10, replica=1),
        # speculative step emits 4 tokens at once: TTFT 1.0, E2E 2.5, TPOT (2.5 - 1.0) / 4 = 0.375, gap 1.5
        RequestRecord(request_id=2, arrival_s=2.0, prompt_tokens=30, output_tokens=5, first_scheduled_s=2.0,
                      first_token_s=3.0, finish_s=4.5, token_times_s=(3.0, 4.5), token_counts=(1, 4), preemptions=2),
        RequestRecord(request_id=3, arrival_s=2.5, prompt_tokens=100_000, output_tokens=5, rejected=True,
                      reject_reason="prompt exceeds KV capacity"),
    ]


def test_every_field_of_the_hand_computed_example() -> None:
    s = summarize(_three_requests(), slo=SloSpec(ttft_s=1.0, tpot_s=0.45))
    assert (s["num_requests"], s["completed"], s["rejected"], s["unfinished"]) == (4, 3, 1, 0)
    assert s["reject_reasons"] == {"prompt exceeds KV capacity": 1}
    assert s["duration_s"] == 4.5  # last finish 4.5 - first arrival 0
    assert s["request_throughput_per_s"] == pytest.approx(3 / 4.5, rel=EXACT)
    assert s["output_tokens_per_s"] == pytest.approx((3 + 1 + 5) / 4.5, rel=EXACT)
    assert s["total_tokens_per_s"] == pytest.approx((10 + 20 + 30 + 9) / 4.5, rel=EXACT)
    # numpy linear percentiles: p of sorted [a, b, c] at index p/100 * 2
    assert s["ttft_s"] == pytest.approx({"mean": 2.5 / 3, "p50": 1.0, "p90": 1.0, "p99": 1.0}, rel=EXACT)
    assert s["e2e_s"] == pytest.approx({"mean": 5 / 3, "p50": 2.0, "p90": 2.4, "p99": 2.49}, rel=EXACT)
    assert s["tpot_s"] == pytest.approx({"mean": 0.4375, "p50": 0.4375, "p90": 0.4875, "p99": 0.49875}, rel=EXACT)
    assert s["itl_s"] == pytest.approx({"mean": 2.5 / 3, "p50": 0.5, "p90": 1.3, "p99": 1.48}, rel=EXACT)
    assert s["queue_s"]["mean"] == pytest.approx(0.5 / 3, rel=EXACT)
    # good: request 1 (TTFT 0.5, one token) and request 2 (TTFT 1.0 <= 1.0, TPOT 0.375); request 0 has TPOT 0.5
    assert s["goodput_requests_per_s"] == pytest.approx(2 / 4.5, rel=EXACT)
    assert s["slo_attainment"] == pytest.approx(2 / 4, rel=EXACT)  # the rejected request is a miss
    assert s["slo_met"] is False  # 50 % < 90 %
    assert s["preemptions"] == 3
    assert s["prefix_cache_hit_rate"] == pytest.approx(10 / 60, rel=EXACT)
    assert s["saturated"] is False


def test_goodput_needs_every_slo() -> None:
    records = _three_requests()
    only_ttft = summarize(records, slo=SloSpec(ttft_s=0.9))
    assert only_ttft["goodput_requests_per_s"] == pytest.approx(1 / 4.5, rel=EXACT)  # request 1 only
    both = summarize(records, slo=SloSpec(ttft_s=0.9, tpot_s=0.45))
    assert both["goodput_requests_per_s"] == pytest.approx(1 / 4.5, rel=EXACT)
    e2e = summarize(records, slo=SloSpec(e2e_s=2.0, percentile=50))
    assert e2e["goodput_requests_per_s"] == pytest.approx(2 / 4.5, rel=EXACT)  # requests 0 and 1
    assert e2e["slo_met"] is True  # 2 of 4 = 50 % >= 50 %
    assert e2e["e2e_s"] == pytest.approx({"mean": 5 / 3, "p50": 2.0, "p90": 2.4, "p99": 2.49}, rel=EXACT)
    none = summarize(records)
    assert none["goodput_requests_per_s"] is None and none["slo_attainment"] is None


def test_tpot_excludes_one_token_requests() -> None:
    single = [RequestRecord(request_id=i, arrival_s=float(i), prompt_tokens=5, output_tokens=1, first_scheduled_s=i,
                            first_token_s=i + 0.2, finish_s=i + 0.2, token_times_s=(i + 0.2,), token_counts=(1,))
              for i in range(3)]
    s = summarize(single)
    assert s["tpot_s"] is None and s["itl_s"] is None
    assert s["ttft_s"]["mean"] == pytest.approx(0.2, rel=1e-9)
    assert single[0].tpot_s is None


def test_extra_slo_percentile_is_reported() -> None:
    s = summarize(_three_requests(), slo=SloSpec(ttft_s=2.0, percentile=95))
    assert s["e2e_s"]["p95"] == pytest.approx(2.0 + 0.9 * 0.5, rel=EXACT)  # index 1.9 of [0.5, 2.0, 2.5]


def test_rejected_requests_are_counted_not_timed() -> None:
    records = _three_requests()
    with_reject = summarize(records)
    without = summarize(records[:3])
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s", "request_throughput_per_s", "duration_s"):
        assert with_reject[key] == without[key]
    assert (with_reject["rejected"], without["rejected"]) == (1, 0)


def test_given_duration_and_empty_run() -> None:
    s = summarize(_three_requests(), duration_s=9.0)
    assert s["request_throughput_per_s"] == pytest.approx(3 / 9, rel=EXACT)
    empty = summarize([])
    assert empty["completed"] == 0 and empty["request_throughput_per_s"] == 0.0 and empty["ttft_s"] is None


def test_records_frame_columns_and_values() -> None:
    frame = records_frame(_three_requests())
    assert list(frame["request_id"]) == [0, 1, 2, 3]
    assert frame.loc[0, "tpot_s"] == pytest.approx(0.5, rel=EXACT)
    assert math.isnan(frame.loc[1, "tpot_s"]) and math.isnan(frame.loc[3, "ttft_s"])
    assert list(frame["rejected"]) == [False, False, False, True]
    assert list(frame["emissions"]) == [3, 1, 2, 0]
    assert all(name == "request_id" or "_" in name or name in ("replica", "emissions", "preemptions", "rejected")
               for name in frame.columns)


def test_record_checks_its_invariants() -> None:
    with pytest.raises(ValueError, match="token_counts"):
        RequestRecord(request_id=0, arrival_s=0.0, prompt_tokens=1, output_tokens=2, token_times_s=(1.0,))
    with pytest.raises(ValueError, match="precedes"):
        RequestRecord(request_id=0, arrival_s=1.0, prompt_tokens=1, output_tokens=1, first_token_s=0.5)
    with pytest.raises(ValueError, match="reject_reason"):
        RequestRecord(request_id=0, arrival_s=1.0, prompt_tokens=1, output_tokens=1, rejected=True)


def test_parse_slo() -> None:
    assert parse_slo(None) is None and parse_slo({}) is None
    assert parse_slo({"ttft_s": 2, "tpot_s": 0.1, "percentile": 99}) == SloSpec(ttft_s=2.0, tpot_s=0.1, percentile=99)
    with pytest.raises(ConfigError, match="slo: unknown keys \\['ttft'\\]"):
        parse_slo({"ttft": 2.0})
    with pytest.raises(ConfigError, match="slo.tpot_s = -0.1"):
        parse_slo({"tpot_s": -0.1})
    with pytest.raises(ConfigError, match="slo.percentile"):
        parse_slo({"ttft_s": 1.0, "percentile": 0})
    with pytest.raises(ConfigError, match="at least one"):
        parse_slo({"percentile": 90})


# ------------------------------------------------------------------ saturation


def _single_server(rate_per_s: float, service_s: float, count: int, seed: int,
                   horizon_s: float = math.inf) -> list[RequestRecord]:
    """FIFO single server with deterministic service (M/D/1) via Lindley's recursion; requests not
    finished by ``horizon_s`` are left unfinished (never scheduled if they had not started)."""
    rng = np.random.default_rng(seed)
    arrivals = np.concatenate(([0.0], np.cumsum(rng.exponential(1 / rate_per_s, count - 1))))
    records, free_s = [], 0.0
    for i, arrival in enumerate(arrivals):
        start = max(arrival, free_s)
        free_s = start + service_s
        done = free_s <= horizon_s
        records.append(RequestRecord(
            request_id=i, arrival_s=float(arrival), prompt_tokens=10, output_tokens=1,
            first_scheduled_s=start if start <= horizon_s else None,
            first_token_s=free_s if done else None, finish_s=free_s if done else None,
            token_times_s=(free_s,) if done else (), token_counts=(1,) if done else (),
        ))
    return records


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("load", [0.5, 0.9, 0.95])
def test_stable_md1_is_not_saturated(seed: int, load: float) -> None:
    records = _single_server(load, 1.0, 3000, seed)
    assert not saturated(records, load)
    assert summarize(records, offered_rate_per_s=load)["saturated"] is False


@pytest.mark.parametrize("seed", [0, 1])
def test_overloaded_queue_is_saturated(seed: int) -> None:
    assert saturated(_single_server(1.2, 1.0, 3000, seed), 1.2)
    # the run stops before the backlog drains: unfinished requests are still a growing queue
    assert saturated(_single_server(1.2, 1.0, 3000, seed, horizon_s=2000.0), 1.2)


def test_each_request_waiting_longer_is_saturated() -> None:
    # arrivals every 1 s, service 1.5 s: request i waits 0.5 * i s
    records = [RequestRecord(request_id=i, arrival_s=float(i), prompt_tokens=1, output_tokens=1,
                             first_scheduled_s=1.5 * i, first_token_s=1.5 * i + 1.5, finish_s=1.5 * i + 1.5,
                             token_times_s=(1.5 * i + 1.5,), token_counts=(1,)) for i in range(100)]
    assert saturated(records, 1.0)
    assert saturated(records, None)  # realized rate (n - 1) / span = 1/s


def test_offline_and_tiny_runs_are_not_saturated() -> None:
    offline = [RequestRecord(request_id=i, arrival_s=0.0, prompt_tokens=1, output_tokens=1, first_scheduled_s=float(i),
                             first_token_s=i + 1.0, finish_s=i + 1.0, token_times_s=(i + 1.0,), token_counts=(1,))
               for i in range(50)]
    assert not saturated(offline, None)
    assert not saturated(_single_server(5.0, 1.0, 5, 0), 5.0)
