"""The planner's MILPs against brute force on instances small enough to enumerate."""

from __future__ import annotations

import itertools

import pytest

from search.solver import available_solver
from search.training_milp import (
    MilpInfeasible,
    RecomputeInput,
    StageAssignmentInput,
    assign_layers,
    choose_recompute,
    recompute_outcome,
    stage_times_and_bytes,
)

SOLVERS = ["HiGHS", available_solver(("COIN_CMD", "PULP_CBC_CMD"))]
GiB = 2**30


def _splits(layers: int, chunks: int):
    """Every composition of ``layers`` into ``chunks`` positive parts."""
    for cuts in itertools.combinations(range(1, layers), chunks - 1):
        bounds = (0, *cuts, layers)
        yield tuple(b - a for a, b in zip(bounds, bounds[1:]))


def _dense_moe(split: tuple[int, ...], dense_layers: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    dense, moe, start = [], [], 0
    for n in split:
        d = min(max(dense_layers - start, 0), n)
        dense.append(d)
        moe.append(n - d)
        start += n
    return tuple(dense), tuple(moe)


def _brute_force(data: StageAssignmentInput) -> float | None:
    best = None
    for split in _splits(data.layers, data.chunks):
        times, memory = stage_times_and_bytes(data, *_dense_moe(split, data.dense_layers))
        if max(m - data.capacity(st) for st, m in enumerate(memory)) <= 0 and (best is None or max(times) < best):
            best = max(times)
    return best


def _instance(**overrides) -> StageAssignmentInput:
    values = dict(
        layers=12, dense_layers=12, pp=4, virtual_stages=1, dense_layer_s=1.0, moe_layer_s=1.6,
        first_s=0.7, last_s=2.3,  # a large vocabulary: the LM head costs more than two layers
        static_bytes=(10 * GiB, 6 * GiB, 6 * GiB, 12 * GiB),
        dense_layer_bytes=(4 * GiB, 3 * GiB, 2 * GiB, 1 * GiB),  # 1F1B: stage 0 keeps the most in flight
        moe_layer_bytes=(5 * GiB, 4 * GiB, 3 * GiB, 2 * GiB),
        capacity_bytes=22 * GiB,
    )
    values.update(overrides)
    return StageAssignmentInput(**values)


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize(
    "overrides",
    [
        {},  # dense: the head's stage gets fewer layers
        {"dense_layers": 3},  # 3 dense layers, then 9 MoE: contiguity across kinds
        {"capacity_bytes": 18 * GiB},  # memory pushes layers off stage 0
        {"pp": 2, "virtual_stages": 2, "static_bytes": (10 * GiB, 12 * GiB),
         "dense_layer_bytes": (2 * GiB, 1 * GiB), "moe_layer_bytes": (3 * GiB, 2 * GiB)},  # interleaved chunks
        # a heterogeneous cluster: stages 2 and 3 on a GPU 2.5x faster, stage 3's with less memory
        {"dense_layer_s_per_stage": (1.0, 1.0, 0.4, 0.4), "moe_layer_s_per_stage": (1.6, 1.6, 0.64, 0.64),
         "capacity_bytes_per_stage": (22 * GiB, 22 * GiB, 40 * GiB, 20 * GiB), "dense_layers": 5},
    ],
)
def test_assign_layers_matches_brute_force(solver, overrides) -> None:
    data = _instance(**overrides)
    expected = _brute_force(data)
    result = assign_layers(data, solver=solver)
    assert result.slowest_stage_s == pytest.approx(expected, abs=1e-9)
    assert sum(result.layers_per_chunk) == data.layers and min(result.layers_per_chunk) >= 1
    assert all(b <= data.capacity(st) for st, b in enumerate(result.stage_bytes))
    # contiguity: the dense layers are exactly the first ones
    assert _dense_moe(result.layers_per_chunk, data.dense_layers)[0] == result.dense_per_chunk


def test_uneven_split_beats_even_with_an_expensive_head() -> None:
    data = _instance(capacity_bytes=1e15)
    even_times, _ = stage_times_and_bytes(data, (3, 3, 3, 3), (0, 0, 0, 0))
    result = assign_layers(data)
    assert result.slowest_stage_s < max(even_times)
    assert result.layers_per_chunk[-1] < 3


def test_faster_stages_get_more_layers() -> None:
    """Per-stage layer seconds (stages on GPUs of different speeds): the split follows the speeds."""
    data = _instance(capacity_bytes=1e15, first_s=0.0, last_s=0.0, dense_layer_s_per_stage=(1.0, 1.0, 0.5, 0.5))
    result = assign_layers(data)
    assert result.layers_per_chunk == (2, 2, 4, 4)
    assert result.slowest_stage_s == pytest.approx(2.0)


def test_assign_layers_infeasible_names_the_constraint() -> None:
    data = _instance(capacity_bytes=12 * GiB)  # one layer each: 14, 9, 8, 13 GiB: stage 0 misses by 2
    with pytest.raises(MilpInfeasible) as info:
        assign_layers(data)
    assert info.value.constraint == "stage_memory_within_capacity"
    assert info.value.by == pytest.approx(2 * GiB)


def _recompute_instance(**overrides) -> RecomputeInput:
    values = dict(
        layers=(4, 4, 3),
        stage_s=(10.0, 9.0, 11.0),
        stage_bytes=(30 * GiB, 26 * GiB, 24 * GiB),
        recompute_layer_s=(0.8, 0.8, 0.9),
        saved_bytes_per_layer=(3 * GiB, 2 * GiB, 1 * GiB),
        working_bytes=(1 * GiB, 1 * GiB, 1 * GiB),
        capacity_bytes=24 * GiB,
        num_microbatches=8,
    )
    values.update(overrides)
    return RecomputeInput(**values)


def _brute_force_recompute(data: RecomputeInput) -> float | None:
    best = None
    for choice in itertools.product(*(range(n + 1) for n in data.layers)):
        objective, _, memory = recompute_outcome(data, choice)
        if max(memory) <= data.capacity_bytes and (best is None or objective < best):
            best = objective
    return best


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("capacity_GiB", [24, 26, 30, 40])
def test_recompute_knapsack_matches_brute_force(solver, capacity_GiB) -> None:
    data = _recompute_instance(capacity_bytes=capacity_GiB * GiB)
    result = choose_recompute(data, solver=solver)
    assert result.pipeline_s == pytest.approx(_brute_force_recompute(data), abs=1e-9)
    assert max(result.stage_bytes) <= data.capacity_bytes


def test_recompute_knapsack_recomputes_nothing_when_it_fits() -> None:
    assert choose_recompute(_recompute_instance(capacity_bytes=40 * GiB)).recompute_layers == (0, 0, 0)


def test_recompute_knapsack_infeasible_names_stage_and_shortfall() -> None:
    data = _recompute_instance(capacity_bytes=17 * GiB)  # at best 19, 19 and 22 GiB: stage 2 misses by 5
    with pytest.raises(MilpInfeasible) as info:
        choose_recompute(data)
    assert info.value.constraint == "stage_2_memory_within_capacity"
    assert info.value.by == pytest.approx(5 * GiB)
