"""Closed-form iteration time of a ``PipelineWork`` (the analytic fidelity).

Exact for uniform stages without overlap, where it must agree with the DES to 1 %:
GPipe and 1F1B take (m + p - 1)(F + B + W) (Narayanan et al. 2021; Huang et al. 2019), interleaved
1F1B with v chunks m (F + B + W) + (p - 1)(F + B + W)/v, ZB-H1 m (F + B + W) + (p - 1)(F + B - W)
(Qi et al. 2024). Non-uniform stages use the slowest stage for the steady state and the sum over
stages for fill and drain; each boundary crossing in fill and drain adds a p2p transfer.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.training.work import PipelineWork, StageWork


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineEstimate:
    """What both fidelities report about one iteration of one data-parallel replica."""

    iteration_time_s: float
    pipeline_time_s: float  # end of the last backward op over all stages
    bubble_fraction: float  # idle share of the compute streams during the pipeline phase
    exposed_comm_s: dict[str, float]  # per axis, on the critical path
    stage_busy_s: tuple[float, ...]  # compute-stream busy time per stage


def _per_microbatch(stage: StageWork) -> tuple[float, float, float]:
    forward = sum(c.forward_s for c in stage.chunks)
    backward_input = sum(c.backward_input_s for c in stage.chunks)
    backward_weight = sum(c.backward_weight_s for c in stage.chunks)
    return forward, backward_input, backward_weight


def p2p_time_s(work: PipelineWork, boundary: int, message_bytes: float) -> float:
    bandwidth = work.p2p_bandwidth_Bps[boundary]
    if bandwidth == float("inf"):
        return 0.0
    return message_bytes / bandwidth + work.p2p_latency_s[boundary]


def analytic_iteration(work: PipelineWork) -> PipelineEstimate:
    """Iteration time, bubble and exposed communication in closed form."""
    m, p, v = work.num_microbatches, work.pp, work.virtual_stages
    times = [_per_microbatch(stage) for stage in work.stages]
    totals = [f + b + w for f, b, w in times]
    slowest = max(totals)
    # fill and drain cross each of the p - 1 boundaries once forward (activations) and once backward
    p2p = 0.0
    if p > 1:
        for boundary in range(p - 1):
            message = work.stages[boundary].chunks[-1].send_bytes
            p2p += 2.0 * p2p_time_s(work, boundary, message)
    if work.schedule in ("gpipe", "1f1b"):
        pipeline = (m - 1) * slowest + sum(totals) + p2p
    elif work.schedule == "interleaved":
        pipeline = m * slowest + (p - 1) * slowest / v + p2p * v
    elif work.schedule == "zb-h1":
        f, b, w = (max(t[i] for t in times) for i in range(3))
        pipeline = m * slowest + (p - 1) * max(f + b - w, 0.0) + p2p
    else:
        raise ValueError(f"unknown schedule '{work.schedule}'")
    busy = tuple(m * t for t in totals)
    bubble = 1.0 - sum(busy) / (p * pipeline) if pipeline > 0 else 0.0

    # Each stage finishes its last backward once the later stages have drained theirs.
    iteration = 0.0
    exposed_dp_critical = 0.0
    drain_after = 0.0  # backward of the earlier stages, summed in stage order
    for index, stage in enumerate(work.stages):
        end = pipeline - drain_after
        drain_after += times[index][1] + times[index][2]
        window = times[index][1] + times[index][2]  # the last micro-batch's backward hides the buckets
        sync = sum(c.duration_s for c in stage.grad_sync)
        last_bucket = stage.grad_sync[-1].duration_s if stage.grad_sync else 0.0
        exposed_dp = max(last_bucket, sync - window) if stage.grad_sync else 0.0
        gathers = [g.duration_s for g in stage.param_gather]
        if gathers:
            gather_total = 2.0 * m * sum(gathers)
            exposed_dp += gathers[0] + max(0.0, gather_total - busy[index])
        finish = end + exposed_dp + stage.optimizer_s
        if finish >= iteration:
            iteration, exposed_dp_critical = finish, exposed_dp
    critical = max(range(p), key=lambda s: totals[s])
    exposed: dict[str, float] = {"tp": 0.0, "cp": 0.0, "ep": 0.0}
    for chunk in work.stages[critical].chunks:
        for axis, seconds in chunk.exposed_comm_s.items():
            exposed[axis] = exposed.get(axis, 0.0) + seconds * m
    exposed["pp"] = p2p
    exposed["dp"] = exposed_dp_critical
    return PipelineEstimate(
        iteration_time_s=iteration,
        pipeline_time_s=pipeline,
        bubble_fraction=bubble,
        exposed_comm_s=exposed,
        stage_busy_s=busy,
    )
