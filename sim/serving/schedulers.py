"""Batch schedulers of one replica: plain classes, no SimPy. ``schedule(now_s)`` returns the next
``StepPlan``; ``complete(plan, end_s)`` applies its results (computed tokens, sampled tokens,
finished requests) when the step's time has passed. The engine calls both; tests call them directly.

- ``VllmScheduler``: current vLLM (V1) semantics. A token budget ``max_batched_tokens`` and
  ``max_num_seqs`` per step; running requests first, in arrival order, then waiting ones (FCFS);
  chunked prefill; KV blocks allocated lazily as tokens are computed; when blocks run out the newest
  running request is preempted (recompute: its KV is dropped and it returns to the head of the
  queue; or swap: its blocks go to CPU memory over PCIe). New requests keep a 1 % block watermark
  free (vLLM ``watermark = 0.01``). With ``chunked_prefill = False`` it follows vLLM V0's default
  instead: a step holding prefills holds only prefills (whole prompts), decodes wait.
- Sarathi-Serve (``decode_first = True``, budget ``chunk_size``): all decodes first, then prefill
  chunks fill the rest of the token budget (stall-free batching).
- Disaggregated prefill pool (``prefill_only = True``): a request leaves after its first token and
  keeps its blocks until the engine has moved its KV (``release``).
- Pipeline parallelism (``pipelined = True``, set by the engine for pp > 1): several batches are in
  flight; requests in ``in_flight`` are skipped (and never chosen as preemption victims) until their
  step completes, as vLLM V1's scheduler skips a request with no new tokens to compute while its
  output is pending. ``max_num_seqs`` and the KV blocks are shared by all in-flight batches (one
  scheduler, as in V1). Not modelled: V1 advances a prompt's computed tokens at scheduling time, so
  consecutive prefill chunks of one long prompt can be in flight together; here a request is in at
  most one in-flight batch.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable

from sim.serving.kv_cache import BlockManager, blocks_for
from sim.serving.plan import Chunk, StepPlan
from sim.serving.request import SimRequest, Status

PREEMPTION_MODES = ("recompute", "swap")

# vLLM BlockSpaceManager / KVCacheManager: new requests are admitted only while 1 % of the blocks
# stay free, so running requests can grow without immediate preemption (vllm/config.py watermark 0.01).
WATERMARK_FRACTION = 0.01


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchLimits:
    """Per-step limits of a replica's scheduler."""

    max_num_seqs: int  # requests in one step
    max_batched_tokens: int  # query tokens in one step (the token budget)
    chunked_prefill: bool = True
    decode_first: bool = False  # Sarathi-Serve ordering
    prefill_only: bool = False  # disaggregated prefill replica
    speculative_tokens: int = 0  # k draft tokens verified per decode step
    preemption_mode: str = "recompute"
    swap_capacity_blocks: int = 0  # CPU swap space in blocks (swap mode)

    def __post_init__(self) -> None:
        if self.max_num_seqs <= 0 or self.max_batched_tokens <= 0:
            raise ValueError(
                f"max_num_seqs {self.max_num_seqs} and max_batched_tokens {self.max_batched_tokens} must be > 0"
            )
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ValueError(f"preemption_mode '{self.preemption_mode}' not in {PREEMPTION_MODES}")


AcceptedTokens = Callable[[SimRequest, int], int]
"""Speculative decoding: tokens emitted by a decode chunk that verified ``k`` drafts (1..k+1)."""


def _one_token(request: SimRequest, drafts: int) -> int:
    return 1


class VllmScheduler:
    """vLLM-style continuous batching over a paged KV cache (see the module docstring)."""

    PIPELINE_CAPABLE = True  # batches of disjoint requests may overlap on pipeline stages

    def __init__(self, limits: BatchLimits, blocks: BlockManager) -> None:
        self.limits = limits
        self.blocks = blocks
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.swapped: deque[SimRequest] = deque()
        self.swap_used_blocks = 0
        self.num_preemptions = 0
        self.watermark_blocks = int(WATERMARK_FRACTION * blocks.capacity)
        # pipeline parallelism: up to pp batches in flight; a request whose step is in flight is not
        # scheduled again until that step completes (its next token depends on it)
        self.pipelined = False
        self.in_flight: set[int] = set()

    # ---- queue -----------------------------------------------------------------------------------
    def add(self, request: SimRequest, now_s: float) -> None:
        request.status = Status.WAITING
        self.waiting.append(request)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def outstanding(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.swapped)

    def can_ever_fit(self, request: SimRequest) -> str:
        """Empty when the request can run alone on this replica; else the reason it never can."""
        need = blocks_for(request.prompt_tokens + request.output_tokens, self.blocks.block_size)
        usable = self.blocks.capacity - self.watermark_blocks
        if need > usable:
            return (
                f"prompt {request.prompt_tokens} + output {request.output_tokens} tokens need {need} KV blocks; "
                f"the replica holds {self.blocks.capacity} ({usable} usable above the 1 % admission watermark)"
            )
        return ""

    # ---- scheduling --------------------------------------------------------------------------------
    def _preempt(self, victim: SimRequest, preempted: list[SimRequest]) -> int:
        """Evict ``victim`` from running; return blocks swapped out (0 for recompute)."""
        self.running.remove(victim)
        held = self.blocks.held(victim.request_id)
        self.blocks.free_request(victim.request_id)
        victim.preemptions += 1
        self.num_preemptions += 1
        preempted.append(victim)
        if self.limits.preemption_mode == "swap" and self.swap_used_blocks + held <= self.limits.swap_capacity_blocks:
            victim.status = Status.SWAPPED
            victim.swapped_blocks = held
            self.swap_used_blocks += held
            self.swapped.append(victim)
            return held
        victim.computed = 0
        victim.status = Status.WAITING
        self.waiting.appendleft(victim)
        return 0

    def _victim(self, request: SimRequest, chunks: list[Chunk]) -> SimRequest:
        """The newest running request not already in this step's batch (else ``request`` itself)."""
        scheduled = {id(c.request) for c in chunks}
        in_flight = self.in_flight
        for candidate in reversed(self.running):
            if candidate is request:
                return candidate
            if id(candidate) not in scheduled and candidate.request_id not in in_flight:
                return candidate
        return request

    def _query_tokens(self, request: SimRequest, budget: int) -> int:
        if request.in_decode:
            drafts = min(self.limits.speculative_tokens, request.output_tokens - request.generated - 1)
            return 1 + max(drafts, 0)
        remaining = request.remaining_tokens
        return min(remaining, budget) if self.limits.chunked_prefill else remaining

    def _schedule_running(
        self, order: list[SimRequest], budget: int, chunks: list[Chunk], preempted: list[SimRequest]
    ) -> tuple[int, int]:
        # hot loop (one pass per step over the running requests): properties inlined, locals bound
        swapped_out = 0
        blocks = self.blocks
        block_size = blocks.block_size
        owned_get, shared = blocks.owned.get, blocks.shared
        drafts_max = self.limits.speculative_tokens
        chunked = self.limits.chunked_prefill
        running = Status.RUNNING
        append = chunks.append
        for request in order:
            if budget <= 0:
                break  # the budget only shrinks: nothing later fits
            if request.status is not running:
                continue
            computed = request.computed
            generated = request.generated
            remaining = request.prompt_tokens + generated - computed
            if generated and remaining == 1:
                decode = True
                n = 1
                if drafts_max:
                    extra = request.output_tokens - generated - 1
                    if extra > 0:
                        n += drafts_max if drafts_max < extra else extra
            else:
                decode = False
                n = remaining if (not chunked or remaining <= budget) else budget
            if n > budget:
                continue  # an unchunked prefill or a verification of drafts that does not fit the budget
            rid = request.request_id
            need = -(-(computed + n) // block_size) - owned_get(rid, 0)
            if shared:
                need -= len(shared.get(rid, ()))
            if need > 0:
                while need > blocks.free + len(blocks.evictable):
                    victim = self._victim(request, chunks)
                    swapped_out += self._preempt(victim, preempted)
                    if victim is request:
                        break
                if request.status is not running:
                    continue
                blocks.allocate(rid, need)
            append(Chunk(request, n, computed, decode))
            budget -= n
        return budget, swapped_out

    def _admit_waiting(self, budget: int, chunks: list[Chunk], now_s: float) -> int:
        limits = self.limits
        while self.waiting and budget > 0 and len(self.running) < limits.max_num_seqs:
            request = self.waiting[0]
            rid = request.request_id
            if request.computed == 0 and request.block_hashes and self.blocks.prefix_caching:
                request.cached_tokens = self.blocks.acquire_prefix(rid, request.block_hashes, request.prompt_tokens)
                request.computed = request.cached_tokens
            n = self._query_tokens(request, budget)
            too_big = n > budget and not (not limits.chunked_prefill and not chunks)
            need = blocks_for(request.computed + n, self.blocks.block_size) - self.blocks.held(rid)
            if too_big or not self.blocks.can_allocate(need, self.watermark_blocks):
                if request.cached_tokens and request.computed == request.cached_tokens:
                    self.blocks.hits_tokens -= request.cached_tokens
                    self.blocks.queried_tokens -= request.prompt_tokens
                    self.blocks.free_request(rid)
                    request.computed = request.cached_tokens = 0
                break
            self.waiting.popleft()
            self.blocks.allocate(rid, need)
            request.status = Status.RUNNING
            if request.first_scheduled_s is None:
                request.first_scheduled_s = now_s
            self.running.append(request)
            chunks.append(Chunk(request, n, request.computed, request.in_decode))
            budget -= n
        return budget

    def _swap_in(self) -> int:
        swapped_in = 0
        while self.swapped and len(self.running) < self.limits.max_num_seqs:
            request = self.swapped[0]
            if not self.blocks.can_allocate(request.swapped_blocks, self.watermark_blocks):
                break
            self.swapped.popleft()
            self.blocks.allocate(request.request_id, request.swapped_blocks)
            self.swap_used_blocks -= request.swapped_blocks
            swapped_in += request.swapped_blocks
            request.swapped_blocks = 0
            request.status = Status.RUNNING
            self.running.append(request)
        return swapped_in

    def schedule(self, now_s: float) -> StepPlan:
        """The next step's batch (possibly empty when memory blocks every request, or when every
        running request already has a step in flight on the pipeline)."""
        plan = self._schedule(now_s)
        if self.pipelined:
            self.in_flight.update(c.request.request_id for c in plan.chunks)
        return plan

    def _schedulable(self) -> list[SimRequest]:
        """Running requests without a step in flight, in arrival order (a fresh list)."""
        in_flight = self.in_flight
        if not in_flight:
            return list(self.running)
        return [r for r in self.running if r.request_id not in in_flight]

    def _schedule(self, now_s: float) -> StepPlan:
        limits = self.limits
        chunks: list[Chunk] = []
        preempted: list[SimRequest] = []
        budget = limits.max_batched_tokens
        if not limits.chunked_prefill and not limits.decode_first and self.waiting and not self.swapped:
            # vLLM V0 default: prefills get a step of their own whenever one can be admitted
            self._admit_waiting(budget, chunks, now_s)
            if chunks:
                return StepPlan(chunks=tuple(chunks))
        order = self._schedulable()
        if limits.decode_first:
            order = [r for r in order if r.in_decode] + [r for r in order if not r.in_decode]
        budget, swapped_out = self._schedule_running(order, budget, chunks, preempted)
        swapped_in = 0
        if not preempted:
            swapped_in = self._swap_in()
            if swapped_in:
                for request in self._schedulable():
                    if request.status == Status.RUNNING and all(c.request is not request for c in chunks):
                        budget, _ = self._schedule_running([request], budget, chunks, preempted)
            if not self.swapped and (limits.chunked_prefill or limits.decode_first):
                self._admit_waiting(budget, chunks, now_s)
        return StepPlan(
            chunks=tuple(chunks), preempted=tuple(preempted), swapped_out_blocks=swapped_out, swapped_in_blocks=swapped_in
        )

    # ---- results ------------------------------------------------------------------------------------
    def complete(self, plan: StepPlan, end_s: float, accepted: AcceptedTokens = _one_token) -> list[SimRequest]:
        """Apply a finished step; return the requests that left this replica (finished, or handed
        off to a decode replica in a prefill-only pool)."""
        left: list[SimRequest] = []
        prefill_only = self.limits.prefill_only
        running = Status.RUNNING
        publish = self.blocks.publish if self.blocks.prefix_caching else None
        if self.in_flight:
            self.in_flight.difference_update(c.request.request_id for c in plan.chunks)
        for chunk in plan.chunks:
            request = chunk.request
            if request.status is not running:
                continue
            if chunk.is_decode:
                query = chunk.query_tokens
                if query == 1:
                    emitted = 1
                else:
                    emitted = accepted(request, query - 1)
                    if emitted > request.output_tokens - request.generated:
                        emitted = request.output_tokens - request.generated
                request.computed += emitted
                generated = request.generated + emitted
                request.generated = generated
                request.token_times_s.append(end_s)
                request.token_counts.append(emitted)
                request.last_token_s = end_s
            else:
                computed = request.computed + chunk.query_tokens
                request.computed = computed
                if publish is not None:
                    publish(request.request_id, request.block_hashes, computed)
                if computed == request.prompt_tokens + request.generated:
                    request.emit(1, end_s)
                generated = request.generated
            if generated >= request.output_tokens or (prefill_only and generated > 0):
                left.append(request)
        if left:
            gone = {r.request_id for r in left}
            self.running = [r for r in self.running if r.request_id not in gone]
            for request in left:
                if request.done:
                    request.status = Status.FINISHED
                    request.finish_s = end_s
                    self.blocks.free_request(request.request_id)
                else:
                    request.status = Status.TRANSFERRING
        return left

    def release(self, request: SimRequest) -> None:
        """Free a handed-off request's blocks once its KV has left this replica."""
        self.blocks.free_request(request.request_id)
