"""Stage classes: pricing and sizing each distinct stage once must give exactly the per-stage results."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from sim.training.analytic import analytic_iteration, analytic_iteration_classes
from sim.training.config import parse_training
from sim.training.data_parallel import stage_signatures
from sim.training.iteration import build_iteration, build_iteration_classes, stage_layout
from sim.training.estimate import estimate_training, peak_memory
from sim.training.memory import memory_per_stage, stage_memory
from sim.training.pricing_cache import PricingCache


def _config(model: str, num_gpus: int, parallel: dict[str, Any], **training: Any) -> dict[str, Any]:
    return {
        "model": {"name": model},
        "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": num_gpus},
        "training": {"seq_len": 2048, "global_batch": 256, "micro_batch": 1, "precision": "bf16", **training},
        "parallel": parallel,
    }


CONFIGS = {
    "gpt-even-1f1b": _config("gpt3-175b", 512, {"tp": 8, "pp": 8, "zero": 1}),
    "gpt-interleaved": _config("gpt3-175b", 512, {"tp": 8, "pp": 8, "schedule": "interleaved", "virtual_stages": 3,
                                                   "recompute": "selective"}),
    "gpt-uneven-gpipe": _config("gpt3-175b", 256, {"tp": 8, "pp": 4, "schedule": "gpipe",
                                                    "layers_per_stage": [23, 25, 25, 23], "zero": 3}),
    "llama-odd-split-zb": _config("llama3-70b", 192, {"tp": 8, "pp": 3, "schedule": "zb-h1", "recompute": "full"},
                                  global_batch=192),
    "mixtral-ep": _config("mixtral-8x7b", 128, {"tp": 2, "pp": 4, "ep": 4, "zero": 1}),
    "deepseek-dense-first": _config("deepseek-v3", 512, {"tp": 8, "pp": 16, "ep": 4, "zero": 1, "recompute": "full"},
                                    global_batch=512),
    "gpt-no-dp-overlap": _config("gpt3-175b", 256, {"tp": 8, "pp": 4, "zero": 0, "dp_comm_overlap": False}),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_memory_per_stage_is_stage_memory_of_every_stage(name: str) -> None:
    setup = parse_training(CONFIGS[name])
    model, plan, job = setup.model, setup.plan, setup.job
    capacity = setup.cluster.gpu.hbm_capacity_bytes
    grouped = memory_per_stage(model, plan, job, capacity_bytes=capacity)
    one_by_one = tuple(stage_memory(model, plan, job, capacity_bytes=capacity, stage=s) for s in range(plan.pp))
    assert grouped == one_by_one  # bit for bit


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_peak_stages_decide_memory_metrics_as_all_stages(name: str) -> None:
    setup = parse_training(CONFIGS[name])
    cache = PricingCache()
    peaks = peak_memory(setup, build_iteration_classes(setup, cache), cache)
    stages = memory_per_stage(setup.model, setup.plan, setup.job, capacity_bytes=setup.cluster.gpu.hbm_capacity_bytes)
    worst = max(stages, key=lambda b: b.total_bytes)
    assert max(peaks, key=lambda b: b.total_bytes) == worst
    assert all(b.fits_in_memory for b in peaks) == all(b.fits_in_memory for b in stages)
    assert max(b.shortfall_bytes for b in peaks) == max(b.shortfall_bytes for b in stages)
    assert all(b == stages[b.stage] for b in peaks)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_class_closed_form_equals_per_stage_closed_form(name: str) -> None:
    setup = parse_training(CONFIGS[name])
    priced = build_iteration_classes(setup)
    by_class = analytic_iteration_classes(
        [(c.chunk, c.data_parallel) for c in priced.classes],
        priced.layout.stage_class,
        schedule=priced.schedule,
        num_microbatches=priced.num_microbatches,
        virtual_stages=priced.virtual_stages,
        p2p_bandwidth_Bps=priced.p2p_bandwidth_Bps,
        p2p_latency_s=priced.p2p_latency_s,
        overlap_slowdown=priced.overlap_slowdown,
    )
    assert by_class == analytic_iteration(build_iteration(setup).pipeline)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_stage_classes_group_equal_stages(name: str) -> None:
    setup = parse_training(CONFIGS[name])
    layout = stage_layout(setup, PricingCache())
    signatures = stage_signatures(setup)
    work = build_iteration(setup).pipeline
    assert len(layout.stage_class) == setup.plan.pp
    for stage, index in enumerate(layout.stage_class):
        assert layout.signatures[index] == signatures[stage]
        assert sum(chunk[1] for chunk in signatures[stage]) == sum(c.layers for c in work.stages[stage].chunks)
    # an as-even-as-possible split has first, last and at most two middle sizes, times the link patterns
    if not setup.plan.layers_per_stage:
        assert len(layout.signatures) <= 4 * len(set(layout.links_keys))


def test_even_split_has_first_middle_last_classes() -> None:
    setup = parse_training(CONFIGS["gpt-even-1f1b"])
    signatures = {s for s in stage_signatures(setup)}
    assert signatures == {((12, 12, True, False, 0, ()),), ((12, 12, False, False, 0, ()),), ((12, 12, False, True, 0, ()),)}


def test_dense_first_layers_of_moe_model_are_counted_as_dense() -> None:
    setup = parse_training(CONFIGS["deepseek-dense-first"])
    model = setup.model
    signatures = stage_signatures(setup)
    assert sum(chunk[0] for stage in signatures for chunk in stage) == model.dense_layers
    assert signatures[0][0][0] == min(model.dense_layers, signatures[0][0][1])


def test_estimate_with_one_cache_over_many_plans_equals_fresh() -> None:
    base = parse_training(CONFIGS["gpt-even-1f1b"])
    cache = PricingCache(max_entries=4)  # eviction on every few entries
    for zero in (0, 1, 3, 1, 0):
        setup = dataclasses.replace(base, plan=dataclasses.replace(base.plan, zero=zero))
        assert estimate_training(setup, cache) == estimate_training(setup)
