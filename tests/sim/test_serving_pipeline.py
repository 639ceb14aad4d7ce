"""Pipeline parallelism in serving: up to pp batches in flight, each stage busy with a different one.

Closed forms with constant per-stage costs (binary fractions, so every time is exact): a batch's
step takes host + pp stages + (pp - 1) hops of latency, and with two alternating groups of requests
a PP=2 replica completes a step every (2 stage + hop) / 2 on average, twice the rate of running the
same stages one batch at a time.
"""

from __future__ import annotations

import numpy as np
import pytest

from sim.config import resolve_cluster
from sim.serving.config import parse_serving
from sim.serving.plan import Chunk, StepPlan
from sim.serving.request import SimRequest
from sim.serving.run import build_system, pipeline_stage_cost, run
from workloads.catalog import get_model

STAGE_S = 1.0
HOP_S = 0.25


def _system(pp: int, scheduler: str = "vllm", *, stage_cost=None, step_cost=None):  # type: ignore[no-untyped-def]
    # token budget 16 with 4-token prompts: the first batch takes 4 requests, the next batch the rest
    spec = parse_serving({"tp": 1, "pp": pp, "scheduler": scheduler, "block_size": 4, "max_num_seqs": 8,
                          "max_batched_tokens": 16})
    cluster = resolve_cluster({"cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8}})
    return build_system(spec, get_model("llama3-8b"), cluster, step_cost=step_cost, capacity_blocks=1000,
                        stage_cost=stage_cost)


def _requests(count: int, output: int) -> list[SimRequest]:
    return [SimRequest(i, 0.0, 4, output) for i in range(count)]


def test_pp2_two_groups_alternate_on_the_stages_exact_timeline() -> None:
    system = _system(2, stage_cost=lambda plan: (0.0, STAGE_S, HOP_S))
    requests = _requests(8, 5)
    replicas, rejected, events = run(system, requests, rng=np.random.default_rng(0), trace=True)
    assert not rejected
    cycle = 2 * STAGE_S + HOP_S  # latency per token = sum of the stages + the transfer
    for r in requests[:4]:  # group A: issued at 0, 2.25, 4.5, ...
        assert tuple(r.token_times_s) == tuple(cycle * (k + 1) for k in range(5))
    for r in requests[4:]:  # group B: issued when stage 0 frees up, one stage later
        assert tuple(r.token_times_s) == tuple(STAGE_S + cycle * (k + 1) for k in range(5))
    replica = replicas[0]
    assert replica.steps == 10
    makespan = max(r.finish_s for r in requests)
    assert makespan == STAGE_S + 5 * cycle
    # no stage ever runs two batches at once
    for stage in (0, 1):
        spans = sorted((e.start_s, e.start_s + e.duration_s) for e in events if e.stage == stage)
        assert len(spans) == 10
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))
    assert 0.0 < replica.busy_s / makespan <= 1.0


def test_pp2_step_rate_is_twice_that_of_one_batch_at_a_time() -> None:
    requests = _requests(8, 40)
    replicas, _, _ = run(_system(2, stage_cost=lambda plan: (0.0, STAGE_S, HOP_S)), requests,
                         rng=np.random.default_rng(0))
    makespan = max(r.finish_s for r in requests)
    # closed form: 40 steps per group, two groups, group B one stage behind group A
    assert makespan == STAGE_S + 40 * (2 * STAGE_S + HOP_S)
    step_rate = replicas[0].steps / makespan
    sequential_rate = 1.0 / (2 * STAGE_S + HOP_S)  # a step passes both stages and the hop alone
    assert step_rate / sequential_rate == pytest.approx(2.0, rel=0.02)


def test_static_batches_pass_the_stages_one_step_at_a_time() -> None:
    requests = _requests(8, 5)
    replicas, _, _ = run(_system(2, "static", stage_cost=lambda plan: (0.0, STAGE_S, HOP_S)), requests,
                         rng=np.random.default_rng(0))
    assert replicas[0].depth == 1
    # one batch of 8: a prefill step and 4 decode steps, each of 2 stages + 1 hop
    assert max(r.finish_s for r in requests) == 5 * (2 * STAGE_S + HOP_S)


def test_requests_in_flight_are_not_scheduled_again() -> None:
    system = _system(2, stage_cost=lambda plan: (0.0, STAGE_S, HOP_S))
    requests = _requests(8, 3)
    replicas, _, _ = run(system, requests, rng=np.random.default_rng(0))
    scheduler = replicas[0].scheduler
    assert scheduler.in_flight == set()  # every step completed
    for r in requests:
        gaps = np.diff([0.0, *r.token_times_s])
        assert np.all(gaps >= 2 * STAGE_S + HOP_S)  # one step at a time per request


def test_step_cost_split_keeps_the_step_latency() -> None:
    system = _system(4)
    cost = system.pools[0].cost
    stage_cost = pipeline_stage_cost(cost, 4)
    reqs = [SimRequest(i, 0.0, 300 + 50 * i, 10) for i in range(6)]
    plan = StepPlan(chunks=tuple(
        [Chunk(reqs[0], 256, 0, False)] + [Chunk(r, 1, r.prompt_tokens, True) for r in reqs[1:]]
    ))
    host_s, stage_s, hop_s = stage_cost(plan)
    assert host_s == pytest.approx(cost.step_overhead_s + cost.request_overhead_s * 6, rel=1e-12)
    assert hop_s > 0.0 and stage_s > hop_s
    assert host_s + 4 * stage_s + 3 * hop_s == pytest.approx(cost.step_time_s(plan), rel=1e-12)


def test_pp_run_with_real_costs_beats_the_same_stages_without_overlap() -> None:
    # saturating offline load: the overlapped replica finishes sooner than sequential stages would
    rng = np.random.default_rng(5)
    def fresh() -> list[SimRequest]:  # noqa: E306
        r = np.random.default_rng(5)
        return [SimRequest(i, 0.0, int(r.integers(50, 400)), int(r.integers(20, 120))) for i in range(120)]
    spec = parse_serving({"tp": 1, "pp": 2, "scheduler": "vllm", "max_num_seqs": 32, "max_batched_tokens": 512})
    cluster = resolve_cluster({"cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8}})
    model = get_model("llama3-8b")
    overlapped = fresh()
    run(build_system(spec, model, cluster), overlapped, rng=rng)
    sequential = fresh()
    cost = build_system(spec, model, cluster).pools[0].cost
    run(build_system(spec, model, cluster, step_cost=cost.step_time_s,
                     stage_cost=lambda plan: (cost.step_time_s(plan), 0.0, 0.0)),
        sequential, rng=rng)
    t_overlap = max(r.finish_s for r in overlapped)
    t_sequential = max(r.finish_s for r in sequential)
    assert all(r.finish_s is not None for r in overlapped + sequential)
    assert 1.3 < t_sequential / t_overlap <= 2.0, t_sequential / t_overlap  # 1.85 when written


@pytest.mark.parametrize("scheduler", ["vllm", "sarathi", "orca"])
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_pipelined_invariants_under_memory_pressure(scheduler: str, mode: str) -> None:
    spec = parse_serving({"tp": 1, "pp": 2, "scheduler": scheduler, "block_size": 4, "max_num_seqs": 16,
                          "max_batched_tokens": 64, "chunk_size": 32, "preemption_mode": mode,
                          "swap_space_GiB": 0.001, "max_model_len": 200})
    cluster = resolve_cluster({"cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 2}})
    system = build_system(spec, get_model("llama3-8b"), cluster, capacity_blocks=60)
    rng = np.random.default_rng(3)
    arrivals = np.cumsum(rng.exponential(0.02, size=120))
    requests = [SimRequest(i, float(t), int(rng.integers(1, 100)), int(rng.integers(1, 60)))
                for i, t in enumerate(arrivals)]
    replicas, rejected, events = run(system, requests, rng=rng, trace=True)
    scheduler_ = replicas[0].scheduler
    assert scheduler_.in_flight == set()
    blocks = scheduler_.blocks
    assert blocks.peak_used <= blocks.capacity
    blocks.check()
    assert blocks.available == blocks.capacity
    assert all(r.finish_s is not None for r in requests if r not in rejected)
    for r in requests:
        if r.finish_s is not None:
            assert sum(r.token_counts) == r.output_tokens
            assert list(r.token_times_s) == sorted(r.token_times_s)
    for stage in (0, 1):
        spans = sorted((e.start_s, e.start_s + e.duration_s) for e in events if e.stage == stage)
        assert all(a_end <= b_start + 1e-12 for (_, a_end), (b_start, _) in zip(spans, spans[1:]))
