"""Closed-form iteration time of a ``PipelineWork`` (the analytic fidelity).

The pipeline phase comes from the schedule's program (``sim.training.schedules.program_profile``,
executed once per (schedule, p, m, v) and cached): the longest of its critical paths on uniform
stages, as op counts, priced with the stages' F, B and W (``_program_time``). Exact for uniform
stages without overlap, where it must agree with the DES to 1 %: GPipe and 1F1B take
(m + p - 1)(F + B + W) (Narayanan et al. 2021; Huang et al. 2019), interleaved 1F1B with v chunks
m (F + B + W) + (p - 1)(F + B + W)/v, ZB-H1 m (F + B + W) + (p - 1)(F + B - W) (Qi et al. 2024).
Non-uniform stages: with one chunk per stage and a fused backward, the slowest stage for the steady
state and the sum over stages for fill and drain; otherwise (split backward, several chunks) the
longest paths of the program's dependency graph with every op at its own stage's chunk time
(``schedules.program_graph``, level by level, memoized per price vector). Each chunk boundary
crossing in fill and drain adds a p2p transfer.

Stages come in few classes (with an even split all middle stages are alike), so the formula reads
per-class terms (``StageTimes``, computed once per class) through a stage -> class map; the sums
over stages still run in stage order, so grouping changes no float.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate, groupby
from operator import attrgetter, mul
from typing import NamedTuple, Sequence

import numpy as np

from sim.training.schedules import (
    B_CODE, F_CODE, W_CODE, BackwardTail, ProgramProfile, amortises_gathers, program_graph, program_profile,
    schedule_program, tiles_iterations,
)
from sim.training.work import ChunkWork, CommWork, PipelineWork, compute_beside_communication, overlap_stretch_s


_DURATION = attrgetter("duration_s")


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineEstimate:
    """What both fidelities report about one iteration of one data-parallel replica."""

    iteration_time_s: float
    pipeline_time_s: float  # end of the last backward op over all stages
    bubble_fraction: float  # idle share of the compute streams during the pipeline phase
    exposed_comm_s: dict[str, float]  # per axis, on the critical path
    stage_busy_s: tuple[float, ...]  # compute-stream busy time per stage


@dataclass(frozen=True, slots=True, kw_only=True)
class ChunkTimes:
    """One micro-batch's F, B, W over a stage's chunks (equal on every stage of a class)."""

    chunks: tuple[ChunkWork, ...]  # for the exposed communication of the critical stage
    forward_s: float
    backward_input_s: float
    backward_weight_s: float
    total_s: float  # F + B + W
    backward_s: float  # B + W
    send_bytes: float  # the last chunk's message to the next stage


@dataclass(frozen=True, slots=True, kw_only=True)
class DataParallelTimes:
    """A stage's data-parallel and optimizer work as the closed form reads it."""

    grad_sync: tuple[CommWork, ...]  # buckets overlapping the backward
    param_gather: tuple[CommWork, ...]  # ZeRO-3 parameter all-gathers
    optimizer_s: float
    serial_grad_sync_s: float  # buckets run after the backward, before the optimizer (no overlap)
    grad_sync_s: float  # all gradient buckets overlapping the backward
    last_bucket_s: float
    gathers_s: tuple[float, ...]
    buckets: int = 0  # gradient buckets overlapping the backward (len(grad_sync))
    bucket_runs: tuple[tuple[float, int], ...] = ()  # their seconds, run-length encoded: (seconds, buckets)
    # FSDP units (``StageWork.param_gather_first_s`` / ``param_gather_tail_share``): per chunk, the
    # seconds until a gather's first unit is in, and the share of an op's compute after its last unit
    gather_first_s: tuple[float, ...] = ()
    gather_tail_share: tuple[float, ...] = ()
    # ZeRO-1/2's paced gathers (``StageWork.param_gather_first_forward_only``): once per chunk, before
    # its first forward
    gather_first_forward_only: bool = False
    # per chunk, the gather before a B, its first unit and tail share (``StageWork.param_gather_backward``:
    # units kept gathered since the F left out); the F's where the stack keeps none
    param_gather_backward: tuple[CommWork, ...] = ()
    backward_gathers_s: tuple[float, ...] = ()
    backward_gather_first_s: tuple[float, ...] = ()
    backward_gather_tail_share: tuple[float, ...] = ()


def chunk_times(chunks: tuple[ChunkWork, ...]) -> ChunkTimes:
    forward = sum(c.forward_s for c in chunks)
    backward_input = sum(c.backward_input_s for c in chunks)
    backward_weight = sum(c.backward_weight_s for c in chunks)
    return ChunkTimes(
        chunks=chunks,
        forward_s=forward,
        backward_input_s=backward_input,
        backward_weight_s=backward_weight,
        total_s=forward + backward_input + backward_weight,
        backward_s=backward_input + backward_weight,
        send_bytes=chunks[-1].send_bytes,
    )


def data_parallel_times(
    grad_sync: tuple[CommWork, ...],
    param_gather: tuple[CommWork, ...],
    optimizer_s: float,
    serial_grad_sync_s: float = 0.0,
    gather_first_s: tuple[float, ...] = (),
    gather_tail_share: tuple[float, ...] = (),
    gather_first_forward_only: bool = False,
    param_gather_backward: tuple[CommWork, ...] = (),
    backward_gather_first_s: tuple[float, ...] = (),
    backward_gather_tail_share: tuple[float, ...] = (),
) -> DataParallelTimes:
    """The closed form's view of a stage's data-parallel work; without ``gather_first_s`` every gather
    is one unit (its first unit is all of it) and no compute waits for its end; without
    ``param_gather_backward`` a B's gathers are the F's."""
    gathers_s = tuple(map(_DURATION, param_gather))
    gather_first_s = gather_first_s or gathers_s
    gather_tail_share = gather_tail_share or (0.0,) * len(gathers_s)
    backward_s = tuple(map(_DURATION, param_gather_backward)) or gathers_s
    return DataParallelTimes(
        grad_sync=grad_sync,
        param_gather=param_gather,
        optimizer_s=optimizer_s,
        serial_grad_sync_s=serial_grad_sync_s,
        grad_sync_s=sum(map(_DURATION, grad_sync)),  # C loop, same order as a generator sum
        last_bucket_s=grad_sync[-1].duration_s if grad_sync else 0.0,
        gathers_s=gathers_s,
        buckets=len(grad_sync),
        bucket_runs=tuple((seconds, len(tuple(run))) for seconds, run in groupby(map(_DURATION, grad_sync))),
        gather_first_s=gather_first_s,
        gather_tail_share=gather_tail_share,
        gather_first_forward_only=gather_first_forward_only,
        param_gather_backward=param_gather_backward,
        backward_gathers_s=backward_s,
        backward_gather_first_s=(backward_gather_first_s or backward_s) if param_gather_backward else gather_first_s,
        backward_gather_tail_share=(backward_gather_tail_share or (0.0,) * len(backward_s)) if param_gather_backward
        else gather_tail_share,
    )


StageTimes = tuple[ChunkTimes, DataParallelTimes]  # what the closed form reads of one stage (class)


def p2p_time_s(work: PipelineWork, boundary: int, message_bytes: float) -> float:
    return _p2p_s(work.p2p_bandwidth_Bps[boundary], work.p2p_latency_s[boundary], message_bytes)


def _p2p_s(bandwidth_Bps: float, latency_s: float, message_bytes: float) -> float:
    if bandwidth_Bps == float("inf"):
        return 0.0
    return message_bytes / bandwidth_Bps + latency_s


def analytic_iteration(work: PipelineWork) -> PipelineEstimate:
    """Iteration time, bubble and exposed communication in closed form."""
    times = [
        (chunk_times(s.chunks), data_parallel_times(s.grad_sync, s.param_gather, s.optimizer_s, s.serial_grad_sync_s,
                                                    s.param_gather_first_s, s.param_gather_tail_share,
                                                    s.param_gather_first_forward_only, s.param_gather_backward,
                                                    s.param_gather_backward_first_s,
                                                    s.param_gather_backward_tail_share))
        for s in work.stages
    ]
    return analytic_iteration_classes(
        times,
        range(work.pp),
        schedule=work.schedule,
        num_microbatches=work.num_microbatches,
        virtual_stages=work.virtual_stages,
        p2p_bandwidth_Bps=work.p2p_bandwidth_Bps,
        p2p_latency_s=work.p2p_latency_s,
        overlap_slowdown=work.overlap_slowdown,
    )


def analytic_iteration_classes(
    classes: Sequence[StageTimes],
    stage_class: Sequence[int],
    *,
    schedule: str,
    num_microbatches: int,
    virtual_stages: int,
    p2p_bandwidth_Bps: Sequence[float],
    p2p_latency_s: Sequence[float],
    overlap_slowdown: float,
) -> PipelineEstimate:
    """``analytic_iteration`` of the pipeline whose stage s has the times ``classes[stage_class[s]]``;
    entry i of the p2p tuples is the link from stage i to stage (i + 1) % pp."""
    chunk_of = [c[0] for c in classes]
    phase = pipeline_phase(
        chunk_of,
        stage_class,
        schedule=schedule,
        num_microbatches=num_microbatches,
        virtual_stages=virtual_stages,
        p2p_bandwidth_Bps=p2p_bandwidth_Bps,
        p2p_latency_s=p2p_latency_s,
    )
    return finish_iteration(
        phase, chunk_of, [c[1] for c in classes], stage_class, num_microbatches=num_microbatches,
        overlap_slowdown=overlap_slowdown,
    )


class PipelinePhase(NamedTuple):
    """The part of the closed form that the chunks alone determine (no data-parallel work): a search
    shares it between plans that differ only in ZeRO, sharding or offload."""

    pipeline_time_s: float
    bubble_fraction: float
    stage_busy_s: tuple[float, ...]
    last_backward_end_s: tuple[float, ...]  # per stage: when its last backward ends, once the later
    # stages have drained theirs (pipeline time - the backward of the earlier stages, summed in stage order)
    exposed_comm_s: dict[str, float]  # tp, cp, ep (any chunk axis) of the critical stage, and pp; shared,
    # so never modified (finish_iteration copies it)
    gather_rounds: int = 1  # times each chunk's ZeRO-3 parameters are gathered per pass (``pipeline_phase``)
    # schedules whose iterations tile (``tiles_iterations``): when each stage's first op starts; the
    # iteration is then the longest span from there to the stage's optimizer end. Empty otherwise.
    stage_start_s: tuple[float, ...] = ()
    # one stage running one chunk as F0 B0 F1 B1 ... with a fused backward (1f1b and its kin at pp 1:
    # plain FSDP / ZeRO-3 data parallelism): ``finish_iteration`` then follows the FSDP stream op by op
    alternating: bool = False
    # the program's profile: where each stage's gradient buckets become ready and what compute they can
    # hide behind (``ProgramProfile.gradient_tails``, priced by ``gradient_windows``)
    profile: ProgramProfile | None = None


def pipeline_phase(
    chunk_of: Sequence[ChunkTimes],
    stage_class: Sequence[int],
    *,
    schedule: str,
    num_microbatches: int,
    virtual_stages: int,
    p2p_bandwidth_Bps: Sequence[float],
    p2p_latency_s: Sequence[float],
) -> PipelinePhase:
    """Pipeline time, bubble, busy time and the exposed tp / cp / ep / pp communication of the
    pipeline whose stage s runs the chunks ``chunk_of[stage_class[s]]``."""
    m, p, v = num_microbatches, len(stage_class), virtual_stages
    class_totals = [c.total_s for c in chunk_of]
    totals = [class_totals[k] for k in stage_class]
    slowest = max(class_totals[k] for k in set(stage_class))
    profile = program_profile(schedule, p, m, v)
    # every model-order chunk boundary between stages is crossed once by the fill (activations)
    # and once by the drain (gradients); the message is the boundary stage's last chunk's
    p2p = 0.0
    if p > 1:
        infinite = float("inf")
        seconds_of = []
        for boundary in range(p - 1):
            bandwidth = p2p_bandwidth_Bps[boundary]
            seconds = 0.0 if bandwidth == infinite else chunk_of[stage_class[boundary]].send_bytes / bandwidth + p2p_latency_s[boundary]
            seconds_of.append(2.0 * seconds)
        for boundary in profile.p2p_boundaries:
            p2p += seconds_of[boundary]
    # when each stage's last op ends, where stages differ: a closed form where one is exact, else the
    # program's longest paths (None on uniform stages: the program's paths in op counts)
    ends = one_chunk_ends(chunk_of, stage_class, schedule=schedule, num_microbatches=m, virtual_stages=v)
    request = None if ends else spans_request(chunk_of, stage_class, schedule=schedule, num_microbatches=m,
                                              virtual_stages=v)
    spans = longest_paths(request) if request is not None else None
    ends = ends or (spans[1] if spans else None)
    pipeline = (max(ends) if ends else _program_time(profile, chunk_of, stage_class, totals, slowest, m, p, v)) + p2p
    busy = tuple([m * t for t in totals])
    bubble = 1.0 - sum(busy) / (p * pipeline) if pipeline > 0 else 0.0
    critical = totals.index(max(totals))
    exposed: dict[str, float] = {"tp": 0.0, "cp": 0.0, "ep": 0.0}
    for chunk_work in chunk_of[stage_class[critical]].chunks:
        for axis, seconds in chunk_work.exposed_comm_s.items():
            exposed[axis] = exposed.get(axis, 0.0) + seconds * m
    # pp: the fill / drain transfers plus what the chunks hold of blocking p2p and vocabulary-parallel
    # collectives (per micro-batch, ``ChunkWork.exposed_comm_s``)
    exposed["pp"] = exposed.get("pp", 0.0) + p2p
    # ZeRO-3 gathers: FSDP re-gathers a chunk's parameters for every micro-batch that visits it
    # (parameters are freed after each forward and backward), except in a breadth-first loop, where
    # all micro-batches run a chunk back to back and one gather per pass serves them all
    # (Lamy-Poirier 2022, arXiv 2211.05953)
    rounds = 1 if amortises_gathers(schedule) else m
    if tiles_iterations(schedule):
        # post-validation: each stage's own span, first op to last op, at the per-pass prices of the
        # split-backward closed form (below); the bubble is the idle share of the longest span
        if spans:
            starts, finishes = spans
        else:
            f, b, w = _pass_prices(chunk_of, stage_class, v)
            finishes = _stage_finishes(profile, totals, m, v, f, b, w)
            starts = tuple(max(nf * f + nb * b + nw * w for nf, nb, nw in begins) for begins in profile.stage_start_paths)
        span = max(end - start for end, start in zip(finishes, starts))
        bubble = 1.0 - sum(busy) / (p * span) if span > 0 else 0.0
        return PipelinePhase(pipeline, bubble, busy, finishes, exposed, rounds, starts, alternates(schedule, p, m, v), profile)
    # each stage's last op ends where ``ends`` says, or on uniform stages where the program's paths do
    # (exact: the drain of 1F1B, one chunk at a time under interleaving, the ends of a V or a split
    # backward); after the fill and drain transfers
    finishes = ends or _stage_finishes(profile, totals, m, v, *_pass_prices(chunk_of, stage_class, v))
    return PipelinePhase(pipeline, bubble, busy, tuple(f + p2p for f in finishes), exposed, rounds, (),
                         alternates(schedule, p, m, v), profile)


def _flat_prices(chunks: ChunkTimes) -> list[float]:
    """A stage's F, B and W seconds per micro-batch, flat and chunk-major, as the profiles' op counts are."""
    return [seconds for c in chunks.chunks for seconds in (c.forward_s, c.backward_input_s, c.backward_weight_s)]


def gradient_windows(
    tail: tuple[tuple[int, tuple[int, ...]], ...], chunks: ChunkTimes, split_backward: bool,
) -> tuple[tuple[float, float], ...]:
    """A stage's ``ProgramProfile.gradient_tails`` entry priced at its chunks' F, B and W seconds: per
    final gradient op, (the nominal compute seconds from its start to the stage's last op, its own); the
    final op is the chunk's W, with its B unless the schedule splits the backward."""
    prices = _flat_prices(chunks)
    return tuple(
        (sum(map(mul, counts, prices)), prices[3 * chunk + 2] + (0.0 if split_backward else prices[3 * chunk + 1]))
        for chunk, counts in tail
    )


def _program_time(
    profile: ProgramProfile,
    chunk_of: Sequence[ChunkTimes],
    stage_class: Sequence[int],
    totals: Sequence[float],
    slowest: float,
    m: int,
    p: int,
    v: int,
) -> float:
    """The pipeline phase without p2p: the longest of the program's critical paths on uniform
    stages (``ProgramProfile.critical_paths``, op counts per chunk), priced at the slowest stage.

    A path of equal F, B and W counts k (the fused 1F1B family, gpipe, interleaved, bfs) costs
    k x the slowest stage's chunk total; with one chunk per stage its k - m fill and drain ops are
    one per other stage, each at that stage's own speed ((k - p) x slowest + the sum over stages, the
    classic (m - 1) t_slowest + sum t_s of 1F1B, Narayanan et al. 2021). Otherwise (split backward,
    waves) F, B and W are priced separately at the slowest stage's value for each pass, and each
    stage s finishes at m t_s + the idle time the program leaves it on uniform stages at those
    prices (``ProgramProfile.stage_paths``; ZB-H1: m (F + B + W) + (p - 1)(F + B - W), Qi et al. 2024)."""
    paths = profile.critical_paths
    if all(f == b == w for f, b, w in paths):
        k = max(f for f, _, _ in paths)
        if v == 1:
            return (k - p) * slowest + sum(totals)
        return k * slowest / v
    return max(_stage_finishes(profile, totals, m, v, *_pass_prices(chunk_of, stage_class, v)))


def one_chunk_ends(
    chunk_of: Sequence[ChunkTimes], stage_class: Sequence[int], *, schedule: str, num_microbatches: int,
    virtual_stages: int,
) -> tuple[float, ...] | None:
    """When each stage's last op ends, without transfers, where stages differ and a closed form gives
    the program's longest paths exactly (None elsewhere, and on uniform stages). GPipe with fused
    backwards: the forward lattice, then the backward one, each paced by its own slowest stage
    (sum F + (m - 1) max F; stage s ends after sum B + (m - 1) max B over the stages from s on).
    1F1B whose last stage is the slowest (F + B + W): the classic (m - 1) t_last + sum t_s, each
    stage ending its drain the backwards of the stages before it earlier (with a faster last stage,
    the others' slack is not idle: the program's longest paths, ``spans_request``). Both checked
    against the longest paths on random stages (tests/sim/test_training_uneven_stages.py)."""
    m, p = num_microbatches, len(stage_class)
    if virtual_stages != 1 or schedule not in ("gpipe", "1f1b") or len({id(chunk_of[k]) for k in stage_class}) <= 1:
        return None
    backward = [chunk_of[k].backward_s for k in stage_class]
    if schedule == "gpipe":
        forward = [chunk_of[k].forward_s for k in stage_class]
        filled = sum(forward) + (m - 1) * max(forward)
        return tuple(filled + sum(backward[s:]) + (m - 1) * max(backward[s:]) for s in range(p))
    totals = [chunk_of[k].total_s for k in stage_class]
    if totals[-1] < max(totals):
        return None
    pipeline = (m - 1) * totals[-1] + sum(totals)
    return tuple(pipeline - sum(backward[:s]) for s in range(p))


# (schedule, pp, micro-batches, chunks per stage, the price of every (stage, local chunk, kind) slot)
SpansRequest = tuple[str, int, int, int, tuple[float, ...]]
Spans = tuple[tuple[float, ...], tuple[float, ...]]  # (start, finish) of every stage


def spans_request(
    chunk_of: Sequence[ChunkTimes], stage_class: Sequence[int], *, schedule: str, num_microbatches: int,
    virtual_stages: int,
) -> SpansRequest | None:
    """What ``pipeline_phase`` prices on stages that differ (None: its closed form is exact): the
    longest paths of the program's dependency graph with every op at its own stage's chunk time
    (``longest_paths``). The uniform-stage closed form would price every op at the slowest stage's
    chunk, idling a heavy stage whose neighbours have slack as if all were as slow (a V schedule
    with the naive vocabulary placement holds the embedding and the LM head on stage 0: a third too
    slow; under 1F1B with one chunk per stage the classic (m - 1) t_slowest + sum t_s counts the faster
    stages' slack as idle, and under GPipe the slowest forward and the slowest backward on different
    stages as one)."""
    m, p, v = num_microbatches, len(stage_class), virtual_stages
    if len({id(chunk_of[k]) for k in stage_class}) <= 1:
        return None
    price: list[float] = []
    for k in stage_class:
        for chunk in chunk_of[k].chunks:
            price += (chunk.forward_s, chunk.backward_input_s, chunk.backward_weight_s,
                      chunk.backward_input_s + chunk.backward_weight_s)
    return (schedule, p, m, v, tuple(price))


# priced spans per request: a search prices plans that differ only in their data-parallel work
# alike; bounded (emptied when full: results never depend on it)
_SPANS: dict[SpansRequest, Spans] = {}
MAX_SPANS = 4096
_SPANS_BATCH_VALUES = 1 << 22  # ops x requests priced in one pass (the pass's float table)


def longest_paths(request: SpansRequest) -> Spans:
    """(start, finish) of every stage: the longest paths of the program's dependency graph
    (``schedules.program_graph``, a max-plus pass level by level, as the DES runs it without
    communication) with every op at its slot's price; memoized."""
    spans = _SPANS.get(request)
    if spans is None:
        prepare_longest_paths([request])
        spans = _SPANS[request]
    return spans


def prepare_longest_paths(requests: Sequence[SpansRequest]) -> None:
    """``longest_paths`` of many requests at once: those of one program in one level-by-level pass
    over a table of their prices side by side (the same float operations per request as alone)."""
    by_program: dict[tuple[str, int, int, int], dict[SpansRequest, None]] = {}
    for request in requests:
        if request not in _SPANS:
            by_program.setdefault(request[:4], {})[request] = None
    if len(_SPANS) + sum(map(len, by_program.values())) > MAX_SPANS:
        _SPANS.clear()
    for key, wanted in by_program.items():
        graph = program_graph(*key)
        pending = list(wanted)
        per_pass = max(1, _SPANS_BATCH_VALUES // len(graph.slot))
        for i in range(0, len(pending), per_pass):
            chunk = pending[i : i + per_pass]
            starts, finishes = graph.longest_paths(np.ascontiguousarray(np.array([r[4] for r in chunk]).T))
            for request, start, finish in zip(chunk, starts.T.tolist(), finishes.T.tolist()):
                _SPANS[request] = (tuple(start), tuple(finish))


def _pass_prices(chunk_of: Sequence[ChunkTimes], stage_class: Sequence[int], v: int) -> tuple[float, float, float]:
    """Per-chunk F, B and W of the split-backward closed form: the slowest stage's value of each pass."""
    used = [chunk_of[k] for k in set(stage_class)]
    f = max(t.forward_s for t in used) / v
    b = max(t.backward_input_s for t in used) / v
    w = max(t.backward_weight_s for t in used) / v
    return f, b, w


def _stage_finishes(
    profile: ProgramProfile, totals: Sequence[float], m: int, v: int, f: float, b: float, w: float
) -> tuple[float, ...]:
    """When each stage's last op ends: after its own m micro-batches plus the idle time its program
    leaves it on uniform stages at the prices f, b, w (exact on uniform stages; the slack of faster
    stages is not used)."""
    uniform = m * v * (f + b + w)
    return tuple(
        m * total + max(nf * f + nb * b + nw * w for nf, nb, nw in ends) - uniform
        for total, ends in zip(totals, profile.stage_paths)
    )


@lru_cache(maxsize=256)
def alternates(schedule: str, pp: int, num_microbatches: int, virtual_stages: int) -> bool:
    """Whether the program is one stage running one chunk as F0 B0 W0 F1 B1 W1 ..., its backward fused
    or split (ZB-H1 at pp 1: each W right after its B) (``fsdp_alternating_s`` is then the DES's FSDP
    timeline)."""
    if pp != 1 or virtual_stages != 1:
        return False
    program = schedule_program(schedule, 1, num_microbatches, 1)
    return program.steps[0] == tuple((kind, mb, 0) for mb in range(num_microbatches) for kind in ("F", "B", "W"))


def _held_compute(work_s: float, window_s: float, hold_s: float, tail_share: float, slowdown: float) -> tuple[float, float]:
    """(end, end without the hold) of ``work_s`` of compute started at 0 beside a data-parallel stream
    busy until ``window_s`` (``compute_beside_communication``), whose last ``tail_share`` waits for
    its chunk's last FSDP unit, gathered at ``hold_s`` (``pipeline_des``'s rule)."""
    inside, left = compute_beside_communication(work_s, window_s, slowdown)
    whole = inside + left
    if hold_s <= 0.0 or tail_share <= 0.0:
        return whole, whole
    inside, left = compute_beside_communication((1.0 - tail_share) * work_s, window_s, slowdown)
    if inside + left >= hold_s:
        return whole, whole
    rest = window_s - hold_s
    tail = tail_share * work_s
    if rest > 0.0:
        inside, left = compute_beside_communication(tail, rest, slowdown)
        return hold_s + inside + left, whole
    return hold_s + tail, whole


def fsdp_alternating_s(
    forward_s: float, backward_s: float, gather_s: float, grad_sync_s: float, last_bucket_s: float, buckets: int,
    num_microbatches: int, overlap_slowdown: float, first_unit_s: float | None = None, tail_share: float = 0.0,
    backward_gather: tuple[float, float, float] | None = None, split_weight_s: float | None = None,
) -> float:
    """Compute and FSDP stream of one stage running F0 B0 F1 B1 ... (one chunk, its backward fused, or
    split with each W right after its B: ``split_weight_s``), from the first gather to the end of the
    last backward or of the stream after it, whichever is later.

    The DES's rules (``pipeline_des``) followed op by op on the one FIFO data-parallel stream: each op
    issues the next op's gather when it starts (the first at time 0) and starts once the first unit
    of its own gather is in (``first_unit_s``; None: the gather is one unit), its last
    ``tail_share`` of compute waiting for the whole gather; every B spreads its ``buckets``
    reduce-scatters over its work (bucket q ready at (q + 1) / buckets of it). So F_i hides what is
    left of its own gather and of the buckets of B_(i-1), plus the gather of B_i, and B_i what is
    left of its own gather, the gather of F_(i+1) and its buckets, which end at max(gathers + all of
    them, first ready + all of them, B + the last one, the first bucket held by the last unit + the
    rest). Compute beside the stream runs ``overlap_slowdown`` times slower
    (``compute_beside_communication``; a B overlaps all its buckets but the last). Exact without a
    slowdown when the buckets are equal; with one, B's buckets are taken as running from its start
    (they run as they become ready), so it is a little long when the buckets are few and longer than B.
    ``backward_gather``: a B's gather, its first unit and tail share where they differ from the F's.
    ``split_weight_s``: the backward is split (ZB-H1 at pp 1) into a B of ``backward_s`` less this W
    and the W right after it: the B waits for its gather (its own tail share held) beside the
    gathers alone, the W then runs beside what is left of them and the buckets, which it spreads
    over itself (the first ready 1/buckets into it)."""
    first = gather_s if first_unit_s is None else first_unit_s
    gather_b, first_b, tail_b = backward_gather if backward_gather is not None else (gather_s, first, tail_share)
    split, weight = split_weight_s is not None, split_weight_s or 0.0
    t = first  # the first unit of the first gather: nothing to hide behind
    own = leftover = gather_s - first  # of F_i's own gather / of the stream, left when F_i starts
    for i in range(num_microbatches):
        window = leftover + gather_b  # B_i's gather queued behind what is left
        forward, _ = _held_compute(forward_s, window, own, tail_share, overlap_slowdown)
        backward_start = max(forward, leftover + first_b)  # B_i waits for its first unit
        t += backward_start
        own_b = window - backward_start if window > backward_start else 0.0  # of B_i's gather
        following = own_b + gather_s if i < num_microbatches - 1 else own_b  # F_(i+1)'s gather ends
        end = following
        if split:  # B beside the gathers, then W beside what is left of them and its buckets
            b_end, _ = _held_compute(backward_s - weight, following, own_b, tail_b, overlap_slowdown)
            stream_left = following - b_end if following > b_end else 0.0
            inside, left = compute_beside_communication(weight, stream_left + grad_sync_s - last_bucket_s, overlap_slowdown)
            backward = b_end + inside + left
            if buckets:  # the first ready 1/buckets into the W
                end = max(following + grad_sync_s, b_end + (inside + left) / buckets + grad_sync_s,
                          backward + last_bucket_s)
        else:
            backward, unheld = _held_compute(backward_s, following + grad_sync_s - last_bucket_s, own_b, tail_b,
                                             overlap_slowdown)
            if buckets:
                end = max(following + grad_sync_s, unheld / buckets + grad_sync_s, backward + last_bucket_s)
                if backward > unheld:  # the buckets after the hold's boundary wait with it
                    end = max(end, _held_buckets_end(backward_s, backward, own_b, tail_b, grad_sync_s, last_bucket_s,
                                                     buckets))
        if i < num_microbatches - 1:
            start = max(backward, own_b + first)  # F_(i+1) waits for its first unit
            t += start
            own = following - start if following > start else 0.0
            leftover = end - start if end > start else 0.0
        else:
            t += max(backward, end)
    return t


def _held_buckets_end(
    backward_s: float, backward_end: float, hold_s: float, tail_share: float, grad_sync_s: float, last_bucket_s: float,
    buckets: int,
) -> float:
    """When a B's buckets end counting from its first bucket past the hold's boundary (ready at the
    hold plus its share of the tail's elapsed time), with all the buckets after it."""
    boundary = (1.0 - tail_share) * backward_s
    q = min(int((1.0 - tail_share) * buckets), buckets - 1)
    while q > 0 and (q / buckets) * backward_s > boundary:
        q -= 1
    while q < buckets - 1 and ((q + 1) / buckets) * backward_s <= boundary:
        q += 1
    rate = (backward_end - hold_s) / (tail_share * backward_s)
    ready = hold_s + (((q + 1) / buckets) * backward_s - boundary) * rate
    others = (grad_sync_s - last_bucket_s) / (buckets - 1) if buckets > 1 else 0.0
    return ready + (buckets - q - 1) * others + last_bucket_s


def first_forward_shift_s(
    chunk_of: Sequence[ChunkTimes], dp_of: Sequence[DataParallelTimes], stage_class: Sequence[int], overlap_slowdown: float,
    profile: ProgramProfile,
) -> float:
    """Seconds by which ZeRO-1/2's paced parameter gathers (``gather_first_forward_only``) delay the
    pipeline (``pipeline_des``'s rule: a stage's gathers queue on its data-parallel stream, the first at
    time 0, each next one issued when the previous chunk's first F starts; an F starts once its chunk's
    first unit is in and is held by the last). The larger of two delays:

    - the first micro-batch's forward through the stages' first local chunks, each F starting at
      max(the previous stage's F end, its first unit in), less the same chain without gathers, plus
      what the later chunks' gathers (virtual stages) slow the first stage's compute: exact at pp = 1
      with one chunk, with pp > 1 an upper bound on the DES's delay (the p2p of the fill, not in the
      chain, makes the DES's later F start later, so their gathers hide more);
    - with several chunks per stage, the first forward of every global chunk in model order
      (``_first_forward_path_s``): where a chunk's gather outlasts the compute its stage runs between
      two chunks' first forwards, the gathers pace them (Megatron-Core at one layer per virtual stage:
      a layer's gather is longer than the forwards of the pp micro-batches before the next layer's).
    (tests/sim/test_training_zero1_pacing.py)"""
    if not any(dp_of[k].gather_first_forward_only and dp_of[k].gathers_s for k in stage_class):
        return 0.0
    t = nominal = 0.0
    for k in stage_class:
        dp, forward_s = dp_of[k], chunk_of[k].chunks[0].forward_s
        nominal += forward_s
        if not (dp.gather_first_forward_only and dp.gathers_s):
            t += forward_s
            continue
        start = max(t, dp.gather_first_s[0])
        left = dp.gathers_s[0] - start  # of the chunk's gather when its first F starts
        end, _ = _held_compute(forward_s, left, left, dp.gather_tail_share[0], overlap_slowdown) if left > 0.0 else (forward_s, 0.0)
        t = start + end
    shift = t - nominal
    k = stage_class[0]
    dp = dp_of[k]
    if not (dp.gather_first_forward_only and len(dp.gathers_s) > 1):
        return shift
    shift += overlap_stretch_s(chunk_of[k].total_s, sum(dp.gathers_s[1:]), overlap_slowdown)
    paced = _first_forward_path_s(chunk_of, dp_of, stage_class, overlap_slowdown, profile, gathered=True) - \
        _first_forward_path_s(chunk_of, dp_of, stage_class, overlap_slowdown, profile, gathered=False)
    return max(shift, paced)


def _first_forward_path_s(
    chunk_of: Sequence[ChunkTimes], dp_of: Sequence[DataParallelTimes], stage_class: Sequence[int], overlap_slowdown: float,
    profile: ProgramProfile, *, gathered: bool,
) -> float:
    """When the first micro-batch's forward through the last global chunk ends (``first_forward_shift_s``):
    each F starts once its input has arrived, its stage has run what its program puts before it
    (``ProgramProfile.first_forward_heads``, slowed beside the stage's data-parallel stream) and, if
    ``gathered``, its chunk's first unit is in; the p2p of the fill is not in the path."""
    p = len(stage_class)
    heads = [dict(stage) for stage in profile.first_forward_heads]  # per stage: chunk -> counts before its first F
    local = [0] * p  # the next local chunk of each stage, in model order
    free = [0.0] * p  # when each stage's compute is free
    stream = [0.0] * p  # when each stage's data-parallel stream is free
    issue = [0.0] * p  # when each stage issues its next gather
    prices = {k: _flat_prices(chunk_of[k]) for k in set(stage_class)}
    arrival = 0.0
    for s in profile.placement:
        k, c = stage_class[s], local[s]
        local[s] += 1
        chunks, dp = chunk_of[k], dp_of[k]
        before = sum(map(mul, heads[s][c], prices[k]))
        if before > 0.0:  # what the stage's program runs before this F, beside its stream
            inside, left = compute_beside_communication(before, max(0.0, stream[s] - free[s]), overlap_slowdown)
            free[s] += inside + left
        start = max(arrival, free[s])
        forward_s = chunks.chunks[c].forward_s
        if gathered and dp.gather_first_forward_only and dp.gathers_s:
            begin = max(issue[s], stream[s])
            stream[s] = begin + dp.gathers_s[c]
            start = max(start, begin + dp.gather_first_s[c])
            issue[s] = start
            left = stream[s] - start
            end = _held_compute(forward_s, left, left, dp.gather_tail_share[c], overlap_slowdown)[0] if left > 0.0 else forward_s
        else:
            end = forward_s
        free[s] = arrival = start + end
    return arrival


def _advance_beside(now: float, done: float, free: float, to: float, slowdown: float) -> float:
    """Wall seconds at which compute that has run ``done`` nominal seconds by ``now`` has run ``to``,
    beside a data-parallel stream busy until ``free`` (``compute_beside_communication``), then alone."""
    inside, left = compute_beside_communication(to - done, max(0.0, free - now), slowdown)
    return now + inside + left


@lru_cache(maxsize=8192)
def grad_sync_exposed_s(
    runs: tuple[tuple[float, int], ...], windows: tuple[tuple[float, float], ...], slowdown: float,
) -> tuple[float, float]:
    """(Seconds a stage's overlapped gradient buckets keep it busy past its last op's nominal end,
    seconds by which they slow the compute of its last final gradient op), bucket by bucket as the DES
    runs them: split over the chunks' final gradient ops in program order (op i of K gets buckets
    i n // K to (i + 1) n // K - 1, bucket q of its k ready at (q + 1) / k of the op), queued on the
    data-parallel stream, and slowing the compute they overlap to 1 / ``slowdown``
    (``work.compute_beside_communication``). ``runs``: the buckets' seconds, run-length encoded
    (``DataParallelTimes.bucket_runs``); ``windows``: per final op, (nominal compute seconds from its
    start to the stage's last op, its own seconds); the compute after the first final op is dense.
    Memoized: plans of a search share their stages' buckets.

    A run of equal buckets of d seconds ready ``step`` nominal seconds apart is closed form: with the
    stream ``gap`` seconds from free when a bucket is queued, the next is ready ``step * slowdown`` later
    and finds it ``gap - step * slowdown + d`` from free while ``gap >= step * slowdown``; once it is
    not, the stream is free at every later bucket, and each takes ``d + step - d / slowdown``."""
    n, ops = sum(count for _, count in runs), len(windows)
    tail = windows[0][0]
    # the cursor: wall seconds since the first final op's start (now) and nominal compute seconds run by
    # then (done); the stream is busy from the cursor until ``free``
    now = done = free = 0.0
    last_start = 0.0  # wall seconds when the last final op starts
    r, used = 0, 0  # the run of the next bucket, and how many of its buckets are queued
    for i, (window, op_s) in enumerate(windows):
        if i == ops - 1:
            now = last_start = _advance_beside(now, done, free, tail - window, slowdown)
            done = tail - window
        lo, hi = i * n // ops, (i + 1) * n // ops
        if hi == lo:
            continue
        step, wall = op_s / (hi - lo), op_s / (hi - lo) * slowdown
        q = lo
        while q < hi:
            d, count = runs[r]
            take = min(count - used, hi - q)
            r, used = (r + 1, 0) if used + take == count else (r, used + take)
            # the first bucket: advance the cursor to its ready point, then queue it
            ready = tail - window + (q - lo + 1) * step
            now, done = _advance_beside(now, done, free, ready, slowdown), ready
            free = max(free, now) + d
            # the others, closed form
            later = take - 1
            if later:
                gap = free - now
                behind = later if d >= wall else min(later, int((gap - wall) // (wall - d)) + 1) if gap >= wall else 0
                now, free, done = now + behind * wall, free + behind * d, done + behind * step
                if behind < later:  # the stream frees before the next is ready, and at every later one
                    now = _advance_beside(now, done, free, done + step, slowdown)
                    now += (later - behind - 1) * (d + step - d / slowdown)
                    done += (later - behind) * step
                    free = now + d
            q += take
    now = _advance_beside(now, done, free, tail, slowdown)
    return max(now, free) - tail, (now - last_start) - windows[-1][0]


class Zero3Prices(NamedTuple):
    """A stage class's prices for the ZeRO-3 bounds (``zero3_prices``), flat per op F, B, W and
    chunk-major as ``BackwardTail``'s counts."""

    paced: tuple[float, ...]  # an op run back to back, no faster than the gather issued as the one before starts
    gathers: tuple[float, ...]  # the gather each op needs (none for a W)
    hop: tuple[float, ...]  # per chunk, its B as the drain runs it: alone where the backward is split, else
    # with its W and slowed by the buckets it issues (its chunk's share of the stage's)
    share: float  # one chunk's buckets, issued over one of its gradient ops
    stream: float  # every micro-batch's buckets


def zero3_prices(chunks: ChunkTimes, dp: DataParallelTimes, m: int, split_backward: bool,
                 overlap_slowdown: float) -> Zero3Prices:
    """``Zero3Prices`` of a stage class whose ``m`` micro-batches each gather and reduce-scatter."""
    paced, gathers, hop = [], [], []
    share = dp.grad_sync_s / len(dp.gathers_s)
    for work, gather, gather_b in zip(chunks.chunks, dp.gathers_s, dp.backward_gathers_s):
        backward = work.backward_input_s + (0.0 if split_backward else work.backward_weight_s)
        paced += [max(work.forward_s, gather), max(backward, gather_b), work.backward_weight_s if split_backward else 0.0]
        gathers += [gather, gather_b, 0.0]
        hop.append(backward if split_backward else backward + overlap_stretch_s(backward, share, overlap_slowdown))
    return Zero3Prices(tuple(paced), tuple(gathers), tuple(hop), share, m * dp.grad_sync_s)


def first_backward_starts(
    chunk_of: Sequence[ChunkTimes], prices_of: Sequence[Zero3Prices | None], stage_class: Sequence[int],
    profile: ProgramProfile,
) -> list[float]:
    """Per stage of a ZeRO-3 pipeline, the least time at which it can start its first B
    (``ProgramProfile.backward_tails``: micro-batch 0's, of global chunk g) at the nominal prices with
    no transfer time: once that micro-batch's forward has run through every chunk of the model; once
    the stage has run every op before that B after its first F could start, none faster than the
    gather issued as the op before it starts; and once the B of global chunk g + 1 (on its stage, no
    earlier than that stage's first B) has run (``Zero3Prices.hop``)."""
    p, placement, global_of, local_of = len(stage_class), profile.placement, profile.stage_chunks, profile.local_chunk
    offsets = list(accumulate(
        (chunk_of[stage_class[owner]].chunks[local].forward_s for owner, local in zip(placement, local_of)), initial=0.0
    ))  # forward of the chunks before g
    forward = offsets[-1]
    first_global, order = profile.first_backward_chunks
    starts = [0.0] * p
    for s in order:
        g, prices = first_global[s], prices_of[stage_class[s]]
        start = max(forward, offsets[global_of[s][0]] + sum(map(mul, profile.backward_tails[s].before, prices.paced)))
        if g + 1 < len(placement):
            owner = placement[g + 1]
            start = max(start, starts[owner] + prices_of[stage_class[owner]].hop[local_of[g + 1]])
        starts[s] = start
    return starts


def fsdp_backward_stream_end_s(first_backward_s: float, tail: BackwardTail, prices: Zero3Prices,
                               split_backward: bool) -> float:
    """The earliest end of a ZeRO-3 stage's data-parallel stream from its first gradient op on (its first
    B, or its first W where the backward is split: ``BackwardTail``), which starts no earlier than the
    ops from its first B (``first_backward_starts``) have run (``Zero3Prices.paced``): every
    micro-batch's gradient buckets and the gathers of the later ops are issued no earlier (but the next
    gather, issued as the op before starts), and the one FIFO stream runs them back to back at best."""
    cut = first_backward_s
    if split_backward:
        cut += sum(map(mul, tail.counts, prices.paced)) - sum(map(mul, tail.gradient_counts, prices.paced))
    gathers = sum(map(mul, tail.gradient_counts, prices.gathers))
    if gathers:
        gathers -= max(prices.gathers) if split_backward else prices.gathers[3 * tail.chunk]
    return cut + gathers + prices.stream


def split_stream_end_s(kinds: Sequence[int], chunks_of_ops: Sequence[int], start_s: float, chunks: ChunkTimes,
                       dp: DataParallelTimes, share_s: float) -> float:
    """The least time a ZeRO-3 stage whose backward is split ends its compute and data-parallel stream,
    its ops (``kinds``, ``chunks_of_ops``: its program from its first B on) run from ``start_s`` by the
    DES's rules but for the waits on other stages and the slowdown: each F or B issues, as it starts,
    the gather of the next op that needs one and waits for its own gather's first unit; each W queues its
    chunk's buckets (``share_s``) as it starts. Where a W's buckets outlast the ops after it, the gather
    issued behind them holds the B that needs it while the stream idles through the B before it."""
    works = chunks.chunks
    needing = [j for j, kind in enumerate(kinds) if kind != W_CODE]
    next_needing = dict(zip(needing, needing[1:]))
    ready = {0: start_s}  # op -> when its gather's first unit is in (the first op's: at the start)
    compute = stream = start_s
    for j, (kind, c) in enumerate(zip(kinds, chunks_of_ops)):
        work = works[c]
        begin = max(compute, ready.get(j, compute))
        if j in next_needing:
            after = next_needing[j]
            issued = max(begin, stream)
            if kinds[after] == F_CODE:
                stream = issued + dp.gathers_s[chunks_of_ops[after]]
                ready[after] = issued + dp.gather_first_s[chunks_of_ops[after]]
            else:
                stream = issued + dp.backward_gathers_s[chunks_of_ops[after]]
                ready[after] = issued + dp.backward_gather_first_s[chunks_of_ops[after]]
        if kind == F_CODE:
            compute = begin + work.forward_s
        elif kind == B_CODE:
            compute = begin + work.backward_input_s
        else:
            stream = max(begin, stream) + share_s
            compute = begin + work.backward_weight_s
    return max(compute, stream)


def fsdp_stream_bounds_s(
    phase: PipelinePhase, chunk_of: Sequence[ChunkTimes], dp_of: Sequence[DataParallelTimes],
    stage_class: Sequence[int], aggregated: Sequence[bool], m: int, overlap_slowdown: float, carries: bool,
) -> list[float]:
    """Per stage, the least seconds its ZeRO-3 stream keeps it busy past its last backward's nominal end
    (0 where its class is not priced in aggregate, ``finish_iteration``). The stream work issued once
    the stage's gradients start to flow cannot start earlier (``fsdp_backward_stream_end_s``). Under a
    model-order placement with a fused backward (``carries``), a stage's last B (local chunk 0) is what
    the stage before waits for: it starts no earlier than its gather, queued behind all that stream
    work but the buckets of the gradient ops issued after it (``BackwardTail.late``), nor than it would
    without the stream, nor than the later stage's last B ends; it runs slowed beside its own buckets.
    Where the backward is split, the stage whose bound ends last is also walked op by op
    (``split_stream_end_s``: one stage, for its cost)."""
    profile, p = phase.profile, len(stage_class)
    prices_of = [zero3_prices(chunk, dp, m, profile.split_backward, overlap_slowdown) if bound else None
                 for chunk, dp, bound in zip(chunk_of, dp_of, aggregated)]
    first_backward = first_backward_starts(chunk_of, prices_of, stage_class, profile)
    exposed = [0.0] * p
    ended = 0.0  # the least time the later stage's last B ends
    walked = (-1, 0.0)  # a split backward's stage whose stream bound ends last, and that bound
    for s in reversed(range(p)):
        k = stage_class[s]
        prices = prices_of[k]
        if prices is None:
            ended = 0.0
            continue
        dp, last_backward_end, tail = dp_of[k], phase.last_backward_end_s[s], profile.backward_tails[s]
        bound = fsdp_backward_stream_end_s(first_backward[s], tail, prices, profile.split_backward)
        if profile.split_backward and bound > walked[1]:
            walked = (s, bound)
        exposed[s] = bound - last_backward_end
        if not carries:
            continue
        share, last = prices.share, chunk_of[k].chunks[0]
        nominal = last_backward_end - last.backward_input_s - last.backward_weight_s  # without the stream
        started = max(bound - tail.late * share - dp.backward_gathers_s[0] + dp.backward_gather_first_s[0], nominal,
                      ended)
        # the last B runs beside the buckets it issues, which end no earlier than all of them after its start
        ended = started + prices.hop[0]
        finished = started + max(prices.hop[0] + dp.last_bucket_s, share)
        exposed[s] = max(exposed[s], finished - last_backward_end)
    s = walked[0]
    if s >= 0:
        k = stage_class[s]
        ops = np.frombuffer(profile.backward_tails[s].ops, dtype=np.uint8).reshape(-1, 2)
        end = split_stream_end_s(ops[:, 0].tolist(), ops[:, 1].tolist(), first_backward[s], chunk_of[k], dp_of[k],
                                 prices_of[k].share)
        exposed[s] = max(exposed[s], end - phase.last_backward_end_s[s])
    return exposed


def finish_iteration(
    phase: PipelinePhase,
    chunk_of: Sequence[ChunkTimes],
    dp_of: Sequence[DataParallelTimes],
    stage_class: Sequence[int],
    *,
    num_microbatches: int,
    overlap_slowdown: float,
) -> PipelineEstimate:
    """The iteration after ``phase``: every stage finishes its data-parallel work and optimizer step
    after its last backward; the latest finish is the iteration time. The compute that the
    data-parallel stream overlaps runs ``overlap_slowdown`` times slower meanwhile (the DES's rule,
    ``work.compute_beside_communication``), which the exposed dp time includes."""
    m, pipeline = num_microbatches, phase.pipeline_time_s
    # data-parallel time exposed after each class's last backward (the last micro-batch's backward
    # hides the gradient buckets; ZeRO-3 gathers hide behind the stage's compute), and its finish
    # offset after the stage's last backward
    exposed_dp_of = []
    after_of = []
    aggregated = []  # per class: whether its ZeRO-3 stream is priced in aggregate (below, then bounded)
    shift = first_forward_shift_s(chunk_of, dp_of, stage_class, overlap_slowdown, phase.profile)
    slowest = max(c.total_s for c in chunk_of)  # a micro-batch's F, B and W on the slowest stage
    for chunk, dp in zip(chunk_of, dp_of):
        aggregate = False
        if dp.gathers_s and not dp.gather_first_forward_only:
            # FSDP / ZeRO-3 (the DES's rule): every micro-batch gathers each chunk before its F and
            # its B and reduce-scatters its gradients (once per loop under bfs: ``gather_rounds``).
            compute = m * chunk.total_s
            if phase.alternating and phase.gather_rounds == m:
                # one stage, F0 B0 F1 B1 ...: the stream op by op, as the DES runs it
                exposed_dp = fsdp_alternating_s(
                    chunk.forward_s, chunk.backward_s, dp.gathers_s[0], dp.grad_sync_s, dp.last_bucket_s, dp.buckets,
                    m, overlap_slowdown, dp.gather_first_s[0], dp.gather_tail_share[0],
                    (dp.backward_gathers_s[0], dp.backward_gather_first_s[0], dp.backward_gather_tail_share[0]),
                    chunk.backward_weight_s if phase.profile.split_backward else None) - compute
            else:
                # several stages or chunks: the stream hides behind the stage's compute but the first
                # gather's first unit and the last bucket are exposed; the rest overlaps the m
                # micro-batches' compute and slows it. In aggregate: the per-op waits of a gather (or
                # of its last unit) longer than the op it hides behind are not followed (the ends
                # counted on top of a stream longer than the compute stand in for them); where the
                # stream outlasts the backward, the bounds after the loop below take over (alone, the
                # aggregate read 10-14 % short of the DES on HSDP plans under GPipe)
                stream = phase.gather_rounds * (sum(dp.gathers_s) + sum(dp.backward_gathers_s) + dp.grad_sync_s)
                ends = dp.gather_first_s[0] + dp.last_bucket_s
                stretch = overlap_stretch_s(compute, stream - ends, overlap_slowdown)
                # the slowest stage paces every micro-batch: a faster one waits for it each time while
                # its stream goes on (a stage of a slower GPU, of more layers, of the LM head)
                window = m * slowest
                exposed_dp = ends + stretch + max(0.0, stream - window - stretch)
                aggregate = phase.gather_rounds == m
        elif dp.grad_sync:
            exposed_dp = None  # per stage: its program's windows (below)
        else:
            exposed_dp = 0.0
        exposed_dp_of.append(exposed_dp)
        aggregated.append(aggregate)
        # the serial buckets (no overlap) run before the optimizer: all of them are exposed
        after_of.append(dp.optimizer_s + dp.serial_grad_sync_s)
    iteration = 0.0
    exposed_dp_critical = 0.0
    starts = phase.stage_start_s or (0.0,) * len(stage_class)
    profile = phase.profile
    p = len(stage_class)
    # the buckets' slowdown of a stage's last op delays the earlier stages' drain where that op is a B
    # (fused with its W) whose input gradient the stage before waits for: the model-order placement of
    # 1F1B, GPipe and interleaving; a split backward's last W sends nothing
    carries = not profile.split_backward and profile.placement == tuple(g % p for g in range(len(profile.placement)))
    exposed_of_tail: dict[tuple[int, int], tuple[float, float]] = {}  # (tail, class): the stages alike share it
    exposed_of_stage, slowed_of_stage = [], []
    for s, k in enumerate(stage_class):
        exposed_dp, slowed = exposed_dp_of[k], 0.0
        if exposed_dp is None:
            key = (profile.gradient_tail_of_stage[s], k)
            if key not in exposed_of_tail:
                windows = gradient_windows(profile.gradient_tails[key[0]], chunk_of[k], profile.split_backward)
                exposed_of_tail[key] = grad_sync_exposed_s(dp_of[k].bucket_runs, windows, overlap_slowdown)
            exposed_dp, slowed = exposed_of_tail[key]
        exposed_of_stage.append(exposed_dp)
        slowed_of_stage.append(slowed if carries else 0.0)
    carried_of_stage = [sum(slowed_of_stage[s + 1:]) for s in range(p)]  # the later stages' slowed last ops
    if any(aggregated):
        bounds = fsdp_stream_bounds_s(phase, chunk_of, dp_of, stage_class, aggregated, m, overlap_slowdown, carries)
        exposed_of_stage = [max(exposed, bound) for exposed, bound in zip(exposed_of_stage, bounds)]
    for s, (last_backward_end, k, start) in enumerate(zip(phase.last_backward_end_s, stage_class, starts)):
        exposed_dp = exposed_of_stage[s]
        finish = last_backward_end + carried_of_stage[s] + shift + exposed_dp + after_of[k] - start
        if finish >= iteration:
            iteration, exposed_dp_critical = finish, shift + exposed_dp + dp_of[k].serial_grad_sync_s
    exposed = dict(phase.exposed_comm_s)
    exposed["dp"] = exposed_dp_critical
    return PipelineEstimate(
        iteration_time_s=iteration,
        pipeline_time_s=pipeline,
        bubble_fraction=phase.bubble_fraction,
        exposed_comm_s=exposed,
        stage_busy_s=phase.stage_busy_s,
    )
