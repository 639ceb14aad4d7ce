"""Screening: every enumerated candidate is validated by the simulator's rules, checked against a
memory lower bound and priced by the analytic fidelity's cached path (``estimate_training`` with
one ``PricingCache`` per worker process). Batches go through ``search.executor.map_batches``; the
per-process state (parsed contexts, the cache) is rebuilt once per process and never changes a
number, so any executor and worker count gives the same results.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Sequence

from sim.runner import RunOptions
from sim.training.config import TrainingSetup
from sim.training.estimate import estimate_training
from sim.training.activations import inflight_microbatches
from sim.training.memory import stage_layer_kinds, stage_memory_class
from sim.training.pricing_cache import PricingCache
from sim.training.run import simulate_training
from search.training_space import Candidate, Context, SetupBuilder, context_setup, rule_of
from workloads.errors import InvalidPlanError

MEMORY_RULE = "memory lower bound (every layer recomputed) exceeds HBM capacity"
# the analytic metrics a screened candidate keeps (the rest are recomputed for the few reported)
SCREEN_METRICS = (
    "iteration_time_s", "tokens_per_s", "mfu", "peak_memory_bytes", "fits_in_memory", "memory_shortfall_bytes",
    "bubble_fraction", "num_microbatches",
)


class Screened(NamedTuple):
    """One candidate's outcome: the prune rule (with the memory floor for the memory rule), or its
    analytic metrics (``SCREEN_METRICS`` in order)."""

    rule: str | None
    floor_bytes: float | None
    metrics: tuple[Any, ...] | None


class _Worker:
    """Per-process state: each context parsed once, one pricing cache, memoized memory floors."""

    def __init__(self, contexts: Sequence[Context]) -> None:
        self.bases = [context_setup(c) for c in contexts]
        self.builders = [SetupBuilder(b) for b in self.bases]
        self.rules: dict[str, str] = {}
        self.cache = PricingCache()
        self.floors: dict[Candidate, float] = {}


_STATE: dict[str, _Worker] = {}  # token -> the worker state of that search, in this process


def _worker(token: str, contexts: Sequence[Context]) -> _Worker:
    worker = _STATE.get(token)
    if worker is None:
        _STATE.clear()  # one search at a time per process
        worker = _STATE[token] = _Worker(contexts)
    return worker


def memory_floor_bytes(setup: TrainingSetup, candidate: Candidate, cache: dict[Candidate, float]) -> float:
    """A lower bound of the peak memory any ``recompute_layers`` can give this plan: the simulator's
    memory model (``stage_memory_class``) on the first and last stages with every layer recomputed
    (inputs kept only). Stored activations only shrink with recomputation, and the one
    re-materialised layer's working set is smaller than the activations it frees once one layer and
    one micro-batch are in flight, so this bounds 'none', 'selective' and any mix from below."""
    key = candidate._replace(recompute="full" if candidate.recompute == "full" else "none")
    floor = cache.get(key)
    if floor is None:
        model, plan, job = setup.model, setup.plan, setup.job
        kinds = stage_layer_kinds(model, plan)
        m = setup.num_microbatches
        floor = 0.0
        for stage in sorted({0, plan.pp - 1}):
            dense, moe = kinds[stage]
            recomputed = 0 if plan.recompute == "full" else dense + moe
            stage_plan = plan if plan.recompute == "full" else dataclasses.replace(
                plan, recompute="none", recompute_layers=())
            kind = stage_memory_class(
                model, stage_plan, job, dense_layers=dense, moe_layers=moe, first=stage == 0, last=stage == plan.pp - 1,
                recomputed_layers=recomputed, flash_attention=setup.fused_attention,
            )
            floor = max(floor, kind.total_bytes(inflight_microbatches(plan, m, stage)))
        cache[key] = floor
    return floor


def screen_batch(token: str, contexts: Sequence[Context], batch: Sequence[Candidate]) -> list[Screened]:
    """Prune or price every candidate of ``batch`` (a top-level function: picklable for pools and dask)."""
    worker = _worker(token, contexts)
    out = []
    for candidate in batch:
        try:
            setup = worker.builders[candidate.context](candidate)
        except InvalidPlanError as exc:
            out.append(Screened(rule_of(str(exc), worker.rules), None, None))
            continue
        floor = memory_floor_bytes(setup, candidate, worker.floors)
        if floor > setup.cluster.gpu.hbm_capacity_bytes:
            out.append(Screened(MEMORY_RULE, floor, None))
            continue
        metrics = estimate_training(setup, worker.cache)
        out.append(Screened(None, None, tuple(metrics[k] for k in SCREEN_METRICS)))
    return out


def price_candidate(token: str, contexts: Sequence[Context], candidate: Candidate) -> dict[str, Any]:
    """Full analytic metrics of one candidate (validated; raises InvalidPlanError)."""
    worker = _worker(token, contexts)
    return estimate_training(worker.builders[candidate.context](candidate), worker.cache)


def simulate_batch(configs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """DES metrics of each config (the re-ranking of the top candidates)."""
    return [simulate_training(config, RunOptions(fidelity="des")).metrics() for config in configs]
