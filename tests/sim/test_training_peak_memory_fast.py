"""Round-4 fast paths: the one peak breakdown, the id bundle and the even layer split are exact."""

from __future__ import annotations

import itertools

import pytest

from sim.training.config import parse_training
from sim.training.iteration import stage_layout
from sim.training.memory import (
    inflight_microbatches,
    memory_per_stage,
    peak_stage_memory,
    stage_memory_class,
)
from sim.training.pricing_cache import PricingCache
from workloads.plan import ParallelPlan, stage_layer_counts

CONFIGS = {
    "gpt-interleaved-zero1": ("gpt3-175b", 256, {"tp": 8, "pp": 8, "schedule": "interleaved", "virtual_stages": 3, "zero": 1}),
    "gpt-gpipe-zero3": ("gpt3-175b", 512, {"tp": 4, "pp": 16, "schedule": "gpipe", "zero": 3, "recompute": "full"}),
    "llama-pp1-offload": ("llama3-70b", 64, {"tp": 8, "pp": 1, "zero": 1, "offload": "optimizer"}),
    "mixtral-ep": ("mixtral-8x7b", 256, {"tp": 2, "pp": 4, "ep": 8, "zero": 1}),
}


def _setup(name: str):
    model, gpus, parallel = CONFIGS[name]
    return parse_training({
        "model": {"name": model},
        "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": gpus},
        "training": {"seq_len": 2048, "global_batch": 512, "micro_batch": 1},
        "parallel": parallel,
    })


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_peak_stage_memory_is_the_first_stage_with_the_largest_total(name: str) -> None:
    setup = _setup(name)
    model, plan, job = setup.model, setup.plan, setup.job
    capacity = setup.cluster.gpu.hbm_capacity_bytes
    layout = stage_layout(setup, PricingCache())
    kinds = tuple(
        stage_memory_class(model, plan, job, dense_layers=d, moe_layers=m, first=f, last=last, recomputed_layers=r)
        for d, m, f, last, r in layout.memory_kinds
    )
    m = setup.num_microbatches
    peak = peak_stage_memory(kinds, layout.memory_class, plan, m, capacity_bytes=capacity)
    stages = memory_per_stage(model, plan, job, capacity_bytes=capacity)
    assert peak == max(stages, key=lambda b: b.total_bytes)  # bit for bit, first maximum
    candidates = [stages[s] for s in layout.memory_first_stage]
    assert peak.fits_in_memory == all(b.fits_in_memory for b in stages)
    assert peak.shortfall_bytes == max(b.shortfall_bytes for b in stages)
    # the method total equals the breakdown's property total exactly
    for kind, breakdown in zip(kinds, candidates):
        inflight = inflight_microbatches(plan, m, breakdown.stage)
        assert kind.total_bytes(inflight) == breakdown.total_bytes


def test_spec_ids_match_the_single_lookups_and_survive_a_clear() -> None:
    setup = _setup("gpt-interleaved-zero1")
    cache = PricingCache(max_entries=8)
    ids = cache.spec_ids(setup.model, setup.cluster)
    assert ids == (cache.model_id(setup.model), cache.cluster_id(setup.cluster), cache.gpu_id(setup.cluster.gpu))
    assert cache.spec_ids(setup.model, setup.cluster) is ids  # the previous pair: no lookup
    for n in range(8):  # fill the intern table past max_entries: it is emptied
        cache.intern(("filler", n))
    again = cache.spec_ids(setup.model, setup.cluster)
    assert again.model != ids.model  # re-interned after the clear, not the remembered pair
    assert again == (cache.model_id(setup.model), cache.cluster_id(setup.cluster), cache.gpu_id(setup.cluster.gpu))


def test_even_layer_split_matches_the_per_chunk_rule() -> None:
    for layers, pp, v in itertools.product((1, 7, 80, 96, 126), (1, 2, 3, 4, 8, 16), (1, 2, 3)):
        if layers < pp * v:
            continue
        plan = ParallelPlan(pp=pp, virtual_stages=v, schedule="interleaved" if v > 1 else "1f1b")
        base, extra = divmod(layers, pp * v)
        assert stage_layer_counts(layers, plan) == tuple(base + (1 if c < extra else 0) for c in range(pp * v))
