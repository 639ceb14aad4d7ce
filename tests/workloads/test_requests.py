"""Request streams: arrival processes, length distributions, sessions, trace readers, errors."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from workloads.errors import WorkloadError
from workloads.requests import (
    LengthSpec,
    RequestSpec,
    WorkloadSpec,
    arrival_times_s,
    build_requests,
    parse_length,
    parse_workload,
    read_trace,
)

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
EXAMPLES = ROOT / "examples" / "data"


def _cv(times: np.ndarray) -> float:
    gaps = np.diff(times)
    return float(gaps.std() / gaps.mean())


# ------------------------------------------------------------------ arrivals


def test_poisson_rate_within_3_percent_and_cv_one() -> None:
    times = arrival_times_s("poisson", 20_000, 8.0, 1.0, np.random.default_rng(1))
    assert times[0] == 0.0 and np.all(np.diff(times) >= 0)
    # 20,000 exponential gaps: relative standard error of the mean rate is 1/sqrt(20,000) = 0.7 %,
    # so 3 % is > 4 sigma; the CV of exponential gaps is exactly 1 (same standard error).
    assert (len(times) - 1) / times[-1] == pytest.approx(8.0, rel=0.03)
    assert _cv(times) == pytest.approx(1.0, rel=0.03)


@pytest.mark.parametrize("shape", [0.25, 4.0])
def test_gamma_cv_is_one_over_sqrt_shape(shape: float) -> None:
    times = arrival_times_s("gamma", 20_000, 5.0, shape, np.random.default_rng(2))
    assert (len(times) - 1) / times[-1] == pytest.approx(5.0, rel=0.05)
    # vLLM benchmark: gamma(shape=k, scale=1/(rate*k)) has CV = 1/sqrt(k): 2.0 for k = 0.25, 0.5 for k = 4.
    assert _cv(times) == pytest.approx(1 / math.sqrt(shape), rel=0.05)


def test_offline_all_at_zero() -> None:
    spec = parse_workload({"arrival": "offline", "num_requests": 50, "prompt_tokens": 10, "output_tokens": 5})
    requests = build_requests(spec, np.random.default_rng(0))
    assert [r.arrival_s for r in requests] == [0.0] * 50
    assert [r.request_id for r in requests] == list(range(50))
    assert {(r.prompt_tokens, r.output_tokens) for r in requests} == {(10, 5)}


def test_same_seed_same_stream_and_different_seed_differs() -> None:
    table = {
        "arrival": "gamma", "rate_per_s": 3.0, "burstiness": 0.5, "num_requests": 200,
        "prompt_tokens": {"distribution": "lognormal", "median": 500, "sigma": 0.8},
        "output_tokens": {"distribution": "uniform", "min": 10, "max": 300},
    }
    spec = parse_workload(table)
    first = build_requests(spec, np.random.default_rng(7))
    assert first == build_requests(spec, np.random.default_rng(7))
    assert first != build_requests(spec, np.random.default_rng(8))
    assert [r.request_id for r in first] == list(range(200))
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(first, first[1:]))


# ------------------------------------------------------------------ lengths


@pytest.mark.parametrize(
    ("table", "stat", "expected", "rel"),
    [
        ({"distribution": "normal", "mean": 800, "std": 100}, np.mean, 800, 0.01),
        ({"distribution": "lognormal", "median": 1020, "sigma": 1.0}, np.median, 1020, 0.03),
        ({"distribution": "lognormal", "mean": 1155, "sigma": 0.9}, np.mean, 1155, 0.03),
        ({"distribution": "lognormal", "mu": math.log(300), "sigma": 0.5}, np.median, 300, 0.03),
        ({"distribution": "uniform", "min": 100, "max": 300}, np.mean, 200, 0.01),
    ],
)
def test_distribution_hits_stated_statistic(table: dict, stat, expected: float, rel: float) -> None:
    # 20,000 draws: standard errors are well under 1 % for these spreads.
    draws = parse_length(table, "workload.prompt_tokens").sample(np.random.default_rng(3), 20_000)
    assert stat(draws) == pytest.approx(expected, rel=rel)


def test_uniform_is_inclusive_and_fixed_is_constant() -> None:
    draws = parse_length({"distribution": "uniform", "min": 3, "max": 5}, "x").sample(np.random.default_rng(0), 3000)
    assert set(draws.tolist()) == {3, 4, 5}
    assert parse_length(64, "x").sample(np.random.default_rng(0), 4).tolist() == [64] * 4
    assert parse_length({"distribution": "fixed", "value": 9}, "x").nominal_mean() == 9


def test_zipf_bounded_probabilities() -> None:
    spec = parse_length({"distribution": "zipf", "exponent": 1.2, "min": 10, "max": 19}, "x")
    weights = np.arange(1, 11, dtype=float) ** -1.2
    draws = spec.sample(np.random.default_rng(4), 50_000)
    assert draws.min() >= 10 and draws.max() <= 19
    # P(min) = 1 / sum_r r^-1.2 over 10 ranks = 0.3353; binomial standard error 0.2 %.
    assert np.mean(draws == 10) == pytest.approx(1 / weights.sum(), abs=0.01)
    assert draws.mean() == pytest.approx(spec.nominal_mean(), rel=0.01)
    assert spec.nominal_mean() == pytest.approx(10 + np.dot(np.arange(10), weights) / weights.sum(), rel=1e-12)


def test_clipping_to_min_one_and_max() -> None:
    draws = parse_length({"distribution": "normal", "mean": 5, "std": 50, "max": 40}, "x").sample(
        np.random.default_rng(5), 5000
    )
    assert draws.min() == 1 and draws.max() == 40


def test_empirical_samples_the_column() -> None:
    spec = parse_length(
        {"distribution": "empirical", "path": "azure_2023_conv_sample.csv", "column": "num_decode_tokens"}, "x", DATA
    )
    column = [r.output_tokens for r in read_trace(DATA / "azure_2023_conv_sample.csv")]
    assert sorted(spec.values) == sorted(column)
    draws = spec.sample(np.random.default_rng(6), 20_000)
    assert set(draws.tolist()) <= set(column)
    assert draws.mean() == pytest.approx(np.mean(column), rel=0.03)


# ------------------------------------------------------------------ sessions and prefixes


def test_sessions_grow_prompts_and_share_prefix_blocks() -> None:
    spec = parse_workload({
        "arrival": "poisson", "rate_per_s": 2.0, "num_requests": 400, "prompt_tokens": 50, "output_tokens": 30,
        "shared_prefix_tokens": 64, "prefix_block_tokens": 16,
        "sessions": {"turns": 3, "think_time_s": 5.0},
    })
    requests = build_requests(spec, np.random.default_rng(9))
    assert len(requests) == 400 and [r.request_id for r in requests] == list(range(400))
    by_session: dict[int, list[RequestSpec]] = {}
    for r in requests:
        by_session.setdefault(r.session_id, []).append(r)
    complete = [turns for turns in by_session.values() if len(turns) == 3]
    assert complete
    for turns in complete:
        # turn k = shared 64 + sum of earlier (50 user + 30 output) + 50 new user tokens
        assert [t.prompt_tokens for t in turns] == [114, 194, 274]
        for earlier, later in zip(turns, turns[1:]):
            assert later.arrival_s >= earlier.arrival_s
            assert later.prefix_hashes[: len(earlier.prefix_hashes)] == earlier.prefix_hashes
        assert [len(t.prefix_hashes) for t in turns] == [114 // 16, 194 // 16, 274 // 16]
    # the 4 blocks of the shared prefix are the same in every session; the rest are not shared
    heads = {r.prefix_hashes[:4] for r in requests}
    assert len(heads) == 1
    tails = [set(turns[0].prefix_hashes[4:]) for turns in by_session.values()]
    assert all(a.isdisjoint(b) for a, b in zip(tails, tails[1:]))


def test_session_max_context_stops_the_session() -> None:
    spec = parse_workload({
        "arrival": "poisson", "rate_per_s": 0.001, "num_requests": 30, "prompt_tokens": 100, "output_tokens": 100,
        "sessions": {"turns": 10, "think_time_s": 1.0, "max_context_tokens": 500},
    })
    requests = build_requests(spec, np.random.default_rng(0))
    # sessions start ~1,000 s apart and their turns ~1 s apart: the 30 earliest requests are whole sessions
    # turn prompts 100, 300, 500: 300 + 100 = 400 <= 500 kept, 500 + 100 > 500 stops: 2 turns each
    assert {r.prompt_tokens for r in requests} == {100, 300}
    assert max(r.prompt_tokens + r.output_tokens for r in requests) <= 500
    assert len({r.session_id for r in requests}) == 15
    offline = build_requests(parse_workload({"arrival": "offline", "num_requests": 30, "prompt_tokens": 100,
                                             "output_tokens": 100, "sessions": {"turns": 10, "think_time_s": 1.0}}),
                             np.random.default_rng(0))
    # offline: all 30 sessions start at t = 0, so the 30 earliest requests are their first turns
    assert {(r.arrival_s, r.prompt_tokens) for r in offline} == {(0.0, 100)}


def test_shared_prefix_without_sessions() -> None:
    spec = parse_workload({
        "arrival": "offline", "num_requests": 3, "prompt_tokens": 40, "output_tokens": 2, "shared_prefix_tokens": 32,
    })
    a, b, c = build_requests(spec, np.random.default_rng(0))
    assert a.prompt_tokens == 72 and len(a.prefix_hashes) == 4
    assert a.prefix_hashes[:2] == b.prefix_hashes[:2] == c.prefix_hashes[:2]
    assert a.prefix_hashes[2] != b.prefix_hashes[2]
    plain = build_requests(parse_workload({"arrival": "offline", "num_requests": 2, "prompt_tokens": 40,
                                           "output_tokens": 2}), np.random.default_rng(0))
    assert plain[0].prefix_hashes == ()


# ------------------------------------------------------------------ traces


def test_trace_reader_converted_samples() -> None:
    conv = read_trace(DATA / "azure_2023_conv_sample.csv")
    assert len(conv) == 300
    assert conv[0] == RequestSpec(request_id=0, arrival_s=0.0, prompt_tokens=374, output_tokens=44)
    assert (conv[1].arrival_s, conv[1].prompt_tokens, conv[1].output_tokens) == (4.314579, 396, 109)
    code = read_trace(DATA / "azure_2023_code_sample.csv", limit=4)
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in code] == [
        (0.0, 4808, 10), (0.052, 3180, 8), (0.098189, 110, 27), (0.140684, 7433, 14)
    ]


def test_trace_reader_original_azure_columns_match_converted() -> None:
    original = read_trace(DATA / "azure_2023_conv_original_columns.csv")
    converted = read_trace(DATA / "azure_2023_conv_sample.csv", limit=20)
    assert len(original) == 20
    for a, b in zip(original, converted):
        assert (a.prompt_tokens, a.output_tokens) == (b.prompt_tokens, b.output_tokens)
        assert a.arrival_s == pytest.approx(b.arrival_s, abs=1e-6)  # microsecond date-time resolution


def test_trace_reader_mooncake_jsonl() -> None:
    requests = read_trace(DATA / "mooncake_format_sample.jsonl")
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in requests] == [
        (0.0, 1200, 40), (0.25, 1100, 12), (0.25, 300, 7), (0.9, 600, 1), (1.0, 2048, 100)
    ]
    # hash_ids cover 512-token blocks; only full blocks are kept (1200 tokens -> 2 blocks)
    assert [r.prefix_hashes for r in requests] == [(0, 1), (0, 1), (), (6,), (0, 1, 2, 5)]
    assert {r.prefix_block_tokens for r in requests} == {512}
    assert requests[3].session_id == 3 and requests[0].session_id is None


def test_conversation_trace_statistics_match_readme() -> None:
    requests = read_trace(EXAMPLES / "azure-2023-conv.csv")
    # ../shared/data/traces/README.md and formulas.md "Public request traces": 19,366 requests over
    # 3,502 s, prompt median 1,020, output median 129.
    assert len(requests) == 19_366
    assert np.median([r.prompt_tokens for r in requests]) == 1020
    assert np.median([r.output_tokens for r in requests]) == 129
    assert requests[-1].arrival_s == pytest.approx(3502, rel=0.01)


def test_trace_workload_limit_and_rescaling() -> None:
    base = {"arrival": "trace", "trace": "azure_2023_conv_sample.csv", "num_requests": 100}
    plain = build_requests(parse_workload(base, DATA), np.random.default_rng(0))
    assert len(plain) == 100
    halved = build_requests(parse_workload({**base, "time_scale": 0.5}, DATA), np.random.default_rng(0))
    assert [r.arrival_s for r in halved] == pytest.approx([r.arrival_s / 2 for r in plain], rel=1e-12)
    rated = build_requests(parse_workload({**base, "rate_per_s": 10.0}, DATA), np.random.default_rng(0))
    assert 99 / rated[-1].arrival_s == pytest.approx(10.0, rel=1e-12)
    assert [r.prompt_tokens for r in rated] == [r.prompt_tokens for r in plain]
    relengthed = build_requests(parse_workload({**base, "output_tokens": 7}, DATA), np.random.default_rng(0))
    assert {r.output_tokens for r in relengthed} == {7}


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("table", "field"),
    [
        ({"arrival": "poisson", "rate_per_s": 1.0, "num_requests": 5, "prompt_tokens": {"distribution": "pareto"},
          "output_tokens": 5}, "workload.prompt_tokens.distribution"),
        ({"arrival": "poisson", "rate_per_s": -2.0, "num_requests": 5, "prompt_tokens": 5, "output_tokens": 5},
         "workload.rate_per_s"),
        ({"arrival": "trace", "trace": "no_such_trace.csv"}, "workload.trace"),
        ({"arrival": "uniform", "num_requests": 5, "prompt_tokens": 5, "output_tokens": 5}, "workload.arrival"),
        ({"arrival": "gamma", "num_requests": 5, "prompt_tokens": 5, "output_tokens": 5}, "workload.rate_per_s"),
        ({"arrival": "poisson", "rate_per_s": 1.0, "num_requests": 5, "prompt_tokens": 5, "output_tokens": 5,
          "burstines": 2.0}, "burstines"),
        ({"arrival": "poisson", "rate_per_s": 1.0, "num_requests": 5, "output_tokens": 5,
          "prompt_tokens": {"distribution": "lognormal", "median": 100}}, "workload.prompt_tokens"),
        ({"arrival": "poisson", "rate_per_s": 1.0, "num_requests": 5, "output_tokens": 5,
          "prompt_tokens": {"distribution": "empirical", "path": "azure_2023_conv_sample.csv", "column": "x"}},
         "workload.prompt_tokens.column"),
        ({"arrival": "offline", "num_requests": 5, "prompt_tokens": 0, "output_tokens": 5}, "workload.prompt_tokens"),
    ],
)
def test_errors_name_the_field(table: dict, field: str) -> None:
    with pytest.raises(WorkloadError, match=field.replace(".", r"\.")):
        parse_workload(table, DATA)


def test_read_trace_errors(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="not found"):
        read_trace(tmp_path / "missing.csv")
    bad = tmp_path / "bad.csv"
    bad.write_text("time,in,out\n0,1,2\n")
    with pytest.raises(WorkloadError, match="arrived_at,num_prefill_tokens,num_decode_tokens"):
        read_trace(bad)


def test_workload_spec_validates_directly() -> None:
    with pytest.raises(WorkloadError, match="burstiness"):
        WorkloadSpec(arrival="gamma", rate_per_s=1.0, burstiness=0.0, num_requests=1,
                     prompt_tokens=LengthSpec(value=1), output_tokens=LengthSpec(value=1))
