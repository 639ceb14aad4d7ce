"""The analytic fidelity runs a stage's overlapped gradient buckets as the DES does: split over the
chunks' final gradient ops in program order (``ProgramProfile.gradient_tails``), each bucket ready
partway through its op, queued on the data-parallel stream, slowing the compute it overlaps; the
slowdown of a stage's last backward carries down the drain to the stages before it."""

from __future__ import annotations

import numpy as np
import pytest

from sim.training.analytic import analytic_iteration
from sim.training.pipeline_des import run_pipeline
from sim.training.schedules import program_profile
from sim.training.work import CommWork
from tests.sim.test_training_des import EXACT, chunk, pipeline


def dp(seconds: float) -> CommWork:
    return CommWork(axis="dp", kind="reduce_scatter", message_bytes=1.0, duration_s=seconds)


def test_gradient_tails_of_the_named_programs() -> None:
    # interleaved, pp 2, m 4, v 2: every stage ends B(2,c1) W B(3,c1) W B(2,c0) W B(3,c0) W, so chunk 1's
    # final (fused) op is B(3,c1)+W, followed by chunk 0's two; chunk 0's final op is the last one
    # (F, B, W counts of chunk 0, then of chunk 1); both stages share the one tail
    profile = program_profile("interleaved", 2, 4, 2)
    assert profile.gradient_tails == (((1, (0, 2, 2, 0, 1, 1)), (0, (0, 1, 1, 0, 0, 0))),)
    assert profile.gradient_tail_of_stage == (0, 0)
    # 1F1B: the last B+W; ZB-H1 splits the backward: the last W alone
    assert program_profile("1f1b", 2, 4).gradient_tails == (((0, (0, 1, 1)),),)
    assert program_profile("zb-h1", 2, 4).gradient_tails == (((0, (0, 0, 1)),),)


def test_exact_timeline_of_two_buckets_behind_the_last_backward() -> None:
    # one stage, m 1, F 1 s, B 1 s, W 1 s (fused B+W, 2 s): bucket 0 (3 s) is ready halfway through the
    # B+W, at 2 s, and runs to 5; bucket 1 is ready at the op's end, 3 s, and waits for it: 5..8. The
    # stage is busy 5 s past its 3 s of compute. With the stream slowing compute by 1.25: the op's
    # second second runs beside bucket 0 from 2 s and ends at 3.25; bucket 1 then runs 5..8 still
    for slowdown, compute_end in ((1.0, 3.0), (1.25, 3.25)):
        work = pipeline("1f1b", 1, 1, chunk(1.0, 1.0, 1.0), grad_sync={0: (dp(3.0), dp(3.0))}, overlap_slowdown=slowdown)
        des, analytic = run_pipeline(work), analytic_iteration(work)
        assert des.iteration_time_s == pytest.approx(8.0, rel=EXACT) and compute_end < 8.0
        assert analytic.iteration_time_s == pytest.approx(8.0, rel=EXACT)
        assert analytic.exposed_comm_s["dp"] == pytest.approx(des.exposed_comm_s["dp"], rel=EXACT) == 5.0


@pytest.mark.parametrize("m", [1, 3, 8])
@pytest.mark.parametrize(("buckets", "bucket_s"), [(1, 0.5), (4, 0.5), (8, 1.0), (2, 3.0), (16, 0.25)])
@pytest.mark.parametrize("slowdown", [1.0, 1.25, 2.0])
def test_one_stage_equals_the_des(m: int, buckets: int, bucket_s: float, slowdown: float) -> None:
    work = pipeline("1f1b", 1, m, chunk(1.0, 1.0, 1.0), grad_sync={0: (dp(bucket_s),) * buckets}, overlap_slowdown=slowdown)
    des, analytic = run_pipeline(work), analytic_iteration(work)
    assert analytic.iteration_time_s == pytest.approx(des.iteration_time_s, rel=EXACT)
    assert analytic.exposed_comm_s["dp"] == pytest.approx(des.exposed_comm_s["dp"], rel=EXACT)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize(("pp", "m"), [(2, 4), (4, 8), (8, 16), (8, 1)])
@pytest.mark.parametrize(("buckets", "bucket_s"), [(4, 0.5), (8, 1.0), (2, 3.0)])
@pytest.mark.parametrize("slowdown", [1.0, 1.25, 2.0])
def test_one_chunk_pipelines_equal_the_des(schedule: str, pp: int, m: int, buckets: int, bucket_s: float,
                                           slowdown: float) -> None:
    # each stage's buckets slow its last B+W, and every earlier stage's last backward waits for that B's
    # input gradient: the drain carries the later stages' slowdowns down to stage 0, as the DES runs it
    work = pipeline(schedule, pp, m, chunk(1.0, 1.0, 1.0), grad_sync={s: (dp(bucket_s),) * buckets for s in range(pp)},
                    overlap_slowdown=slowdown)
    des, analytic = run_pipeline(work), analytic_iteration(work)
    assert analytic.iteration_time_s == pytest.approx(des.iteration_time_s, rel=EXACT)
    assert analytic.exposed_comm_s["dp"] == pytest.approx(des.exposed_comm_s["dp"], rel=EXACT)


@pytest.mark.parametrize(("pp", "v", "m"), [(2, 2, 4), (2, 4, 8), (4, 2, 8), (4, 4, 16)])
@pytest.mark.parametrize(("buckets", "bucket_s"), [(4, 0.5), (8, 1.0), (2, 3.0), (16, 0.25)])
@pytest.mark.parametrize("slowdown", [1.0, 1.25])
def test_interleaved_chunks_hide_their_buckets_behind_the_later_chunks(pp: int, v: int, m: int, buckets: int,
                                                                       bucket_s: float, slowdown: float) -> None:
    # each chunk's buckets start after its own last backward, while the stage still runs the other
    # chunks' (Megatron-Core reduces a chunk's gradients once its last micro-batch is through); priced
    # against one micro-batch's backward, as before, the analytic exposed up to 1.5 s more than the DES on
    # plans like these
    work = pipeline("interleaved", pp, m, chunk(1.0, 1.0, 1.0), v=v,
                    grad_sync={s: (dp(bucket_s),) * buckets for s in range(pp)}, overlap_slowdown=slowdown)
    des, analytic = run_pipeline(work), analytic_iteration(work)
    assert analytic.exposed_comm_s["dp"] == pytest.approx(des.exposed_comm_s["dp"], abs=0.3)
    assert analytic.iteration_time_s == pytest.approx(des.iteration_time_s, rel=0.03)


def _bucket_by_bucket(durations, windows, slowdown):  # type: ignore[no-untyped-def]
    """The stream followed one bucket at a time (what ``grad_sync_exposed_s`` closes over runs): (seconds
    past the compute's nominal end, seconds the last final op's compute is slowed)."""
    n, ops, tail = len(durations), len(windows), windows[0][0]
    now = done = free = 0.0

    def advance(to: float) -> None:
        nonlocal now, done
        if now < free:
            slowed = (free - now) / slowdown
            if done + slowed >= to:
                now, done = now + (to - done) * slowdown, to
                return
            now, done = free, done + slowed
        now, done = now + (to - done), to

    last_start = 0.0
    for i, (window, op_s) in enumerate(windows):
        lo, hi = i * n // ops, (i + 1) * n // ops
        if i == ops - 1:
            advance(tail - window)
            last_start = now
        for q in range(lo, hi):
            advance(tail - window + (q - lo + 1) / (hi - lo) * op_s)
            free = max(free, now) + durations[q]
    advance(tail)
    return max(now, free) - tail, now - last_start - windows[-1][0]


@pytest.mark.parametrize("seed", range(200))
def test_runs_of_equal_buckets_in_closed_form_equal_the_bucket_by_bucket_stream(seed: int) -> None:
    # runs of equal buckets (a search's stages: full buckets, then a smaller last one), behind 1-4 final
    # ops, some streams backlogged throughout, some draining after a long bucket, some never waiting
    from sim.training.analytic import data_parallel_times, grad_sync_exposed_s

    rng = np.random.default_rng(seed)
    durations: list[float] = []
    while len(durations) < rng.integers(1, 40):
        durations += [float(rng.choice([0.05, 0.3, 1.0, 4.0]))] * int(rng.integers(1, 12))
    ops = int(rng.integers(1, 5))
    op_s = rng.uniform(0.5, 3.0, ops)
    windows = tuple((float(op_s[i:].sum() + rng.uniform(0.0, 5.0) * (i < ops - 1)), float(op_s[i])) for i in range(ops))
    windows = tuple(sorted(windows, reverse=True))
    slowdown = float(rng.choice([1.0, 1.138, 2.0]))
    expected = _bucket_by_bucket(tuple(durations), windows, slowdown)
    runs = data_parallel_times(tuple(map(dp, durations)), (), 0.0).bucket_runs
    assert sum(count for _, count in runs) == len(durations)
    assert grad_sync_exposed_s(runs, windows, slowdown) == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert expected[1] >= -1e-12
