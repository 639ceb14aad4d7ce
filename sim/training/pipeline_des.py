"""SimPy executor of one training iteration of one data-parallel replica, one simulated rank per stage.

Each pipeline stage runs its part of the schedule's program (``sim.training.schedules.schedule_program``)
as it is, as a SimPy process, one timeout per op: an op starts when the stage is free and its input
has arrived (F of global chunk g needs F of chunk g-1, B needs the gradient of chunk g+1, wherever
the program's placement puts them), plus FSDP parameter gathers where the plan shards parameters. Everything else a stage does is a FIFO server fed only by that stage's own
compute stream, in time order, so its queue is computed in closed form at enqueue time: this is
exactly what a ``simpy.Resource(capacity=1)`` would produce, at one event per message instead of a
process with request, timeout and release events (the 1T benchmark runs ~10^5 ops):

* p2p links: one FIFO per boundary and direction (link i joins stage i and (i+1) % pp); a message of
  ``send_bytes`` occupies it for ``send_bytes / p2p_bandwidth_Bps + p2p_latency_s``.
* the data-parallel stream of a stage: FSDP ``param_gather`` and gradient ``grad_sync`` buckets,
  back to back. While it runs, the stage's compute progresses at rate ``1 / overlap_slowdown``
  (communication kernels take SMs); p2p sends are not counted as SM-taking kernels.

Rules (documented choices):

* Gradient buckets: the last op in program order that completes each chunk's weight gradients (W,
  or the fused B+W) is that chunk's final gradient op. ``grad_sync`` buckets are split over these
  ops in program order (op i of K gets buckets ``i*n//K .. (i+1)*n//K - 1``) and spread evenly over
  the op's work: bucket q of k is ready at fraction (q+1)/k of the op. The optimizer step of a stage
  starts when both its compute and its DP stream are done.
* FSDP / ZeRO-3 (``param_gather[c]`` for local chunk c): parameters are resharded after each use,
  so every F and every B of every micro-batch waits for its own gather of its chunk (as FSDP and
  DeepSpeed ZeRO-3 do under gradient accumulation); prefetch issues the gather of the next op that
  needs one when an op starts (the first at time 0). A gather of several FSDP units
  (``StageWork.param_gather_first_s``: per-layer units) lets its op start once the first unit is in,
  and holds the op's last ``param_gather_tail_share`` of compute (the last unit's) until the whole
  gather is in: the op ends at max(start + its compute, gather end + the last unit's compute),
  the hold counting as a wait on the gather. Where the stack keeps units gathered from their F to
  their B, a B waits for ``param_gather_backward[c]`` instead (the rest, with its own first unit
  and tail share). Every micro-batch's gradient op of a chunk reduce-scatters the chunk's buckets
  (no gradient accumulation outside the shards). A breadth-first
  loop (``bfs``) gathers once per run of one chunk and pass and reduce-scatters once per chunk
  (Lamy-Poirier 2022, arXiv 2211.05953).
* ZeRO-1/2 paced parameter all-gather (``StageWork.param_gather_first_forward_only``, Megatron-Core's
  distributed optimizer with --overlap-param-gather): ``param_gather[c]`` is waited on by chunk c's
  first F of the iteration only, with the same first-unit / last-unit rule (its units are the
  chunk's buckets) and the same prefetch (the first at time 0, the next chunk's when that F starts);
  the gradients are reduced as without gathers (once per chunk, after its last micro-batch).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, NamedTuple

import simpy

from sim.training.schedules import Program, amortises_gathers, schedule_program, tiles_iterations
from sim.training.work import PipelineWork, compute_beside_communication

_AXES_IN_CHUNKS = ("tp", "cp", "ep")


class TraceEvent(NamedTuple):
    """One interval on one stream of one stage (seconds)."""

    stage: int
    stream: str  # "compute" | "comm-dp" | "p2p"
    name: str
    start_s: float
    end_s: float
    args: dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineResult:
    """One simulated iteration.

    ``bubble_fraction``: with T_pipe = ``pipeline_time_s`` (end of the last compute op on any stage,
    i.e. the pipeline flush, before the DP/optimizer tail), the mean over stages of
    (T_pipe - compute busy time) / T_pipe. For uniform stages with no communication this is
    (p-1)/(m+p-1) for gpipe and 1f1b.

    ``exposed_comm_s``: ``dp`` = the iteration time past max over stages of (compute end + optimizer)
    (the DP tail) + the critical stage's compute waits on FSDP gathers + its compute lost to the
    overlap slowdown; ``pp`` = p2p transfer time on the critical path ending at the critical stage's
    last compute op (time waited on p2p beyond the schedule's own bubbles); ``tp``/``cp``/``ep`` =
    m x the sum of ``ChunkWork.exposed_comm_s`` over the critical stage's chunks. The critical stage
    is the one whose optimizer step ends last (lowest index on ties).
    """

    iteration_time_s: float
    pipeline_time_s: float  # end of the last compute op (flush), before the DP/optimizer tail
    stage_end_s: tuple[float, ...]  # end of each stage's optimizer step
    compute_end_s: tuple[float, ...]  # end of each stage's last compute op
    compute_busy_s: tuple[float, ...]  # compute-stream busy time per stage
    bubble_fraction: float
    exposed_comm_s: dict[str, float]  # tp, cp, ep, dp, pp
    critical_stage: int
    peak_activation_bytes: tuple[float, ...]  # per stage, activations held at once (end of F to end of B)
    peak_inflight_microbatches: tuple[int, ...]  # per stage, (micro-batch, chunk) activations held at once
    memory_timeline: tuple[tuple[tuple[float, float], ...], ...]  # per stage: (time_s, activation bytes)
    events: tuple[TraceEvent, ...]  # empty unless run with trace=True


class _DpStream:
    """A stage's data-parallel stream: FIFO kernels, and the compute slowdown while they run."""

    __slots__ = ("free_at", "intervals", "slowdown")

    def __init__(self, slowdown: float) -> None:
        self.free_at = 0.0
        self.intervals: deque[tuple[float, float]] = deque()
        self.slowdown = slowdown

    def enqueue(self, ready_s: float, duration_s: float) -> tuple[float, float]:
        start = ready_s if ready_s > self.free_at else self.free_at
        end = start + duration_s
        self.free_at = end
        if duration_s > 0.0:
            self.intervals.append((start, end))
        return start, end

    def advance(self, t: float, work_s: float) -> float:
        """End time of ``work_s`` of nominal compute started at ``t`` under the queued DP kernels."""
        intervals = self.intervals
        while intervals and intervals[0][1] <= t:
            intervals.popleft()
        if not intervals or self.slowdown == 1.0:
            return t + work_s
        remaining = work_s
        for start, end in intervals:
            if start > t:
                gap = start - t
                if remaining <= gap:
                    return t + remaining
                remaining -= gap
                t = start
            inside, remaining = compute_beside_communication(remaining, end - t, self.slowdown)
            if remaining == 0.0:
                return t + inside
            t = end
        return t + remaining


def _validate(work: PipelineWork) -> None:
    pp = work.pp
    if pp < 1:
        raise ValueError("PipelineWork.stages is empty; a pipeline needs at least one stage")
    if work.overlap_slowdown < 1.0:
        raise ValueError(f"PipelineWork.overlap_slowdown = {work.overlap_slowdown} must be >= 1")
    for index, stage in enumerate(work.stages):
        if stage.stage != index:
            raise ValueError(f"PipelineWork.stages[{index}].stage = {stage.stage}; stages must be in order 0..{pp - 1}")
        if len(stage.chunks) != work.virtual_stages:
            raise ValueError(
                f"PipelineWork.stages[{index}] has {len(stage.chunks)} chunks; "
                f"virtual_stages = {work.virtual_stages} requires that many"
            )
        if stage.param_gather and len(stage.param_gather) != work.virtual_stages:
            raise ValueError(
                f"PipelineWork.stages[{index}].param_gather has {len(stage.param_gather)} entries; "
                f"expected 0 or virtual_stages = {work.virtual_stages}"
            )
        for name in ("param_gather_first_s", "param_gather_tail_share", "param_gather_backward",
                     "param_gather_backward_first_s", "param_gather_backward_tail_share"):
            values = getattr(stage, name)
            if values and len(values) != len(stage.param_gather):
                raise ValueError(
                    f"PipelineWork.stages[{index}].{name} has {len(values)} entries; "
                    f"expected 0 or one per param_gather ({len(stage.param_gather)})"
                )
        for name in ("param_gather_tail_share", "param_gather_backward_tail_share"):
            if any(not 0.0 <= share <= 1.0 for share in getattr(stage, name)):
                raise ValueError(f"PipelineWork.stages[{index}].{name} = {getattr(stage, name)}: each must be in [0, 1]")
    links_needed = pp if (work.virtual_stages > 1 and pp > 1) else pp - 1
    for name in ("p2p_bandwidth_Bps", "p2p_latency_s"):
        if len(getattr(work, name)) < links_needed:
            raise ValueError(f"PipelineWork.{name} has {len(getattr(work, name))} entries; {links_needed} links are used")
    for i in range(links_needed):
        if not work.p2p_bandwidth_Bps[i] > 0.0:
            raise ValueError(f"PipelineWork.p2p_bandwidth_Bps[{i}] = {work.p2p_bandwidth_Bps[i]} must be > 0")
        if work.p2p_latency_s[i] < 0.0:
            raise ValueError(f"PipelineWork.p2p_latency_s[{i}] = {work.p2p_latency_s[i]} must be >= 0")


# Compiled op: (kind, microbatch, chunk, work_s, b_share, dep_slot, send, buckets, gather_wait,
# gather_issue, gather_after); see _compile_stage.
_KIND_F, _KIND_B, _KIND_W, _KIND_BW = 0, 1, 2, 3
_NAMES = {_KIND_F: "F", _KIND_B: "B", _KIND_W: "W", _KIND_BW: "B"}


def _route(src: int, dst: int, pp: int, forward: bool) -> tuple[int, int]:
    """(direction, link) of a message from stage ``src`` to ``dst``, or (-1, -1) when local. Link i
    joins stage i and (i + 1) % pp; direction 0 runs i -> i + 1, 1 runs i + 1 -> i. Activations take
    direction 0 when the next stage is ``src + 1`` (mod pp), gradients direction 1 when it is
    ``src - 1``: the interleaved wrap-around and the way back of a V share the same channels."""
    if src == dst:
        return -1, -1
    up, down = dst == (src + 1) % pp, dst == (src - 1) % pp
    if up and (forward or not down):
        return 0, src
    return 1, dst


def _compile_stage(work: PipelineWork, s: int, program: Program) -> list[tuple[Any, ...]]:
    """Turn a stage program into executable records: durations, dependency slots, sends, buckets.

    Dependency slots: F-input of (global chunk g, micro-batch i) is slot 2 (g m + i), B-input 2 (g m + i) + 1.
    ``send`` = (direction 0 fwd / 1 bwd, link index or -1 when the neighbour chunk is local, slot,
    bytes, target stage). Unless the schedule splits the backward, a B and the W right after it
    become one fused op (kind _KIND_BW) whose gradient is sent at its end.
    """
    pp, v, m = work.pp, work.virtual_stages, work.num_microbatches
    last_global = pp * v - 1
    stage_work = work.stages[s]
    split = program.split_backward
    steps = program.steps[s]
    place = program.placement
    gathered = bool(stage_work.param_gather)
    # ZeRO-1/2's paced gathers: only each chunk's first F (in program order) waits for one
    once = gathered and stage_work.param_gather_first_forward_only
    fsdp = gathered and not once
    first_forward_seen: set[int] = set()

    # Per chunk constants: (g, F work, B work, B+W work, B share of B+W, W work, bytes, fwd route, bwd route)
    consts = []
    for c, (cw, g) in enumerate(zip(stage_work.chunks, program.stage_chunks(s))):
        fused = cw.backward_input_s + cw.backward_weight_s
        consts.append(
            (
                g,
                cw.forward_s,
                cw.backward_input_s,
                fused,
                cw.backward_input_s / fused if fused > 0.0 else 1.0,
                cw.backward_weight_s,
                cw.send_bytes,
                _route(s, place[g + 1], pp, forward=True) if g < last_global else (-1, -1),
                _route(s, place[g - 1], pp, forward=False) if g > 0 else (-1, -1),
            )
        )

    ops: list[list[Any]] = []
    final_index: dict[int, int] = {}  # chunk -> index of the op that completes its weight gradients
    grad_ops: dict[int, list[int]] = {}  # chunk -> every op completing a micro-batch's weight gradients
    i, n = 0, len(steps)
    while i < n:
        kind_name, mb, c = steps[i]
        g, f_s, b_s, bw_s, b_share, w_s, nbytes, fwd_link, bwd_link = consts[c]
        if kind_name == "F":
            dep = 2 * (g * m + mb) if g > 0 else -1
            send = (fwd_link[0], fwd_link[1], 2 * ((g + 1) * m + mb), nbytes, place[g + 1]) if g < last_global else None
            op = [_KIND_F, mb, c, f_s, 0.0, dep, send, None, None, None, None]
            if fsdp or (once and c not in first_forward_seen):
                op[8] = ("f", mb, c)
                first_forward_seen.add(c)
        elif kind_name == "B":
            fuse = not split and i + 1 < n and steps[i + 1] == ("W", mb, c)
            dep = 2 * (g * m + mb) + 1 if g < last_global else -1
            send = (bwd_link[0], bwd_link[1], 2 * ((g - 1) * m + mb) + 1, nbytes, place[g - 1]) if g > 0 else None
            if fuse:
                op = [_KIND_BW, mb, c, bw_s, b_share, dep, send, None, None, None, None]
                final_index[c] = len(ops)
                i += 1
            else:
                op = [_KIND_B, mb, c, b_s, 1.0, dep, send, None, None, None, None]
            if fsdp:
                op[8] = ("b", mb, c)
        else:
            final_index[c] = len(ops)
            op = [_KIND_W, mb, c, w_s, 0.0, -1, None, None, None, None, None]
        if kind_name != "F" and (kind_name == "W" or op[0] == _KIND_BW):
            grad_ops.setdefault(c, []).append(len(ops))
        ops.append(op)
        i += 1

    # A breadth-first loop keeps a chunk's gathered parameters while its micro-batches run back to
    # back (``amortises_gathers``): only the first op of each run of one (pass, chunk) gathers, and
    # the chunk's gradients are reduce-scattered once, after its last micro-batch
    keep = amortises_gathers(work.schedule)
    if fsdp and keep:
        previous = None
        for op in ops:
            if op[8] is not None:
                run = (op[8][0], op[8][2])
                if run == previous:
                    op[8] = None
                previous = run
    # FSDP prefetch: the gather of the next op that needs parameters is issued when an op starts
    # (the first at time 0, see run_pipeline); every F and every B gathers again (per micro-batch)
    needing = [index for index, op in enumerate(ops) if op[8] is not None]
    for here, after in zip(needing, needing[1:]):
        ops[here][9] = ops[after][8]

    # Gradient buckets: split over the chunks' final gradient ops in program order, spread evenly in
    # each. Under FSDP every micro-batch's gradient op of a chunk reduce-scatters the chunk's buckets.
    buckets = stage_work.grad_sync
    finals = sorted(final_index.values())
    chunk_of_final = {index: ops[index][2] for index in finals}
    for k, index in enumerate(finals):
        lo, hi = k * len(buckets) // len(finals), (k + 1) * len(buckets) // len(finals)
        if hi > lo:
            plan = tuple(((q + 1) / (hi - lo), lo + q) for q in range(hi - lo))
            for target in grad_ops[chunk_of_final[index]] if fsdp and not keep else (index,):
                ops[target][7] = plan
    return [tuple(op) for op in ops]


def _gather_label(key: tuple[str, int, int]) -> str:
    pass_name, mb, chunk = key
    return f"param_gather {mb}.c{chunk} {'fwd' if pass_name == 'f' else 'bwd'}"


def run_pipeline(work: PipelineWork, *, trace: bool = False) -> PipelineResult:
    """Simulate one iteration of ``work`` event by event; see ``PipelineResult`` for the metrics."""
    _validate(work)
    pp, v, m = work.pp, work.virtual_stages, work.num_microbatches
    program = schedule_program(work.schedule, pp, m, v)
    compiled = [_compile_stage(work, s, program) for s in range(pp)]

    env = simpy.Environment()
    arrivals: list[tuple[float, float, float] | None] = [None] * (2 * pp * v * m)
    waiting: dict[int, simpy.Event] = {}
    link_free = [[0.0] * pp, [0.0] * pp]  # [direction][link]: 0 = forward (s -> s+1), 1 = backward
    # links beyond those _validate requires are never used (pp - 1 links without a wrap-around)
    link_latency = [work.p2p_latency_s[i] if i < len(work.p2p_latency_s) else 0.0 for i in range(pp)]
    link_bandwidth = [work.p2p_bandwidth_Bps[i] if i < len(work.p2p_bandwidth_Bps) else 0.0 for i in range(pp)]
    events: list[TraceEvent] = []
    streams = [_DpStream(work.overlap_slowdown) for _ in range(pp)]
    busy = [0.0] * pp
    compute_end = [0.0] * pp
    compute_start = [0.0] * pp  # start of each stage's first compute op
    # when the first op's parameter gather was in (it is issued at 0): under post-validation the next
    # iteration's gather waits for this stage's optimizer step, so the span counts it (0: no gather)
    first_gather_in = [0.0] * pp
    slow_extra = [0.0] * pp
    gather_waits = [0.0] * pp
    acc_pp_end = [0.0] * pp
    peak_bytes = [0.0] * pp
    peak_inflight = [0] * pp
    timelines: list[list[tuple[float, float]]] = [[(0.0, 0.0)] for _ in range(pp)]
    finished = [False] * pp

    def dp_kernel(s: int, ready_s: float, duration_s: float, name: str, axis: str) -> tuple[float, float]:
        start, end = streams[s].enqueue(ready_s, duration_s)
        if trace:
            events.append(TraceEvent(s, "comm-dp", name, start, end, {"axis": axis}))
        return start, end

    def stage_process(s: int):  # type: ignore[no-untyped-def]
        stream = streams[s]
        advance = stream.advance
        stage_work = work.stages[s]
        activation = [c.activation_bytes for c in stage_work.chunks]
        # FSDP units: an op may start once its gather's first unit is in; its last ``tail`` share of
        # compute waits for the gather's end. One unit (no first_unit_s): the whole gather. A B's
        # gathers leave out the units kept since the F (``param_gather_backward``; empty: the F's)
        def units(gathers, first_s, tail_share):  # type: ignore[no-untyped-def]
            return gathers, first_s or tuple(g.duration_s for g in gathers), tail_share or (0.0,) * len(gathers)

        forward = units(stage_work.param_gather, stage_work.param_gather_first_s, stage_work.param_gather_tail_share)
        by_pass = {"f": forward, "b": units(stage_work.param_gather_backward, stage_work.param_gather_backward_first_s,
                                            stage_work.param_gather_backward_tail_share)
                   if stage_work.param_gather_backward else forward}
        gather_done: dict[tuple[str, int, int], tuple[float, float]] = {}  # (first unit in, all in)

        def issue_gather(key: tuple[str, int, int], ready_s: float) -> None:
            gathers, first_unit_s, _ = by_pass[key[0]]
            gather = gathers[key[2]]
            begin, finish = dp_kernel(s, ready_s, gather.duration_s, _gather_label(key), gather.axis)
            first_in = begin + first_unit_s[key[2]]
            gather_done[key] = (first_in if first_in < finish else finish, finish)

        first = next((op[8] for op in compiled[s] if op[8] is not None), None)
        if first is not None:
            issue_gather(first, 0.0)
        timeline = timelines[s]
        timeout = env.timeout
        held_bytes = peak = 0.0
        held = peak_held = 0
        busy_s = nominal_s = 0.0
        acc_prev = free_t = 0.0
        started = False
        for kind, mb, chunk, duration, b_share, dep, send, plan, g_wait, g_issue, g_after in compiled[s]:
            start = free_t
            acc = acc_prev
            if dep >= 0:
                entry = arrivals[dep]
                if entry is None:
                    event = env.event()
                    waiting[dep] = event
                    entry = yield event
                arrival, produced, acc_in = entry
                if arrival > start:
                    start = arrival
                    acc = acc_in + (arrival - produced)
            hold = tail = 0.0  # when the op's last unit is gathered, if after its start (else 0); its share
            if g_wait is not None:
                ready, gathered = gather_done[g_wait]
                if not started:
                    first_gather_in[s] = ready
                if ready > start:
                    gather_waits[s] += ready - start
                    start = ready
                tail = by_pass[g_wait[0]][2][chunk]
                if gathered > start and tail > 0.0:
                    hold = gathered
            if g_issue is not None:
                issue_gather(g_issue, start)
            if not started:
                compute_start[s], started = start, True
            waited = 0.0
            if hold:
                # the op's compute up to its last unit's share, then (once that unit is in) the rest;
                # buckets at or before the boundary are enqueued first
                boundary = (1.0 - tail) * duration
                end, done = start, 0.0
                for fraction, bucket in plan or ():
                    point = fraction * duration
                    if boundary >= 0.0 and point > boundary:
                        end = advance(end, boundary - done)
                        done, boundary = boundary, -1.0
                        if hold > end:
                            waited, end = hold - end, hold
                    end = advance(end, point - done)
                    done = point
                    comm = stage_work.grad_sync[bucket]
                    dp_kernel(s, end, comm.duration_s, f"grad_sync bucket {bucket}", comm.axis)
                if boundary >= 0.0:
                    end = advance(end, boundary - done)
                    done = boundary
                    if hold > end:
                        waited, end = hold - end, hold
                if done < duration:
                    end = advance(end, duration - done)
                gather_waits[s] += waited
            elif plan is None:
                end = advance(start, duration)
            else:
                end, done = start, 0.0
                for fraction, bucket in plan:
                    point = fraction * duration
                    end = advance(end, point - done)
                    done = point
                    comm = stage_work.grad_sync[bucket]
                    dp_kernel(s, end, comm.duration_s, f"grad_sync bucket {bucket}", comm.axis)
            now = env.now
            if end > now:
                yield timeout(end - now)
            busy_s += end - start - waited
            nominal_s += duration
            b_end = end
            if kind == _KIND_F:
                held_bytes += activation[chunk]
                held += 1
                if held_bytes > peak:
                    peak = held_bytes
                if held > peak_held:
                    peak_held = held
                timeline.append((end, held_bytes))
            elif kind != _KIND_W:
                if b_share != 1.0:
                    b_end = start + (end - start) * b_share
                held_bytes -= activation[chunk]
                held -= 1
                timeline.append((b_end, held_bytes))
            if trace:
                name = _NAMES[kind]
                label = f"{name}{mb}" if v == 1 else f"{name}{mb}.c{chunk}"
                args = {"kind": name, "microbatch": mb, "chunk": chunk}
                events.append(TraceEvent(s, "compute", label, start, b_end, args))
                if kind == _KIND_BW:
                    events.append(TraceEvent(s, "compute", "W" + label[1:], b_end, end, {**args, "kind": "W"}))
            if send is not None:
                direction, link, slot, nbytes, target = send
                if link < 0:
                    tx_start = arrival = end
                else:
                    free = link_free[direction]
                    tx_start = end if end > free[link] else free[link]
                    arrival = tx_start + nbytes / link_bandwidth[link] + link_latency[link]
                    free[link] = arrival
                    if trace:
                        what = "act" if direction == 0 else "grad"
                        events.append(
                            TraceEvent(s, "p2p", f"{what} {mb}.c{chunk} -> stage {target}", tx_start, arrival, {"bytes": nbytes})
                        )
                entry = (arrival, end, acc)
                arrivals[slot] = entry
                waiter = waiting.pop(slot, None)
                if waiter is not None:
                    waiter.succeed(entry)
            free_t = end
            acc_prev = acc
        compute_end[s] = free_t
        acc_pp_end[s] = acc_prev
        busy[s] = busy_s
        slow_extra[s] = busy_s - nominal_s
        peak_bytes[s] = peak
        peak_inflight[s] = peak_held
        finished[s] = True

    for s in range(pp):
        env.process(stage_process(s))
    env.run()
    stuck = [s for s in range(pp) if not finished[s]]
    if stuck:
        raise RuntimeError(f"pipeline deadlock: stages {stuck} did not finish schedule {work.schedule!r}")

    stage_end = []
    for s in range(pp):
        opt_start = max(compute_end[s], streams[s].free_at)
        serial = work.stages[s].serial_grad_sync_s  # buckets run after the backward (no overlap)
        stage_end.append(opt_start + (work.stages[s].optimizer_s + serial))
        if trace and serial > 0.0:
            events.append(TraceEvent(s, "comm-dp", "grad sync (serial)", opt_start, opt_start + serial, {"axis": "dp"}))
        if trace and work.stages[s].optimizer_s > 0.0:
            events.append(
                TraceEvent(s, "compute", "optimizer", opt_start + serial, stage_end[s], {"kind": "optimizer"})
            )
    pipeline_time = max(compute_end)
    # Post-validation (``tiles_iterations``): no barrier between iterations, each stage starts its next
    # one when its own optimizer step ends, so the iteration lasts its longest stage span (the next
    # iteration's program shifted by that much meets every dependency); the bubble is measured over it.
    # A first op that needs gathered parameters (ZeRO-3, paced ZeRO-1/2 gathers) also needs the next
    # iteration's gather, which starts after this stage's optimizer step: the span then runs from the
    # first op's start less that gather's time (the whole span when the op waited on it)
    offset = ([start - gathered for start, gathered in zip(compute_start, first_gather_in)]
              if tiles_iterations(work.schedule) else [0.0] * pp)
    spans = [stage_end[s] - offset[s] for s in range(pp)]
    iteration = max(spans)
    critical = spans.index(iteration)
    phase = max(compute_end[s] - offset[s] for s in range(pp))
    # idle compute that the schedule causes; waits on FSDP parameter gathers count as exposed dp instead
    bubble = (
        max(0.0, sum((phase - b - w) / phase for b, w in zip(busy, gather_waits)) / pp)
        if phase > 0.0
        else 0.0
    )  # clamped: with no idle time the sum of float differences can round to -1e-17
    no_dp_end = max(compute_end[s] + work.stages[s].optimizer_s - offset[s] for s in range(pp))
    exposed = {axis: 0.0 for axis in (*_AXES_IN_CHUNKS, "dp", "pp")}
    for chunk in work.stages[critical].chunks:
        for axis in _AXES_IN_CHUNKS:
            exposed[axis] += m * chunk.exposed_comm_s.get(axis, 0.0)
    # clamp: the tail and the slowdown are differences of sums of floats (rounding can go below 0)
    tail = iteration - no_dp_end
    # a stage stalled on its gathers stalls its pipeline neighbours too: the longest stall is exposed
    exposed["dp"] = (tail if tail > 1e-12 * iteration else 0.0) + max(gather_waits) + max(0.0, slow_extra[critical])
    # pp: transfers waited on along the critical path, plus what the critical stage's chunks hold of
    # blocking p2p and vocabulary-parallel collectives (m per chunk, as the tp / cp / ep axes)
    exposed["pp"] = acc_pp_end[critical] + sum(m * chunk.exposed_comm_s.get("pp", 0.0) for chunk in work.stages[critical].chunks)
    return PipelineResult(
        iteration_time_s=iteration,
        pipeline_time_s=pipeline_time,
        stage_end_s=tuple(stage_end),
        compute_end_s=tuple(compute_end),
        compute_busy_s=tuple(busy),
        bubble_fraction=bubble,
        exposed_comm_s=exposed,
        critical_stage=critical,
        peak_activation_bytes=tuple(peak_bytes),
        peak_inflight_microbatches=tuple(peak_inflight),
        memory_timeline=tuple(tuple(t) for t in timelines),
        events=tuple(events),
    )
