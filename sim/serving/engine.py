"""The SimPy serving engine: request arrivals, a router, replicas that run one batch step per event
(never one event per token), and for disaggregated serving the KV transfers between pools.

A replica process asks its scheduler for a ``StepPlan``, asks the step-cost function for the step's
duration, waits that long, then lets the scheduler apply the results. An idle replica waits on a
wake-up event that ``submit`` triggers (no polling).

Pipeline parallelism (``stages = pp > 1``): as vLLM's ``pipeline_parallel_size`` (pp virtual
engines, or V1's batch queue of ``max_concurrent_batches = pp``) and TensorRT-LLM do, up to pp
batches of disjoint requests are in flight, each stage busy with a different batch. A batch holds the
host for its CPU overhead, then stage 0; its step on stage s starts when stage s is free and its
stage s-1 output has crossed the inter-stage link (``hop_s``). The next batch is scheduled as soon
as stage 0 is free and fewer than pp batches are in flight; a batch's tokens are sampled when its
last stage ends, and only then are its requests schedulable again. Latency per step is unchanged
(host + pp stages + pp-1 hops); throughput approaches one batch per stage time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Protocol, Sequence

import numpy as np
import simpy

from sim.serving.plan import StepPlan
from sim.serving.request import SimRequest, Status

StepCost = Callable[[StepPlan], float]
StageCost = Callable[[StepPlan], tuple[float, float, float]]
"""Pipeline-parallel step cost: (host CPU seconds before stage 0, GPU seconds on each stage,
seconds of one activation transfer between adjacent stages)."""


class Scheduler(Protocol):
    blocks: object

    def add(self, request: SimRequest, now_s: float) -> None: ...
    def has_work(self) -> bool: ...
    def outstanding(self) -> int: ...
    def can_ever_fit(self, request: SimRequest) -> str: ...
    def schedule(self, now_s: float) -> StepPlan: ...
    def complete(self, plan: StepPlan, end_s: float, accepted: Callable[[SimRequest, int], int]) -> list[SimRequest]: ...
    def release(self, request: SimRequest) -> None: ...


@dataclass(frozen=True, slots=True)
class StepEvent:
    """One executed batch step, for the Chrome trace."""

    replica: int
    start_s: float
    duration_s: float
    requests: int
    prefill_tokens: int
    decode_tokens: int
    preempted: int
    stage: int = 0  # pipeline stage (0 without pipeline parallelism)


class AcceptanceSampler:
    """Speculative decoding: tokens a verification of k drafts emits, 1 + (leading accepted drafts),
    each draft accepted with probability alpha given its predecessors; draws come in batches from
    the run's seeded generator. Mean: (1 - alpha^(k+1)) / (1 - alpha)."""

    def __init__(self, acceptance_rate: float, rng: np.random.Generator, batch: int = 65536) -> None:
        self.alpha = acceptance_rate
        self.rng = rng
        self.batch = batch
        self._draws: list[int] = []

    def __call__(self, request: SimRequest, drafts: int) -> int:
        if drafts <= 0:
            return 1
        if self.alpha >= 1.0:
            return drafts + 1
        if not self._draws:
            # geometric(1 - alpha) - 1 = number of accepted drafts before the first rejection
            self._draws = (self.rng.geometric(1.0 - self.alpha, size=self.batch) - 1).tolist()
        return min(self._draws.pop(), drafts) + 1


def one_token(request: SimRequest, drafts: int) -> int:
    return 1


class Replica:
    """One serving replica as a SimPy process."""

    def __init__(
        self,
        env: simpy.Environment,
        index: int,
        scheduler: Scheduler,
        step_cost: StepCost,
        *,
        on_leave: Callable[[Replica, SimRequest], None],
        accepted: Callable[[SimRequest, int], int] = one_token,
        swap_time_s: Callable[[int], float] = lambda blocks: 0.0,
        trace: list[StepEvent] | None = None,
        role: str = "replica",
        stages: int = 1,
        stage_cost: StageCost | None = None,
    ) -> None:
        if stages < 1:
            raise ValueError(f"replica {index}: stages = {stages} must be >= 1")
        if stages > 1 and stage_cost is None:
            raise ValueError(f"replica {index}: {stages} pipeline stages need a stage_cost")
        self.env = env
        self.index = index
        self.scheduler = scheduler
        self.step_cost = step_cost
        self.on_leave = on_leave
        self.accepted = accepted
        self.swap_time_s = swap_time_s
        self.trace = trace
        self.role = role
        self.busy_s = 0.0
        self.steps = 0
        self.max_outstanding = 0
        self.stage_cost = stage_cost
        # overlap batches only when the scheduler can keep in-flight requests out of the next batch
        pipelined = stages > 1 and getattr(scheduler, "PIPELINE_CAPABLE", False)
        self.stages = stages
        self.depth = stages if pipelined else 1  # batches in flight at most
        self.in_flight = 0
        self._wakeup = env.event()
        if pipelined:
            scheduler.pipelined = True  # type: ignore[attr-defined]
            self.process = env.process(self._run_pipelined())
        else:
            if stages > 1:  # sequential through the stages: the step's time is the sum of them
                self.step_cost = self._sequential_step_s
            self.process = env.process(self._run())

    def submit(self, request: SimRequest) -> None:
        request.replica = self.index
        self.scheduler.add(request, self.env.now)
        outstanding = self.scheduler.outstanding()
        if outstanding > self.max_outstanding:
            self.max_outstanding = outstanding
        self.kick()

    def kick(self) -> None:
        if not self._wakeup.triggered:
            self._wakeup.succeed()

    def _idle(self):  # type: ignore[no-untyped-def]
        """A fresh wake-up event for the loop to wait on (``kick`` triggers it)."""
        self._wakeup = self.env.event()
        return self._wakeup

    def _swap_s(self, plan: StepPlan) -> float:
        """PCIe time of the blocks the step swaps in or out (0 without swapping)."""
        swapped = plan.swapped_in_blocks + plan.swapped_out_blocks
        return self.swap_time_s(swapped) if swapped else 0.0

    def _run(self):  # type: ignore[no-untyped-def]
        env, scheduler = self.env, self.scheduler
        while True:
            plan = scheduler.schedule(env.now) if scheduler.has_work() else None
            if plan is None or plan.empty:
                yield self._idle()
                continue
            start = env.now
            duration = self.step_cost(plan) + self._swap_s(plan)
            yield env.timeout(duration)
            self.busy_s += duration
            self.steps += 1
            if self.trace is not None:
                self.trace.append(
                    StepEvent(self.index, start, duration, len(plan.chunks), plan.num_prefill_tokens,
                              plan.num_decode_tokens, len(plan.preempted))
                )
            for request in scheduler.complete(plan, env.now, self.accepted):
                self.on_leave(self, request)


    def _sequential_step_s(self, plan: StepPlan) -> float:
        host_s, stage_s, hop_s = self.stage_cost(plan)  # type: ignore[misc]
        return host_s + self.stages * stage_s + (self.stages - 1) * hop_s

    def _run_pipelined(self):  # type: ignore[no-untyped-def]
        env, scheduler, stages = self.env, self.scheduler, self.stages
        stage_free_s = [0.0] * stages  # when each stage finishes the last batch it was given
        while True:
            if self.in_flight >= self.depth:
                yield self._idle()
                continue
            plan = scheduler.schedule(env.now) if scheduler.has_work() else None
            if plan is None or plan.empty:
                yield self._idle()
                continue
            start = env.now
            host_s, stage_s, hop_s = self.stage_cost(plan)  # type: ignore[misc]
            host_s += self._swap_s(plan)
            begin = start + host_s  # stage 0 is free: this loop issues a batch only then
            end = begin + stage_s
            stage_free_s[0] = end
            stage_0_end = end
            spans = [(begin, end)]
            for s in range(1, stages):
                begin = max(end + hop_s, stage_free_s[s])
                end = begin + stage_s
                stage_free_s[s] = end
                spans.append((begin, end))
            self.in_flight += 1
            self.busy_s += stage_0_end - start  # stage 0 (with the host) is the replica's busiest stage
            self.steps += 1
            if self.trace is not None:
                for s, (b, e) in enumerate(spans):
                    self.trace.append(
                        StepEvent(self.index, b, e - b, len(plan.chunks), plan.num_prefill_tokens,
                                  plan.num_decode_tokens, len(plan.preempted), s)
                    )
            env.process(self._finish(plan, end - start))
            yield env.timeout(stage_0_end - start)

    def _finish(self, plan: StepPlan, latency_s: float):  # type: ignore[no-untyped-def]
        yield self.env.timeout(latency_s)
        self.in_flight -= 1
        for request in self.scheduler.complete(plan, self.env.now, self.accepted):
            self.on_leave(self, request)
        self.kick()


class Router:
    """Picks a replica for each request: ``round_robin``, ``least_outstanding`` (fewest queued or
    running requests, lowest index on ties) or ``prefix_aware`` (longest cached prompt prefix, then
    least outstanding)."""

    def __init__(self, policy: str, replicas: Sequence[Replica]) -> None:
        self.policy = policy
        self.replicas = list(replicas)
        self._next = 0

    def pick(self, request: SimRequest) -> Replica:
        replicas = self.replicas
        if len(replicas) == 1:
            return replicas[0]
        if self.policy == "round_robin":
            replica = replicas[self._next % len(replicas)]
            self._next += 1
            return replica
        if self.policy == "prefix_aware" and request.block_hashes:
            best = max(
                replicas,
                key=lambda r: (r.scheduler.blocks.cached_prefix_blocks(request.block_hashes),  # type: ignore[attr-defined]
                               -r.scheduler.outstanding(), -r.index),
            )
            return best
        return min(replicas, key=lambda r: (r.scheduler.outstanding(), r.index))


def arrivals(
    env: simpy.Environment, requests: Iterable[SimRequest], dispatch: Callable[[SimRequest], None]
):  # type: ignore[no-untyped-def]
    """Release each request at its arrival time (requests sorted by arrival)."""
    for request in requests:
        delay = request.arrival_s - env.now
        if delay > 0:
            yield env.timeout(delay)
        dispatch(request)


def admit(router: Router, request: SimRequest, rejected: list[SimRequest]) -> None:
    """Route a request; reject it (with the reason) when it can never fit on the chosen replica."""
    replica = router.pick(request)
    reason = replica.scheduler.can_ever_fit(request)
    if reason:
        request.status = Status.REJECTED
        request.reject_reason = reason
        request.replica = replica.index
        rejected.append(request)
        return
    replica.submit(request)
