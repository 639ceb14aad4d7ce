"""The SimPy serving engine: exact timeline of a tiny case, invariants, M/D/1 oracle, determinism."""

from __future__ import annotations

import numpy as np
import pytest

from sim.config import resolve_cluster
from sim.runner import RunOptions, simulate
from sim.serving.config import parse_serving
from sim.serving.request import SimRequest, Status
from sim.serving.result import to_record
from sim.serving.run import build_system, run
from workloads.catalog import get_model


def _system(serving: dict, *, step_s: float | None = 1.0, capacity_blocks: int | None = 1000, gpu: str = "a100-sxm-80gb"):  # type: ignore[no-untyped-def]
    spec = parse_serving(serving)
    gpus = spec.replicas * spec.tp * spec.pp
    cluster = resolve_cluster({"cluster": {"gpu": gpu, "num_gpus": max(gpus, 2)}})
    step_cost = (lambda plan: step_s) if step_s is not None else None
    return build_system(spec, get_model("llama3-8b"), cluster, step_cost=step_cost, capacity_blocks=capacity_blocks)


def test_exact_timeline_three_requests_constant_cost() -> None:
    # one replica, step = 1 s whatever the batch; A at 0 (prompt 4, 3 tokens), B at 0.5 (2 tokens),
    # C at 2.5 (1 token). Steps: [0,1] A prefill; [1,2] A decode + B prefill; [2,3] A, B decode;
    # [3,4] C prefill.
    system = _system({"tp": 1, "scheduler": "vllm", "block_size": 4})
    requests = [SimRequest(0, 0.0, 4, 3), SimRequest(1, 0.5, 4, 2), SimRequest(2, 2.5, 4, 1)]
    replicas, rejected, _ = run(system, requests, rng=np.random.default_rng(0))
    assert not rejected
    log = [(r.request_id, r.first_scheduled_s, tuple(r.token_times_s), r.finish_s) for r in requests]
    assert log == [
        (0, 0.0, (1.0, 2.0, 3.0), 3.0),
        (1, 1.0, (2.0, 3.0), 3.0),
        (2, 3.0, (4.0,), 4.0),
    ]
    assert replicas[0].steps == 4 and replicas[0].busy_s == pytest.approx(4.0, rel=1e-12)  # pure arithmetic


@pytest.mark.parametrize("scheduler", ["vllm", "sarathi", "orca", "static"])
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_invariants_under_memory_pressure(scheduler: str, mode: str) -> None:
    serving = {"tp": 1, "scheduler": scheduler, "block_size": 4, "max_num_seqs": 16, "max_batched_tokens": 64,
               "chunk_size": 32, "preemption_mode": mode, "swap_space_GiB": 0.001, "max_model_len": 200}
    system = _system(serving, step_s=None, capacity_blocks=60)
    rng = np.random.default_rng(3)
    arrivals = np.cumsum(rng.exponential(0.02, size=120))
    requests = [
        SimRequest(i, float(t), int(rng.integers(1, 100)), int(rng.integers(1, 60)))
        for i, t in enumerate(arrivals)
    ]
    requests.append(SimRequest(999, float(arrivals[-1]), 400, 10))  # 410 tokens > 60 blocks x 4: never fits
    replicas, rejected, _ = run(system, requests, rng=rng)
    blocks = replicas[0].scheduler.blocks
    assert blocks.peak_used <= blocks.capacity
    blocks.check()
    assert blocks.available == blocks.capacity  # everything released at the end
    assert [r.request_id for r in rejected] == [999] and "never" not in rejected[0].reject_reason
    for r in requests:
        assert r.status in (Status.FINISHED, Status.REJECTED)
        if r.status == Status.FINISHED:
            assert r.generated == r.output_tokens
            assert r.arrival_s <= r.first_scheduled_s <= r.first_token_s <= r.finish_s  # type: ignore[operator]
            assert list(r.token_times_s) == sorted(r.token_times_s)
            assert sum(r.token_counts) == r.output_tokens
        to_record(r)  # the record validates its own ordering
    if scheduler in ("orca", "static"):
        assert sum(r.preemptions for r in requests) == 0


def test_md1_mean_wait_matches_queueing_formula() -> None:
    # one request at a time, deterministic service D (one 1-token step), Poisson arrivals at rho = 0.5:
    # mean wait lambda D^2 / (2 (1 - rho)); 5 % tolerance (the bound) over 60,000 requests,
    # first 1,000 trimmed as warm-up.
    service_s, rate = 0.01, 50.0
    system = _system({"tp": 1, "max_num_seqs": 1}, step_s=service_s)
    rng = np.random.default_rng(11)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, size=60_000))
    requests = [SimRequest(i, float(t), 8, 1) for i, t in enumerate(arrivals)]
    run(system, requests, rng=rng)
    waits = np.array([r.first_scheduled_s - r.arrival_s for r in requests[1000:]])  # type: ignore[operator]
    rho = rate * service_s
    expected = rate * service_s**2 / (2 * (1 - rho))
    assert waits.mean() == pytest.approx(expected, rel=0.05)


CONFIG = {
    "model": {"name": "llama3-8b"},
    "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 1},
    "serving": {"tp": 1, "scheduler": "vllm"},
    "workload": {"arrival": "poisson", "rate_per_s": 5.0, "num_requests": 60,
                 "prompt_tokens": {"distribution": "uniform", "min": 50, "max": 800},
                 "output_tokens": {"distribution": "uniform", "min": 5, "max": 100}},
    "slo": {"ttft_s": 1.0, "tpot_s": 0.05},
}


def test_determinism_by_seed() -> None:
    a = simulate(CONFIG, RunOptions(seed=1)).metrics()
    b = simulate(CONFIG, RunOptions(seed=1)).metrics()
    c = simulate(CONFIG, RunOptions(seed=2)).metrics()
    assert a == b
    assert a["e2e_s"] != c["e2e_s"]
    assert a["completed"] == 60 and a["fits_in_memory"]


def test_metrics_fields_of_the_interface() -> None:
    m = simulate(CONFIG, RunOptions(seed=0)).metrics()
    for key in ("num_requests", "completed", "duration_s", "request_throughput_per_s", "output_tokens_per_s",
                "total_tokens_per_s", "ttft_s", "tpot_s", "itl_s", "e2e_s", "goodput_requests_per_s",
                "slo_attainment", "saturated", "preemptions"):
        assert key in m
    assert set(m["ttft_s"]) >= {"mean", "p50", "p90", "p99"}
