"""The two structured sub-problems of the training planner as MILPs (PuLP; HiGHS, CBC fallback).

(a) ``assign_layers``: contiguous blocks of layers per (virtual) pipeline chunk minimising the
    slowest stage; the embedding and the LM head + loss are counted on their stages, and every
    stage's memory (model states of its layers plus the activations its schedule keeps in flight)
    stays within capacity. Gives ``[parallel] layers_per_stage``.
(b) ``choose_recompute``: per stage, how many layers are fully recomputed (``recompute_layers``,
    Megatron's block method), the others keeping the plan's ``recompute``: least time under the
    memory cap (a knapsack per stage, coupled through the slowest stage).

Both take plain numbers (``StageAssignmentInput``, ``RecomputeInput``) so that they can be solved
and brute-forced on tiny instances; ``search.training_refine`` derives those numbers from the
simulator's own cost and memory functions. Constraints are named; the solution is checked with
``check_constraints`` before it is returned, and the caller re-prices it with the analytic model.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulp

from search.solver import check_constraints, solve


class MilpInfeasible(Exception):
    """No solution meets the constraints; ``constraint`` names the one that binds and ``by`` says by
    how much its best case misses (in the constraint's unit)."""

    def __init__(self, constraint: str, by: float, message: str) -> None:
        super().__init__(message)
        self.constraint = constraint
        self.by = by


class MilpCheckFailed(Exception):
    """The solver's answer broke a named constraint when re-checked in plain Python."""


# ---- (a) layers to stages ------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class StageAssignmentInput:
    """Per-layer and per-stage costs of one plan shape. Layers 0..dense_layers-1 are dense, the rest
    MoE (a dense model has dense_layers == layers). Chunk c runs on stage c % pp."""

    layers: int
    dense_layers: int
    pp: int
    virtual_stages: int
    dense_layer_s: float  # F + B + W of one dense layer, one micro-batch
    moe_layer_s: float
    first_s: float  # embedding F + B + W (on chunk 0)
    last_s: float  # LM head + loss F + B + W (on the last chunk)
    static_bytes: tuple[float, ...]  # per stage: memory with no layers (reserves, embedding / head, logits)
    dense_layer_bytes: tuple[float, ...]  # per stage: one dense layer's model states + its in-flight activations
    moe_layer_bytes: tuple[float, ...]
    capacity_bytes: float
    # per stage, where stages differ in speed or capacity (a heterogeneous cluster: each stage on its
    # group's GPU); empty: every stage takes dense_layer_s / moe_layer_s / capacity_bytes
    dense_layer_s_per_stage: tuple[float, ...] = ()
    moe_layer_s_per_stage: tuple[float, ...] = ()
    capacity_bytes_per_stage: tuple[float, ...] = ()

    @property
    def chunks(self) -> int:
        return self.pp * self.virtual_stages

    def layer_s(self, stage: int) -> tuple[float, float]:
        """(dense, MoE) layer seconds on ``stage``."""
        return (self.dense_layer_s_per_stage[stage] if self.dense_layer_s_per_stage else self.dense_layer_s,
                self.moe_layer_s_per_stage[stage] if self.moe_layer_s_per_stage else self.moe_layer_s)

    def capacity(self, stage: int) -> float:
        return self.capacity_bytes_per_stage[stage] if self.capacity_bytes_per_stage else self.capacity_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class StageAssignment:
    layers_per_chunk: tuple[int, ...]  # in pipeline order (chunk c on stage c % pp)
    dense_per_chunk: tuple[int, ...]
    slowest_stage_s: float
    stage_s: tuple[float, ...]
    stage_bytes: tuple[float, ...]


def stage_times_and_bytes(
    data: StageAssignmentInput, dense_per_chunk: tuple[int, ...], moe_per_chunk: tuple[int, ...]
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Every stage's seconds and bytes for a given split (the MILP's model, in plain Python)."""
    times = [0.0] * data.pp
    memory = list(data.static_bytes)
    last_chunk = data.chunks - 1
    for c, (d, e) in enumerate(zip(dense_per_chunk, moe_per_chunk)):
        s = c % data.pp
        dense_s, moe_s = data.layer_s(s)
        times[s] += d * dense_s + e * moe_s
        times[s] += (data.first_s if c == 0 else 0.0) + (data.last_s if c == last_chunk else 0.0)
        memory[s] += d * data.dense_layer_bytes[s] + e * data.moe_layer_bytes[s]
    return tuple(times), tuple(memory)


def assign_layers(data: StageAssignmentInput, *, solver: str | None = None) -> StageAssignment:
    """Solve (a). Raises ``MilpInfeasible`` naming the stage memory that cannot be met."""
    chunks, pp = data.chunks, data.pp
    if data.layers < chunks:
        raise MilpInfeasible("one_layer_per_chunk", chunks - data.layers,
                             f"{data.layers} layers cannot fill {chunks} chunks with one layer each")
    moe_total = data.layers - data.dense_layers
    problem = pulp.LpProblem("layers_to_stages", pulp.LpMinimize)
    dense = [problem.add_variable(f"dense_{c}", lowBound=0, upBound=data.dense_layers, cat="Integer") for c in range(chunks)]
    moe = [problem.add_variable(f"moe_{c}", lowBound=0, upBound=moe_total, cat="Integer") for c in range(chunks)]
    slowest = problem.add_variable("slowest_stage_s", lowBound=0)
    problem += slowest
    problem += (pulp.lpSum(dense) == data.dense_layers, "all_dense_layers_placed")
    problem += (pulp.lpSum(moe) == moe_total, "all_moe_layers_placed")
    for c in range(chunks):
        problem += (dense[c] + moe[c] >= 1, f"chunk_{c}_holds_a_layer")
    if data.dense_layers and moe_total:
        # contiguity: dense layers come first; past[c] = 1 once chunk c holds MoE layers, and a chunk
        # after one that held MoE layers holds no dense layer
        past = [problem.add_variable(f"past_dense_{c}", cat="Binary") for c in range(chunks)]
        for c in range(chunks):
            problem += (moe[c] <= moe_total * past[c], f"chunk_{c}_moe_only_past_dense")
            if c:
                problem += (past[c] >= past[c - 1], f"chunk_{c}_stays_past_dense")
                problem += (dense[c] <= data.dense_layers * (1 - past[c - 1]), f"chunk_{c}_dense_before_moe")
    last_chunk = chunks - 1
    for s in range(pp):
        own = range(s, chunks, pp)
        dense_s, moe_s = data.layer_s(s)
        seconds = pulp.lpSum(dense_s * dense[c] + moe_s * moe[c] for c in own)
        ends = (data.first_s if s == 0 else 0.0) + (data.last_s if s == last_chunk % pp else 0.0)
        problem += (seconds + ends <= slowest, f"stage_{s}_within_slowest")
        memory = pulp.lpSum(data.dense_layer_bytes[s] * dense[c] + data.moe_layer_bytes[s] * moe[c] for c in own)
        problem += (memory + data.static_bytes[s] <= data.capacity(s), f"stage_{s}_memory_within_capacity")
    solution = solve(problem, solver=solver)
    if not solution.optimal:
        worst = _least_memory_shortfall(data)
        raise MilpInfeasible(
            "stage_memory_within_capacity", worst,
            f"no contiguous split fits: even the best one exceeds the {min(map(data.capacity, range(pp))) / 2**30:.1f} GiB "
            f"capacity by {worst / 2**30:.2f} GiB on some stage",
        )
    violated = check_constraints(problem, solution)
    if violated:
        raise MilpCheckFailed(f"layers_to_stages: solution violates {', '.join(violated)}")
    dense_per_chunk = tuple(round(solution.value(v)) for v in dense)
    moe_per_chunk = tuple(round(solution.value(v)) for v in moe)
    times, memory = stage_times_and_bytes(data, dense_per_chunk, moe_per_chunk)
    return StageAssignment(
        layers_per_chunk=tuple(d + e for d, e in zip(dense_per_chunk, moe_per_chunk)),
        dense_per_chunk=dense_per_chunk,
        slowest_stage_s=max(times),
        stage_s=times,
        stage_bytes=memory,
    )


def _least_memory_shortfall(data: StageAssignmentInput) -> float:
    """How far the lightest possible stage (one layer per chunk, the lightest kind) is over capacity:
    a lower bound of the miss of every split, reported when (a) is infeasible."""
    lightest = []
    for s in range(data.pp):
        per_layer = min(data.dense_layer_bytes[s] if data.dense_layers else float("inf"),
                        data.moe_layer_bytes[s] if data.layers > data.dense_layers else float("inf"))
        lightest.append(data.static_bytes[s] + data.virtual_stages * per_layer - data.capacity(s))
    return max(0.0, max(lightest))


# ---- (b) per-stage recompute ---------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class RecomputeInput:
    """Per stage: its layers, seconds and bytes with no layer fully recomputed, and what each fully
    recomputed layer adds (seconds) and saves (bytes at the stage's peak); recomputing any layer
    also needs a working set of ``working_bytes`` more (one layer re-materialised in full)."""

    layers: tuple[int, ...]
    stage_s: tuple[float, ...]
    stage_bytes: tuple[float, ...]
    recompute_layer_s: tuple[float, ...]
    saved_bytes_per_layer: tuple[float, ...]
    working_bytes: tuple[float, ...]
    capacity_bytes: float
    num_microbatches: int  # weights the slowest stage (m - 1) against the sum of all stages (1F1B form)


@dataclass(frozen=True, slots=True, kw_only=True)
class RecomputeChoice:
    recompute_layers: tuple[int, ...]
    pipeline_s: float  # (m - 1) x slowest + sum of stages: the objective
    stage_s: tuple[float, ...]
    stage_bytes: tuple[float, ...]


def recompute_outcome(data: RecomputeInput, choice: tuple[int, ...]) -> tuple[float, tuple[float, ...], tuple[float, ...]]:
    """(objective, stage seconds, stage bytes) of recomputing ``choice[s]`` layers on stage s."""
    times = tuple(t + r * dt for t, r, dt in zip(data.stage_s, choice, data.recompute_layer_s))
    memory = tuple(
        b - r * saved + (w if r else 0.0)
        for b, r, saved, w in zip(data.stage_bytes, choice, data.saved_bytes_per_layer, data.working_bytes)
    )
    return (data.num_microbatches - 1) * max(times) + sum(times), times, memory


def choose_recompute(data: RecomputeInput, *, solver: str | None = None) -> RecomputeChoice:
    """Solve (b). Raises ``MilpInfeasible`` naming the stage that does not fit with every layer recomputed."""
    pp = len(data.layers)
    problem = pulp.LpProblem("recompute_knapsack", pulp.LpMinimize)
    count = [problem.add_variable(f"recompute_{s}", lowBound=0, upBound=data.layers[s], cat="Integer") for s in range(pp)]
    used = [problem.add_variable(f"recomputes_any_{s}", cat="Binary") for s in range(pp)]
    slowest = problem.add_variable("slowest_stage_s", lowBound=0)
    seconds = [data.stage_s[s] + data.recompute_layer_s[s] * count[s] for s in range(pp)]
    problem += (data.num_microbatches - 1) * slowest + pulp.lpSum(seconds)
    for s in range(pp):
        problem += (seconds[s] <= slowest, f"stage_{s}_within_slowest")
        problem += (count[s] <= data.layers[s] * used[s], f"stage_{s}_recompute_needs_working_set")
        memory = data.stage_bytes[s] - data.saved_bytes_per_layer[s] * count[s] + data.working_bytes[s] * used[s]
        problem += (memory <= data.capacity_bytes, f"stage_{s}_memory_within_capacity")
    solution = solve(problem, solver=solver)
    if not solution.optimal:
        all_in = tuple(data.layers)
        _, _, memory = recompute_outcome(data, all_in)
        stage = max(range(pp), key=lambda s: memory[s] - data.capacity_bytes)
        by = memory[stage] - data.capacity_bytes
        raise MilpInfeasible(
            f"stage_{stage}_memory_within_capacity", by,
            f"stage {stage} exceeds the {data.capacity_bytes / 2**30:.1f} GiB capacity by {by / 2**30:.2f} GiB "
            "even with every layer recomputed",
        )
    violated = check_constraints(problem, solution)
    if violated:
        raise MilpCheckFailed(f"recompute_knapsack: solution violates {', '.join(violated)}")
    choice = tuple(round(solution.value(v)) for v in count)
    objective, times, memory = recompute_outcome(data, choice)
    return RecomputeChoice(recompute_layers=choice, pipeline_s=objective, stage_s=times, stage_bytes=memory)
