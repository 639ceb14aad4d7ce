"""The analytic fidelity for plan search: one resolved setup -> the training metrics, fast.

Same numbers as ``simulate_training(config, RunOptions(fidelity="analytic")).metrics()``: it runs
the same pricing (``build_iteration_classes``, which ``build_iteration`` expands to stages), the same
closed form (``pipeline_phase`` then ``finish_iteration``, the two halves of
``analytic_iteration_classes``, which ``analytic_iteration`` calls per stage), the same memory classes
and the same metric formulas (``run.training_metrics``, which ``TrainingResult.metrics`` calls). What
it skips is per-stage repetition: each class of identical stages is priced and sized once, and a
``PricingCache`` shared across calls memoizes the exact intermediate results (the chunk-only pipeline
phase is shared by plans differing only in data-parallel work; a setup seen before returns its
whole result). Per candidate it looks up the model and cluster ids once (``pricing_keys``) and
builds one memory breakdown, the peak stage's, which is all the metrics read.
"""

from __future__ import annotations

from dataclasses import fields
from operator import attrgetter
from typing import Any, Sequence

from sim.training.analytic import finish_iteration, pipeline_phase, prepare_longest_paths, spans_request
from sim.training.config import TrainingSetup
from sim.training.iteration import IterationClasses, PricingKeys, build_iteration_classes, job_values, pricing_keys
from sim.training.memory import (
    MemoryBreakdown,
    StageMemoryClass,
    StageMemoryTerms,
    peak_stage_memory,
    stage_memory_class,
    stage_memory_terms,
)
from sim.training.pricing_cache import PricingCache
from sim.training.schedules import plan_occupancy
from sim.training.run import model_flops_per_iteration, training_metrics, with_goodput
from workloads.plan import ParallelPlan

# ParallelPlan fields a stage memory class does not depend on beyond its (dense, MoE, first, last,
# recomputed) key; pp matters only through pp > 1 (tied LM head) and the world size through > 1 (NCCL
# buffers), the schedule only through the last chunk's live logits (in the key): plans differing
# only in their schedule share their classes (the 1T example's 48k priced plans: 39k classes otherwise)
_NOT_MEMORY_FIELDS = ("pp", "virtual_stages", "layers_per_stage", "recompute_layers", "schedule")
_MEMORY_PLAN_FIELDS = tuple(f.name for f in fields(ParallelPlan) if f.name not in _NOT_MEMORY_FIELDS)
_memory_plan_values = attrgetter(*_MEMORY_PLAN_FIELDS)  # plan -> tuple of those fields' values
# ... and its ``stage_memory_terms`` not on sharding, ZeRO or offload either
_NOT_TERMS_FIELDS = _NOT_MEMORY_FIELDS + ("dp", "zero", "hsdp", "hsdp_shard", "offload")
_TERMS_PLAN_FIELDS = tuple(f.name for f in fields(ParallelPlan) if f.name not in _NOT_TERMS_FIELDS)
_terms_plan_values = attrgetter(*_TERMS_PLAN_FIELDS)
# the metrics' nested dicts, copied for the caller (the memoized result stays intact)
_NESTED_METRICS = ("exposed_communication_s", "memory_bytes", "offloaded_bytes", "parallel")


def memory_terms(
    setup: TrainingSetup, plan: ParallelPlan, kinds: tuple[tuple[int, int, bool, bool, int], ...], cache: PricingCache,
    model_id: int,
) -> tuple[StageMemoryTerms, ...]:
    """``stage_memory_terms`` (parameters and activations before sharding) of ``plan`` for every
    (dense, MoE, first, last, recomputed) memory kind in ``kinds``, memoized without the ZeRO, offload
    and data-parallel fields, so plans differing only there share them (``model_id``: the model's
    interned id, ``PricingCache.spec_ids``)."""
    model, job = setup.model, setup.job
    flash = setup.fused_attention
    terms_key = (
        model_id, job_values(job), flash, (plan.pp if plan.vocab_parallel else plan.pp > 1),
        plan_occupancy(plan, job.num_microbatches(plan.dp)).last_chunk_inflight, _terms_plan_values(plan), kinds,
    )
    return cache.memo(
        "memory_terms",
        terms_key,
        lambda: tuple(
            stage_memory_terms(
                model, plan, job, dense_layers=dense, moe_layers=moe, first=first, last=last,
                recomputed_layers=recomputed, flash_attention=flash,
            )
            for dense, moe, first, last, recomputed in kinds
        ),
    )


def _memory_classes(
    setup: TrainingSetup, priced: IterationClasses, cache: PricingCache
) -> tuple[StageMemoryClass, ...]:
    """``stage_memory_class`` of every (dense, MoE, first, last, recomputed) memory kind of ``priced.layout``,
    from their memoized ``memory_terms``: plans differing only in ZeRO, offload and data-parallel
    fields redo just the sharding arithmetic of ``stage_memory_class``."""
    model, plan, job = setup.model, setup.plan, setup.job
    kinds = priced.layout.memory_kinds
    flash = setup.fused_attention
    terms = memory_terms(setup, plan, kinds, cache, priced.keys.model)
    return tuple(
        stage_memory_class(
            model, plan, job, dense_layers=dense, moe_layers=moe, first=first, last=last,
            recomputed_layers=recomputed, flash_attention=flash, terms=kind_terms,
        )
        for (dense, moe, first, last, recomputed), kind_terms in zip(kinds, terms)
    )


def peak_memory(setup: TrainingSetup, priced: IterationClasses, cache: PricingCache) -> tuple[MemoryBreakdown]:
    """The one breakdown the metrics read of ``memory.memory_per_stage`` with ``simulate_training``'s
    defaults: its first stage reaching the largest total (``memory.peak_stage_memory``). The memory
    classes of one plan shape are computed once per cache, and the peak once per (classes, stages)."""
    plan, job = setup.plan, setup.job
    layout = priced.layout
    # the classes depend on the plan beyond _MEMORY_PLAN_FIELDS only through the stage kinds and
    # the last chunk's in-flight micro-batches (the logits held; pp, v and the schedule set it)
    classes_key = cache.intern((
        "memory_classes", priced.keys.model, job_values(job), setup.fused_attention, (plan.pp if plan.vocab_parallel else plan.pp > 1),
        plan.world_size > 1, _memory_plan_values(plan), layout.memory_kinds,
        plan_occupancy(plan, priced.num_microbatches).last_chunk_inflight,
    ))
    capacity = setup.cluster.gpu.hbm_capacity_bytes
    # the peak adds the stage indices, which (with the schedule, pp, v and the micro-batches, fixed
    # by job and dp in the key) give each class's in-flight micro-batches
    return cache.memo(
        "peak_memory",
        (classes_key, plan.schedule, plan.pp, plan.virtual_stages, layout.memory_first_stage, capacity),
        lambda: (peak_stage_memory(
            cache.memo("memory_classes", classes_key, lambda: _memory_classes(setup, priced, cache)),
            layout.memory_class, plan, priced.num_microbatches, capacity_bytes=capacity,
            first_stages=layout.memory_first_stage,
        ),),
    )


def _phase_key(keys: PricingKeys, priced: IterationClasses) -> tuple[Any, ...]:
    # the first part of analytic_iteration_classes depends on the chunks alone (chunk context,
    # layout, schedule), so plans differing only in their data-parallel work share it
    return (keys.chunk, priced.layout.key, priced.schedule)


def _evaluate(
    setup: TrainingSetup, keys: PricingKeys, cache: PricingCache, priced: IterationClasses | None = None
) -> dict[str, Any]:
    if priced is None:
        priced = build_iteration_classes(setup, cache, keys=keys)
    layout = priced.layout
    # analytic_iteration_classes in its two parts (pipeline_phase, then finish_iteration)
    phase = cache.memo(
        "pipeline_phase",
        _phase_key(keys, priced),
        lambda: pipeline_phase(
            priced.chunks,
            layout.stage_class,
            schedule=priced.schedule,
            num_microbatches=priced.num_microbatches,
            virtual_stages=priced.virtual_stages,
            p2p_bandwidth_Bps=priced.p2p_bandwidth_Bps,
            p2p_latency_s=priced.p2p_latency_s,
        ),
    )
    estimate = finish_iteration(
        phase, priced.chunks, priced.data_parallel, layout.stage_class, num_microbatches=priced.num_microbatches,
        overlap_slowdown=priced.overlap_slowdown,
    )
    job = setup.job
    model_flops, full_attention = cache.memo(
        "model_flops",
        (keys.model, job.seq_len, job.global_batch, job.micro_batch, setup.plan.cp, setup.attention_kernel),
        lambda: (model_flops_per_iteration(setup), model_flops_per_iteration(setup, full_attention=True)),
    )
    return training_metrics(
        setup, estimate, peak_memory(setup, priced, cache),
        recompute_flops_per_replica=priced.recompute_flops_per_replica, fidelity="analytic", model_flops=model_flops,
        model_flops_full_attention=full_attention,
    )


def estimate_training(setup: TrainingSetup, cache: PricingCache | None = None) -> dict[str, Any]:
    """Analytic training metrics of ``setup`` (the ``--format json`` training fields); pass one
    ``cache`` to every call of a search. The returned dict is the caller's to modify."""
    cache = cache if cache is not None else PricingCache()
    keys = pricing_keys(setup, cache)
    return _metrics(setup, cache.memo("estimate", keys.setup, lambda: _evaluate(setup, keys, cache)))


def is_estimated(setup: TrainingSetup, cache: PricingCache) -> bool:
    """Whether ``cache`` holds the metrics of ``setup`` (``estimate_training`` then reads no pipeline
    program: neither its profile nor its dependency graph)."""
    return cache.get("estimate", pricing_keys(setup, cache).setup) is not None


def estimate_trainings(setups: Sequence[TrainingSetup], cache: PricingCache) -> list[dict[str, Any]]:
    """``estimate_training`` of every setup (the same numbers), faster for many: the per-stage
    longest paths that their pipeline phases need (``analytic.spans_request``) are priced together,
    those of one program in one pass (``analytic.prepare_longest_paths``)."""
    keyed = [(setup, pricing_keys(setup, cache)) for setup in setups]
    priced_of: dict[Any, IterationClasses] = {}
    requests = []
    for setup, keys in keyed:
        if keys.setup in priced_of or cache.get("estimate", keys.setup) is not None:
            continue
        priced = priced_of[keys.setup] = build_iteration_classes(setup, cache, keys=keys)
        if cache.get("pipeline_phase", _phase_key(keys, priced)) is None:
            request = spans_request(priced.chunks, priced.layout.stage_class, schedule=priced.schedule,
                                    num_microbatches=priced.num_microbatches, virtual_stages=priced.virtual_stages)
            if request is not None:
                requests.append(request)
    prepare_longest_paths(requests)
    return [
        _metrics(setup, cache.memo("estimate", keys.setup, lambda: _evaluate(setup, keys, cache, priced_of.get(keys.setup))))
        for setup, keys in keyed
    ]


def _metrics(setup: TrainingSetup, metrics: dict[str, Any]) -> dict[str, Any]:
    """The caller's copy of memoized metrics, with the goodput fields."""
    out = dict(metrics)
    for key in _NESTED_METRICS:
        out[key] = dict(out[key])
    return with_goodput(setup, out)  # outside the memo: checkpoint and failure tables are not in its key
