"""Screening: every enumerated candidate is validated by the simulator's rules, checked against a
memory lower bound and priced by the analytic fidelity's cached path (``estimate_training`` with
one ``PricingCache`` per worker process). Batches go through ``search.executor.BatchPool``; the
per-process state (parsed contexts, the cache) is rebuilt once per process and never changes a
number, so any executor and worker count gives the same results.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any, NamedTuple, Sequence

from sim.runner import RunOptions
from sim.training.config import TrainingSetup
from sim.training.estimate import _NOT_TERMS_FIELDS, estimate_training, estimate_trainings, is_estimated, memory_terms
from sim.training.activations import inflight_microbatches
from sim.training.memory import stage_layer_kinds, stage_memory_class
from sim.training.pricing_cache import PricingCache
from sim.training.run import simulate_training
from sim.training.schedules import build_programs, check_program, placement_kind, prepare_program_profiles
from search.training_space import Candidate, Context, SetupBuilder, context_setup, rule_of
from workloads.errors import InvalidPlanError
from workloads.plan import ParallelPlan, TrainingJob

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
        self.floor_parts: dict[tuple[Any, ...], tuple[Any, ...]] = {}  # see memory_floor_bytes
        self.layer_kinds: dict[tuple[Any, ...], tuple[tuple[int, int], ...]] = {}


_STATE: dict[str, _Worker] = {}  # token -> the worker state of that search, in this process


def _worker(token: str, contexts: Sequence[Context]) -> _Worker:
    worker = _STATE.get(token)
    if worker is None:
        _STATE.clear()  # one search at a time per process
        worker = _STATE[token] = _Worker(contexts)
    return worker


# Candidate fields the memory terms never read (``estimate._NOT_TERMS_FIELDS``): candidates that
# differ only there (and in recompute "none" / "selective": the floor recomputes every layer of
# both) share their floor's stages, memory kinds, terms and in-flight micro-batches
_TERMS_FREE_FIELDS = ("zero", "hsdp", "offload")
assert set(_TERMS_FREE_FIELDS) <= set(_NOT_TERMS_FIELDS)
_floor_parts_key = itemgetter(*(i for i, f in enumerate(Candidate._fields) if f not in _TERMS_FREE_FIELDS + ("recompute",)))


def memory_floor_bytes(plan: ParallelPlan, job: TrainingJob, candidate: Candidate, worker: _Worker) -> float:
    """A lower bound of the peak memory any ``recompute_layers`` can give this plan: the simulator's
    memory model (``stage_memory_class``) on the first and last stages with every layer recomputed
    (inputs kept only). Stored activations only shrink with recomputation, and the one
    re-materialised layer's working set is smaller than the activations it frees once one layer and
    one micro-batch are in flight, so this bounds 'none', 'selective' and any mix from below.
    Memoized per plan (the recompute choice aside); the stages' memory kinds, terms (as the analytic
    fidelity memoizes them, ``estimate.memory_terms``) and in-flight micro-batches per plan without
    its ZeRO, offload and HSDP fields, which only the sharding arithmetic of ``stage_memory_class`` reads.
    ``plan`` and ``job``: the candidate's, validated (``SetupBuilder.validated``)."""
    key = candidate if candidate.recompute != "selective" else candidate._replace(recompute="none")
    floor = worker.floors.get(key)
    if floor is None:
        setup = worker.bases[candidate.context]  # the context's model, cluster and attention kernel
        model = setup.model
        full = plan.recompute == "full"
        # the plan with every layer recomputed: "full" as it is, else recompute "none" (and every layer
        # in recomputed_layers below); the builder's memoized plan of that candidate
        stage_plan = plan if full or (plan.recompute == "none" and not plan.recompute_layers) \
            else worker.builders[candidate.context].plan(key._replace(recompute="none", recompute_layers=()))
        parts_key = (_floor_parts_key(candidate), full)
        parts = worker.floor_parts.get(parts_key)
        if parts is None:
            shape = (candidate.context, plan.schedule, plan.pp, plan.virtual_stages, plan.layers_per_stage)
            kinds = worker.layer_kinds.get(shape)
            if kinds is None:
                kinds = worker.layer_kinds[shape] = stage_layer_kinds(model, plan)
            m = job.num_microbatches(plan.dp)
            stages = sorted({0, plan.pp - 1})
            memory_kinds = tuple(
                (kinds[s][0], kinds[s][1], s == 0, s == plan.pp - 1, 0 if full else sum(kinds[s])) for s in stages
            )
            model_id = worker.cache.spec_ids(model, setup.cluster).model
            # memory_terms reads the setup's model, job and attention kernel
            terms = memory_terms(worker.builders[candidate.context].setup(plan, job), stage_plan, memory_kinds,
                                 worker.cache, model_id)
            inflight = tuple(inflight_microbatches(plan, m, s) for s in stages)
            parts = worker.floor_parts[parts_key] = (memory_kinds, terms, inflight)
        memory_kinds, terms, inflight = parts
        flash = setup.fused_attention
        floor = 0.0
        for (dense, moe, first, last, recomputed), stage_terms, stage_inflight in zip(memory_kinds, terms, inflight):
            kind = stage_memory_class(
                model, stage_plan, job, dense_layers=dense, moe_layers=moe, first=first, last=last,
                recomputed_layers=recomputed, flash_attention=flash, terms=stage_terms,
            )
            floor = max(floor, kind.total_bytes(stage_inflight))
        worker.floors[key] = floor
    return floor


def program_key(context: Context, candidate: Candidate) -> tuple[str, int, int, int]:
    """(schedule, pp, virtual stages, micro-batches) of a candidate: what its pipeline program (the
    costliest thing screening computes, ``sim.training.schedules.program_profile``) depends on;
    micro-batches 0 where the batch does not divide (validation prunes those)."""
    dp = context.num_gpus // (candidate.tp * candidate.pp * candidate.cp)
    per_step = dp * candidate.micro_batch
    m = candidate.global_batch // per_step if per_step and candidate.global_batch % per_step == 0 else 0
    return (candidate.schedule, candidate.pp, candidate.virtual_stages, m)


def program_batches(contexts: Sequence[Context], candidates: Sequence[Candidate], size: int) -> list[list[int]]:
    """Candidate indices in batches of about ``size`` that never split the candidates of one pipeline
    program (``program_key``), so that each program is computed by one worker; the batches of the
    longest programs first (they take longest), programs of one schedule (the V shapes next to each
    other: their placement) and of about one length
    (micro-batches x chunks per stage, within a factor 2: the time steps of their generation and
    execution) together (they are generated and executed side by side, as lanes of one array,
    ``prepare_program_profiles``), each batch in enumeration order."""
    groups: dict[tuple[str, int, int, int], list[int]] = {}
    for index, candidate in enumerate(candidates):
        groups.setdefault(program_key(contexts[candidate.context], candidate), []).append(index)
    keys = sorted(groups, key=lambda k: (-(k[2] * k[3]).bit_length(), placement_kind(k[0]), k[0], -k[1] * k[2] * k[3], k))
    out: list[list[int]] = []
    current: list[int] = []
    for key in keys:
        current.extend(groups[key])
        if len(current) >= size:
            out.append(sorted(current))
            current = []
    if current:
        out.append(sorted(current))
    return out


def prepare_programs(contexts: Sequence[Context], candidates: Sequence[Candidate]) -> None:
    """Compute the pipeline programs of ``candidates`` together (``prepare_program_profiles``)
    before they are priced one by one: the few plans the search process itself prices (the MILPs'
    parents, the top K, the Pareto set), whose programs the screening computed in other processes."""
    keys = (program_key(contexts[c.context], c) for c in candidates)
    prepare_program_profiles((schedule, pp, m, v) for schedule, pp, v, m in keys if m)


def screen_batch(token: str, contexts: Sequence[Context], batch: Sequence[Candidate]) -> list[Screened]:
    """Prune or price every candidate of ``batch`` (a top-level function: picklable for pools and dask).
    Every rule but the last (the pipeline program) is checked first; the programs of the plans left
    are built together (``build_programs``: generated, not executed), then each plan's program
    checked (the last rule) and its memory bounded (from what the built program holds), and only
    the programs of the plans left executed, together (``prepare_program_profiles``), and those
    plans priced together (``estimate_trainings``)."""
    worker = _worker(token, contexts)
    # (plan, job) of each valid candidate: its setup is built only once its memory floor fits
    valid: list[tuple[ParallelPlan, TrainingJob] | Screened] = []
    for candidate in batch:
        try:
            valid.append(worker.builders[candidate.context].validated(candidate, check_program=False))
        except InvalidPlanError as exc:
            valid.append(Screened(rule_of(str(exc), worker.rules), None, None))
    build_programs(_plan_program_key(*v) for v in valid if not isinstance(v, Screened))
    out: list[Screened | TrainingSetup] = []
    for candidate, v in zip(batch, valid):
        if isinstance(v, Screened):
            out.append(v)
            continue
        plan, job = v
        try:
            check_program(*_plan_program_key(plan, job))  # the last rule
        except InvalidPlanError as exc:
            out.append(Screened(rule_of(str(exc), worker.rules), None, None))
            continue
        floor = memory_floor_bytes(plan, job, candidate, worker)
        builder = worker.builders[candidate.context]
        out.append(Screened(MEMORY_RULE, floor, None) if floor > builder.base.cluster.gpu.hbm_capacity_bytes
                   else builder.setup(plan, job))
    left = [s for s in out if isinstance(s, TrainingSetup)]
    prepare_program_profiles(_setup_program_key(s) for s in left)
    # the plans left, priced together (their per-stage longest paths in one pass per program)
    priced = iter(estimate_trainings(left, worker.cache))
    for i, setup in enumerate(out):
        if isinstance(setup, TrainingSetup):
            metrics = next(priced)
            out[i] = Screened(None, None, tuple(metrics[k] for k in SCREEN_METRICS))
    return out  # type: ignore[return-value]


def _plan_program_key(plan: ParallelPlan, job: TrainingJob) -> tuple[str, int, int, int]:
    """(schedule, pp, micro-batches, virtual stages) of a validated plan and job's pipeline program."""
    return (plan.schedule, plan.pp, job.num_microbatches(plan.dp), plan.virtual_stages)


def _setup_program_key(setup: TrainingSetup) -> tuple[str, int, int, int]:
    """``_plan_program_key`` of a setup."""
    return _plan_program_key(setup.plan, setup.job)


def holds_metrics(token: str, contexts: Sequence[Context], candidate: Candidate) -> bool:
    """Whether this process holds the analytic metrics of a valid candidate (it screened or priced
    it): ``price_candidate`` then needs no pipeline program."""
    worker = _worker(token, contexts)
    return is_estimated(worker.builders[candidate.context](candidate, check_program=False), worker.cache)


def price_candidate(token: str, contexts: Sequence[Context], candidate: Candidate) -> dict[str, Any]:
    """Full analytic metrics of one candidate (validated; raises InvalidPlanError)."""
    worker = _worker(token, contexts)
    return estimate_training(worker.builders[candidate.context](candidate), worker.cache)


def simulate_batch(configs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """DES metrics of each config (the re-ranking of the top candidates)."""
    return [simulate_training(config, RunOptions(fidelity="des")).metrics() for config in configs]
