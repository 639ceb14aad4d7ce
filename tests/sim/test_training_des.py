"""SimPy pipeline executor: exact timelines, textbook bubbles, invariants, communication, traces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.training.pipeline_des import PipelineResult, run_pipeline
from sim.training.schedules import stage_program
from sim.training.trace import MICROSECONDS_PER_SECOND, chrome_trace, plot_pipeline_timeline, write_chrome_trace
from sim.training.work import ChunkWork, CommWork, PipelineWork, StageWork

EXACT = 1e-9  # pure arithmetic on small floats


def chunk(
    forward_s: float = 1.0,
    backward_input_s: float = 2.0,
    backward_weight_s: float = 0.0,
    *,
    activation_bytes: float = 10.0,
    send_bytes: float = 0.0,
    exposed: dict[str, float] | None = None,
) -> ChunkWork:
    return ChunkWork(
        forward_s=forward_s,
        backward_input_s=backward_input_s,
        backward_weight_s=backward_weight_s,
        exposed_comm_s=exposed or {},
        recompute_s=0.0,
        activation_bytes=activation_bytes,
        send_bytes=send_bytes,
        layers=1,
    )


def pipeline(
    schedule: str,
    pp: int,
    m: int,
    chunk_work: ChunkWork | list[ChunkWork],
    *,
    v: int = 1,
    latency_s: float = 0.0,
    bandwidth_Bps: float = 1e12,
    grad_sync: dict[int, tuple[CommWork, ...]] | None = None,
    param_gather: tuple[CommWork, ...] = (),
    optimizer_s: float = 0.0,
    overlap_slowdown: float = 1.0,
) -> PipelineWork:
    per_stage = chunk_work if isinstance(chunk_work, list) else [chunk_work] * pp
    stages = tuple(
        StageWork(
            stage=s,
            chunks=(per_stage[s],) * v,
            grad_sync=(grad_sync or {}).get(s, ()),
            param_gather=param_gather,
            optimizer_s=optimizer_s,
            static_memory_bytes=0.0,
        )
        for s in range(pp)
    )
    return PipelineWork(
        schedule=schedule,
        num_microbatches=m,
        virtual_stages=v,
        stages=stages,
        p2p_bandwidth_Bps=(bandwidth_Bps,) * pp,
        p2p_latency_s=(latency_s,) * pp,
        overlap_slowdown=overlap_slowdown,
    )


def dp(duration_s: float) -> CommWork:
    return CommWork(axis="dp", kind="all_reduce", message_bytes=1.0, duration_s=duration_s)


def compute_ops(result: PipelineResult) -> list[tuple[int, str, float, float]]:
    return [(e.stage, e.name, e.start_s, e.end_s) for e in result.events if e.stream == "compute"]


def test_tiny_1f1b_timeline_is_exact() -> None:
    # pp = 2, m = 2, F = 1, B = 2, W = 0, no p2p cost: worked by hand.
    result = run_pipeline(pipeline("1f1b", 2, 2, chunk(1.0, 2.0, 0.0), bandwidth_Bps=float("inf")), trace=True)
    fb = [op for op in compute_ops(result) if op[1][0] in "FB"]
    assert sorted(fb, key=lambda op: (op[0], op[2])) == [
        (0, "F0", 0.0, 1.0),
        (0, "F1", 1.0, 2.0),
        (0, "B0", 4.0, 6.0),
        (0, "B1", 7.0, 9.0),
        (1, "F0", 1.0, 2.0),
        (1, "B0", 2.0, 4.0),
        (1, "F1", 4.0, 5.0),
        (1, "B1", 5.0, 7.0),
    ]
    assert result.iteration_time_s == 9.0
    assert result.compute_end_s == (9.0, 7.0)
    assert result.compute_busy_s == (6.0, 6.0)
    assert result.memory_timeline[1] == ((0.0, 0.0), (2.0, 10.0), (4.0, 0.0), (5.0, 10.0), (7.0, 0.0))
    assert result.exposed_comm_s == {"tp": 0.0, "cp": 0.0, "ep": 0.0, "dp": 0.0, "pp": 0.0}


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("pp", "m"), [(1, 4), (2, 2), (4, 8), (4, 3), (8, 32)])
@pytest.mark.parametrize(("f", "b", "w"), [(1.0, 2.0, 0.0), (1.0, 1.0, 1.0), (0.3, 0.5, 0.4)])
def test_gpipe_and_1f1b_match_the_textbook_bubble(schedule: str, pp: int, m: int, f: float, b: float, w: float) -> None:
    # Narayanan et al. 2021 / Huang et al. 2019: T = (m + p - 1)(t_f + t_b); bubble (p-1)/(m+p-1) of T.
    result = run_pipeline(pipeline(schedule, pp, m, chunk(f, b, w), bandwidth_Bps=float("inf")))
    assert result.iteration_time_s == pytest.approx((m + pp - 1) * (f + b + w), rel=EXACT)
    assert result.bubble_fraction == pytest.approx((pp - 1) / (m + pp - 1), rel=EXACT, abs=EXACT)
    expected_inflight = tuple(m if schedule == "gpipe" else min(pp - s, m) for s in range(pp))
    assert result.peak_inflight_microbatches == expected_inflight
    assert result.peak_activation_bytes == tuple(10.0 * n for n in expected_inflight)


@pytest.mark.parametrize(("pp", "m", "v"), [(2, 4, 2), (4, 4, 2), (4, 8, 2), (4, 8, 4), (8, 16, 2)])
def test_interleaved_bubble_is_p_minus_1_over_v_m(pp: int, m: int, v: int) -> None:
    # Narayanan et al. 2021 Sec. 2.2.2: bubble time / ideal time = (p - 1) / (v m).
    t_f, t_b = 1.0, 2.0  # per micro-batch per stage, split over v chunks
    result = run_pipeline(pipeline("interleaved", pp, m, chunk(t_f / v, t_b / v), v=v, bandwidth_Bps=float("inf")))
    ideal_s = m * (t_f + t_b)
    assert (result.iteration_time_s - ideal_s) / ideal_s == pytest.approx((pp - 1) / (v * m), rel=EXACT)


@pytest.mark.parametrize(("pp", "m"), [(2, 2), (4, 8), (8, 16), (8, 64)])
def test_zb_h1_bubble_with_equal_f_b_w(pp: int, m: int) -> None:
    # Qi et al. 2024: ZB-H1 bubble = (p - 1)(T_F + T_B - T_W), against (p - 1)(T_F + T_B + T_W) for 1F1B.
    t = 1.0
    zb = run_pipeline(pipeline("zb-h1", pp, m, chunk(t, t, t), bandwidth_Bps=float("inf")))
    one_f_one_b = run_pipeline(pipeline("1f1b", pp, m, chunk(t, t, t), bandwidth_Bps=float("inf")))
    assert zb.iteration_time_s == pytest.approx(m * 3 * t + (pp - 1) * (t + t - t), rel=EXACT)
    assert one_f_one_b.iteration_time_s - zb.iteration_time_s == pytest.approx((pp - 1) * 2 * t, rel=EXACT, abs=EXACT)
    assert zb.peak_inflight_microbatches == one_f_one_b.peak_inflight_microbatches


@pytest.mark.parametrize(
    ("schedule", "v"), [("gpipe", 1), ("1f1b", 1), ("zb-h1", 1), ("interleaved", 2)]
)
def test_invariants_with_uneven_stages_and_p2p(schedule: str, v: int) -> None:
    pp, m = 4, 8
    chunks = [chunk(0.5 + 0.1 * s, 1.0 + 0.05 * s, 0.3, send_bytes=1e6) for s in range(pp)]
    work = pipeline(schedule, pp, m, chunks, v=v, latency_s=1e-3, bandwidth_Bps=1e9)
    result = run_pipeline(work, trace=True)
    for s in range(pp):
        ops = sorted((e.start_s, e.end_s) for e in result.events if e.stage == s and e.stream == "compute")
        assert all(end >= start for start, end in ops)
        assert all(a_end <= b_start + 1e-12 for (_, a_end), (b_start, _) in zip(ops, ops[1:]))  # never busy twice
        nominal = v * m * (chunks[s].forward_s + chunks[s].backward_input_s + chunks[s].backward_weight_s)
        assert result.compute_busy_s[s] == pytest.approx(nominal, rel=EXACT)
        assert result.compute_busy_s[s] <= result.iteration_time_s
        levels = [held for _, held in result.memory_timeline[s]]
        assert min(levels) >= 0.0 and levels[-1] == 0.0
        times = [t for t, _ in result.memory_timeline[s]]
        assert times == sorted(times)
    assert 0.0 <= result.bubble_fraction < 1.0
    assert run_pipeline(work, trace=True) == result  # deterministic, bit for bit


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe", "zb-h1"])
def test_p2p_latency_increases_time_monotonically_and_is_exposed(schedule: str) -> None:
    pp, m = 4, 8
    base = run_pipeline(pipeline(schedule, pp, m, chunk(1.0, 1.0, 1.0, send_bytes=1e6), bandwidth_Bps=1e9))
    previous = base.iteration_time_s
    for latency_s in (1e-4, 1e-3, 1e-2, 1e-1):
        result = run_pipeline(
            pipeline(schedule, pp, m, chunk(1.0, 1.0, 1.0, send_bytes=1e6), latency_s=latency_s, bandwidth_Bps=1e9)
        )
        assert result.iteration_time_s > previous
        previous = result.iteration_time_s
    ideal = run_pipeline(pipeline(schedule, pp, m, chunk(1.0, 1.0, 1.0), bandwidth_Bps=float("inf")))
    # uniform stages: every extra second lies on the critical path as a p2p transfer
    assert result.exposed_comm_s["pp"] == pytest.approx(result.iteration_time_s - ideal.iteration_time_s, abs=EXACT)


def test_p2p_link_serialises_messages() -> None:
    # pp = 2, gpipe, F = 0.1 s, 1 s per message: the link, not the sender, sets the arrival rate.
    result = run_pipeline(pipeline("gpipe", 2, 3, chunk(0.1, 0.1, 0.0, send_bytes=1e9), bandwidth_Bps=1e9), trace=True)
    sends = [(e.start_s, e.end_s) for e in result.events if e.stream == "p2p" and e.stage == 0]
    assert sends == [(0.1, 1.1), (1.1, 2.1), (2.1, 3.1)]
    f_stage1 = [(e.start_s, e.end_s) for e in result.events if e.stage == 1 and e.name.startswith("F")]
    assert f_stage1 == [(1.1, pytest.approx(1.2)), (2.1, pytest.approx(2.2)), (3.1, pytest.approx(3.2))]


def test_dp_bucket_hidden_under_remaining_compute_exposes_nothing() -> None:
    # 1f1b, pp = 2, m = 2, F = 1, B = 2: stage 1 ends compute at 7, stage 0 at 9 (see the exact timeline).
    hidden = run_pipeline(pipeline("1f1b", 2, 2, chunk(), bandwidth_Bps=float("inf"), grad_sync={1: (dp(1.5),)}))
    assert hidden.iteration_time_s == pytest.approx(9.0, rel=EXACT)
    assert hidden.exposed_comm_s["dp"] == pytest.approx(0.0, abs=EXACT)
    exposed = run_pipeline(pipeline("1f1b", 2, 2, chunk(), bandwidth_Bps=float("inf"), grad_sync={1: (dp(3.0),)}))
    assert exposed.iteration_time_s == pytest.approx(10.0, rel=EXACT)  # 7 + 3
    assert exposed.exposed_comm_s["dp"] == pytest.approx(3.0 - 2.0, rel=EXACT)  # the bucket minus the remaining compute
    assert exposed.critical_stage == 1


def test_buckets_spread_over_the_last_backward_and_slow_compute() -> None:
    # pp = 1, m = 1, F = 1, B = 2, two buckets of 0.5 s, slowdown 2: bucket 0 is ready halfway
    # through B (t = 2), runs 2..2.5 and halves compute meanwhile; B ends at 3.25; bucket 1 runs to 3.75.
    work = pipeline("1f1b", 1, 1, chunk(), grad_sync={0: (dp(0.5), dp(0.5))}, overlap_slowdown=2.0, optimizer_s=0.5)
    result = run_pipeline(work, trace=True)
    comm = [(e.start_s, e.end_s) for e in result.events if e.stream == "comm-dp"]
    assert comm == [(2.0, 2.5), (3.25, 3.75)]
    assert result.compute_end_s == (3.25,)
    assert result.iteration_time_s == pytest.approx(3.75 + 0.5, rel=EXACT)  # optimizer after the last bucket
    assert result.exposed_comm_s["dp"] == pytest.approx(0.5 + 0.25, rel=EXACT)  # tail + slowed compute


def test_fsdp_gathers_every_micro_batch_with_one_op_prefetch() -> None:
    # gpipe, pp = 1, m = 2, F 1 s, B 2 s, gather 0.5 s: FSDP reshards after each use, so every F and B
    # gathers; the gather of the next op is issued when an op starts. F0's gather 0..0.5 is exposed,
    # F1's (0.5..1.0) hides under F0, B0's (1.5..2.0) under F1 and B1's (2.5..3.0) under B0.
    gather = CommWork(axis="dp", kind="all_gather", message_bytes=1.0, duration_s=0.5)
    result = run_pipeline(pipeline("gpipe", 1, 2, chunk(), param_gather=(gather,)), trace=True)
    assert [(e.start_s, e.end_s) for e in result.events if e.stream == "comm-dp"] == [
        (0.0, 0.5), (0.5, 1.0), (1.5, 2.0), (2.5, 3.0)]
    assert result.iteration_time_s == pytest.approx(0.5 + 2 * 3.0, rel=EXACT)
    assert result.exposed_comm_s["dp"] == pytest.approx(0.5, rel=EXACT)
    # 1f1b: F0 B0 F1 B1, each gather prefetched under the op before it: only the first is exposed
    one_f_one_b = run_pipeline(pipeline("1f1b", 1, 2, chunk(), param_gather=(gather,)), trace=True)
    assert [(e.start_s, e.end_s) for e in one_f_one_b.events if e.stream == "comm-dp"] == [
        (0.0, 0.5), (0.5, 1.0), (1.5, 2.0), (3.5, 4.0)]
    assert one_f_one_b.iteration_time_s == pytest.approx(0.5 + 2 * 3.0, rel=EXACT)
    assert one_f_one_b.exposed_comm_s["dp"] == pytest.approx(0.5, rel=EXACT)
    # a gather longer than the op it hides behind stalls the next op by the difference
    slow = CommWork(axis="dp", kind="all_gather", message_bytes=1.0, duration_s=1.5)
    stalled = run_pipeline(pipeline("gpipe", 1, 2, chunk(), param_gather=(slow,)))
    # g(F0) 0..1.5; F0 1.5..2.5 (g(F1) 1.5..3.0); F1 3.0..4.0 (g(B0) 3.0..4.5); B0 4.5..6.5; B1 6.5..8.5
    assert stalled.iteration_time_s == pytest.approx(8.5, rel=EXACT)
    assert stalled.exposed_comm_s["dp"] == pytest.approx(1.5 + 0.5 + 0.5, rel=EXACT)


def test_tp_exposure_sums_chunk_values_on_the_critical_stage() -> None:
    work = pipeline("1f1b", 2, 4, chunk(exposed={"tp": 0.1, "ep": 0.02}), v=1, bandwidth_Bps=float("inf"))
    result = run_pipeline(work)
    assert result.exposed_comm_s["tp"] == pytest.approx(4 * 0.1, rel=EXACT)
    assert result.exposed_comm_s["ep"] == pytest.approx(4 * 0.02, rel=EXACT)
    assert result.exposed_comm_s["cp"] == 0.0


def test_invalid_work_is_rejected_with_the_field_name() -> None:
    with pytest.raises(ValueError, match="overlap_slowdown"):
        run_pipeline(pipeline("1f1b", 2, 2, chunk(), overlap_slowdown=0.5))
    with pytest.raises(ValueError, match="virtual_stages = 2"):
        good = pipeline("interleaved", 2, 2, chunk(), v=2)
        run_pipeline(
            PipelineWork(
                schedule="interleaved",
                num_microbatches=2,
                virtual_stages=2,
                stages=(good.stages[0], StageWork(**{**_fields(good.stages[1]), "chunks": (chunk(),)})),
                p2p_bandwidth_Bps=good.p2p_bandwidth_Bps,
                p2p_latency_s=good.p2p_latency_s,
                overlap_slowdown=1.0,
            )
        )


def _fields(stage: StageWork) -> dict[str, object]:
    return {name: getattr(stage, name) for name in StageWork.__dataclass_fields__}


def test_chrome_trace_has_an_event_per_op_in_microseconds(tmp_path: Path) -> None:
    pp, m = 2, 3
    result = run_pipeline(
        pipeline("1f1b", pp, m, chunk(0.1, 0.2, 0.1, send_bytes=1e6), grad_sync={0: (dp(0.05),)}), trace=True
    )
    trace = json.loads(json.dumps(chrome_trace(result.events, result.memory_timeline)))
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    compute = [e for e in spans if e["cat"] == "compute"]
    assert len(compute) == sum(len(stage_program("1f1b", pp, s, m)) for s in range(pp))  # one per F/B/W
    assert all(e["dur"] >= 0.0 for e in spans)
    for event, span in zip(result.events, spans):
        assert span["ts"] == event.start_s * 1e6 and span["dur"] == (event.end_s - event.start_s) * 1e6
    assert MICROSECONDS_PER_SECOND == 1e6
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {"stage 0", "stage 1"}
    threads = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert threads == {"compute", "comm-dp", "p2p"}
    counters = [e for e in trace["traceEvents"] if e["ph"] == "C"]
    assert len(counters) == sum(len(t) for t in result.memory_timeline)
    path = write_chrome_trace(tmp_path / "run.json", result.events, result.memory_timeline)
    assert json.loads(path.read_text()) == trace


def test_pipeline_timeline_plot_writes_a_png(tmp_path: Path) -> None:
    result = run_pipeline(pipeline("interleaved", 2, 4, chunk(0.5, 1.0, 0.5), v=2), trace=True)
    path = plot_pipeline_timeline(result.events, tmp_path / "timeline.png", max_microbatches=2)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="max_microbatches"):
        plot_pipeline_timeline(result.events, tmp_path / "x.png", max_microbatches=0)
