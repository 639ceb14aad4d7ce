"""The analytic fidelity for plan search: one resolved setup -> the training metrics, fast.

Same numbers as ``simulate_training(config, RunOptions(fidelity="analytic")).metrics()``: it runs
the same ``build_iteration``, ``memory_per_stage``, ``analytic_iteration`` and
``TrainingResult.metrics``; only a ``PricingCache`` shared across calls memoizes the exact
intermediate results (and the whole result of a setup seen before).
"""

from __future__ import annotations

from typing import Any

from sim.training.analytic import analytic_iteration
from sim.training.config import TrainingSetup
from sim.training.costs import build_iteration, pricing_keys
from sim.training.memory import memory_per_stage
from sim.training.pricing_cache import PricingCache
from sim.training.run import TrainingResult


def _evaluate(setup: TrainingSetup, cache: PricingCache, setup_context: int) -> dict[str, Any]:
    work = build_iteration(setup, cache)
    capacity = setup.cluster.gpu.hbm_capacity_bytes
    flash = setup.attention_kernel == "flash"
    # the key build_iteration used for the same memory_per_stage call, so this is a cache hit
    memory = cache.memo(
        "memory",
        (setup_context, capacity, flash),
        lambda: memory_per_stage(setup.model, setup.plan, setup.job, capacity_bytes=capacity, flash_attention=flash),
    )
    result = TrainingResult(
        setup=setup, work=work, estimate=analytic_iteration(work.pipeline), memory=memory, fidelity="analytic"
    )
    return result.metrics()


def estimate_training(setup: TrainingSetup, cache: PricingCache | None = None) -> dict[str, Any]:
    """Analytic training metrics of ``setup`` (the ``--format json`` training fields); pass one
    ``cache`` to every call of a search. The returned dict is the caller's to modify."""
    cache = cache if cache is not None else PricingCache()
    _, setup_context = pricing_keys(setup, cache)
    metrics = cache.memo("estimate", setup_context, lambda: _evaluate(setup, cache, setup_context))
    return {key: dict(value) if isinstance(value, dict) else value for key, value in metrics.items()}
