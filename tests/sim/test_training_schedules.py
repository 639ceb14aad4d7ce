"""Pipeline schedules as stage programs: completeness, dependency order, in-flight limits, exact orders."""

from __future__ import annotations

import pytest

from sim.training.schedules import (
    SCHEDULES,
    PipeOp,
    max_inflight_microbatches,
    splits_backward,
    stage_program,
)
from workloads.errors import InvalidPlanError

CASES = [
    ("gpipe", 1, 1, 1),
    ("gpipe", 4, 6, 1),
    ("1f1b", 1, 3, 1),
    ("1f1b", 4, 3, 1),
    ("1f1b", 4, 8, 1),
    ("1f1b", 8, 16, 1),
    ("zb-h1", 4, 2, 1),
    ("zb-h1", 4, 8, 1),
    ("zb-h1", 8, 16, 1),
    ("interleaved", 2, 4, 2),
    ("interleaved", 4, 4, 2),
    ("interleaved", 4, 8, 3),
    ("interleaved", 4, 12, 4),
    ("interleaved", 4, 8, 1),
]


def _text(program: tuple[PipeOp, ...], chunks: bool = False) -> str:
    return " ".join(f"{op.kind}{op.microbatch}" + (f".{op.chunk}" if chunks else "") for op in program)


@pytest.mark.parametrize(("schedule", "pp", "m", "v"), CASES)
def test_every_op_once_and_f_before_b_before_w(schedule: str, pp: int, m: int, v: int) -> None:
    for stage in range(pp):
        program = stage_program(schedule, pp, stage, m, v)
        position = {(op.kind, op.microbatch, op.chunk): i for i, op in enumerate(program)}
        assert len(position) == len(program) == 3 * m * v  # each (kind, micro-batch, chunk) exactly once
        for mb in range(m):
            for chunk in range(v):
                assert position[("F", mb, chunk)] < position[("B", mb, chunk)] < position[("W", mb, chunk)]


@pytest.mark.parametrize(("schedule", "pp", "m", "v"), [c for c in CASES if c[0] != "zb-h1"])
def test_fused_schedules_put_each_w_right_after_its_b(schedule: str, pp: int, m: int, v: int) -> None:
    assert not splits_backward(schedule)
    for stage in range(pp):
        program = stage_program(schedule, pp, stage, m, v)
        for i, op in enumerate(program):
            if op.kind == "B":
                assert program[i + 1] == PipeOp(kind="W", microbatch=op.microbatch, chunk=op.chunk)


@pytest.mark.parametrize(("pp", "m"), [(4, 8), (4, 3), (8, 16), (2, 1)])
def test_in_flight_limits_of_1f1b_gpipe_and_zb_h1(pp: int, m: int) -> None:
    for stage in range(pp):
        assert max_inflight_microbatches(stage_program("gpipe", pp, stage, m)) == m
        # Narayanan et al. 2021 Sec. 2.2.1: 1F1B keeps at most pp - stage micro-batches in flight
        assert max_inflight_microbatches(stage_program("1f1b", pp, stage, m)) == min(pp - stage, m)
        # Qi et al. 2024: ZB-H1 keeps the peak memory of 1F1B
        assert max_inflight_microbatches(stage_program("zb-h1", pp, stage, m)) == min(pp - stage, m)


def test_exact_1f1b_programs() -> None:
    assert _text(stage_program("1f1b", 4, 0, 6)) == "F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 B3 W3 B4 W4 B5 W5"
    assert _text(stage_program("1f1b", 4, 3, 6)) == "F0 B0 W0 F1 B1 W1 F2 B2 W2 F3 B3 W3 F4 B4 W4 F5 B5 W5"
    assert _text(stage_program("gpipe", 2, 1, 2)) == "F0 F1 B0 W0 B1 W1"


def test_exact_zb_h1_programs_defer_stage_many_w() -> None:
    # Stage s defers the W of its first s micro-batches to the end (Qi et al. 2024, Fig. 3).
    assert _text(stage_program("zb-h1", 4, 0, 6)) == "F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 B3 W3 B4 W4 B5 W5"
    assert _text(stage_program("zb-h1", 4, 3, 6)) == "F0 B0 F1 B1 F2 B2 F3 B3 W3 F4 B4 W4 F5 B5 W5 W0 W1 W2"
    assert splits_backward("zb-h1")


def test_exact_interleaved_program_follows_megatron_chunk_order() -> None:
    # pp = 2, m = 4, v = 2: forwards visit chunk 0 for micro-batches 0,1 then chunk 1 for 0,1, ...;
    # warm-up of stage 0 = 2 (pp - 0 - 1) + (v - 1) pp = 4 forwards; of stage 1 = 2.
    assert _text(stage_program("interleaved", 2, 0, 4, 2), chunks=True) == (
        "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 W0.1 F3.0 B1.1 W1.1 F2.1 B0.0 W0.0 F3.1 B1.0 W1.0 "
        "B2.1 W2.1 B3.1 W3.1 B2.0 W2.0 B3.0 W3.0"
    )
    assert _text(stage_program("interleaved", 2, 1, 4, 2), chunks=True).startswith("F0.0 F1.0 F0.1 B0.1 W0.1 F1.1")
    # m == pp: Megatron runs every forward first
    program = stage_program("interleaved", 2, 1, 2, 2)
    assert [op.kind for op in program[:4]] == ["F"] * 4


@pytest.mark.parametrize(
    ("schedule", "pp", "stage", "m", "v", "words"),
    [
        ("pipedream", 2, 0, 4, 1, "not one of"),
        ("interleaved", 4, 0, 6, 2, "divisible by pp"),
        ("1f1b", 4, 0, 8, 2, "needs schedule 'interleaved'"),
        ("1f1b", 4, 4, 8, 1, "stage = 4"),
        ("gpipe", 0, 0, 8, 1, "pp = 0"),
        ("gpipe", 2, 0, 0, 1, "num_microbatches = 0"),
    ],
)
def test_invalid_inputs_name_the_rule(schedule: str, pp: int, stage: int, m: int, v: int, words: str) -> None:
    with pytest.raises(InvalidPlanError, match=words):
        stage_program(schedule, pp, stage, m, v)


def test_schedule_names_match_the_interface() -> None:
    assert SCHEDULES == ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "zb-v", "v-half", "v-min", "bfs", "hanayo")
