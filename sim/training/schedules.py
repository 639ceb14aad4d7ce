"""Pipeline schedules as per-stage programs: the exact order in which one stage runs its ops.

Pure functions, no SimPy. ``stage_program`` returns a tuple of ``PipeOp`` for one pipeline stage;
the executor (``sim.training.pipeline_des``) runs it in order and adds the cross-stage waits.

Convention for the backward pass (one for all schedules): every schedule emits the input-gradient
op "B" and the weight-gradient op "W" as separate ops. In ``gpipe``, ``1f1b`` and ``interleaved``
each W immediately follows its B, and the executor runs the pair as one fused backward: autograd
produces the gradient for the previous stage only at the end of the fused pass, so that gradient is
sent after W. ``zb-h1`` (``splits_backward``) sends the gradient at the end of B and runs W where
the program puts it, later. Activations are held from the end of F to the end of B; W holds none.

Micro-batch indices run 0..m-1; ``chunk`` is the local chunk index on the stage (0..v-1); local
chunk c on stage s is global (virtual) stage ``c * pp + s`` in model order (Megatron's layout).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from workloads.errors import InvalidPlanError

SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b", "interleaved", "zb-h1")
OpKind = Literal["F", "B", "W"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PipeOp:
    """One compute op of a stage program: forward, input-gradient or weight-gradient pass."""

    kind: OpKind  # "F" | "B" | "W"
    microbatch: int  # 0..num_microbatches-1
    chunk: int  # local chunk index on the stage, 0..virtual_stages-1


def splits_backward(schedule: str) -> bool:
    """True when the schedule runs W apart from B (B's gradient is sent before W runs)."""
    return schedule == "zb-h1"


def global_chunk(stage: int, chunk: int, pp: int) -> int:
    """Model-order (virtual stage) index of local chunk ``chunk`` on ``stage`` (Megatron layout)."""
    return chunk * pp + stage


def _check(schedule: str, pp: int, stage: int, num_microbatches: int, virtual_stages: int) -> None:
    if schedule not in SCHEDULES:
        raise InvalidPlanError(f"parallel.schedule = {schedule!r} is not one of {', '.join(SCHEDULES)}")
    if pp < 1:
        raise InvalidPlanError(f"pipeline-parallel degree pp = {pp} must be >= 1")
    if not 0 <= stage < pp:
        raise InvalidPlanError(f"stage = {stage} must be in 0..{pp - 1} for pp = {pp}")
    if num_microbatches < 1:
        raise InvalidPlanError(f"num_microbatches = {num_microbatches} must be >= 1")
    if virtual_stages < 1:
        raise InvalidPlanError(f"parallel.virtual_stages = {virtual_stages} must be >= 1")
    if schedule != "interleaved" and virtual_stages != 1:
        raise InvalidPlanError(
            f"parallel.virtual_stages = {virtual_stages} needs schedule 'interleaved'; "
            f"schedule {schedule!r} runs one chunk per stage (virtual_stages = 1)"
        )
    if schedule == "interleaved" and virtual_stages > 1 and num_microbatches % pp != 0:
        # Megatron-LM's interleaved schedule asserts the same rule (Narayanan et al. 2021, Sec. 2.2.2).
        raise InvalidPlanError(
            f"interleaved schedule needs num_microbatches ({num_microbatches}) divisible by pp ({pp})"
        )


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


def stage_steps(schedule: str, pp: int, stage: int, num_microbatches: int, virtual_stages: int = 1) -> list[Step]:
    """``stage_program`` as (kind, microbatch, chunk) tuples (cheaper for the executor)."""
    _check(schedule, pp, stage, num_microbatches, virtual_stages)
    m = num_microbatches
    if schedule == "gpipe":
        return _gpipe(m)
    if schedule == "1f1b" or (schedule == "interleaved" and virtual_stages == 1):
        # interleaving with one chunk per stage is plain 1F1B (Megatron-LM picks the same schedule)
        return _one_f_one_b(pp, stage, m, deferred_w=0)
    if schedule == "interleaved":
        return _interleaved(pp, stage, m, virtual_stages)
    return _one_f_one_b(pp, stage, m, deferred_w=min(stage, m))


def stage_program(
    schedule: str, pp: int, stage: int, num_microbatches: int, virtual_stages: int = 1
) -> tuple[PipeOp, ...]:
    """The ops of ``stage`` (0-based) for one iteration of ``num_microbatches`` micro-batches, in run order.

    ``zb-h1``: zero-bubble H1 of Qi et al. (ICLR'24, arXiv 2401.10241, Fig. 3): the F/B order and
    the peak in-flight micro-batches of 1F1B, with the W of the first ``stage`` micro-batches deferred
    to the end of the program, where they fill the cool-down bubbles (the same order as the ZB-H1 job
    list of PaddlePaddle's ``pipeline_scheduler_ZBH1`` pass). Raises ``InvalidPlanError`` on an
    unknown schedule or an invalid degree.
    """
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
