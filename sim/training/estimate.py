"""The analytic fidelity for plan search: one resolved setup -> the training metrics, fast.

Same numbers as ``simulate_training(config, RunOptions(fidelity="analytic")).metrics()``: it runs
the same pricing (``build_iteration_classes``, which ``build_iteration`` expands to stages), the same
closed form (``analytic_iteration_classes``, which ``analytic_iteration`` calls per stage), the same
memory classes and ``TrainingResult.metrics``. What it skips is per-stage repetition: each class of
identical stages is priced and sized once, and a ``PricingCache`` shared across calls memoizes the
exact intermediate results (and the whole result of a setup seen before).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from sim.training.analytic import analytic_iteration_classes
from sim.training.config import TrainingSetup
from sim.training.iteration import IterationClasses, build_iteration_classes, pricing_keys
from sim.training.memory import (
    MemoryBreakdown,
    StageMemoryClass,
    peak_memory_stages,
    stage_memory_class,
    stage_memory_terms,
)
from sim.training.pricing_cache import PricingCache
from sim.training.run import TrainingResult
from workloads.plan import ParallelPlan

# ParallelPlan fields a stage memory class does not depend on beyond its (dense, MoE, first, last)
# key; pp matters only through pp > 1 (tied LM head) and the world size through > 1 (NCCL buffers).
_NOT_MEMORY_FIELDS = ("pp", "virtual_stages", "layers_per_stage")
_MEMORY_PLAN_FIELDS = tuple(f.name for f in fields(ParallelPlan) if f.name not in _NOT_MEMORY_FIELDS)
# ... and its ``stage_memory_terms`` not on sharding, ZeRO, offload or the schedule either (gpipe
# enters through the live logits count, in the key)
_NOT_TERMS_FIELDS = _NOT_MEMORY_FIELDS + ("dp", "zero", "hsdp", "offload", "schedule")
_TERMS_PLAN_FIELDS = tuple(f.name for f in fields(ParallelPlan) if f.name not in _NOT_TERMS_FIELDS)


def peak_memory(setup: TrainingSetup, priced: IterationClasses, cache: PricingCache) -> tuple[MemoryBreakdown, ...]:
    """``memory.peak_memory_stages`` for ``setup`` with ``memory_per_stage``'s defaults (as
    ``simulate_training`` calls it), each memory class computed once per cache."""
    model, plan, job = setup.model, setup.plan, setup.job
    flash = setup.attention_kernel == "flash"
    context = cache.intern((
        "memory", cache.model_id(model), job, flash, plan.pp > 1, plan.world_size > 1,
        tuple(getattr(plan, f) for f in _MEMORY_PLAN_FIELDS),
    ))
    terms_context = cache.intern((
        "memory_terms", cache.model_id(model), job, flash, plan.pp > 1,
        priced.num_microbatches if plan.schedule == "gpipe" else 1, tuple(getattr(plan, f) for f in _TERMS_PLAN_FIELDS),
    ))
    layout = priced.layout

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

    kinds = tuple(cache.memo("memory_class", (context, kind), lambda: memory_class(kind)) for kind in layout.memory_kinds)
    return peak_memory_stages(
        kinds, layout.memory_class, plan, priced.num_microbatches, capacity_bytes=setup.cluster.gpu.hbm_capacity_bytes
    )


def _evaluate(setup: TrainingSetup, cache: PricingCache) -> dict[str, Any]:
    priced = build_iteration_classes(setup, cache)
    estimate = analytic_iteration_classes(
        [(c.chunk, c.data_parallel) for c in priced.classes],
        priced.layout.stage_class,
        schedule=priced.schedule,
        num_microbatches=priced.num_microbatches,
        virtual_stages=priced.virtual_stages,
        p2p_bandwidth_Bps=priced.p2p_bandwidth_Bps,
        p2p_latency_s=priced.p2p_latency_s,
    )
    # TrainingResult.metrics reads the work's FLOP counts only, and of the memory the largest total
    # (first stage reaching it), whether all fit and the largest shortfall, which the first stage of
    # each memory class determines (peak_memory_stages)
    result = TrainingResult(
        setup=setup, work=priced, estimate=estimate, memory=peak_memory(setup, priced, cache), fidelity="analytic"  # type: ignore[arg-type]
    )
    return result.metrics()


def estimate_training(setup: TrainingSetup, cache: PricingCache | None = None) -> dict[str, Any]:
    """Analytic training metrics of ``setup`` (the ``--format json`` training fields); pass one
    ``cache`` to every call of a search. The returned dict is the caller's to modify."""
    cache = cache if cache is not None else PricingCache()
    _, setup_context = pricing_keys(setup, cache)
    metrics = cache.memo("estimate", setup_context, lambda: _evaluate(setup, cache))
    return {key: dict(value) if isinstance(value, dict) else value for key, value in metrics.items()}
