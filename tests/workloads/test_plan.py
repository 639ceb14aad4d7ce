"""Parallel plans and training jobs: validation rules and layer splits."""

from __future__ import annotations

import pytest

from workloads.errors import InvalidPlanError
from workloads.plan import ParallelPlan, TrainingJob, stage_layer_counts


def test_even_split_puts_the_larger_chunks_first() -> None:
    assert stage_layer_counts(10, ParallelPlan(pp=4)) == (3, 3, 2, 2)


def test_uneven_split_per_chunk_is_taken_as_given() -> None:
    plan = ParallelPlan(pp=2, schedule="interleaved", virtual_stages=2, layers_per_stage=(1, 3, 3, 1))
    assert stage_layer_counts(8, plan) == (1, 3, 3, 1)


def test_uneven_split_per_stage_spreads_over_its_chunks() -> None:
    # chunk c lives on stage c % pp: stage 0 holds chunks 0 and 2, stage 1 chunks 1 and 3
    plan = ParallelPlan(pp=2, schedule="interleaved", virtual_stages=2, layers_per_stage=(5, 3))
    counts = stage_layer_counts(8, plan)
    assert counts == (3, 2, 2, 1)
    assert counts[0] + counts[2] == 5 and counts[1] + counts[3] == 3


@pytest.mark.parametrize("layers, message", [((4, 4, 1), "needs pp = 2"), ((5, 4), "sum to the model's 8 layers")])
def test_bad_uneven_splits_name_the_rule(layers: tuple[int, ...], message: str) -> None:
    with pytest.raises(InvalidPlanError, match=message):
        stage_layer_counts(8, ParallelPlan(pp=2, layers_per_stage=layers))


def test_more_chunks_than_layers_is_rejected() -> None:
    with pytest.raises(InvalidPlanError, match="fewer than pp x virtual_stages = 16"):
        stage_layer_counts(8, ParallelPlan(pp=16))


@pytest.mark.parametrize("kwargs, message", [
    ({"tp": 0}, "parallel.tp = 0"),
    ({"zero": 4}, "parallel.zero = 4"),
    ({"schedule": "pipedream"}, "parallel.schedule = 'pipedream'"),
    ({"virtual_stages": 2}, "needs schedule 'interleaved'"),
    ({"hsdp": True, "zero": 1}, "hsdp = true needs zero = 3"),
    ({"ep": 3, "dp": 4}, "ep = 3 must divide dp \\* cp = 4"),
])
def test_plan_rules(kwargs: dict, message: str) -> None:
    with pytest.raises(InvalidPlanError, match=message):
        ParallelPlan(**kwargs)


def test_world_size_and_microbatches() -> None:
    plan = ParallelPlan(tp=8, pp=8, dp=16)
    assert plan.world_size == 1024
    job = TrainingJob(seq_len=2048, global_batch=1536, micro_batch=1)
    assert job.num_microbatches(plan.dp) == 96
    with pytest.raises(InvalidPlanError, match="global_batch 1536 must be divisible by dp 7"):
        job.num_microbatches(7)


def test_cp_comm_takes_interface_md_s_hyphenated_all_gather() -> None:
    assert ParallelPlan(cp=2, cp_comm="all-gather").cp_comm == "all_gather"
    with pytest.raises(InvalidPlanError, match="cp_comm = 'allgather' must be one of ring, all_gather"):
        ParallelPlan(cp=2, cp_comm="allgather")
