"""Pipeline schedules as programs: for every device, the ordered list of (micro-batch, chunk, pass) it runs.

A schedule is data. ``schedule_program(schedule, pp, m, v)`` returns a ``Program``: per stage the
ops in run order (pass "F" forward, "B" input gradient, "W" weight gradient; micro-batch 0..m-1;
``chunk`` = local chunk index on the stage, 0..v-1, in model order), the stage of every model chunk
(``placement``) and whether B and W run apart (``split_backward``). A generator function per named
schedule produces it; a user gives one as a JSON file (``schedule = "file:PATH"``, format in
``program_from_json``). Every program is validated before use: each op exactly once, F before B
before W, chunk neighbours on adjacent stages, and an execution on unit-time stages that must not
deadlock. The DES (``sim.training.pipeline_des``) executes the program as it is; the analytic
fidelity and the memory model read ``program_profile``, which executes it once per
(schedule, pp, m, v) and keeps what they need: the peak activations held per stage and the
critical paths of uniform stages.

A program holds its ops as one integer array per stage (``Program.ops``; ``Program.steps`` gives
them as tuples), and the generators, the checks and the executor work on whole arrays: the list
scheduler and the executor step all stages through time together, a few array operations per time
step, and ``prepare_program_profiles`` executes many programs side by side (a plan search needs
thousands, some of hundreds of thousands of ops).

Conventions (one for all schedules): activations are held from the end of F to the end of B; W
holds none. Without ``split_backward`` each W immediately follows its B and the executor runs the
pair as one fused backward: the gradient for the previous chunk is sent after W. With it, the
gradient is sent at the end of B and W runs where the program puts it.

Placements: "looping" puts global chunk g on stage g % pp (Megatron's interleaved layout);
"zigzag" runs down the stages and back (g // pp even: stage g % pp, odd: pp - 1 - g % pp), the V
shape of Qi et al. 2024 with two chunks and Hanayo's waves with 2 W chunks.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any, Callable, Literal, NamedTuple, Sequence, TypeVar

import numpy as np

from workloads.errors import InvalidPlanError

SCHEDULES: tuple[str, ...] = (
    "gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "zb-v", "v-half", "v-min", "bfs", "hanayo",
)
FILE_PREFIX = "file:"  # schedule = "file:PATH": a program from a JSON file
V_SHAPES = ("zb-v", "v-half", "v-min")  # two chunks per stage in a V (Qi et al. 2024, arXiv 2405.15362)
_SPLIT = ("zb-h1", "zb-h2") + V_SHAPES
# Schedules whose iterations tile without a barrier between them. Pipeline training usually
# all-reduces over all stages before the optimizer step (global gradient norm for clipping, the
# INF/NaN check of mixed precision), which makes every iteration start from an empty pipeline; ZB-H2
# replaces it with post-validation: each stage steps its optimizer at once and rolls back in the rare
# case the later global check fails (Qi et al. ICLR'24, arXiv 2401.10241, Sec. 4; sail-sg/zero-bubble-
# pipeline-parallelism, "Optimizer Post Validation"). Its program is a parallelogram (every stage
# busy from its first op to its last on uniform stages), so consecutive iterations interlock and the
# iteration time is the steady-state period: the longest stage span, first op to optimizer end.
POST_VALIDATION = ("zb-h2",)
OpKind = Literal["F", "B", "W"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PipeOp:
    """One compute op of a stage program: forward, input-gradient or weight-gradient pass."""

    kind: OpKind  # "F" | "B" | "W"
    microbatch: int  # 0..num_microbatches-1
    chunk: int  # local chunk index on the stage, 0..virtual_stages-1


Step = tuple[str, int, int]  # (kind, microbatch, chunk): a PipeOp as a plain tuple, for the executor's hot loop


# A program's ops as one int64 array per stage, rows (pass code, micro-batch, local chunk) in run
# order: the generators build these with numpy (a large program holds hundreds of thousands of ops)
F_CODE, B_CODE, W_CODE = 0, 1, 2
PASS_NAMES = "FBW"  # pass code -> name


def _ops(kinds: np.ndarray, microbatches: np.ndarray, chunks: np.ndarray) -> np.ndarray:
    return np.stack([kinds, microbatches, chunks], axis=1).astype(np.int64, copy=False)


def _gpipe(m: int) -> np.ndarray:
    # Huang et al. 2019 (GPipe): all forwards, then all backwards (ascending micro-batch order, as
    # torch.distributed.pipelining's ScheduleGPipe); every stage keeps all m micro-batches in flight.
    i = np.arange(m)
    kinds = np.concatenate([np.full(m, F_CODE), np.tile([B_CODE, W_CODE], m)])
    return _ops(kinds, np.concatenate([i, np.repeat(i, 2)]), np.zeros(3 * m, dtype=np.int64))


def _warmup_then_alternate(
    forward: tuple[np.ndarray, np.ndarray], backward: tuple[np.ndarray, np.ndarray], warmup: np.ndarray,
    deferred_w: np.ndarray,
) -> np.ndarray:
    """The 1F1B shape of every stage s over n (micro-batch, chunk) forwards and n backwards in their
    orders: ``warmup[s]`` forwards, then for k = 0..n-1 the next forward (while any is left),
    backward k and its W (the W of the first ``deferred_w[s]`` backwards moved to the end).
    Returns the stages' ``Program.ops``, shape (stages, 3 n, 3)."""
    (f_mb, f_c), (b_mb, b_c) = forward, backward
    n = len(f_mb)
    w, d = np.minimum(warmup, n)[:, None], np.minimum(deferred_w, n)[:, None]
    stages = len(w)
    k = np.arange(n)
    # per stage and k a block of (F of warmup + k | none), (B k), (W k | none); -1 marks an empty
    # slot; an entry is the op's place in the forward (F) or backward (B, W) order
    index = np.stack([np.where(k < n - w, w + k, -1), np.broadcast_to(k, (stages, n)), np.where(k >= d, k, -1)],
                     axis=2).reshape(stages, 3 * n)
    keep = index >= 0
    kind = np.empty((stages, 3 * n), dtype=np.int64)
    order = np.empty((stages, 3 * n), dtype=np.int64)
    # a stage's ops: its w warm-up forwards, its kept block slots in order, its d deferred W
    row = np.broadcast_to(np.arange(stages)[:, None], (stages, 3 * n))[keep]
    column = (w + np.cumsum(keep, axis=1) - 1)[keep]
    kind[row, column] = np.broadcast_to(np.tile([F_CODE, B_CODE, W_CODE], n), (stages, 3 * n))[keep]
    order[row, column] = index[keep]
    head_row, head = np.nonzero(k < w)
    kind[head_row, head], order[head_row, head] = F_CODE, head
    tail_row, tail = np.nonzero(k < d)
    kind[tail_row, 3 * n - d[tail_row, 0] + tail], order[tail_row, 3 * n - d[tail_row, 0] + tail] = W_CODE, tail
    is_f = kind == F_CODE
    return np.stack([kind, np.where(is_f, f_mb[order], b_mb[order]), np.where(is_f, f_c[order], b_c[order])], axis=2)


def _one_f_one_b(pp: int, m: int, deferred_w: np.ndarray) -> np.ndarray:
    """PipeDream-flush / 1F1B (Narayanan et al. 2021, Sec. 2.2.1) with the first ``deferred_w[s]`` W
    ops of stage s moved to the end, for every stage.

    Warm-up of min(pp - stage - 1, m) forwards, steady state one F then one B, cool-down of the
    remaining B: at most pp - stage micro-batches are in flight on the stage.
    """
    i, zero = np.arange(m), np.zeros(m, dtype=np.int64)
    return _warmup_then_alternate((i, zero), (i, zero), np.minimum(pp - np.arange(pp) - 1, m), deferred_w)


def _interleaved(pp: int, m: int, v: int) -> np.ndarray:
    """Megatron-LM's interleaved 1F1B (Narayanan et al. 2021, Sec. 2.2.2) with v chunks per stage,
    for every stage.

    The k-th forward (0..m*v-1) of a stage runs micro-batch (k // (pp*v)) * pp + k % pp on local
    chunk (k % (pp*v)) // pp: groups of pp micro-batches go through chunk 0, then chunk 1, ...;
    backwards visit the chunks in reverse order. Warm-up length follows Megatron-LM
    ``forward_backward_pipelining_with_interleaving``: all m*v forwards when m == pp, else
    min(2 (pp - stage - 1) + (v - 1) pp, m v); then one F and one B alternate; then the remaining B.
    """
    total = m * v
    stage = np.arange(pp)
    warmup = np.full(pp, total) if m == pp else np.minimum(2 * (pp - stage - 1) + (v - 1) * pp, total)
    k = np.arange(total)
    microbatch, chunk = (k // (pp * v)) * pp + k % pp, (k % (pp * v)) // pp
    return _warmup_then_alternate((microbatch, chunk), (microbatch, v - 1 - chunk), warmup, np.zeros(pp, dtype=np.int64))


@dataclass(frozen=True, kw_only=True, eq=False)
class Program:
    """A validated pipeline schedule: what every stage runs, in order, and where every chunk lives."""

    schedule: str
    pp: int
    num_microbatches: int
    chunks_per_stage: int
    placement: tuple[int, ...]  # stage of global (model-order) chunk g, g = 0..pp * chunks_per_stage - 1
    split_backward: bool
    # per stage, rows (pass code F_CODE / B_CODE / W_CODE, micro-batch, local chunk) in run order:
    # shape (pp, 3 x num_microbatches x chunks_per_stage, 3)
    ops: np.ndarray

    @cached_property
    def steps(self) -> tuple[tuple[Step, ...], ...]:
        """Per stage, (kind, microbatch, local chunk) in run order."""
        return tuple(tuple((PASS_NAMES[k], mb, c) for k, mb, c in stage.tolist()) for stage in self.ops)

    def stage_chunks(self, stage: int) -> tuple[int, ...]:
        """Global chunks of ``stage`` in model order (local chunk c is entry c)."""
        return tuple(g for g, s in enumerate(self.placement) if s == stage)

    @cached_property
    def occupancy(self) -> "ProgramOccupancy":
        """What the memory model reads of the program (``program_occupancy``), from its ops alone."""
        peak, last = _occupancy(self.ops, _local_chunks(self.placement, self.pp), len(self.placement))
        return ProgramOccupancy(chunks_per_stage=self.chunks_per_stage, peak_held_chunks=peak, last_chunk_inflight=last)


class ProgramOccupancy(NamedTuple):
    """The activations a program holds (``ProgramProfile``'s fields of the same names), counted in its
    ops in run order: known once the program is built, before it is executed (``program_occupancy``)."""

    chunks_per_stage: int
    peak_held_chunks: tuple[int, ...]  # per stage, most (micro-batch, chunk) activations held at once
    last_chunk_inflight: int  # most micro-batches whose last-chunk forward has run and backward not

    def inflight_stages(self, stage: int) -> float:
        """Peak in-flight activations of ``stage`` in units of the whole stage's layers."""
        return self.peak_held_chunks[stage] / self.chunks_per_stage


def _local_chunks(place: tuple[int, ...], pp: int) -> np.ndarray:
    """(pp, chunks per stage) array: the global chunks of every stage in model order."""
    return np.argsort(np.asarray(place, dtype=np.int64), kind="stable").reshape(pp, len(place) // pp)


def is_file_schedule(schedule: str) -> bool:
    return schedule.startswith(FILE_PREFIX)


@lru_cache(maxsize=1024)
def placement(kind: str, pp: int, chunks: int) -> tuple[int, ...]:
    """Stage of every global chunk: "looping" (g % pp) or "zigzag" (down the stages and back)."""
    if kind == "looping":
        return tuple(g % pp for g in range(pp * chunks))
    return tuple(g % pp if (g // pp) % 2 == 0 else pp - 1 - g % pp for g in range(pp * chunks))


def schedule_placement(schedule: str, pp: int, chunks: int) -> tuple[int, ...]:
    """The placement of a named schedule, or of the program in a schedule file."""
    if is_file_schedule(schedule):
        return _file_placement(schedule, pp)
    return placement("zigzag" if schedule in V_SHAPES or schedule == "hanayo" else "looping", pp, chunks)


def chunks_per_stage(schedule: str, virtual_stages: int) -> int:
    """Model chunks per stage that ``schedule`` runs given the user's ``virtual_stages``: V shapes 2,
    hanayo 2 per wave (``virtual_stages`` = waves), a schedule file what its program holds, others
    ``virtual_stages`` (which the one-chunk schedules reject unless it is 1)."""
    if schedule in V_SHAPES:
        return 2
    if schedule == "hanayo":
        return 2 * virtual_stages
    if is_file_schedule(schedule):
        return _load_file(schedule[len(FILE_PREFIX):])["chunks"]
    return virtual_stages


def config_virtual_stages(schedule: str, chunks: int) -> int:
    """The ``[parallel] virtual_stages`` that runs ``chunks`` chunks per stage (the inverse of
    ``chunks_per_stage``: hanayo's value counts waves of 2 chunks; a schedule file's program holds
    its own chunks, whatever the value)."""
    if schedule == "hanayo":
        return chunks // 2
    return 1 if is_file_schedule(schedule) else chunks


def splits_backward(schedule: str) -> bool:
    """True when the schedule runs W apart from B (B's gradient is sent before W runs)."""
    if is_file_schedule(schedule):
        return bool(_load_file(schedule[len(FILE_PREFIX):])["split_backward"])
    return schedule in _SPLIT


def tiles_iterations(schedule: str) -> bool:
    """Whether consecutive iterations of ``schedule`` overlap (``POST_VALIDATION``): the iteration
    time is then the longest stage span (each stage's first op to its optimizer step's end)."""
    return schedule in POST_VALIDATION


def amortises_gathers(schedule: str) -> bool:
    """True when the schedule keeps a chunk's ZeRO-3 parameters gathered while all micro-batches run
    it back to back, and reduce-scatters its gradients once (breadth-first, Lamy-Poirier 2022)."""
    return schedule == "bfs"


def global_chunk(stage: int, chunk: int, pp: int) -> int:
    """Model-order (virtual stage) index of local chunk ``chunk`` on ``stage`` (looping layout)."""
    return chunk * pp + stage


def _check(schedule: str, pp: int, stage: int, num_microbatches: int, virtual_stages: int) -> None:
    if schedule not in SCHEDULES and not is_file_schedule(schedule):
        raise InvalidPlanError(
            f"parallel.schedule = {schedule!r} is not one of {', '.join(SCHEDULES)} or 'file:PATH'"
        )
    if pp < 1:
        raise InvalidPlanError(f"pipeline-parallel degree pp = {pp} must be >= 1")
    if not 0 <= stage < pp:
        raise InvalidPlanError(f"stage = {stage} must be in 0..{pp - 1} for pp = {pp}")
    if num_microbatches < 1:
        raise InvalidPlanError(f"num_microbatches = {num_microbatches} must be >= 1")
    if virtual_stages < 1:
        raise InvalidPlanError(f"parallel.virtual_stages = {virtual_stages} must be >= 1")
    if schedule in ("gpipe", "1f1b", "zb-h1", "zb-h2") and virtual_stages != 1:
        raise InvalidPlanError(
            f"parallel.virtual_stages = {virtual_stages} needs schedule 'interleaved', 'bfs' or 'hanayo'; "
            f"schedule {schedule!r} runs one chunk per stage (virtual_stages = 1)"
        )
    if schedule in V_SHAPES and virtual_stages != 2:
        raise InvalidPlanError(f"schedule {schedule!r} runs 2 chunks per stage (a V), not {virtual_stages}")
    if schedule == "hanayo" and virtual_stages % 2:
        raise InvalidPlanError(f"schedule 'hanayo' runs 2 chunks per wave per stage; {virtual_stages} chunks is odd")
    if schedule == "interleaved" and virtual_stages > 1 and num_microbatches % pp != 0:
        # Megatron-LM's interleaved schedule asserts the same rule (Narayanan et al. 2021, Sec. 2.2.2).
        raise InvalidPlanError(
            f"interleaved schedule needs num_microbatches ({num_microbatches}) divisible by pp ({pp})"
        )


def _bfs(pp: int, m: int, v: int) -> np.ndarray:
    """Breadth-first looping (Lamy-Poirier 2022, arXiv 2211.05953): every micro-batch runs through
    local chunk 0, then all through chunk 1, ...; the backward visits the chunks in reverse, each
    for all micro-batches. A chunk's parameters are used by all micro-batches in one stretch, which
    is what lets FSDP gather them once per pass (``sim.training.analytic``)."""
    i, c = np.tile(np.arange(m), v), np.repeat(np.arange(v), m)
    back_c = np.repeat(np.arange(v)[::-1], 2 * m)
    forward = _ops(np.full(m * v, F_CODE), i, c)
    backward = _ops(np.tile([B_CODE, W_CODE], m * v), np.tile(np.repeat(np.arange(m), 2), v), back_c)
    ops = np.concatenate([forward, backward])
    return np.broadcast_to(ops, (pp,) + ops.shape)


class GreedySpec(NamedTuple):
    """What ``_greedy`` list-schedules: ``pp`` stages, ``m`` micro-batches, the chunk placement, the
    activation limit of every stage (in chunk-activations), whether B and W run apart, and whether
    F goes before B when both are ready."""

    pp: int
    m: int
    place: tuple[int, ...]
    limits: tuple[int, ...]
    split: bool
    forward_first: bool = False


def _greedy(specs: Sequence[GreedySpec]) -> list[np.ndarray]:
    """List-schedule the ops on unit-time uniform stages (F = B = W = 1, the setting of Qi et al.'s
    analysis): whenever a stage is free it runs, of the ops whose inputs have arrived, a B first
    (oldest micro-batch, deepest chunk), else an F if its activations fit under ``limits[stage]``
    chunk-activations (keeping room for the micro-batch's later chunks on the stage, so the oldest
    micro-batch can always finish), else a pending W (the zero-bubble filler). With ``split`` False
    a B is followed by its W at once (fused backward, 2 time units). Returns each spec's
    ``Program.ops``.

    Times are integers, and an op started at time t ends after t, so what the stages free at t
    choose cannot depend on one another: the stages are stepped through time together, each step
    a few array operations over all stages (a stage's choice is the one of the event-by-event list
    scheduler with stages deciding in (time, stage) order). Several programs (of equal ``split`` and
    ``forward_first``, any chunks per stage) run side by side, their stages as lanes of one array:
    they share no op, and a lane that has nothing to choose at t chooses the same at every time
    until one of its inputs ends, so stepping it with the others changes none of its choices. A
    step costs about the same for a few lanes as for hundreds (array-call overhead), so the fewer
    steps the better: hanayo's programs of 1 to 32 waves, as long as one another, run as one."""
    split, forward_first = specs[0].split, specs[0].forward_first
    if any(s.split != split or s.forward_first != forward_first for s in specs):
        raise ValueError("_greedy schedules programs of equal split and forward_first together")
    # per lane (a stage of one program) and per chunk (a global chunk of one program): offsets into
    # the flat tables; a chunk's F end times sit at ends[base + micro-batch], its B's at ends[E + base + mb]
    pps = np.array([s.pp for s in specs], dtype=np.int64)
    ms = np.array([s.m for s in specs], dtype=np.int64)
    chunk_counts = np.array([len(s.place) for s in specs], dtype=np.int64)
    lane_per_stage = np.repeat(chunk_counts // pps, pps)  # the lane's chunks
    lane_m = np.repeat(ms, pps)
    lane_chunks = np.repeat(chunk_counts, pps)
    chunk_m = np.repeat(ms, chunk_counts)
    first_chunk = np.repeat(np.cumsum(chunk_counts) - chunk_counts, chunk_counts)
    chunk_ids = np.arange(len(chunk_m))
    g_in = chunk_ids - first_chunk  # chunk index within its program
    base = np.cumsum(chunk_m) - chunk_m
    slots = int(chunk_m.sum())
    sentinel = 2 * slots  # a region of -1 (always ready): chunk 0 waits for no forward, the last for no backward
    last_in = g_in == np.repeat(chunk_counts, chunk_counts) - 1
    f_wait = np.where(g_in > 0, base - np.roll(chunk_m, 1), sentinel)  # forward of g waits for g - 1's
    b_wait = np.where(~last_in, slots + np.roll(base, -1), sentinel)  # backward of g for g + 1's
    # every lane's global chunks (batch ids) in model order, lane after lane
    local = np.concatenate([
        (_local_chunks(s.place, s.pp) + c0).ravel() for s, c0 in zip(specs, np.cumsum(chunk_counts) - chunk_counts)
    ])
    local_start = np.cumsum(lane_per_stage) - lane_per_stage  # per lane, its first entry of ``local``
    never = np.iinfo(np.int64).max
    nowhere = sentinel + int(ms.max())  # the end of an op that never runs (a column with no op left)
    dump = nowhere + 1  # where a W's end goes (nothing waits for a W)
    ends = np.full(dump + 1, never, dtype=np.int64)
    ends[sentinel:nowhere] = -1
    limit = np.concatenate([np.asarray(s.limits, dtype=np.int64) for s in specs])
    lanes = len(limit)
    # the choices of a lane, as columns: B of each local chunk, F of each local chunk and, with
    # ``split``, its oldest pending W (one column); the lanes' columns one after another in flat
    # arrays (lanes differ in their chunks). Per column, what its next op (micro-batch nxt) waits
    # for: ends[first + nxt] and ends[second + nxt] (a B its own F and the next chunk's B; an F the
    # previous chunk's F), ends[at + nxt] where it ends, the most activations the lane may hold to
    # start it (an F) and its key (class, micro-batch, deepest chunk first: one integer; B before F
    # unless forward_first; the W column after both)
    w_columns = 1 if split else 0
    lane_columns = 2 * lane_per_stage + w_columns
    column_start = np.cumsum(lane_columns) - lane_columns  # per lane, its first column
    flat_size = int(lane_columns.sum())
    lane = np.repeat(np.arange(lanes), lane_columns)  # per column, its lane
    within = np.arange(flat_size) - column_start[lane]  # the column's index in its lane
    per_stage = lane_per_stage[lane]
    part = (within >= per_stage).astype(np.int64) + (within >= 2 * per_stage)  # 0: B, 1: F, 2: W
    column_chunk = np.where(part == 0, within, np.where(part == 1, within - per_stage, 0))  # local chunk (W: 0)
    g = local[local_start[lane] + column_chunk]  # the column's global chunk (the W column: the lane's first)
    own_f = base[g]
    is_b, is_f, is_w = part == 0, part == 1, part == 2
    first = np.where(is_b, own_f, np.where(is_f, f_wait[g], sentinel))
    second = np.where(is_b, b_wait[g], sentinel)
    at = np.where(is_b, slots + own_f, np.where(is_f, own_f, dump))
    # the lane's count that must be at most ``room`` to start the column's op: held activations
    # for B and F (B: always), minus the pending W for the W column (at least one pending)
    later = lane_per_stage[lane] - 1 - column_chunk  # the stage's chunks after the column's (room kept for them)
    room = np.where(is_b, never, np.where(is_f, limit[lane] - 1 - later, -1))
    depth = lane_chunks[lane] - 1 - (g - first_chunk[g])  # smaller key for the deeper chunk
    span = lane_m * lane_chunks
    b_class, f_class = (span, np.zeros_like(span)) if forward_first else (np.zeros_like(span), span)
    key = np.where(is_b, b_class[lane] + depth, np.where(is_f, f_class[lane] + depth, 2 * span[lane]))
    # keys carry their column's index in the lane in their low bits: a lane's smallest key names its
    # column (a lane's ready columns never tie: keys differ in micro-batch or depth)
    index_bits = int(lane_columns.max()).bit_length()
    no_choice = 3 * int(span.max()) << index_bits
    lane_column_m = np.where(is_w, 0, lane_m[lane])  # (the W column: never gone)
    # per column, in the rows of ``state``: the next op's micro-batch, where it ends (at +
    # micro-batch), the two ends it waits for (first + ..., second + ...), its key and the ops the
    # column has left, moved on by ``step`` as the column's ops are placed (the W column stays as
    # it is: which W it runs is known once all are placed, below)
    state = np.stack([np.zeros(flat_size, dtype=np.int64), at, first, second, key << index_bits | within, lane_column_m])
    step = np.ones_like(state)
    step[4] = lane_chunks[lane] << index_bits
    step[5] = -1
    step[:, is_w] = 0
    waits, keys = state[2:4], state[4]
    state_flat, step_flat = state.ravel(), step.ravel()  # (one fancy index into all rows: rows offset by flat_size)
    row_offsets = (np.arange(len(state)) * flat_size)[:, None]
    # per lane (held activations, minus the pending W) and what each column's op adds to them
    counted = np.zeros((lanes, 2), dtype=np.int64)
    column_counts = np.zeros((flat_size, 2), dtype=np.int64)
    column_counts[is_b, 0], column_counts[is_f, 0] = -1, 1
    if split:
        column_counts[is_b, 1], column_counts[is_w, 1] = -1, 1
    counted_index = 2 * lane + is_w  # the count (in ``counted``, flat) each column's room bounds
    column_duration = np.where(is_b & (not split), 2, 1)
    free = np.zeros(lanes, dtype=np.int64)
    total = 3 * lane_m * lane_per_stage
    out_base = np.cumsum(total) - total
    # an op placed is recorded as its micro-batch and its column; the W right after a fused B as
    # the B's column + flat_size (pass and chunk by column)
    out_mb, out_column = np.zeros((2, int(total.sum())), dtype=np.int64)
    cursor = out_base.copy()  # per lane, where its next op goes in ``out_mb`` / ``out_column``
    index_mask = (1 << index_bits) - 1
    left = int(total.sum())  # ops not yet placed
    t = 0
    while True:
        # every lane's choices: its best ready B or F, else (with ``split``) a pending W
        ready = ends.take(waits).max(axis=0) <= t
        score = np.where(ready & (counted.ravel().take(counted_index) <= room), keys, no_choice)
        best_key = np.minimum.reduceat(score, column_start)
        has_op = best_key < no_choice  # the best is a ready op
        rows = (has_op if split else has_op & (free <= t)).nonzero()[0]
        if not len(rows):
            later_free = free[free > t]  # ops still running (on any stage) make inputs arrive then
            if not len(later_free):
                stuck = specs[int(np.searchsorted(np.cumsum(pps), np.flatnonzero(cursor < out_base + total)[0], side="right"))]
                raise InvalidPlanError(
                    f"schedule cannot proceed under its activation limits {list(stuck.limits)} (pp = {stuck.pp}, m = {stuck.m})"
                )
            t = int(later_free.min())
            continue
        row = cursor[rows]
        cursor[rows] = row + 1
        flat = column_start[rows] + (best_key[rows] & index_mask)
        entries = flat + row_offsets
        values = state_flat[entries]
        state_flat[entries] = values + step_flat[entries]
        mb = values[0]
        out_mb[row], out_column[row] = mb, flat
        ends[values[1]] = t + column_duration[flat] if not split else t + 1
        gone = flat[values[5] == 1]  # the column's last op: it never has another
        if len(gone):
            waits[:, gone] = nowhere
        counted[rows] += column_counts[flat]
        if not split:
            free[rows] = t + 1
            b_placed = is_b[flat]
            b_stages = rows[b_placed]
            if len(b_stages):  # its W at once (fused backward: the stage is busy 2 time units)
                w_row = cursor[b_stages]
                out_mb[w_row], out_column[w_row] = mb[b_placed], flat[b_placed] + flat_size
                cursor[b_stages] = w_row + 1
                free[b_stages] = t + 2
            left -= len(b_stages)
        left -= len(rows)
        if not left:
            break
        t += 1
    if split:  # each lane's W run in the order of its B (its oldest pending W each time)
        w_rows, b_rows = np.flatnonzero(is_w[out_column]), np.flatnonzero(is_b[out_column])
        out_mb[w_rows], out_column[w_rows] = out_mb[b_rows], out_column[b_rows] + flat_size
    w_op = out_column >= flat_size
    placed = out_column - w_op * flat_size
    kind = np.where(w_op, W_CODE, np.where(is_b[placed], B_CODE, F_CODE))
    out = np.stack([kind, out_mb, column_chunk[placed]], axis=1)  # rows (pass code, micro-batch, local chunk)
    cuts = np.cumsum(3 * ms * chunk_counts)[:-1]
    return [ops.reshape(s.pp, -1, 3) for s, ops in zip(specs, np.split(out, cuts))]


def _greedy_spec(schedule: str, pp: int, m: int, v: int) -> GreedySpec | None:
    """What ``_greedy`` list-schedules for a list-scheduled named schedule (zb-h2, the V shapes,
    hanayo); None for the others (generated in closed form)."""
    if schedule == "zb-h2":
        # ZB-H2 (Qi et al. 2024, Fig. 4): more warm-up forwards, up to 2 (pp - stage) - 1 in flight
        # (peak (2p - 1) M_B on stage 0), W filling every remaining gap
        return GreedySpec(pp=pp, m=m, place=placement("looping", pp, 1),
                          limits=tuple(min(2 * (pp - s) - 1, m) for s in range(pp)), split=True)
    if schedule == "hanayo":
        # Hanayo (Liu et al. SC'23): W waves (2W chunks per stage, zigzag), fused backward, at most
        # 1F1B's peak activation memory (p stages' worth = p v chunk activations); forwards first
        # while memory allows (the wave fills the pipeline as far as it can before the backward)
        return GreedySpec(pp=pp, m=m, place=placement("zigzag", pp, v), limits=(pp * v,) * pp, split=False,
                          forward_first=True)
    if schedule == "zb-v":
        # ZB-V (Qi et al. 2024, Sec. 6): V placement, 1F1B's peak (2p chunk activations = p stages'
        # worth), zero bubble when F = B = W
        limit = 2 * pp
    elif schedule == "v-half":
        # V-Half (Qi et al. 2024, arXiv 2405.15362): half of 1F1B's activation memory: p chunks = p/2 stages
        limit = max(2, pp)
    elif schedule == "v-min":
        # V-Min (same paper): a third: ceil(2p/3) chunks = p/3 stages' worth
        limit = max(2, math.ceil(2 * pp / 3))
    else:
        return None
    return GreedySpec(pp=pp, m=m, place=placement("zigzag", pp, v), limits=(min(limit, 2 * m),) * pp, split=True)


def _generate(schedule: str, pp: int, m: int, v: int) -> tuple[tuple[int, ...], np.ndarray]:
    """(placement, per-stage ops: ``Program.ops``) of a named schedule."""
    spec = _greedy_spec(schedule, pp, m, v)
    if spec is not None:
        return spec.place, _greedy([spec])[0]
    if schedule == "gpipe":
        ops = _gpipe(m)
        return placement("looping", pp, 1), np.broadcast_to(ops, (pp,) + ops.shape)
    if schedule == "1f1b" or (schedule == "interleaved" and v == 1):
        # interleaving with one chunk per stage is plain 1F1B (Megatron-LM picks the same schedule)
        return placement("looping", pp, 1), _one_f_one_b(pp, m, np.zeros(pp, dtype=np.int64))
    if schedule == "interleaved":
        return placement("looping", pp, v), _interleaved(pp, m, v)
    if schedule == "zb-h1":
        # ZB-H1 (Qi et al. ICLR'24, arXiv 2401.10241, Fig. 3): the F/B order and peak of 1F1B, with
        # the W of the first ``stage`` micro-batches deferred to the end (PaddlePaddle's ZBH1 job list)
        return placement("looping", pp, 1), _one_f_one_b(pp, m, np.minimum(np.arange(pp), m))
    if schedule == "bfs":
        return placement("looping", pp, v), _bfs(pp, m, v)
    raise InvalidPlanError(f"unknown schedule {schedule!r}")  # pragma: no cover - _check rejects unknown names


# ---- schedule files ------------------------------------------------------------------------------
def _parse_op(text: Any, where: str) -> Step:
    if isinstance(text, list) and len(text) in (2, 3):
        kind, mb, chunk = (text + [0])[:3] if len(text) == 2 else text
    elif isinstance(text, str) and text[:1] in ("F", "B", "W"):
        kind, _, rest = text[0], None, text[1:]
        mb_text, _, chunk_text = rest.partition(".")
        if not mb_text.isdigit() or (chunk_text and not chunk_text.isdigit()):
            raise InvalidPlanError(f"{where}: op {text!r} must look like 'F3' or 'B3.1' (pass, micro-batch, .chunk)")
        mb, chunk = int(mb_text), int(chunk_text or 0)
    else:
        raise InvalidPlanError(f"{where}: op {text!r} must be a string like 'F3.1' or a list [pass, micro-batch, chunk]")
    if kind not in ("F", "B", "W") or not isinstance(mb, int) or not isinstance(chunk, int) or mb < 0 or chunk < 0:
        raise InvalidPlanError(f"{where}: op {text!r} needs pass F, B or W and non-negative micro-batch and chunk")
    return (kind, mb, chunk)


def program_from_json(data: Any, where: str) -> dict[str, Any]:
    """A schedule file's content checked for shape: ``{"stages": [[op, ...], ...], "placement":
    [stage of each global chunk] (optional, default looping), "split_backward": bool (optional,
    default false)}``; an op is "F3", "B3.1" (pass, micro-batch, .local chunk) or ["W", 3, 1]."""
    if not isinstance(data, dict) or not isinstance(data.get("stages"), list) or not data["stages"]:
        raise InvalidPlanError(f"{where}: needs a JSON object with 'stages': a list of per-stage op lists")
    unknown = sorted(set(data) - {"stages", "placement", "split_backward", "name", "comment"})
    if unknown:
        raise InvalidPlanError(f"{where}: unknown keys {unknown}; allowed: stages, placement, split_backward, name, comment")
    stages = []
    for s, ops in enumerate(data["stages"]):
        if not isinstance(ops, list):
            raise InvalidPlanError(f"{where}: stages[{s}] must be a list of ops")
        stages.append(tuple(_parse_op(op, f"{where}: stages[{s}]") for op in ops))
    pp = len(stages)
    chunks = 1 + max((c for ops in stages for _, _, c in ops), default=0)
    place = data.get("placement")
    if place is None:
        place = list(placement("looping", pp, chunks))
    if not isinstance(place, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in place):
        raise InvalidPlanError(f"{where}: placement must be a list of stage indices, one per global chunk")
    if len(place) != pp * chunks or any(place.count(s) != chunks for s in range(pp)):
        raise InvalidPlanError(
            f"{where}: placement {place} must hold each of the {pp} stages exactly {chunks} times "
            f"(one entry per global chunk)"
        )
    split = data.get("split_backward", False)
    if not isinstance(split, bool):
        raise InvalidPlanError(f"{where}: split_backward = {split!r} must be true or false")
    m = 1 + max((mb for ops in stages for _, mb, _ in ops), default=0)
    return {"stages": tuple(stages), "placement": tuple(place), "split_backward": split, "chunks": chunks, "m": m}


@lru_cache(maxsize=64)
def _load_file(path: str) -> dict[str, Any]:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise InvalidPlanError(f"parallel.schedule = 'file:{path}': cannot read the file ({exc.strerror})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidPlanError(f"parallel.schedule = 'file:{path}': not JSON ({exc.msg} at line {exc.lineno})") from None
    return program_from_json(data, f"schedule file {path}")


def _file_placement(schedule: str, pp: int) -> tuple[int, ...]:
    content = _load_file(schedule[len(FILE_PREFIX):])
    if len(content["stages"]) != pp:
        raise InvalidPlanError(f"{schedule}: the program has {len(content['stages'])} stages; parallel.pp = {pp}")
    return content["placement"]


# ---- validation and execution on unit stages ---------------------------------------------------------
def _adjacent(a: int, b: int, pp: int) -> bool:
    return a == b or (a - b) % pp in (1, pp - 1)


def _check_ops(program: Program) -> None:
    """Every (pass, micro-batch, chunk) exactly once per stage, F before B before W (W right after B
    without ``split_backward``), chunk neighbours on the same or adjacent stages (the deadlock check
    is the execution's). Raises ``InvalidPlanError`` naming the first violation."""
    pp, m, v = program.pp, program.num_microbatches, program.chunks_per_stage
    name = program.schedule
    for g in range(len(program.placement) - 1):
        a, b = program.placement[g], program.placement[g + 1]
        if not _adjacent(a, b, pp):
            raise InvalidPlanError(f"schedule {name!r}: chunks {g} and {g + 1} sit on stages {a} and {b}, which are not adjacent")
    if not _ops_in_order(program.ops, m, v, program.split_backward):
        _name_the_violation(name, program.steps, m, v, program.split_backward)


def _ops_in_order(ops: np.ndarray, m: int, v: int, split_backward: bool) -> bool:
    """Whether every stage's rows hold each (pass, micro-batch, chunk) once, F before B before W
    and, without ``split_backward``, each W right after its B (whole-array checks)."""
    pp, n, _ = ops.shape
    if n != 3 * m * v:
        return False
    kind, mb, chunk = ops[:, :, 0], ops[:, :, 1], ops[:, :, 2]
    if not ((kind >= 0) & (kind <= W_CODE) & (mb >= 0) & (mb < m) & (chunk >= 0) & (chunk < v)).all():
        return False
    ids = (kind * m + mb) * v + chunk  # F ids, then B ids, then W ids: each in 0..n-1
    position = np.full((pp, n), -1, dtype=np.int64)
    position[np.arange(pp)[:, None], ids] = np.arange(n)
    if (position < 0).any():  # n ids of a stage in n places: one is missing iff one repeats
        return False
    f, b, w = position[:, : m * v], position[:, m * v : 2 * m * v], position[:, 2 * m * v :]
    return bool((f < b).all() and (b < w).all() and (split_backward or (w == b + 1).all()))


def _name_the_violation(name: str, steps: Any, m: int, v: int, split_backward: bool) -> None:
    """Raise ``InvalidPlanError`` naming the first op that breaks ``_ops_in_order``'s rules."""
    for s, ops in enumerate(steps):
        position: dict[Step, int] = {}
        for k, op in enumerate(ops):
            kind, mb, c = op
            if not (0 <= mb < m and 0 <= c < v):
                raise InvalidPlanError(f"schedule {name!r}: stage {s} op {kind}{mb}.{c} is outside {m} micro-batches x {v} chunks")
            if op in position:
                raise InvalidPlanError(f"schedule {name!r}: stage {s} runs {kind}{mb}.{c} twice")
            position[op] = k
        if len(position) != 3 * m * v:
            missing = next(
                f"{kind}{mb}.{c}" for kind in "FBW" for mb in range(m) for c in range(v) if (kind, mb, c) not in position
            )
            raise InvalidPlanError(f"schedule {name!r}: stage {s} never runs {missing} (needs F, B and W of {m} micro-batches x {v} chunks)")
        for mb in range(m):
            for c in range(v):
                f, b, w = position[("F", mb, c)], position[("B", mb, c)], position[("W", mb, c)]
                if not f < b < w:
                    raise InvalidPlanError(f"schedule {name!r}: stage {s} must run F{mb}.{c} before B{mb}.{c} before W{mb}.{c}")
                if not split_backward and w != b + 1:
                    raise InvalidPlanError(
                        f"schedule {name!r}: W{mb}.{c} must follow B{mb}.{c} at once on stage {s} unless split_backward = true"
                    )
    raise InvalidPlanError(f"schedule {name!r}: the program breaks the op rules")  # pragma: no cover - the checks agree


Vector = tuple[int, int, int]  # ops on a path: (F, B, W) counts in chunk ops

# Relative (F, B, W) op times at which the critical path is tracked: B / F and W / F over the range
# of transformer chunks (B ~ W ~ F for GEMM-bound layers; B up to 2-3 F with recompute or attention
# backward; W -> 0 for communication-bound chunks). The max over these paths' linear forms is exact
# at every tracked ratio and a lower bound between them.
_WEIGHTS: tuple[Vector, ...] = tuple(
    (2, b, w) for b in (1, 2, 3, 4, 6) for w in (0, 1, 2, 3, 4)
)


def _pareto(vectors: tuple[Vector, ...]) -> tuple[Vector, ...]:
    """The vectors not dominated component-wise by another (duplicates removed), largest sum first."""
    kept: list[Vector] = []
    for vec in sorted(set(vectors), key=lambda x: (-(x[0] + x[1] + x[2]), x)):
        if not any(k[0] >= vec[0] and k[1] >= vec[1] and k[2] >= vec[2] for k in kept):
            kept.append(vec)
    return tuple(kept)


def _pareto_lanes(counts: np.ndarray) -> list[tuple[Vector, ...]]:
    """``_pareto`` of every lane's (F, B, W) rows of ``counts`` (lanes, rows, 3) in whole-array
    operations: each lane's distinct rows (rows packed into one integer, 21 bits per count, and
    sorted), those that no other distinct row of the lane dominates, largest sum first (then in
    (F, B, W) order, the packed order), made tuples once."""
    if not len(counts):
        return []
    if int(counts.max()) >= 1 << 21:  # counts too large to pack
        return [_pareto(tuple(map(tuple, lane))) for lane in counts.tolist()]
    code = (counts[:, :, 0].astype(np.int64) << 42) | (counts[:, :, 1].astype(np.int64) << 21) | counts[:, :, 2]
    code.sort(axis=1)
    distinct = np.ones(code.shape, dtype=bool)
    distinct[:, 1:] = code[:, 1:] != code[:, :-1]
    # a row is dominated when another distinct row is >= in every count (the row itself is one such)
    f, b, w = code >> 42, (code >> 21) & (1 << 21) - 1, code & (1 << 21) - 1
    covering = ((f[:, None, :] >= f[:, :, None]) & (b[:, None, :] >= b[:, :, None]) & (w[:, None, :] >= w[:, :, None])
                & distinct[:, None, :]).sum(axis=2)
    lanes, columns = np.nonzero(distinct & (covering == 1))
    kept = np.stack([f[lanes, columns], b[lanes, columns], w[lanes, columns]], axis=1)
    order = np.argsort((lanes << 24) | ((1 << 23) - kept.sum(axis=1)), kind="stable")
    lanes = lanes[order]
    vectors = list(map(tuple, kept[order].tolist()))
    bounds = np.searchsorted(lanes, np.arange(len(counts) + 1)).tolist()
    return [tuple(vectors[i:j]) for i, j in zip(bounds[:-1], bounds[1:])]


# What one op adds to a path at every tracked weighting: rows (weighted time, F, B, W counts), as
# one int64 array so that the executor updates all weightings of many ops in one operation.
_WEIGHT_MATRIX = np.array(_WEIGHTS, dtype=np.int64)


def _step(df: int, db: int, dw: int) -> np.ndarray:
    """What one op adds to every tracked path: its weighted time and its (F, B, W) counts."""
    delta = np.empty((len(_WEIGHTS), 4), dtype=np.int64)
    delta[:, 0] = _WEIGHT_MATRIX @ np.array((df, db, dw), dtype=np.int64)
    delta[:, 1:] = (df, db, dw)
    return delta


_F_STEP, _W_STEP = _step(1, 0, 0), _step(0, 0, 1)
_B_STEP = {True: _step(0, 1, 1), False: _step(0, 1, 0)}  # fused B+W, or B alone


def _occupancy(ops: np.ndarray, local_to_global: np.ndarray, chunks: int) -> tuple[tuple[int, ...], int]:
    """(Peak held chunk-activations per stage, peak micro-batches held by the last chunk): +1 at the
    end of F, -1 at the end of B, counted in each stage's run order."""
    kind = ops[:, :, 0]
    delta = (kind == F_CODE).astype(np.int64) - (kind == B_CODE)
    held = np.cumsum(delta, axis=1)
    peak = np.maximum(held.max(axis=1, initial=0), 0)
    is_last = local_to_global[np.arange(len(ops))[:, None], ops[:, :, 2]] == chunks - 1
    last_held = np.cumsum(delta * is_last, axis=1)
    return tuple(int(x) for x in peak), max(0, int(last_held.max(initial=0)))


# (per stage the Pareto-maximal op counts of the paths to its last op's end, peak held
# chunk-activations per stage, peak micro-batches held by the last chunk, per stage the same counts
# of the paths to the start of its first op)
Execution = tuple[tuple[tuple[Vector, ...], ...], tuple[int, ...], int, tuple[tuple[Vector, ...], ...]]


def _execute(program: Program) -> Execution:
    """Run the program with its dependencies (F after the previous chunk's F, B after the next
    chunk's B, or its fused B+W) on uniform stages, tracking for every op the longest path ending at
    it at each of the ``_WEIGHTS`` op-time ratios. Returns (per stage, the Pareto-maximal (F, B, W) op
    counts of those paths to the stage's last op, peak held chunk-activations per stage, peak
    micro-batches held by the last chunk, per stage the same counts of the paths to the start of its
    first op). Raises ``InvalidPlanError`` on a deadlock."""
    return _execute_all([program])[0]


# A path's weighted time grows by at most this per op (a fused B + W at the largest B and W
# weights), and its op counts by at most 1: int16 paths are exact while steps x this < 2**15.
_MAX_OP_WEIGHT = int(_WEIGHT_MATRIX[:, 1:].max(axis=0).sum())


class _Lanes(NamedTuple):
    """Several programs' ops as one flat table, the stages of all programs as lanes (``_lanes``):
    per op (lane by lane, each in run order) its pass (F_CODE, B_CODE, W_CODE or 3: a fused B + W),
    its lane, its local chunk, the path slot it fills (F or B of (chunk, micro-batch) of its program; W: the sink), the slot it waits for (the
    zero slot: nothing), the op that fills that slot and its lane predecessor (n = the op count:
    none); per lane its op count and first op; per program its occupancy (``_occupancy``)."""

    kind: np.ndarray
    lane: np.ndarray
    chunk: np.ndarray
    out_slot: np.ndarray
    wait_slot: np.ndarray
    dep: np.ndarray
    prev: np.ndarray
    counts: np.ndarray
    first: np.ndarray
    zero_slot: int
    sink: int
    occupancy: list[tuple[tuple[int, ...], int]]


def _lanes(programs: list[Program]) -> _Lanes:
    kinds, mbs, globals_, stages, locals_ = [], [], [], [], []
    occupancy, sizes = [], []
    for program in programs:
        pp, v = program.pp, program.chunks_per_stage
        ops = program.ops
        local_to_global = _local_chunks(program.placement, pp)
        held = program.occupancy
        occupancy.append((held.peak_held_chunks, held.last_chunk_inflight))
        stage_of = np.repeat(np.arange(pp), ops.shape[1])
        kind, mb, chunk = ops.reshape(-1, 3).T
        if not program.split_backward:  # the W right after a fused B is part of it
            keep = kind != W_CODE
            kind, mb, chunk, stage_of = kind[keep], mb[keep], chunk[keep], stage_of[keep]
            kind = kind | (kind == B_CODE) << 1  # B_CODE -> 3: fused B + W
        kinds.append(kind)
        locals_.append(chunk)
        mbs.append(mb)
        globals_.append(local_to_global.ravel()[stage_of * v + chunk])
        stages.append(stage_of)
        sizes.append(len(kind))
    pps = np.array([p.pp for p in programs], dtype=np.int64)
    ms = np.array([p.num_microbatches for p in programs], dtype=np.int64)
    cs = np.array([len(p.placement) for p in programs], dtype=np.int64)
    slot_bases = np.cumsum(2 * cs * ms) - 2 * cs * ms
    lane_count, slot_count = int(pps.sum()), int((2 * cs * ms).sum())
    kind, mb, g, stage = (np.concatenate(x) for x in (kinds, mbs, globals_, stages))
    lane = stage + np.repeat(np.cumsum(pps) - pps, sizes)
    # path slots: F of (g, mb) and B of (g, mb) of each program, a zero path (nothing to wait for), a sink for W
    zero_slot, sink = slot_count, slot_count + 1
    base, m_of, c_of = (np.repeat(x, sizes) for x in (slot_bases, ms, cs))
    is_f, is_b = kind == F_CODE, kind & 1 == 1  # B_CODE or 3
    f_slot = base + g * m_of + mb
    out_slot = np.where(is_f, f_slot, np.where(is_b, f_slot + c_of * m_of, sink))
    wait_slot = np.where(is_f & (g > 0), f_slot - m_of, np.where(is_b & (g < c_of - 1), f_slot + (c_of + 1) * m_of, zero_slot))
    counts = np.bincount(lane, minlength=lane_count)
    first = np.concatenate(([0], np.cumsum(counts)[:-1]))
    n = len(kind)
    producer = np.full(sink + 1, n, dtype=np.int64)
    fills = kind != W_CODE
    producer[out_slot[fills]] = np.flatnonzero(fills)
    prev = np.arange(-1, n - 1, dtype=np.int64)
    prev[first[counts > 0]] = n
    return _Lanes(kind=kind, lane=lane, chunk=np.concatenate(locals_), out_slot=out_slot, wait_slot=wait_slot,
                  dep=producer[wait_slot], prev=prev, counts=counts, first=first, zero_slot=zero_slot, sink=sink,
                  occupancy=occupancy)


class _Deadlock(Exception):
    """No lane of an execution can go on: the lanes and the ops they wait at."""

    def __init__(self, active: np.ndarray, op: np.ndarray) -> None:
        super().__init__()
        self.active, self.op = active, op


def _started(current: np.ndarray, stop: np.ndarray, dep: np.ndarray, ends: np.ndarray, t: int) -> tuple[np.ndarray, ...] | None:
    """(lanes, ops, the ops they wait for) of the ops that start at step ``t``: every unfinished
    lane's next op (``current``, lanes end at ``stop``) whose input (``dep``) has ended (``ends``);
    None when every lane is done. Raises ``_Deadlock`` when no lane can go on."""
    active = (current < stop).nonzero()[0]
    if not len(active):
        return None
    op = current[active]
    waits = dep[op]
    ready = ends[waits] <= t
    if not _all(ready):
        if not _any(ready):
            raise _Deadlock(active, op)
        active, op, waits = active[ready], op[ready], waits[ready]
    return active, op, waits


_all, _any = np.logical_and.reduce, np.logical_or.reduce  # (the ufuncs, without ndarray.all's wrapper)


def _deadlock(programs: list[Program], table: _Lanes, stuck: _Deadlock) -> list[Execution]:
    """What an execution that no lane can go on does: with several programs, each run alone (to find
    the one that deadlocks); a single program raises ``InvalidPlanError`` naming what each stage waits at."""
    if len(programs) > 1:
        return [_execute_all([program])[0] for program in programs]
    program = programs[0]
    waiting = []
    for s, position in zip(stuck.active.tolist(), (stuck.op - table.first[stuck.active]).tolist()):
        kept = np.flatnonzero(program.split_backward | (program.ops[s, :, 0] != W_CODE))  # the ops run (fused: no W)
        k, mb, c = program.ops[s, kept[position]].tolist()
        waiting.append(f"stage {s} at {PASS_NAMES[k]}{mb}.{c}")
    raise InvalidPlanError(f"schedule {program.schedule!r} deadlocks: {'; '.join(waiting)} wait for inputs that never come")


def _executions(programs: list[Program], table: _Lanes, last: np.ndarray, starts: np.ndarray) -> list[Execution]:
    """The ``Execution`` of every program from the (F, B, W) counts (lanes, weightings, 3) of the
    paths to each lane's last op's end (``last``) and to its first op's start (``starts``)."""
    out: list[Execution] = []
    start = 0
    last_paths, start_paths = _pareto_lanes(last), _pareto_lanes(starts)
    for program, (peak, last_peak) in zip(programs, table.occupancy):
        stage_ends = tuple(last_paths[start : start + program.pp])
        stage_starts = tuple(start_paths[start : start + program.pp])
        out.append((stage_ends, peak, last_peak, stage_starts))
        start += program.pp
    return out


def _execute_all(
    programs: list[Program], record: list[np.ndarray] | None = None, dtype: type[np.signedinteger] | None = None,
) -> list[Execution]:
    """``_execute`` of several programs in one run: their stages side by side as lanes of one array.

    The ops run as soon as possible one time unit each, every lane stepped together: the ops
    started in one step depend on none of each other, so each step updates the paths of all of
    them with a few array operations. A path's value at an op is the longer of the lane's previous
    op's path and the path of the op it waits for (the lane's own on ties), plus the op. A deadlock
    (no lane can go on) is raised for a single program; with several each is run alone to find it.
    ``record``: receives the step at which every op starts, in the ops of all programs in order
    (``_lanes``): the programs' dependency graphs in levels (``_graphs``). The paths run packed (``_execute_packed``)
    while their counts fit its fields, else as (time, F, B, W) rows of ``dtype`` (``_execute_rows``)."""
    return _execute_table(programs, _lanes(programs), record, dtype)


def _execute_table(
    programs: list[Program], table: _Lanes, record: list[np.ndarray] | None = None,
    dtype: type[np.signedinteger] | None = None,
) -> list[Execution]:
    """``_execute_all`` of the programs laid out in ``table``."""
    try:
        if dtype is None and int(table.counts.max(initial=0)) < _PACKED_STEPS:
            executions = _execute_packed(programs, table, record)
            if executions is not None:
                return executions
        return _execute_rows(programs, table, record, dtype)
    except _Deadlock as stuck:
        return _deadlock(programs, table, stuck)


def _execute_rows(
    programs: list[Program], table: _Lanes, record: list[np.ndarray] | None, dtype: type[np.signedinteger] | None,
) -> list[Execution]:
    """``_execute_all`` with every path a (weighted time, F, B, W) row per weighting, per path slot
    and per lane. ``dtype`` of the rows: by default int16 when the run can fit (every lane's ops x
    ``_MAX_OP_WEIGHT`` < 2**15; run again in int32 if its steps turn out too many), else int32."""
    kind, out_slot, wait_slot, dep = table.kind, table.out_slot, table.wait_slot, table.dep
    counts, first, sink = table.counts, table.first, table.sink
    lane_count = len(counts)
    # int32: a path's weighted time is at most 10 x its ops (< 2**31 for any program validation admits)
    if dtype is None:
        dtype = np.int16 if int(counts.max()) * _MAX_OP_WEIGHT < 1 << 15 else np.int32
    paths = np.zeros((sink + 1, len(_WEIGHTS), 4), dtype=dtype)
    n = len(kind)
    ends = np.full(n + 1, np.iinfo(np.int64).max, dtype=np.int64)  # per op (n: none, at -1)
    ends[n] = -1
    steps = np.stack([_F_STEP, _B_STEP[False], _W_STEP, _B_STEP[True]]).astype(dtype)
    last = np.zeros((lane_count, len(_WEIGHTS), 4), dtype=dtype)
    starts = np.zeros((lane_count, len(_WEIGHTS), 4), dtype=dtype)  # the path to each lane's first op's start
    current, stop = first.copy(), first + counts  # per lane, its next op and its end
    level = np.zeros(n, dtype=np.int64)  # the step at which each op starts
    t = 0
    while (started := _started(current, stop, dep, ends, t)) is not None:
        active, op, _ = started
        own, other = last[active], paths[wait_slot[op]]
        level[op] = t
        beginning = current[active] == first[active]
        if beginning.any():
            starts[active[beginning]] = other[beginning]
        longer = np.where((own[:, :, 0] >= other[:, :, 0])[:, :, None], own, other) + steps[kind[op]]
        last[active] = longer
        paths[out_slot[op]] = longer
        ends[op] = t + 1
        current[active] += 1
        t += 1
        if dtype is np.int16 and t * _MAX_OP_WEIGHT >= 1 << 15:  # paths could outgrow int16
            return _execute_rows(programs, table, record, np.int32)
    if record is not None:
        record.append(level)
    return _executions(programs, table, last[:, :, 1:], starts[:, :, 1:])


# ``_execute_packed``: a path at one weighting as one int64, its weighted time in the high bits
# (from bit 43) and its F, B and W counts in 14 bits each below bit 42, so that extending a path by
# an op is one addition and taking the longer of two paths one ``np.maximum``: bit 42 (``_TIE``),
# clear in every stored path, is set in the lane's own path before the comparison, so that on equal
# times it wins whatever the counts (and is cleared after). Exact while counts stay below 2**14 (a
# path's ops are at most the steps run, checked) and times below 2**20 (10 per op: implied).
_COUNT_BITS = 14
_PACKED_STEPS = 1 << _COUNT_BITS
_TIE = 1 << 3 * _COUNT_BITS
_TIME_SHIFT = 3 * _COUNT_BITS + 1
# non-split programs run F and fused B + W only: their paths have as many B as W ops, so weighting
# (2, b, w) gives every path the time of (2, b + w) on one fused pass: one weighting per distinct b + w
_FUSED_WEIGHTS = tuple(sorted({b + w for _, b, w in _WEIGHTS}))
_FUSED_INDEX = np.array([_FUSED_WEIGHTS.index(b + w) for _, b, w in _WEIGHTS], dtype=np.int64)


def _packed_steps(split: bool) -> np.ndarray:
    """Per op kind (F_CODE, B_CODE, W_CODE, 3: fused B + W) what it adds to a packed path at every
    weighting (``_WEIGHTS``, or ``_FUSED_WEIGHTS`` for programs without ``split_backward``)."""
    counts = np.array([(1, 0, 0), (0, 1, 0), (0, 0, 1), (0, 1, 1)], dtype=np.int64)
    packed = (counts[:, 0] << 2 * _COUNT_BITS) | (counts[:, 1] << _COUNT_BITS) | counts[:, 2]
    if split:
        times = counts @ _WEIGHT_MATRIX.T  # (kinds, weightings)
    else:
        fused = np.array([(2, c) for c in _FUSED_WEIGHTS], dtype=np.int64)
        times = np.stack([counts[:, 0], counts[:, 1]], axis=1) @ fused.T  # F and fused B + W only
    return (times << _TIME_SHIFT) | packed[:, None]


def _execute_packed(
    programs: list[Program], table: _Lanes, record: list[np.ndarray] | None,
) -> list[Execution] | None:
    """``_execute_rows`` with every path packed into one int64 per weighting and kept per op (an op
    reads its lane predecessor's and its input's paths and writes its own): the same maxima, ties
    and sums. Programs without ``split_backward`` alone run at one weighting per distinct b + w
    (``_FUSED_WEIGHTS``). None when a path could outgrow the count fields (run ``_execute_rows``)."""
    kind, dep, prev, counts, first = table.kind, table.dep, table.prev, table.counts, table.first
    n = len(kind)
    split = any(p.split_backward for p in programs)
    steps = _packed_steps(split)
    paths = _scratch((n + 1) * steps.shape[1]).reshape(n + 1, steps.shape[1])  # (an op's row is written before it is read)
    paths[n] = 0  # the path of no op
    ends = np.full(n + 1, np.iinfo(np.int64).max, dtype=np.int64)
    ends[n] = -1
    current = first.copy()  # per lane, its next op
    stop = first + counts
    tie, untie = np.int64(_TIE), ~np.int64(_TIE)
    t = 0
    while (started := _started(current, stop, dep, ends, t)) is not None:
        active, op, waits = started
        longer = paths.take(prev[op], axis=0)  # the lane's own path
        longer |= tie  # wins ties
        np.maximum(longer, paths.take(waits, axis=0), out=longer)
        longer += steps.take(kind[op], axis=0)
        longer &= untie
        paths[op] = longer
        ends[op] = t + 1
        current[active] += 1
        t += 1
        if t >= _PACKED_STEPS:  # a path's counts could outgrow their fields
            return None
    if record is not None:
        record.append(ends[:n] - 1)
    lanes_with_ops = counts > 0
    last_op = np.where(lanes_with_ops, first + counts - 1, n)
    start_op = np.where(lanes_with_ops, dep[np.minimum(first, n - 1)], n)
    columns = slice(None) if split else _FUSED_INDEX
    return _executions(programs, table, _unpacked(paths[last_op][:, columns]), _unpacked(paths[start_op][:, columns]))


def _execute_levels(table: _Lanes) -> np.ndarray:
    """The step at which every op of ``table`` starts in the unit-time run of ``_execute_all`` (what
    its ``record`` receives), the run alone, no path tracked. Raises ``_Deadlock`` when no lane can go on."""
    dep, counts, first = table.dep, table.counts, table.first
    n = len(table.kind)
    ends = np.full(n + 1, np.iinfo(np.int64).max, dtype=np.int64)
    ends[n] = -1
    current, stop = first.copy(), first + counts
    t = 0
    while (started := _started(current, stop, dep, ends, t)) is not None:
        active, op, _ = started
        ends[op] = t + 1
        current[active] += 1
        t += 1
    return ends[:n] - 1


_SCRATCH: list[np.ndarray] = [np.empty(0, dtype=np.int64)]


def _scratch(size: int) -> np.ndarray:
    """``size`` int64 of one buffer kept by this process for ``_execute_packed``'s paths (up to
    ~160 MB for the longest programs a search runs): allocated once at the largest size asked, so
    that a run does not fault in fresh pages for every table (arrays of 32 MiB and more are mapped
    afresh by every allocation); its values are whatever the last run left."""
    if _SCRATCH[0].size < size:
        _SCRATCH[0] = np.empty(0, dtype=np.int64)  # (the old one freed first)
        _SCRATCH[0] = np.empty(size, dtype=np.int64)
    return _SCRATCH[0][:size]


def _unpacked(paths: np.ndarray) -> np.ndarray:
    """(..., 3) F, B and W counts of packed paths (``_execute_packed``)."""
    field = (1 << _COUNT_BITS) - 1
    return np.stack([(paths >> 2 * _COUNT_BITS) & field, (paths >> _COUNT_BITS) & field, paths & field], axis=-1)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProgramGraph:
    """A program's ops as a dependency graph in levels, for its longest paths on stages that differ
    (``longest_paths``): every op of a level depends only on ops of earlier levels (the steps of
    ``_execute_all``'s unit-time run)."""

    slot: np.ndarray  # per op, its (stage, local chunk, kind F/B/W/fused B+W) price index
    prev: np.ndarray  # per op, the stage's previous op (n = none: the zero sentinel)
    dep: np.ndarray  # per op, the op of another chunk it waits for (n = none)
    last: np.ndarray  # per stage, its last op
    first_dep: np.ndarray  # per stage, what its first op waits for (n = none: it starts at 0)
    # the same graph with the ops renumbered level by level (op ``order[i]`` is op i of the
    # renumbering): each level a contiguous range ``bounds[j]:bounds[j + 1]`` of ``level_slot``,
    # ``level_prev`` and ``level_dep`` (predecessors as new numbers, n = none), ``level_last`` and
    # ``level_first_dep`` the stages' ops as new numbers
    order: np.ndarray
    level_slot: np.ndarray
    level_prev: np.ndarray
    level_dep: np.ndarray
    bounds: tuple[int, ...]
    level_last: np.ndarray
    level_first_dep: np.ndarray

    @property
    def levels(self) -> tuple[np.ndarray, ...]:
        """Op indices per level, each level in op order."""
        return tuple(self.order[lo:hi] for lo, hi in zip(self.bounds[:-1], self.bounds[1:]))

    def longest_paths(self, price: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(start, finish) of every stage when each op takes ``price[slot]`` seconds and starts as
        soon as its stage's previous op and its input are done: the program's longest paths.
        ``price`` of shape (slots, k) prices k cases side by side (results of shape (stages, k))."""
        end = np.zeros((len(self.slot) + 1,) + price.shape[1:])
        duration = price[self.level_slot]
        prev, dep = self.level_prev, self.level_dep
        bounds = self.bounds
        for lo, hi in zip(bounds[:-1], bounds[1:]):  # a level's ops: the range lo:hi
            level = end[lo:hi]
            np.maximum(end.take(prev[lo:hi], axis=0), end.take(dep[lo:hi], axis=0), out=level)
            level += duration[lo:hi]
        return end[self.level_first_dep], end[self.level_last]


_GRAPHS: dict[ProgramKey, ProgramGraph] = {}  # filled by prepare_program_profiles (emptied as _PROFILES)


def program_graph(schedule: str, pp: int, num_microbatches: int, virtual_stages: int = 1) -> ProgramGraph:
    """The program's dependency graph in levels (``ProgramGraph``), for pricing its longest paths on
    stages that differ: recorded by ``prepare_program_profiles`` with the program's execution, or
    the program executed once more, recording when each op starts; cached."""
    graph = _GRAPHS.get((schedule, pp, num_microbatches, virtual_stages))
    return graph if graph is not None else _program_graph_alone(schedule, pp, num_microbatches, virtual_stages)


@lru_cache(maxsize=256)
def _program_graph_alone(schedule: str, pp: int, num_microbatches: int, virtual_stages: int) -> ProgramGraph:
    program = schedule_program(schedule, pp, num_microbatches, virtual_stages)  # (validated: it runs)
    table = _lanes([program])
    return _graphs([program], table, _execute_levels(table))[0]


def _graphs(programs: list[Program], table: _Lanes, level: np.ndarray) -> list[ProgramGraph]:
    """``ProgramGraph`` of every program laid out in ``table`` from the step at which each of its ops
    starts in their execution (``_execute_all``'s record; programs side by side start their ops at
    the steps they would alone: they share no dependency)."""
    out = []
    lane = op = 0
    total = len(table.kind)
    for program in programs:
        pp, v = program.pp, program.chunks_per_stage
        counts = table.counts[lane : lane + pp]
        n = int(counts.sum())
        ops = slice(op, op + n)
        prev, dep = (np.where(x[ops] == total, n, x[ops] - op) for x in (table.prev, table.dep))
        first = np.concatenate(([0], np.cumsum(counts)[:-1]))
        last = np.where(counts > 0, first + counts - 1, n)
        first_dep = np.where(counts > 0, dep[np.minimum(first, n - 1)], n)
        steps = level[ops]
        order = np.argsort(steps, kind="stable")  # level by level, each in op order
        renumber = np.empty(n + 1, dtype=np.int64)
        renumber[order] = np.arange(n)
        renumber[n] = n
        sizes = np.bincount(steps)
        sizes = sizes[sizes > 0]
        bounds = np.concatenate(([0], np.cumsum(sizes)))
        slot = ((table.lane[ops] - lane) * v + table.chunk[ops]) * 4 + table.kind[ops]
        out.append(ProgramGraph(
            slot=slot, prev=prev, dep=dep, last=last, first_dep=first_dep, order=order, level_slot=slot[order], level_prev=renumber[prev[order]],
            level_dep=renumber[dep[order]], bounds=tuple(bounds.tolist()), level_last=renumber[last],
            level_first_dep=renumber[first_dep],
        ))
        lane, op = lane + pp, op + n
    return out


class BackwardTail(NamedTuple):
    """What a stage runs from its first B on (``ProgramProfile.backward_tails``); op counts are F, B, W
    per local chunk, flat and chunk-major."""

    chunk: int  # local chunk of the first B
    counts: tuple[int, ...]  # ops from the first B to the stage's last op
    late: int  # gradient ops among the last B and the op before it (whose start issues that B's gather)
    gradient_counts: tuple[int, ...]  # ops from the first gradient op (the first W where the backward
    # is split, else the first B) to the last
    before: tuple[int, ...]  # ops before the first B
    ops: bytes = b""  # where the backward is split, the ops from the first B on: pass code, local chunk


@dataclass(frozen=True, kw_only=True, eq=False)
class ProgramProfile:
    """What the analytic fidelity and the memory model read of a program (``program_profile``)."""

    chunks_per_stage: int
    split_backward: bool
    peak_held_chunks: tuple[int, ...]  # per stage, most (micro-batch, chunk) activations held at once
    last_chunk_inflight: int  # most micro-batches whose last-chunk forward has run and backward not
    p2p_boundaries: tuple[int, ...]  # link index of every model-order chunk transition between stages
    # (link i joins stage i and i + 1; the wrap-around link of looping placements is not counted: a
    # fill and a drain cross each chunk boundary once, and the wrap is hidden behind the other stages)
    key: ProgramKey  # (schedule, pp, m, v) of the program
    # the distinct tails of the stages (``gradient_tails``): per chunk in the program order of its final
    # gradient op, the local chunk and the F, B, W op counts of each local chunk (flat, chunk-major) from
    # that op's start to the stage's end; and which of them is each stage's
    gradient_tails: tuple[tuple[tuple[int, tuple[int, ...]], ...], ...]
    gradient_tail_of_stage: tuple[int, ...]
    # per stage, per local chunk in the program order of its first F: the F, B, W op counts of every
    # local chunk (flat, chunk-major) that run between the previous chunk's first F and this one
    # (``first_forward_heads``); and the stage of every global chunk (``Program.placement``)
    first_forward_heads: tuple[tuple[tuple[int, tuple[int, ...]], ...], ...]
    placement: tuple[int, ...]
    # per stage, what runs from its first B on (``BackwardTail``)
    backward_tails: tuple[BackwardTail, ...]
    # the paths of its execution on uniform stages (``Execution``'s first and last fields), or None
    # where the program was executed for its dependency graph alone (``prepare_program_profiles``):
    # then its execution is run once more when a path is first read (``_checked_program``)
    uniform_paths: tuple[tuple[tuple[Vector, ...], ...], tuple[tuple[Vector, ...], ...]] | None = field(repr=False)

    @cached_property
    def _paths(self) -> tuple[tuple[Vector, ...], tuple[tuple[Vector, ...], ...], tuple[tuple[Vector, ...], ...]]:
        if self.uniform_paths is not None:
            stage_ends, stage_starts = self.uniform_paths
        else:
            execution = _checked_program(*self.key)[1]
            stage_ends, stage_starts = execution[0], execution[3]
        return _pareto(tuple(vec for ends in stage_ends for vec in ends)), stage_ends, stage_starts

    @cached_property
    def stage_chunks(self) -> tuple[tuple[int, ...], ...]:
        """Per stage, its global chunks in local (model) order."""
        return tuple(tuple(g for g, owner in enumerate(self.placement) if owner == s) for s in range(self.key[1]))

    @cached_property
    def local_chunk(self) -> tuple[int, ...]:
        """Local index of every global chunk on its stage."""
        return tuple(self.stage_chunks[owner].index(g) for g, owner in enumerate(self.placement))

    @cached_property
    def first_backward_chunks(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(the global chunk of every stage's first B, the stages from the latest such chunk down)."""
        first = tuple(self.stage_chunks[s][tail.chunk] for s, tail in enumerate(self.backward_tails))
        return first, tuple(sorted(range(len(first)), key=first.__getitem__, reverse=True))

    @property
    def critical_paths(self) -> tuple[Vector, ...]:
        """Pareto-maximal (F, B, W) op counts of the paths to the end of the pipeline on uniform
        stages: with per-chunk-op times f, b, w the pipeline takes max over paths of nF f + nB b + nW w."""
        return self._paths[0]

    @property
    def stage_paths(self) -> tuple[tuple[Vector, ...], ...]:
        """Per stage, the same for the paths ending at the stage's last op (its finish on uniform stages)."""
        return self._paths[1]

    @property
    def stage_start_paths(self) -> tuple[tuple[Vector, ...], ...]:
        """Per stage, the same for the paths to the start of its first op (when it can begin on uniform stages)."""
        return self._paths[2]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ProgramProfile):
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in _PROFILE_FIELDS)

    __hash__ = object.__hash__

    def inflight_stages(self, stage: int) -> float:
        """Peak in-flight activations of ``stage`` in units of the whole stage's layers."""
        return self.peak_held_chunks[stage] / self.chunks_per_stage


_PROFILE_FIELDS = ("key", "chunks_per_stage", "split_backward", "critical_paths", "stage_paths", "stage_start_paths",
                   "gradient_tails", "gradient_tail_of_stage", "first_forward_heads", "backward_tails",
                   "placement", "peak_held_chunks", "last_chunk_inflight", "p2p_boundaries")  # what equal profiles share


def _built_program(schedule: str, pp: int, num_microbatches: int, virtual_stages: int) -> Program:
    """The program of a named schedule or a schedule file, its ops checked (not yet executed)."""
    _check(schedule, pp, 0, num_microbatches, virtual_stages)
    m, v = num_microbatches, virtual_stages
    if is_file_schedule(schedule):
        content = _load_file(schedule[len(FILE_PREFIX):])
        if len(content["stages"]) != pp:
            raise InvalidPlanError(f"{schedule}: the program has {len(content['stages'])} stages; parallel.pp = {pp}")
        if content["m"] != m:
            raise InvalidPlanError(f"{schedule}: the program runs {content['m']} micro-batches; this job has {m}")
        if content["chunks"] != v:
            raise InvalidPlanError(f"{schedule}: the program runs {content['chunks']} chunks per stage, not {v}")
        place, stages = content["placement"], content["stages"]
        split = content["split_backward"]
        if any(len(ops) != 3 * m * v for ops in stages):
            _name_the_violation(schedule, stages, m, v, split)
        ops = np.array([[("FBW".index(k), mb, c) for k, mb, c in stage] for stage in stages], dtype=np.int64)
    else:
        place, ops = _generate(schedule, pp, m, v)
        split = schedule in _SPLIT
    return _checked_ops((schedule, pp, m, v), place, ops, split)


def _checked_ops(key: ProgramKey, place: Sequence[int], ops: np.ndarray, split: bool) -> Program:
    """The ``Program`` of ``key`` with these ops, checked (``_check_ops``)."""
    schedule, pp, m, v = key
    program = Program(
        schedule=schedule, pp=pp, num_microbatches=m, chunks_per_stage=v, placement=tuple(place),
        split_backward=split, ops=ops,
    )
    _check_ops(program)
    return program


def _built_programs(keys: Sequence[ProgramKey]) -> list[tuple[ProgramKey, Program]]:
    """``_built_program`` of every key whose program is valid (the others left out), the
    list-scheduled ones (``_greedy``) generated side by side in groups of equal backward kind and
    of similar length (``_packed``)."""
    out: list[tuple[ProgramKey, Program]] = []
    listed: dict[tuple[bool, bool], list[tuple[ProgramKey, GreedySpec]]] = {}
    for key in keys:
        spec = None if is_file_schedule(key[0]) else _greedy_spec(*key)
        try:
            _check(key[0], key[1], 0, key[2], key[3])
            if spec is None:
                out.append((key, _built_program(*key)))
        except InvalidPlanError:
            continue
        if spec is not None:
            listed.setdefault((spec.split, spec.forward_first), []).append((key, spec))
    for group in listed.values():
        group.sort(key=lambda item: (item[1].m * len(item[1].place) // item[1].pp, item[0]))  # by ops per stage
        for batch in _packed(group, lambda item: (2 * len(item[1].place) * item[1].m, item[1].pp)):
            try:
                generated: list[np.ndarray | None] = list(_greedy([spec for _, spec in batch]))
            except InvalidPlanError:  # a program that cannot proceed: each generated alone, to leave it out
                generated = [None] * len(batch)
            for (key, spec), ops in zip(batch, generated):
                try:
                    out.append((key, _built_program(*key) if ops is None else _checked_ops(key, spec.place, ops, spec.split)))
                except InvalidPlanError:
                    continue
    return out


Item = TypeVar("Item")


def _packed(items: Sequence[Item], size: Callable[[Item], tuple[int, int]]) -> list[list[Item]]:
    """``items`` in consecutive groups run side by side: each at most ``_BATCH_SLOTS`` path slots and
    ``_BATCH_LANES`` stages (``size(item)`` = (slots, stages)), an item larger than that alone."""
    groups: list[list[Item]] = []
    slots = lanes = 0
    for item in items:
        need, stages = size(item)
        if groups and slots + need <= _BATCH_SLOTS and lanes + stages <= _BATCH_LANES:
            groups[-1].append(item)
            slots, lanes = slots + need, lanes + stages
        else:
            groups.append([item])
            slots, lanes = need, stages
    return groups


@lru_cache(maxsize=16)  # the DES and a profile of the same program come back to back
def _checked_program(schedule: str, pp: int, num_microbatches: int, virtual_stages: int) -> tuple[Program, Execution]:
    """The program and its execution on unit stages (``_execute``), validated."""
    program = _built_program(schedule, pp, num_microbatches, virtual_stages)
    return program, _execute(program)  # a deadlock raises


def schedule_program(schedule: str, pp: int, num_microbatches: int, virtual_stages: int = 1) -> Program:
    """The validated program of ``schedule`` on ``pp`` stages with ``num_microbatches`` micro-batches
    and ``virtual_stages`` chunks per stage (``chunks_per_stage``)."""
    program = _PROGRAMS.get((schedule, pp, num_microbatches, virtual_stages))
    return program if program is not None else _checked_program(schedule, pp, num_microbatches, virtual_stages)[0]


ProgramKey = tuple[str, int, int, int]  # (schedule, pp, num_microbatches, virtual_stages)
_PROFILES: dict[ProgramKey, ProgramProfile] = {}
# the programs ``prepare_program_profiles`` last executed (validated), for ``schedule_program``
_PROGRAMS: dict[ProgramKey, Program] = {}
MAX_PROFILES = 4096  # profiles kept (then the table is emptied: results never depend on it)
MAX_GRAPHS = 256  # dependency graphs kept (each as large as its program)
MAX_PROGRAMS = 32  # programs kept by prepare_program_profiles (each as large as its ops)
# programs executed together by ``prepare_program_profiles``: at most this many path slots at once
# (each 400 bytes) and this many stages
_BATCH_SLOTS, _BATCH_LANES = 1 << 19, 4096


def _remember(key: ProgramKey, program: Program, execution: Execution | None) -> ProgramProfile:
    if len(_PROFILES) >= MAX_PROFILES:
        _PROFILES.clear()
    if len(_GRAPHS) >= MAX_GRAPHS:
        _GRAPHS.clear()
    profile = _PROFILES[key] = _profile(key, program, execution)
    return profile


def _paths_deferred(program: Program) -> bool:
    """Whether ``prepare_program_profiles`` executes the program for its dependency graph alone
    (``_execute_levels``), leaving its uniform-stage paths (``ProgramProfile.critical_paths``) to be
    computed when first read: programs of several chunks per stage, which the analytic fidelity
    prices by the longest paths of their graph (``analytic.spans_request``) unless every stage is
    alike (measured on the 1T / 3,072-A100 search: of 537 such programs none has a candidate whose
    stages are all alike, against 441 of the 697 one-chunk programs)."""
    return program.chunks_per_stage > 1


def _needs_graph(program: Program | ProgramProfile) -> bool:
    """Whether the analytic fidelity prices the program's longest paths per stage (``program_graph``)
    where stages differ: every program but GPipe's, whose closed form is exact
    (``analytic.one_chunk_ends``; 1F1B's only where its last stage is the slowest)."""
    schedule = program.schedule if isinstance(program, Program) else program.key[0]
    return program.split_backward or program.chunks_per_stage > 1 or schedule != "gpipe"


def program_profile(schedule: str, pp: int, num_microbatches: int, virtual_stages: int = 1) -> ProgramProfile:
    """``ProgramProfile`` of ``schedule_program(...)``, computed once per (schedule, pp, m, v); raises
    ``InvalidPlanError`` as ``schedule_program`` does (plan validation calls it: the profile, not the
    program, is what a plan search keeps of each program)."""
    key = (schedule, pp, num_microbatches, virtual_stages)
    profile = _PROFILES.get(key)
    if profile is None:
        profile = _remember(key, *_checked_program(*key))  # (the program and its execution)
    return profile


# the programs the last ``build_programs`` call built (ops checked, not executed), until executed
_BUILT: dict[ProgramKey, Program] = {}


def build_programs(keys: Any) -> None:
    """Build the programs of many (schedule, pp, m, v) keys at once without executing them (the
    list-scheduled ones generated side by side, ``_built_programs``), so that what they hold is
    known (``program_occupancy``) and whether they are valid (``check_program``) before any is
    executed (``prepare_program_profiles`` executes those still wanted). Keeps the programs of the
    last call only; keys whose program is invalid are left out (``check_program`` raises for them)."""
    _BUILT.clear()
    _BUILT.update(_built_programs([key for key in dict.fromkeys(keys) if key not in _PROFILES]))


def check_program(schedule: str, pp: int, num_microbatches: int, virtual_stages: int = 1) -> None:
    """Raise ``InvalidPlanError`` when the program is invalid, as ``program_profile`` does, executing
    it only when its build does not already show that it runs. A named schedule's program that
    builds runs without a deadlock: the list-scheduled ones (``_greedy``) place every op only once
    its inputs have ended, the others are the published orders (each stage's F in model order, each
    B after the next chunk's B is listed on its stage; ``test_named_programs_never_deadlock``). A
    schedule file's program is executed to find out."""
    key = (schedule, pp, num_microbatches, virtual_stages)
    if key not in _PROFILES and (key not in _BUILT or is_file_schedule(schedule)):
        program_profile(*key)


def program_occupancy(
    schedule: str, pp: int, num_microbatches: int, virtual_stages: int = 1
) -> ProgramProfile | ProgramOccupancy:
    """The activations the program holds (``peak_held_chunks``, ``last_chunk_inflight``,
    ``inflight_stages``): those of its profile, or of its build (``build_programs``) before it is
    executed; the profile is computed (``program_profile``, raising for an invalid program) when
    neither is at hand."""
    key = (schedule, pp, num_microbatches, virtual_stages)
    known = _PROFILES.get(key)
    if known is not None:
        return known
    built = _BUILT.get(key)
    return built.occupancy if built is not None else program_profile(*key)


def prepare_program_profiles(keys: Any) -> None:
    """Compute the ``program_profile`` of many (schedule, pp, m, v) keys at once: the list-scheduled
    programs are generated together (``_built_programs``) and all executions run together
    (``_execute_all``), programs of similar length side by side, which costs far fewer array steps
    than one by one. Keys whose program is invalid are left out (``program_profile`` raises for them when asked); keys already
    profiled are executed again only for a dependency graph that is missing."""
    wanted = []
    for key in dict.fromkeys(keys):
        known = _PROFILES.get(key)
        if known is None or (_needs_graph(known) and key not in _GRAPHS):
            wanted.append(key)
    built = [(key, _BUILT.pop(key)) for key in wanted if key in _BUILT]  # built by build_programs
    reused = {key for key, _ in built}
    built += _built_programs([key for key in wanted if key not in reused])
    built.sort(key=lambda item: (item[1].ops.shape[1], item[0]))
    # the programs whose paths wait until read (``_paths_deferred``) run apart: their runs track the
    # steps alone (``_execute_levels``), the others' every path too (``_execute_table``)
    deferred = [item for item in built if _paths_deferred(item[1])]
    executed = [item for item in built if not _paths_deferred(item[1])]
    for items, paths in ((executed, True), (deferred, False)):
        for group in _packed(items, lambda item: (2 * len(item[1].placement) * item[1].num_microbatches, item[1].pp)):
            programs = [program for _, program in group]
            table = _lanes(programs)
            record: list[np.ndarray] = []
            try:
                executions: list[Execution | None] = (
                    _execute_table(programs, table, record) if paths else [None] * len(programs)
                )
                if not paths:
                    record.append(_execute_levels(table))
            except (InvalidPlanError, _Deadlock):  # a deadlocked program: left to program_profile to raise
                continue
            graphs = _graphs(programs, table, record[0]) if record else [None] * len(programs)
            for (key, program), execution, graph in zip(group, executions, graphs):
                if execution is not None or key not in _PROFILES:  # (a known profile keeps its paths)
                    _remember(key, program, execution)
                if _needs_graph(program) and graph is not None:
                    if len(_GRAPHS) >= MAX_GRAPHS:
                        _GRAPHS.clear()
                    _GRAPHS[key] = graph
                if len(_PROGRAMS) >= MAX_PROGRAMS:
                    _PROGRAMS.clear()
                _PROGRAMS[key] = program


def _profile(key: ProgramKey, program: Program, execution: Execution | None) -> ProgramProfile:
    """The profile of ``program`` from its ``Execution``, or with its paths computed when first read (None)."""
    occupancy = program.occupancy
    pp, virtual_stages = program.pp, program.chunks_per_stage
    place = program.placement
    looping = place == placement("looping", pp, virtual_stages)
    boundaries = []
    for g in range(len(place) - 1):
        a, b = place[g], place[g + 1]
        if a != b and not (looping and (a, b) == (pp - 1, 0)) and abs(a - b) == 1:
            boundaries.append(min(a, b))
    return ProgramProfile(
        chunks_per_stage=virtual_stages, split_backward=program.split_backward,
        peak_held_chunks=occupancy.peak_held_chunks, last_chunk_inflight=occupancy.last_chunk_inflight,
        p2p_boundaries=tuple(boundaries), key=key, **gradient_tails(program),
        first_forward_heads=first_forward_heads(program), backward_tails=backward_tails(program),
        placement=program.placement,
        uniform_paths=None if execution is None else (execution[0], execution[3]),
    )


def gradient_tails(program: Program) -> dict[str, tuple[Any, ...]]:
    """``ProgramProfile.gradient_tails`` and ``gradient_tail_of_stage``: per stage, per local chunk in
    the program order of the op that completes the chunk's weight gradients (its last W, with the B
    right before it when the backward is fused: the op over which the DES spreads the chunk's share of
    the gradient buckets), the chunk and the F, B, W op counts of every local chunk from that op's start
    to the stage's last op (flat, chunk-major): the compute the buckets can overlap. Stages whose tails
    are alike share one entry."""
    v = program.chunks_per_stage
    distinct: dict[tuple[tuple[int, tuple[int, ...]], ...], int] = {}
    of_stage = []
    for ops in program.ops:
        kinds, chunks = ops[:, 0], ops[:, 2]
        finals = []
        for c in range(v):
            index = int(np.flatnonzero((kinds == W_CODE) & (chunks == c))[-1])
            if not program.split_backward and index > 0 and kinds[index - 1] == B_CODE and chunks[index - 1] == c:
                index -= 1  # the fused B+W (a W right after its B)
            finals.append(index)
        tail = tuple((int(chunks[index]), _op_counts(kinds, chunks, index, len(kinds), v)) for index in sorted(finals))
        of_stage.append(distinct.setdefault(tail, len(distinct)))
    return {"gradient_tails": tuple(distinct), "gradient_tail_of_stage": tuple(of_stage)}


def first_forward_heads(program: Program) -> tuple[tuple[tuple[int, tuple[int, ...]], ...], ...]:
    """``ProgramProfile.first_forward_heads``: per stage, per local chunk in the program order of its
    first F (the F that waits for the chunk's paced ZeRO-1/2 parameter gather), the chunk and the F, B,
    W op counts of every local chunk (flat, chunk-major) that run between the previous chunk's first F
    and this one."""
    v = program.chunks_per_stage
    stages = []
    for ops in program.ops:
        kinds, chunks = ops[:, 0], ops[:, 2]
        firsts = sorted(int(np.flatnonzero((kinds == F_CODE) & (chunks == c))[0]) for c in range(v))
        stages.append(tuple(
            (int(chunks[index]), _op_counts(kinds, chunks, previous + 1, index, v))
            for previous, index in zip([-1, *firsts], firsts)
        ))
    return tuple(stages)


def backward_tails(program: Program) -> tuple[BackwardTail, ...]:
    """``ProgramProfile.backward_tails``: per stage, ``BackwardTail`` (a W right before the last B ends a
    fused B+W; the ops of a split backward kept for ``analytic.split_stream_end_s``)."""
    v = program.chunks_per_stage
    tails = []
    for ops in program.ops:
        kinds, chunks = ops[:, 0], ops[:, 2]
        backwards = np.flatnonzero(kinds == B_CODE)
        first, last = int(backwards[0]), int(backwards[-1])
        gradient = int(np.flatnonzero(kinds == W_CODE)[0]) if program.split_backward else first
        tails.append(BackwardTail(
            chunk=int(chunks[first]), counts=_op_counts(kinds, chunks, first, len(kinds), v),
            late=1 + int(last > 0 and kinds[last - 1] == W_CODE),
            gradient_counts=_op_counts(kinds, chunks, gradient, len(kinds), v),
            before=_op_counts(kinds, chunks, 0, first, v),
            ops=np.stack([kinds[first:], chunks[first:]], axis=1).astype(np.uint8).tobytes() if program.split_backward else b"",
        ))
    return tuple(tails)


def _op_counts(kinds: np.ndarray, chunks: np.ndarray, lo: int, hi: int, v: int) -> tuple[int, ...]:
    """The F, B, W op counts of each of a stage's ``v`` local chunks (flat, chunk-major) among its ops
    ``lo`` .. ``hi`` - 1 in program order."""
    counts = np.zeros((v, 3), dtype=np.int64)
    np.add.at(counts, (chunks[lo:hi], kinds[lo:hi]), 1)
    return tuple(counts.ravel().tolist())


def stage_steps(schedule: str, pp: int, stage: int, num_microbatches: int, virtual_stages: int = 1) -> list[Step]:
    """``stage_program`` as (kind, microbatch, chunk) tuples (cheaper for the executor)."""
    _check(schedule, pp, stage, num_microbatches, virtual_stages)
    return list(schedule_program(schedule, pp, num_microbatches, virtual_stages).steps[stage])


def stage_program(
    schedule: str, pp: int, stage: int, num_microbatches: int, virtual_stages: int = 1
) -> tuple[PipeOp, ...]:
    """The ops of ``stage`` (0-based) for one iteration of ``num_microbatches`` micro-batches, in run
    order (``schedule_program``). Raises ``InvalidPlanError`` on an unknown schedule or an invalid degree."""
    return tuple(
        PipeOp(kind=kind, microbatch=microbatch, chunk=chunk)  # type: ignore[arg-type]
        for kind, microbatch, chunk in stage_steps(schedule, pp, stage, num_microbatches, virtual_stages)
    )


def max_inflight_microbatches(program: tuple[PipeOp, ...]) -> int:
    """Most (micro-batch, chunk) activations held at once: +1 at the end of F, -1 at the end of B."""
    held = peak = 0
    for op in program:
        if op.kind == "F":
            held += 1
            peak = max(peak, held)
        elif op.kind == "B":
            held -= 1
    return peak


def placement_kind(schedule: str) -> str:
    """"zigzag" for V shapes and hanayo, the schedule itself for a schedule file, else "looping"."""
    if schedule in V_SHAPES or schedule == "hanayo":
        return "zigzag"
    return schedule if is_file_schedule(schedule) else "looping"


def plan_placement(plan: Any) -> tuple[int, ...]:
    """Stage of every global chunk of a ``ParallelPlan`` (``plan.virtual_stages`` chunks per stage)."""
    return schedule_placement(plan.schedule, plan.pp, plan.virtual_stages)


def plan_layer_counts(num_layers: int, plan: Any) -> tuple[int, ...]:
    """``workloads.plan.stage_layer_counts`` under the plan's schedule placement."""
    from workloads.plan import stage_layer_counts

    return stage_layer_counts(num_layers, plan, plan_placement(plan))


def plan_occupancy(plan: Any, num_microbatches: int) -> ProgramProfile | ProgramOccupancy:
    """``program_occupancy`` of a ``ParallelPlan``'s schedule."""
    return program_occupancy(plan.schedule, plan.pp, num_microbatches, plan.virtual_stages)


def chunk_ends(plan: Any) -> tuple[tuple[bool, bool], ...]:
    """(holds the embedding, holds the LM head and loss) of every global chunk: the first and the
    last chunk in model order, or with ``plan.vocab_parallel`` a 1/pp vocabulary shard of both on
    every stage, carried by its first and its last local chunk."""
    place = plan_placement(plan)
    chunks = len(place)
    if not plan.vocab_parallel or plan.pp == 1:
        return tuple((g == 0, g == chunks - 1) for g in range(chunks))
    first_local = {s: place.index(s) for s in range(plan.pp)}
    last_local = {s: chunks - 1 - place[::-1].index(s) for s in range(plan.pp)}
    return tuple((first_local[place[g]] == g, last_local[place[g]] == g) for g in range(chunks))


def stage_ends(plan: Any) -> tuple[tuple[bool, bool], ...]:
    """``chunk_ends`` per stage: (holds an embedding share, holds an LM-head share)."""
    place = plan_placement(plan)
    ends = chunk_ends(plan)
    return tuple(
        (any(ends[g][0] for g in range(len(place)) if place[g] == s), any(ends[g][1] for g in range(len(place)) if place[g] == s))
        for s in range(plan.pp)
    )
