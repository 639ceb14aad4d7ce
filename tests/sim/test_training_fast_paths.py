"""The search fast path's pieces agree exactly with the straightforward ones they replace."""

from __future__ import annotations

import copy
import dataclasses
import gc

from sim.runner import RunOptions
from sim.training.analytic import analytic_iteration_classes, finish_iteration, pipeline_phase
from sim.training.config import parse_training
from sim.training.estimate import estimate_training
from sim.training.iteration import build_iteration_classes, stage_layout
from sim.training.memory import peak_stage_memory, stage_memory_class
from sim.training.pricing_cache import PricingCache
from sim.training.run import simulate_training, training_metrics
from workloads.plan import ParallelPlan, TrainingJob

CONFIG = {
    "model": {"name": "gpt3-175b"},
    "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 256},
    "training": {"seq_len": 2048, "global_batch": 256, "micro_batch": 1, "precision": "bf16"},
    "parallel": {"tp": 8, "pp": 8, "schedule": "interleaved", "virtual_stages": 3, "zero": 1},
}


def test_phase_then_finish_is_the_closed_form() -> None:
    setup = parse_training(CONFIG)
    priced = build_iteration_classes(setup)
    chunk_of = [c.chunk for c in priced.classes]
    kwargs = dict(
        schedule=priced.schedule, num_microbatches=priced.num_microbatches, virtual_stages=priced.virtual_stages,
        p2p_bandwidth_Bps=priced.p2p_bandwidth_Bps, p2p_latency_s=priced.p2p_latency_s,
    )
    phase = pipeline_phase(chunk_of, priced.layout.stage_class, **kwargs)
    before = dict(phase.exposed_comm_s)
    split = finish_iteration(
        phase, chunk_of, [c.data_parallel for c in priced.classes], priced.layout.stage_class,
        num_microbatches=priced.num_microbatches, overlap_slowdown=priced.overlap_slowdown,
    )
    whole = analytic_iteration_classes(
        [(c.chunk, c.data_parallel) for c in priced.classes], priced.layout.stage_class, **kwargs,
        overlap_slowdown=priced.overlap_slowdown,
    )
    assert split == whole
    assert phase.exposed_comm_s == before  # the shared phase is never modified
    assert list(split.exposed_comm_s) == ["tp", "cp", "ep", "pp", "dp"]


def test_first_stages_of_memory_classes() -> None:
    setup = parse_training(CONFIG)
    layout = stage_layout(setup, PricingCache())
    assert layout.memory_first_stage == tuple(layout.memory_class.index(k) for k in range(len(layout.memory_kinds)))
    assert list(layout.memory_first_stage) == sorted(layout.memory_first_stage)
    model, plan, job = setup.model, setup.plan, setup.job
    kinds = tuple(
        stage_memory_class(model, plan, job, dense_layers=d, moe_layers=m, first=f, last=last, recomputed_layers=r)
        for d, m, f, last, r in layout.memory_kinds
    )
    m = setup.num_microbatches
    capacity = setup.cluster.gpu.hbm_capacity_bytes
    given = peak_stage_memory(kinds, layout.memory_class, plan, m, capacity_bytes=capacity,
                              first_stages=layout.memory_first_stage)
    assert given == peak_stage_memory(kinds, layout.memory_class, plan, m, capacity_bytes=capacity)
    assert given.stage in layout.memory_first_stage


def test_training_metrics_is_the_result_metrics() -> None:
    result = simulate_training(CONFIG, RunOptions(fidelity="analytic"))
    direct = training_metrics(
        result.setup, result.estimate, result.memory,
        recompute_flops_per_replica=result.work.recompute_flops_per_replica, fidelity=result.fidelity,
    )
    # cost_sources describes where simulate's op costs came from; the search fast path skips it
    metrics = {k: v for k, v in result.metrics().items() if k != "cost_sources"}
    assert direct == metrics
    assert estimate_training(parse_training(CONFIG)) == metrics


def test_returned_metrics_are_the_callers_to_modify() -> None:
    setup = parse_training(CONFIG)
    cache = PricingCache()
    first = estimate_training(setup, cache)
    expected = estimate_training(setup)
    for value in first.values():
        if isinstance(value, dict):
            value.clear()
    first.clear()
    assert estimate_training(setup, cache) == expected


def test_cache_keeps_no_plan_or_job_alive() -> None:
    """Keys hold field values, so a search's plans and jobs are freed after each evaluation."""
    base = parse_training(CONFIG)
    cache = PricingCache()
    for zero in (0, 1, 3):
        setup = dataclasses.replace(base, plan=dataclasses.replace(base.plan, zero=zero),
                                    job=dataclasses.replace(base.job))
        estimate_training(setup, cache)
    del setup
    gc.collect()
    referenced = gc.get_referents(*cache._tables.values(), cache._ids)
    keys = [k for k in referenced if isinstance(k, tuple)]
    flat = [item for key in keys for item in key]
    assert not any(isinstance(item, (ParallelPlan, TrainingJob)) for item in flat)


def test_a_shared_cache_keeps_each_plans_logits_memory() -> None:
    # interleaved at m == pp holds every micro-batch's logits on the last chunk, plain 1F1B (v = 1)
    # one: plans alike but for v share memory kinds, not memory classes (a search's cache must not
    # hand v = 1's peak to v = 2)
    plans = []
    for v in (1, 2, 4):
        config = copy.deepcopy(CONFIG)
        config["training"]["global_batch"] = 32  # m = 32 / dp 4 = 8 = pp
        config["parallel"].update(virtual_stages=v, zero=3)
        plans.append(parse_training(config))
    cache = PricingCache()
    shared = [estimate_training(setup, cache)["peak_memory_bytes"] for setup in plans]
    fresh = [estimate_training(setup, PricingCache())["peak_memory_bytes"] for setup in plans]
    assert shared == fresh
    assert fresh[1] > fresh[0]
