"""``llmsim search`` for training plans: enumerate, prune, screen analytically, refine the best
with the MILPs, re-rank the top K with the DES, and report the Pareto set.

1. ``search.training_space``: the space of ``[search]`` in a fixed order; prunes that need no plan
   (cluster size not divisible; max_gpus) are counted per rule.
2. ``search.training_screen``: every candidate validated by the simulator's rules (the message of
   the broken rule is its prune rule), bounded from below in memory, and priced by the analytic
   fidelity's cached path, in batches on the chosen executor.
3. ``search.training_milp`` / ``training_refine``: (a) layers to stages for the best feasible
   plans with pp > 1; (b) per-stage recompute for the best plans that miss memory only; every
   answer is checked and re-priced analytically, and kept only when it is feasible.
4. DES re-ranking of the top K; Pareto set; binding constraint; ``search.training_report``.
Ties break on enumeration order, so results do not depend on the executor or the worker count.
"""

from __future__ import annotations

import copy
import hashlib
import json
import time
from array import array
from collections import Counter
from functools import partial
from typing import Any, Mapping, Sequence

from hardware import units
from search.executor import BatchPool
from search.progress import progress
from search.run import DEFAULT_TOP_K, SearchOptions
from search.solver import SolverError
from search.training_milp import MilpCheckFailed, MilpInfeasible, assign_layers, choose_recompute
from search.training_refine import recompute_input, stage_assignment_input
from search.training_report import (
    Funnel,
    Plan,
    ScreenRow,
    ScreenRows,
    TrainingSearchResult,
    objective_value,
    pareto_set,
)
from search.training_screen import (
    MEMORY_RULE,
    SCREEN_METRICS,
    _worker,
    holds_metrics,
    prepare_programs,
    price_candidate,
    program_batches,
    screen_batch,
    simulate_batch,
)
from search.training_space import (
    Candidate,
    TrainingSpace,
    candidate_config,
    context_setup,
    enumerate_candidates,
    parse_space,
)
from sim.collector import collector_paused
from sim.errors import ConfigError
from workloads.errors import InvalidPlanError
from workloads.plan import stage_layer_counts

_TOKENS = SCREEN_METRICS.index("tokens_per_s")
_SCHEDULE = Candidate._fields.index("schedule")
_PEAK = SCREEN_METRICS.index("peak_memory_bytes")
MIN_BATCH, MAX_BATCH = 200, 4000  # candidates per executor batch


def _token(config: Mapping[str, Any]) -> str:
    """Names this search's worker state (a process keeps one search's parsed contexts and cache)."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


class _Light:
    """A screened candidate's numbers for ranking and constraint checks (no full metrics yet)."""

    __slots__ = ("index", "candidate", "metrics", "violates", "objective", "amount", "source")

    def __init__(self, index: int, candidate: Candidate, metrics: tuple[Any, ...]) -> None:
        self.index, self.candidate, self.metrics = index, candidate, metrics
        self.source = "screened"
        self.violates = ""
        self.objective = 0.0
        self.amount = 0.0  # by how much it misses the constraint it violates


def _check(space: TrainingSpace, light: _Light) -> None:
    context = space.contexts[light.candidate.context]
    peak, tokens = light.metrics[_PEAK], light.metrics[_TOKENS]
    capacity = context.capacity_bytes
    cost = None if context.price_per_gpu_hour_usd is None else context.price_per_gpu_hour_usd * context.num_gpus
    if peak > capacity:
        light.violates, light.amount = "memory", peak - capacity
    elif capacity - peak < space.min_memory_headroom * capacity:
        light.violates, light.amount = "min_memory_headroom", space.min_memory_headroom * capacity - (capacity - peak)
    elif space.budget_per_hour is not None and cost > space.budget_per_hour:
        light.violates, light.amount = "budget_per_hour", cost - space.budget_per_hour
    if space.objective == "throughput":
        light.objective = -tokens
    else:
        seconds = space.train_tokens / tokens
        light.objective = seconds if space.objective == "time_to_train" else seconds / 3600.0 * cost


def _feasible(space: TrainingSpace, metrics: Mapping[str, Any], candidate: Candidate) -> bool:
    light = _Light(-1, candidate, tuple(metrics[k] for k in SCREEN_METRICS))
    _check(space, light)
    return not light.violates


def search_training(config: Mapping[str, Any], options: SearchOptions) -> TrainingSearchResult:
    if isinstance(config.get("cluster"), dict) and "groups" in config["cluster"]:
        from search.training_hetero import search_hetero_split  # a heterogeneous cluster: its layer split

        return search_hetero_split(config, options)  # type: ignore[return-value]
    # a search builds about a million long-lived objects that hold no reference cycles (candidates,
    # their outcomes, memoized prices): on the 1T / 3,072-A100 example (one process) 16 full
    # collections took 5.0 s and the young ones 1.3 s of 48 s CPU; without them peak memory was the
    # same (1.41 against 1.40 GB) and a collection afterwards found about 3,300 objects in cycles.
    # The pool's worker processes fork inside the block, so they inherit it.
    with collector_paused():
        return _search_training(config, options)


def _search_training(config: Mapping[str, Any], options: SearchOptions) -> TrainingSearchResult:
    start = time.perf_counter()
    space = parse_space(config)
    top_k = options.top_k or space.top_k or DEFAULT_TOP_K
    bases = [context_setup(c) for c in space.contexts]
    candidates, arithmetic = enumerate_candidates(space, bases)
    token = _token(config)
    funnel = Funnel(enumerated=len(candidates) + sum(arithmetic.values()), pruned=dict(arithmetic))
    size = max(MIN_BATCH, min(MAX_BATCH, -(-len(candidates) // max(1, 8 * options.workers))))
    screen = partial(screen_indices, token, space, len(candidates))
    # batches hold whole pipeline programs (each computed by one worker); outcomes back in enumeration order
    work = program_batches(space.contexts, candidates, size)
    _ENUMERATED.clear()
    _ENUMERATED[token] = candidates  # before the pool forks: its processes inherit the list
    try:
        with BatchPool(workers=options.workers, dask_address=options.dask_address) as executor:
            with progress(len(candidates), "screening") as update:
                screened_batches = executor.map(screen, [array("I", batch) for batch in work], on_done=update)
            result = _rank(space, token, top_k, candidates, arithmetic, work, screened_batches, funnel, executor)
    finally:
        _ENUMERATED.clear()
    ranked, pareto, lights, floors, rows, pool = result
    binding = _binding_constraint(space, lights, floors, funnel, ranked[0] if ranked else None)
    return TrainingSearchResult(
        objective=space.objective, train_tokens=space.train_tokens, ranked=ranked,
        pareto=pareto, binding_constraint=binding, funnel=funnel, rows=rows, screen_metric_names=SCREEN_METRICS,
        wall_time_s=time.perf_counter() - start, feasible=bool(pool), contexts=space.contexts,
    )


def _rank(space: TrainingSpace, token: str, top_k: int, candidates: list[Candidate], arithmetic: dict[str, int],
          work: list[list[int]], screened_batches: list[ScreenedColumns], funnel: Funnel, executor: BatchPool) -> Any:
    """The screened outcomes counted and ranked; the MILPs, the top K's full pricing and DES re-ranking
    and the Pareto set's full pricing, all on ``executor`` (where screening computed the programs)."""
    n = len(candidates)
    rules: list[str | None] = [None] * n  # None: screened
    floor_of: list[float | None] = [None] * n
    metrics: list[tuple[Any, ...] | None] = [None] * n
    for batch, (batch_rules, batch_floors, batch_metrics) in zip(work, screened_batches):
        for i, rule, floor, values in zip(batch, batch_rules, batch_floors, batch_metrics):
            rules[i], floor_of[i], metrics[i] = rule, floor, values
    seen: set[tuple[Any, ...]] = set()  # see EQUIVALENT_RULE: the candidate without its schedule, its metrics
    for index in [i for i, rule in enumerate(rules) if rule is None]:
        candidate = candidates[index]
        key = (candidate[:_SCHEDULE], candidate[_SCHEDULE + 1:], metrics[index])
        if key in seen:
            rules[index], metrics[index] = EQUIVALENT_RULE, None
        seen.add(key)
    # per rule in order of first occurrence (enumeration order), after the arithmetic ones
    for rule, count in Counter(rule for rule in rules if rule is not None).items():
        funnel.pruned[rule] = funnel.pruned.get(rule, 0) + count
    floors = [floor_of[i] - space.contexts[candidates[i].context].capacity_bytes  # type: ignore[operator]
              for i, rule in enumerate(rules) if rule == MEMORY_RULE]
    lights: list[_Light] = []
    for index in [i for i, rule in enumerate(rules) if rule is None]:
        light = _Light(index, candidates[index], metrics[index])
        _check(space, light)
        lights.append(light)
    rows = ScreenRows(
        aggregates=[ScreenRow(candidate=None, context=None, rule=rule, count=count) for rule, count in arithmetic.items()],
        candidates=candidates, contexts=space.contexts, rules=rules, metrics=metrics,
        violates={x.index: x.violates for x in lights},
    )
    funnel.screened = len(lights)
    funnel.fits_in_memory = sum(1 for x in lights if x.violates != "memory")
    # ties (equal objective) go to the plan with the smaller peak memory, then to enumeration order
    feasible = sorted((x for x in lights if not x.violates), key=lambda x: (x.objective, x.metrics[_PEAK], x.index))
    funnel.meets_constraints = len(feasible)

    # ---- MILP refinement of the best plans ---------------------------------------------------------
    refined = _refine(space, token, feasible, lights, top_k, funnel, len(candidates), executor)
    pool = sorted(feasible + refined, key=lambda x: (x.objective, x.metrics[_PEAK], x.index))

    # ---- Pareto set over every feasible plan (analytic) ------------------------------------------
    sources = {x.index: x.source for x in pool}
    light_plans = [
        Plan(index=x.index, candidate=x.candidate, context=space.contexts[x.candidate.context], source=sources[x.index],
             analytic=dict(zip(SCREEN_METRICS, x.metrics), fidelity="analytic"))
        for x in pool
    ]
    front = pareto_set(light_plans)

    # ---- full analytic metrics of the top K and the Pareto set; DES re-ranking of the top K --------
    top = pool[:top_k]
    priced = {x.index: x.candidate for x in top}
    for p, _ in front:
        priced.setdefault(p.index, p.candidate)
    in_top = {x.index for x in top}
    with progress(len(priced), "DES re-ranking") as update:
        outcomes_of = dict(zip(priced, (m for batch in executor.map(
            partial(plan_batch, token, space.contexts), [[(c, i in in_top)] for i, c in priced.items()],
            on_done=update) for m in batch)))
    top_plans = [Plan(index=x.index, candidate=x.candidate, context=space.contexts[x.candidate.context],
                      source=sources[x.index], analytic=outcomes_of[x.index][0], des=outcomes_of[x.index][1])
                 for x in top]
    funnel.des_reranked = len(top_plans)
    reranked = sorted(top_plans, key=lambda p: (objective_value(p, space.objective, space.train_tokens),
                                                p.des["peak_memory_bytes"], p.index))
    ranked = [p for p in reranked if _feasible(space, p.des, p.candidate)] or reranked
    # each plan its own metrics (a plan in the top K and the Pareto set shares none with itself)
    pareto = [(Plan(index=p.index, candidate=p.candidate, context=p.context, source=p.source,
                    analytic=copy.deepcopy(outcomes_of[p.index][0])), reason) for p, reason in front]
    return ranked, pareto, lights, floors, rows, pool


# the candidates of the search running in this process (token -> list): set by the search process
# before its pool forks, so that batches travel as indices; a process without them (a dask
# worker, a spawned process) enumerates the space itself, once per search
_ENUMERATED: dict[str, list[Candidate]] = {}
# a batch's outcomes as columns: rules (None: screened), memory floors (the memory rule's), metrics
ScreenedColumns = tuple[list[str | None], list[float | None], list[tuple[Any, ...] | None]]


def screen_indices(token: str, space: TrainingSpace, count: int, indices: Sequence[int]) -> ScreenedColumns:
    """``screen_batch`` of the candidates at ``indices`` of the search's enumeration (a top-level
    function: picklable for pools and dask), its outcomes as columns: sent as indices and returned
    as columns, a batch crosses processes in a few hundred kB instead of pickled records (pickling
    the 1T example's 351,360 candidates and outcomes record by record took 2-3 s of CPU)."""
    candidates = _ENUMERATED.get(token)
    if candidates is None:
        _ENUMERATED.clear()  # one search at a time per process
        candidates = enumerate_candidates(space, _worker(token, space.contexts).bases)[0]
        if len(candidates) != count:
            raise RuntimeError(f"this process enumerated {len(candidates)} candidates; the search has {count}")
        _ENUMERATED[token] = candidates
    outcomes = screen_batch(token, space.contexts, [candidates[i] for i in indices])
    return [o.rule for o in outcomes], [o.floor_bytes for o in outcomes], [o.metrics for o in outcomes]


def plan_batch(token: str, contexts: Sequence[Any], work: Sequence[tuple[Candidate, bool]]) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
    """(full analytic metrics, DES metrics when asked) of each candidate (a top-level function:
    picklable for pools and dask); the programs of the batch computed together first, but for the
    candidates only priced whose metrics this process already holds (it screened them: the 1T
    example's Pareto set holds programs of up to 393k ops, 1.1 CPU-s of 1.6 to compute again)."""
    prepare_programs(contexts, [c for c, des in work if des or not holds_metrics(token, contexts, c)])
    return [
        (price_candidate(token, contexts, c), simulate_batch([candidate_config(contexts[c.context], c)])[0] if des else None)
        for c, des in work
    ]


# candidates that differ only in the schedule and price the same (at pp = 1 every 1F1B-family
# schedule is the same plan): the first is ranked, the rest counted under this rule
EQUIVALENT_RULE = "equivalent: same metrics as an earlier candidate differing only in the schedule"


def _refine(space: TrainingSpace, token: str, feasible: list[_Light], lights: list[_Light], top_k: int,
            funnel: Funnel, next_index: int, executor: BatchPool) -> list[_Light]:
    """(a) on the best feasible plans with pp > 1, (b) on the best plans that only miss memory;
    returns the re-priced feasible improvements as new lights (indices after the enumeration), in
    the order the parents are listed."""
    out: list[_Light] = []

    def add(candidate: Candidate, metrics: dict[str, Any], parent: _Light, name: str) -> None:
        nonlocal next_index
        light = _Light(next_index, candidate, tuple(metrics[k] for k in SCREEN_METRICS))
        next_index += 1
        _check(space, light)
        if light.violates:
            return
        if parent.violates or light.objective < parent.objective:
            light.source = f"milp: {name}"
            out.append(light)
            funnel.milp_improved[name] = funnel.milp_improved.get(name, 0) + 1

    def capacity(candidate: Candidate) -> float:
        return space.contexts[candidate.context].capacity_bytes * (1.0 - space.min_memory_headroom)

    pipelined = [x for x in feasible if x.candidate.pp > 1 and not x.candidate.layers_per_stage][:top_k]
    # the best plans (better than the best feasible one as priced) that miss memory only
    best = feasible[0].objective if feasible else float("inf")
    memory_only = sorted(
        (x for x in lights if x.violates in ("memory", "min_memory_headroom")
         and x.candidate.recompute in ("none", "selective") and x.objective < best),
        key=lambda x: (x.objective, x.index),
    )[:top_k]
    # (a) on the best feasible plans with a pipeline: the split, when it differs from the even one;
    # (b) on the best plans that miss memory only: the recompute per stage. The MILPs' numbers come
    # from the executor (where screening computed the parents' programs), the MILPs are solved here
    # (HiGHS never runs in a pool process: its thread pool does not survive a fork), and the
    # changed plans are priced on the executor.
    parents = [(x, "layers_per_stage") for x in pipelined] + [(x, "recompute_layers") for x in memory_only]
    inputs = [a for batch in executor.map(
        partial(milp_input_batch, token, space.contexts),
        [[(name, x.candidate, capacity(x.candidate))] for x, name in parents]) for a in batch]
    changes: list[tuple[_Light, str, Candidate]] = []
    for (parent, name), (milp_input, even) in zip(parents, inputs):
        c = parent.candidate
        try:
            answer = assign_layers(milp_input) if name == "layers_per_stage" else choose_recompute(milp_input)
        except (MilpInfeasible, MilpCheckFailed, SolverError):
            funnel.milp_infeasible[name] = funnel.milp_infeasible.get(name, 0) + 1
            continue
        funnel.milp_solved[name] = funnel.milp_solved.get(name, 0) + 1
        if name == "layers_per_stage":
            changed = None if answer.layers_per_chunk == even else c._replace(layers_per_stage=answer.layers_per_chunk)
        else:
            changed = c._replace(recompute_layers=answer.recompute_layers) if any(answer.recompute_layers) else None
        if changed is not None:
            changes.append((parent, name, changed))
    priced = [m for batch in executor.map(partial(price_batch, token, space.contexts), [[c] for _, _, c in changes])
              for m in batch]
    for (parent, name, changed), metrics in zip(changes, priced):
        if metrics is not None:  # None: not a valid plan
            add(changed, metrics, parent, name)
    return out


def milp_input_batch(token: str, contexts: Sequence[Any], work: Sequence[tuple[str, Candidate, float]]) -> list[tuple[Any, tuple[int, ...]]]:
    """The MILP's numbers for each (name, parent, capacity) of ``work`` and the parent's even split
    (a top-level function: picklable for pools and dask)."""
    worker = _worker(token, contexts)
    prepare_programs(contexts, [c for _, c, _ in work])
    out = []
    for name, c, capacity in work:
        setup = worker.builders[c.context](c)
        make = stage_assignment_input if name == "layers_per_stage" else recompute_input
        out.append((make(setup, capacity, worker.cache), stage_layer_counts(setup.model.layers, setup.plan)))
    return out


def price_batch(token: str, contexts: Sequence[Any], work: Sequence[Candidate]) -> list[dict[str, Any] | None]:
    """Full analytic metrics of each candidate, None for one that is not a valid plan."""
    prepare_programs(contexts, work)
    out: list[dict[str, Any] | None] = []
    for c in work:
        try:
            out.append(price_candidate(token, contexts, c))
        except InvalidPlanError:
            out.append(None)
    return out


def _gib(x: float) -> str:
    return f"{x / units.GiB:.1f} GiB"


def _binding_constraint(space: TrainingSpace, lights: list[_Light], floors: list[float], funnel: Funnel,
                        best: Plan | None) -> str:
    """The constraint that keeps plans better than the best out (or, with no feasible plan, the
    one that is missed, with the closest miss)."""
    if best is not None:
        target = objective_value(best, space.objective, space.train_tokens, best.analytic)
        better = [x for x in lights if x.violates and x.objective < target]
        if not better:
            return (f"none: no screened plan with a better objective was excluded by a constraint "
                    f"(the best keeps {_gib(best.headroom_bytes)} of memory headroom)")
        counts: dict[str, int] = {}
        for x in better:
            counts[x.violates] = counts.get(x.violates, 0) + 1
        name = min(counts, key=lambda k: (-counts[k], k))
        closest = min((x for x in better if x.violates == name), key=lambda x: (x.amount, x.index))
        return f"{name}: " + _miss(space, name, counts[name], closest, "screened plans better than the best")
    if not lights:
        if floors:
            return (f"memory: every candidate's memory lower bound exceeds capacity; the smallest is "
                    f"{_gib(min(floors))} over")
        rule = min(funnel.pruned, key=lambda k: (-funnel.pruned[k], k)) if funnel.pruned else "empty space"
        return f"every candidate was pruned; most by: {rule} ({funnel.pruned.get(rule, 0):,})"
    for name in ("memory", "min_memory_headroom", "budget_per_hour"):
        missed = [x for x in lights if x.violates == name]
        if len(missed) == len(lights) or (missed and name != "memory"):
            closest = min(missed, key=lambda x: (x.amount, x.index))
            return f"{name}: " + _miss(space, name, len(missed), closest, "screened plans")
    return "no feasible plan"


def _miss(space: TrainingSpace, name: str, count: int, closest: _Light, what: str) -> str:
    context = space.contexts[closest.candidate.context]
    if name == "memory":
        return (f"{count:,} {what} do not fit; the closest needs {_gib(closest.metrics[_PEAK])}, "
                f"{_gib(closest.amount)} over the {_gib(context.capacity_bytes)} capacity")
    if name == "min_memory_headroom":
        return (f"{count:,} {what} keep less than {space.min_memory_headroom:.0%} of memory free; the closest "
                f"misses by {_gib(closest.amount)}")
    return (f"{count:,} {what} cost more than ${space.budget_per_hour:,.2f}/h; the closest by "
            f"${closest.amount:,.2f}/h")
