"""The analytic fidelity for plan search: one resolved setup -> the training metrics, fast.

Same numbers as ``simulate_training(config, RunOptions(fidelity="analytic")).metrics()``: it runs
the same pricing (``build_iteration_classes``, which ``build_iteration`` expands to stages), the same
closed form (``pipeline_phase`` then ``finish_iteration``, the two halves of
``analytic_iteration_classes``, which ``analytic_iteration`` calls per stage), the same memory classes
and the same metric formulas (``run.training_metrics``, which ``TrainingResult.metrics`` calls). What
it skips is per-stage repetition: each class of identical stages is priced and sized once, and a
``PricingCache`` shared across calls memoizes the exact intermediate results (the chunk-only pipeline
phase is shared by plans differing only in data-parallel work; a setup seen before returns its
whole result).
"""

from __future__ import annotations

from dataclasses import fields
from operator import attrgetter
from typing import Any

from sim.training.analytic import finish_iteration, pipeline_phase
from sim.training.config import TrainingSetup
from sim.training.iteration import IterationClasses, build_iteration_classes, job_values, pricing_keys
from sim.training.memory import (
    MemoryBreakdown,
    StageMemoryClass,
    peak_memory_stages,
    stage_memory_class,
    stage_memory_terms,
)
from sim.training.pricing_cache import PricingCache
from sim.training.run import model_flops_per_iteration, training_metrics
from workloads.plan import ParallelPlan

# ParallelPlan fields a stage memory class does not depend on beyond its (dense, MoE, first, last)
# key; pp matters only through pp > 1 (tied LM head) and the world size through > 1 (NCCL buffers).
_NOT_MEMORY_FIELDS = ("pp", "virtual_stages", "layers_per_stage")
_MEMORY_PLAN_FIELDS = tuple(f.name for f in fields(ParallelPlan) if f.name not in _NOT_MEMORY_FIELDS)
_memory_plan_values = attrgetter(*_MEMORY_PLAN_FIELDS)  # plan -> tuple of those fields' values
# ... and its ``stage_memory_terms`` not on sharding, ZeRO, offload or the schedule either (gpipe
# enters through the live logits count, in the key)
_NOT_TERMS_FIELDS = _NOT_MEMORY_FIELDS + ("dp", "zero", "hsdp", "offload", "schedule")
_TERMS_PLAN_FIELDS = tuple(f.name for f in fields(ParallelPlan) if f.name not in _NOT_TERMS_FIELDS)
_terms_plan_values = attrgetter(*_TERMS_PLAN_FIELDS)
# the metrics' nested dicts, copied for the caller (the memoized result stays intact)
_NESTED_METRICS = ("exposed_communication_s", "memory_bytes", "offloaded_bytes", "parallel")


def _memory_classes(
    setup: TrainingSetup, kinds: tuple[tuple[int, int, bool, bool], ...], num_microbatches: int, cache: PricingCache
) -> tuple[StageMemoryClass, ...]:
    """``stage_memory_class`` of every (dense, MoE, first, last) in ``kinds``, each from its
    ``stage_memory_terms`` memoized on the fields they depend on."""
    model, plan, job = setup.model, setup.plan, setup.job
    flash = setup.attention_kernel == "flash"
    terms_context = cache.intern((
        "memory_terms", cache.model_id(model), job_values(job), flash, plan.pp > 1,
        num_microbatches if plan.schedule == "gpipe" else 1, _terms_plan_values(plan),
    ))

    def memory_class(kind: tuple[int, int, bool, bool]) -> StageMemoryClass:
        dense, moe, first, last = kind
        terms = cache.memo(
            "memory_terms",
            (terms_context, kind),
            lambda: stage_memory_terms(
                model, plan, job, dense_layers=dense, moe_layers=moe, first=first, last=last, flash_attention=flash
            ),
        )
        return stage_memory_class(
            model, plan, job, dense_layers=dense, moe_layers=moe, first=first, last=last, flash_attention=flash,
            terms=terms,
        )

    return tuple(memory_class(kind) for kind in kinds)


def peak_memory(setup: TrainingSetup, priced: IterationClasses, cache: PricingCache) -> tuple[MemoryBreakdown, ...]:
    """``memory.peak_memory_stages`` for ``setup`` with ``memory_per_stage``'s defaults (as
    ``simulate_training`` calls it), the memory classes of one plan shape computed once per cache."""
    model, plan, job = setup.model, setup.plan, setup.job
    layout = priced.layout
    # the classes depend on the plan beyond _MEMORY_PLAN_FIELDS only through the stage kinds
    key = (
        cache.model_id(model), job_values(job), setup.attention_kernel == "flash", plan.pp > 1, plan.world_size > 1,
        _memory_plan_values(plan), layout.memory_kinds,
    )
    kinds = cache.memo(
        "memory_classes", key, lambda: _memory_classes(setup, layout.memory_kinds, priced.num_microbatches, cache)
    )
    return peak_memory_stages(
        kinds, layout.memory_class, plan, priced.num_microbatches, capacity_bytes=setup.cluster.gpu.hbm_capacity_bytes,
        first_stages=layout.memory_first_stage,
    )


def _evaluate(setup: TrainingSetup, chunk_context: int, cache: PricingCache) -> dict[str, Any]:
    priced = build_iteration_classes(setup, cache, chunk_context=chunk_context)
    layout = priced.layout
    chunk_of = [c.chunk for c in priced.classes]
    # analytic_iteration_classes in its two parts; the first depends on the chunks alone (chunk
    # context, layout, schedule), so plans differing only in their data-parallel work share it
    phase = cache.memo(
        "pipeline_phase",
        (chunk_context, layout.key, priced.schedule),
        lambda: pipeline_phase(
            chunk_of,
            layout.stage_class,
            schedule=priced.schedule,
            num_microbatches=priced.num_microbatches,
            virtual_stages=priced.virtual_stages,
            p2p_bandwidth_Bps=priced.p2p_bandwidth_Bps,
            p2p_latency_s=priced.p2p_latency_s,
        ),
    )
    estimate = finish_iteration(
        phase, chunk_of, [c.data_parallel for c in priced.classes], layout.stage_class,
        num_microbatches=priced.num_microbatches,
    )
    # the metrics read of the memory the largest total (first stage reaching it), whether all fit and
    # the largest shortfall, which the first stage of each memory class determines (peak_memory_stages)
    job = setup.job
    model_flops = cache.memo(
        "model_flops", (cache.model_id(setup.model), job.seq_len, job.global_batch),
        lambda: model_flops_per_iteration(setup),
    )
    return training_metrics(
        setup, estimate, peak_memory(setup, priced, cache),
        recompute_flops_per_replica=priced.recompute_flops_per_replica, fidelity="analytic", model_flops=model_flops,
    )


def estimate_training(setup: TrainingSetup, cache: PricingCache | None = None) -> dict[str, Any]:
    """Analytic training metrics of ``setup`` (the ``--format json`` training fields); pass one
    ``cache`` to every call of a search. The returned dict is the caller's to modify."""
    cache = cache if cache is not None else PricingCache()
    chunk_context, setup_context = pricing_keys(setup, cache)
    metrics = cache.memo("estimate", setup_context, lambda: _evaluate(setup, chunk_context, cache))
    out = dict(metrics)
    for key in _NESTED_METRICS:
        out[key] = dict(out[key])
    return out
