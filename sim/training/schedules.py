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

Conventions (one for all schedules): activations are held from the end of F to the end of B; W
holds none. Without ``split_backward`` each W immediately follows its B and the executor runs the
pair as one fused backward: the gradient for the previous chunk is sent after W. With it, the
gradient is sent at the end of B and W runs where the program puts it.

Placements: "looping" puts global chunk g on stage g % pp (Megatron's interleaved layout);
"zigzag" runs down the stages and back (g // pp even: stage g % pp, odd: pp - 1 - g % pp), the V
shape of Qi et al. 2024 with two chunks and Hanayo's waves with 2 W chunks.
"""

from __future__ import annotations

import heapq
import json
import math
from collections import deque
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

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


def _gpipe(m: int) -> list[Step]:
    # Huang et al. 2019 (GPipe): all forwards, then all backwards (ascending micro-batch order, as
    # torch.distributed.pipelining's ScheduleGPipe); every stage keeps all m micro-batches in flight.
    ops: list[Step] = [("F", i, 0) for i in range(m)]
    for i in range(m):
        ops.append(("B", i, 0))
        ops.append(("W", i, 0))
    return ops


def _one_f_one_b(pp: int, stage: int, m: int, deferred_w: int) -> list[Step]:
    """PipeDream-flush / 1F1B (Narayanan et al. 2021, Sec. 2.2.1) with the first ``deferred_w`` W ops moved to the end.

    Warm-up of min(pp - stage - 1, m) forwards, steady state one F then one B, cool-down of the
    remaining B: at most pp - stage micro-batches are in flight on the stage.
    """
    warmup = min(pp - stage - 1, m)
    ops: list[Step] = [("F", i, 0) for i in range(warmup)]
    for k in range(m):
        if k < m - warmup:
            ops.append(("F", warmup + k, 0))
        ops.append(("B", k, 0))
        if k >= deferred_w:
            ops.append(("W", k, 0))
    ops.extend(("W", i, 0) for i in range(min(deferred_w, m)))
    return ops


def _interleaved(pp: int, stage: int, m: int, v: int) -> list[Step]:
    """Megatron-LM's interleaved 1F1B (Narayanan et al. 2021, Sec. 2.2.2) with v chunks per stage.

    The k-th forward (0..m*v-1) of a stage runs micro-batch (k // (pp*v)) * pp + k % pp on local
    chunk (k % (pp*v)) // pp: groups of pp micro-batches go through chunk 0, then chunk 1, ...;
    backwards visit the chunks in reverse order. Warm-up length follows Megatron-LM
    ``forward_backward_pipelining_with_interleaving``: all m*v forwards when m == pp, else
    min(2 (pp - stage - 1) + (v - 1) pp, m v); then one F and one B alternate; then the remaining B.
    """
    total = m * v
    warmup = total if m == pp else min(2 * (pp - stage - 1) + (v - 1) * pp, total)

    def forward(k: int) -> Step:
        return ("F", (k // (pp * v)) * pp + k % pp, (k % (pp * v)) // pp)

    ops = [forward(k) for k in range(warmup)]
    for k in range(total):
        if k < total - warmup:
            ops.append(forward(warmup + k))
        microbatch, chunk = (k // (pp * v)) * pp + k % pp, v - 1 - (k % (pp * v)) // pp
        ops.append(("B", microbatch, chunk))
        ops.append(("W", microbatch, chunk))
    return ops




@dataclass(frozen=True, slots=True, kw_only=True)
class Program:
    """A validated pipeline schedule: what every stage runs, in order, and where every chunk lives."""

    schedule: str
    pp: int
    num_microbatches: int
    chunks_per_stage: int
    placement: tuple[int, ...]  # stage of global (model-order) chunk g, g = 0..pp * chunks_per_stage - 1
    split_backward: bool
    steps: tuple[tuple[Step, ...], ...]  # per stage, (kind, microbatch, local chunk) in run order

    def stage_chunks(self, stage: int) -> tuple[int, ...]:
        """Global chunks of ``stage`` in model order (local chunk c is entry c)."""
        return tuple(g for g, s in enumerate(self.placement) if s == stage)


def is_file_schedule(schedule: str) -> bool:
    return schedule.startswith(FILE_PREFIX)


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


def _bfs(pp: int, m: int, v: int) -> list[list[Step]]:
    """Breadth-first looping (Lamy-Poirier 2022, arXiv 2211.05953): every micro-batch runs through
    local chunk 0, then all through chunk 1, ...; the backward visits the chunks in reverse, each
    for all micro-batches. A chunk's parameters are used by all micro-batches in one stretch, which
    is what lets FSDP gather them once per pass (``sim.training.analytic``)."""
    ops: list[Step] = [("F", i, c) for c in range(v) for i in range(m)]
    for c in reversed(range(v)):
        for i in range(m):
            ops.append(("B", i, c))
            ops.append(("W", i, c))
    return [list(ops) for _ in range(pp)]


def _greedy(
    pp: int, m: int, place: tuple[int, ...], limits: list[int], split: bool, forward_first: bool = False
) -> list[list[Step]]:
    """List-schedule the ops on unit-time uniform stages (F = B = W = 1, the setting of Qi et al.'s
    analysis): whenever a stage is free it runs, of the ops whose inputs have arrived, a B first
    (oldest micro-batch, deepest chunk), else an F if its activations fit under ``limits[stage]``
    chunk-activations (keeping room for the micro-batch's later chunks on the stage, so the oldest
    micro-batch can always finish), else a pending W (the zero-bubble filler). Stages decide in time
    order; with ``split`` False a B is followed by its W at once (fused backward)."""
    chunks = len(place)
    local = [[g for g in range(chunks) if place[g] == s] for s in range(pp)]
    index_of = [local[place[g]].index(g) for g in range(chunks)]
    later = [sum(1 for h in local[place[g]] if h > g) for g in range(chunks)]
    f_done: list[list[float | None]] = [[None] * m for _ in range(chunks)]
    b_done: list[list[float | None]] = [[None] * m for _ in range(chunks)]
    next_f, next_b = [0] * chunks, [0] * chunks
    pending_w: list[deque[tuple[float, int, int]]] = [deque() for _ in range(pp)]
    free, held = [0.0] * pp, [0] * pp
    steps: list[list[Step]] = [[] for _ in range(pp)]
    remaining = 3 * m * chunks

    def stage_choice(s: int) -> tuple[Any, ...] | None:
        """((start time, stage), op) of the op stage ``s`` would run next, or None if none is ready."""
        cands = []
        for g in local[s]:
            i = next_b[g]
            if i < m and f_done[g][i] is not None and (g == chunks - 1 or b_done[g + 1][i] is not None):
                ready = max(f_done[g][i], b_done[g + 1][i] if g < chunks - 1 else 0.0)  # type: ignore[type-var]
                cands.append((ready, 1 if forward_first else 0, i, -g, "B", g))
            i = next_f[g]
            if i < m and (g == 0 or f_done[g - 1][i] is not None) and held[s] + 1 + later[g] <= limits[s]:
                cands.append((f_done[g - 1][i] if g else 0.0, 0 if forward_first else 1, i, -g, "F", g))
        if pending_w[s]:
            ready, i, g = pending_w[s][0]
            cands.append((ready, 2, i, -g, "W", g))
        if not cands:
            return None
        t = max(free[s], min(c[0] for c in cands))
        return (t, s), min((c for c in cands if c[0] <= t), key=lambda c: c[1:4])

    # A stage's choice depends on its own state and on its chunks' neighbours: after an op of chunk g
    # only its stage and the stage of g + 1 (after an F) or g - 1 (after a B) can choose differently.
    # The stages' choices sit in a heap by (start time, stage); an entry is stale once its stage chose anew.
    heap: list[tuple[tuple[float, int], int, tuple[Any, ...]]] = []
    version = [0] * pp
    dirty = set(range(pp))
    while remaining:
        for s in dirty:
            version[s] += 1
            made = stage_choice(s)
            if made is not None:
                heapq.heappush(heap, (made[0], version[s], made[1]))
        while heap and heap[0][1] != version[heap[0][0][1]]:
            heapq.heappop(heap)
        if not heap:
            raise InvalidPlanError(f"schedule cannot proceed under its activation limits {limits} (pp = {pp}, m = {m})")
        key, _, choice = heapq.heappop(heap)
        best = (key, key[1], choice)
        (t, _), s, (_, _, i, _, kind, g) = best
        c = index_of[g]
        if kind == "F":
            end = t + 1.0
            f_done[g][i] = end
            next_f[g] += 1
            held[s] += 1
            steps[s].append(("F", i, c))
            remaining -= 1
        elif kind == "B":
            end = t + (1.0 if split else 2.0)
            b_done[g][i] = t + 1.0 if split else end
            next_b[g] += 1
            held[s] -= 1
            steps[s].append(("B", i, c))
            remaining -= 1
            if split:
                pending_w[s].append((t + 1.0, i, g))
            else:
                steps[s].append(("W", i, c))
                remaining -= 1
        else:
            end = t + 1.0
            pending_w[s].popleft()
            steps[s].append(("W", i, c))
            remaining -= 1
        free[s] = end
        dirty = {s}
        if kind == "F" and g < chunks - 1:
            dirty.add(place[g + 1])
        elif kind == "B" and g > 0:
            dirty.add(place[g - 1])
    return steps


def _generate(schedule: str, pp: int, m: int, v: int) -> tuple[tuple[int, ...], list[list[Step]]]:
    """(placement, per-stage steps) of a named schedule."""
    if schedule == "gpipe":
        return placement("looping", pp, 1), [_gpipe(m) for _ in range(pp)]
    if schedule == "1f1b" or (schedule == "interleaved" and v == 1):
        # interleaving with one chunk per stage is plain 1F1B (Megatron-LM picks the same schedule)
        return placement("looping", pp, 1), [_one_f_one_b(pp, s, m, deferred_w=0) for s in range(pp)]
    if schedule == "interleaved":
        return placement("looping", pp, v), [_interleaved(pp, s, m, v) for s in range(pp)]
    if schedule == "zb-h1":
        # ZB-H1 (Qi et al. ICLR'24, arXiv 2401.10241, Fig. 3): the F/B order and peak of 1F1B, with
        # the W of the first ``stage`` micro-batches deferred to the end (PaddlePaddle's ZBH1 job list)
        return placement("looping", pp, 1), [_one_f_one_b(pp, s, m, deferred_w=min(s, m)) for s in range(pp)]
    if schedule == "bfs":
        return placement("looping", pp, v), _bfs(pp, m, v)
    if schedule == "zb-h2":
        # ZB-H2 (Qi et al. 2024, Fig. 4): more warm-up forwards, up to 2 (pp - stage) - 1 in flight
        # (peak (2p - 1) M_B on stage 0), W filling every remaining gap
        place = placement("looping", pp, 1)
        return place, _greedy(pp, m, place, [min(2 * (pp - s) - 1, m) for s in range(pp)], split=True)
    place = placement("zigzag", pp, v)
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
    elif schedule == "hanayo":
        # Hanayo (Liu et al. SC'23): W waves (2W chunks per stage, zigzag), fused backward, at most
        # 1F1B's peak activation memory (p stages' worth = p v chunk activations); forwards first
        # while memory allows (the wave fills the pipeline as far as it can before the backward)
        return place, _greedy(pp, m, place, [pp * v] * pp, split=False, forward_first=True)
    else:  # pragma: no cover - _check rejects unknown names
        raise InvalidPlanError(f"unknown schedule {schedule!r}")
    return place, _greedy(pp, m, place, [min(limit, 2 * m)] * pp, split=True)


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


def validate_program(program: Program) -> None:
    """Every (pass, micro-batch, chunk) exactly once per stage, F before B before W (W right after B
    without ``split_backward``), chunk neighbours on the same or adjacent stages, and no deadlock
    (``_execute`` raises). Raises ``InvalidPlanError`` naming the first violation."""
    pp, m, v = program.pp, program.num_microbatches, program.chunks_per_stage
    name = program.schedule
    for g in range(len(program.placement) - 1):
        a, b = program.placement[g], program.placement[g + 1]
        if not _adjacent(a, b, pp):
            raise InvalidPlanError(f"schedule {name!r}: chunks {g} and {g + 1} sit on stages {a} and {b}, which are not adjacent")
    for s, ops in enumerate(program.steps):
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
                if not program.split_backward and w != b + 1:
                    raise InvalidPlanError(
                        f"schedule {name!r}: W{mb}.{c} must follow B{mb}.{c} at once on stage {s} unless split_backward = true"
                    )
    _execute(program)


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


# A node's paths: per tracked weighting (rows), the score and the (F, B, W) op counts of the longest
# path ending at the node (columns score, F, B, W) as one int64 array, so each op of the executor's
# loop is a few whole-array operations rather than a Python loop over the weightings.
Paths = np.ndarray
_ZERO: Paths = np.zeros((len(_WEIGHTS), 4), dtype=np.int64)
_WEIGHT_MATRIX = np.array(_WEIGHTS, dtype=np.int64)


def _step(df: int, db: int, dw: int) -> np.ndarray:
    """What one op adds to every tracked path: its weighted time and its (F, B, W) counts."""
    delta = np.empty((len(_WEIGHTS), 4), dtype=np.int64)
    delta[:, 0] = _WEIGHT_MATRIX @ np.array((df, db, dw), dtype=np.int64)
    delta[:, 1:] = (df, db, dw)
    return delta


_F_STEP, _W_STEP = _step(1, 0, 0), _step(0, 0, 1)
_B_STEP = {True: _step(0, 1, 1), False: _step(0, 1, 0)}  # fused B+W, or B alone


def _longer(a: Paths, b: Paths) -> Paths:
    """Per weighting, the longer of the two paths (``a`` on ties)."""
    return a if a is b else np.where((a[:, 0] >= b[:, 0])[:, None], a, b)


@lru_cache(maxsize=8)  # validation and ``program_profile`` execute the same program back to back
def _execute(program: Program, track: bool = False) -> tuple[Any, ...]:
    """Run the program with its dependencies (F after the previous chunk's F, B after the next
    chunk's B, or its fused B+W) on uniform stages, tracking for every op the longest path ending at
    it at each of the ``_WEIGHTS`` op-time ratios. Returns (per stage, the Pareto-maximal (F, B, W) op
    counts of those paths to the stage's last op, peak held chunk-activations per stage, peak
    micro-batches held by the last chunk, per stage the same counts of the paths to the start of its
    first op). With ``track`` it also returns, per stage, the ops of those paths (``_path_ops``).
    Raises ``InvalidPlanError`` on a deadlock."""
    pp = program.pp
    chunks = len(program.placement)
    global_of = [program.stage_chunks(s) for s in range(pp)]
    f_paths: dict[tuple[int, int], Paths] = {}
    b_paths: dict[tuple[int, int], Paths] = {}
    pointer = [0] * pp
    last: list[Paths] = [_ZERO] * pp
    first: list[Paths] = [_ZERO] * pp  # the path to the start of each stage's first op
    # with ``track``: every op's (stage, local chunk, kind) slot and its two predecessors (the
    # stage's previous op, the op it waits for; -1: none); the ops that produced each F / B
    op_slot: list[int] = []
    edges: list[tuple[int, int]] = []
    f_ids: dict[tuple[int, int], int] = {}
    b_ids: dict[tuple[int, int], int] = {}
    last_id, first_id = [-1] * pp, [-1] * pp
    v = program.chunks_per_stage
    held, peak = [0] * pp, [0] * pp
    last_held = last_peak = 0
    fused = 0 if program.split_backward else 1
    b_step = _B_STEP[bool(fused)]
    progressed = True
    while any(pointer[s] < len(program.steps[s]) for s in range(pp)):
        if not progressed:
            stuck = [
                "stage {} at {}{}.{}".format(s, *program.steps[s][pointer[s]])
                for s in range(pp) if pointer[s] < len(program.steps[s])
            ]
            raise InvalidPlanError(f"schedule {program.schedule!r} deadlocks: {'; '.join(stuck)} wait for inputs that never come")
        progressed = False
        for s in range(pp):
            ops = program.steps[s]
            while pointer[s] < len(ops):
                kind, mb, c = ops[pointer[s]]
                g = global_of[s][c]
                if kind == "F":
                    dep = f_paths.get((g - 1, mb)) if g > 0 else _ZERO
                    if dep is None:
                        break
                    if pointer[s] == 0:
                        first[s] = dep
                    if track:
                        dep_id = f_ids[(g - 1, mb)] if g > 0 else -1
                        if pointer[s] == 0:
                            first_id[s] = dep_id
                        edges.append((last_id[s], dep_id))
                        op_slot.append((s * v + c) * 4)
                        last_id[s] = f_ids[(g, mb)] = len(op_slot) - 1
                    paths = _longer(last[s], dep) + _F_STEP
                    f_paths[(g, mb)] = paths
                    held[s] += 1
                    peak[s] = max(peak[s], held[s])
                    if g == chunks - 1:
                        last_held += 1
                        last_peak = max(last_peak, last_held)
                elif kind == "B":
                    dep = b_paths.get((g + 1, mb)) if g < chunks - 1 else _ZERO
                    if dep is None:
                        break
                    if pointer[s] == 0:
                        first[s] = dep
                    if track:
                        dep_id = b_ids[(g + 1, mb)] if g < chunks - 1 else -1
                        if pointer[s] == 0:
                            first_id[s] = dep_id
                        edges.append((last_id[s], dep_id))
                        op_slot.append((s * v + c) * 4 + (3 if fused else 1))
                        last_id[s] = b_ids[(g, mb)] = len(op_slot) - 1
                    paths = _longer(last[s], dep) + b_step
                    b_paths[(g, mb)] = paths
                    held[s] -= 1
                    if g == chunks - 1:
                        last_held -= 1
                    pointer[s] += fused  # the W right after a fused B is part of it
                else:
                    if track:
                        edges.append((last_id[s], -1))
                        op_slot.append((s * v + c) * 4 + 2)
                        last_id[s] = len(op_slot) - 1
                    paths = last[s] + _W_STEP
                last[s] = paths
                pointer[s] += 1
                progressed = True
    stage_ends = tuple(_pareto(tuple(tuple(int(x) for x in row[1:]) for row in paths)) for paths in last)
    stage_starts = tuple(_pareto(tuple(tuple(int(x) for x in row[1:]) for row in paths)) for paths in first)
    if not track:
        return stage_ends, tuple(peak), last_peak, stage_starts
    return _levels(op_slot, edges, last_id, first_id)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProgramGraph:
    """A program's ops as a dependency graph in levels, for its longest path on stages that differ
    (``longest_paths``): every op of a level depends only on ops of earlier levels."""

    slot: np.ndarray  # per op, its (stage, local chunk, kind F/B/W/fused B+W) price index
    prev: np.ndarray  # per op, the stage's previous op (n = none: the zero sentinel)
    dep: np.ndarray  # per op, the op of another chunk it waits for (n = none)
    levels: tuple[np.ndarray, ...]  # op indices per level
    last: np.ndarray  # per stage, its last op
    first_dep: np.ndarray  # per stage, what its first op waits for (n = none: it starts at 0)

    def longest_paths(self, price: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(start, finish) of every stage when each op takes ``price[slot]`` seconds and starts as
        soon as its stage's previous op and its input are done: the program's longest paths."""
        n = len(self.slot)
        end = np.zeros(n + 1)
        duration = price[self.slot]
        prev, dep = self.prev, self.dep
        for ops in self.levels:
            end[ops] = np.maximum(end[prev[ops]], end[dep[ops]]) + duration[ops]
        return end[self.first_dep], end[self.last]


def _levels(op_slot: list[int], edges: list[tuple[int, int]], last_id: list[int], first_id: list[int]) -> ProgramGraph:
    n = len(op_slot)
    prev = np.array([a if a >= 0 else n for a, _ in edges], dtype=np.int64)
    dep = np.array([b if b >= 0 else n for _, b in edges], dtype=np.int64)
    level = [0] * (n + 1)
    level[n] = -1
    for i, (a, b) in enumerate(edges):  # ops were recorded in an order that respects their dependencies
        level[i] = 1 + max(level[a if a >= 0 else n], level[b if b >= 0 else n])
    order = np.argsort(np.array(level[:n]), kind="stable")
    counts = np.bincount(np.array(level[:n]))
    levels = tuple(np.split(order, np.cumsum(counts)[:-1]))
    return ProgramGraph(
        slot=np.array(op_slot, dtype=np.int64), prev=prev, dep=dep, levels=levels,
        last=np.array([i if i >= 0 else n for i in last_id], dtype=np.int64),
        first_dep=np.array([i if i >= 0 else n for i in first_id], dtype=np.int64),
    )


@lru_cache(maxsize=256)
def program_graph(schedule: str, pp: int, num_microbatches: int, virtual_stages: int = 1) -> ProgramGraph:
    """The program's dependency graph in levels (``ProgramGraph``), for pricing its longest paths on
    stages that differ; executes the program once more, recording each op's predecessors; cached."""
    return _execute(schedule_program(schedule, pp, num_microbatches, virtual_stages), True)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProgramProfile:
    """What the analytic fidelity and the memory model read of a program (``program_profile``)."""

    chunks_per_stage: int
    split_backward: bool
    # Pareto-maximal (F, B, W) op counts of the paths to the end of the pipeline on uniform stages:
    # with per-chunk-op times f, b, w the pipeline takes max over paths of nF f + nB b + nW w
    critical_paths: tuple[Vector, ...]
    # per stage, the same for the paths ending at the stage's last op (its finish on uniform stages)
    stage_paths: tuple[tuple[Vector, ...], ...]
    # per stage, the same for the paths to the start of its first op (when it can begin on uniform stages)
    stage_start_paths: tuple[tuple[Vector, ...], ...]
    peak_held_chunks: tuple[int, ...]  # per stage, most (micro-batch, chunk) activations held at once
    last_chunk_inflight: int  # most micro-batches whose last-chunk forward has run and backward not
    p2p_boundaries: tuple[int, ...]  # link index of every model-order chunk transition between stages
    # (link i joins stage i and i + 1; the wrap-around link of looping placements is not counted: a
    # fill and a drain cross each chunk boundary once, and the wrap is hidden behind the other stages)

    def inflight_stages(self, stage: int) -> float:
        """Peak in-flight activations of ``stage`` in units of the whole stage's layers."""
        return self.peak_held_chunks[stage] / self.chunks_per_stage


@lru_cache(maxsize=4096)
def schedule_program(schedule: str, pp: int, num_microbatches: int, virtual_stages: int = 1) -> Program:
    """The validated program of ``schedule`` on ``pp`` stages with ``num_microbatches`` micro-batches
    and ``virtual_stages`` chunks per stage (``chunks_per_stage``); cached."""
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
        place, steps = content["placement"], [list(ops) for ops in content["stages"]]
        split = content["split_backward"]
    else:
        place, steps = _generate(schedule, pp, m, v)
        split = schedule in _SPLIT
    program = Program(
        schedule=schedule, pp=pp, num_microbatches=m, chunks_per_stage=v, placement=tuple(place),
        split_backward=split, steps=tuple(tuple(ops) for ops in steps),
    )
    validate_program(program)
    return program


@lru_cache(maxsize=4096)
def program_profile(schedule: str, pp: int, num_microbatches: int, virtual_stages: int = 1) -> ProgramProfile:
    """``ProgramProfile`` of ``schedule_program(...)``, computed once per (schedule, pp, m, v)."""
    program = schedule_program(schedule, pp, num_microbatches, virtual_stages)
    stage_paths, peak, last_peak, start_paths = _execute(program)
    paths = _pareto(tuple(vec for ends in stage_paths for vec in ends))
    place = program.placement
    looping = place == placement("looping", pp, virtual_stages)
    boundaries = []
    for g in range(len(place) - 1):
        a, b = place[g], place[g + 1]
        if a != b and not (looping and (a, b) == (pp - 1, 0)) and abs(a - b) == 1:
            boundaries.append(min(a, b))
    return ProgramProfile(
        chunks_per_stage=virtual_stages, split_backward=program.split_backward, critical_paths=paths,
        stage_paths=stage_paths, stage_start_paths=start_paths,
        peak_held_chunks=peak, last_chunk_inflight=last_peak, p2p_boundaries=tuple(boundaries),
    )


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


def plan_profile(plan: Any, num_microbatches: int) -> ProgramProfile:
    """``program_profile`` of a ``ParallelPlan``'s schedule."""
    return program_profile(plan.schedule, plan.pp, num_microbatches, plan.virtual_stages)


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
