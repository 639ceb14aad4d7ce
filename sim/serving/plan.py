"""Scheduler decisions: what one batch step computes. Plain frozen dataclasses that check their own
invariants (as vLLM's ``SchedulerOutputs`` does)."""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.serving.request import SimRequest


@dataclass(slots=True)
class Chunk:
    """``query_tokens`` new tokens of ``request`` computed against ``context_tokens`` cached ones.

    ``emits`` is False for a finished member of a static batch that still occupies its slot
    (padding: computed, discarded). Not frozen: built once per request per step, and a frozen
    dataclass's ``__init__`` costs several times more; nothing mutates a chunk after scheduling.
    """

    request: SimRequest
    query_tokens: int
    context_tokens: int
    is_decode: bool
    emits: bool = True

    @property
    def kv_tokens(self) -> int:
        """Keys the chunk's last query sees (its context plus itself)."""
        return self.context_tokens + self.query_tokens


@dataclass(frozen=True, slots=True, kw_only=True)
class StepPlan:
    """One batch step: the chunks to run, requests preempted to make room, and KV blocks swapped."""

    chunks: tuple[Chunk, ...] = ()
    preempted: tuple[SimRequest, ...] = ()
    swapped_out_blocks: int = 0
    swapped_in_blocks: int = 0
    num_tokens: int = field(init=False)
    num_prefill_tokens: int = field(init=False)
    num_decode_tokens: int = field(init=False)
    num_decode_chunks: int = field(init=False)  # decode chunks (fewer than num_decode_tokens under speculation)

    def __post_init__(self) -> None:
        prefill = decode = decode_chunks = 0
        ids = set()
        for c in self.chunks:
            if c.query_tokens <= 0:
                raise AssertionError("every scheduled chunk computes at least one token")
            ids.add(c.request.request_id)
            if c.is_decode:
                decode += c.query_tokens
                decode_chunks += 1
            else:
                prefill += c.query_tokens
        if len(ids) != len(self.chunks):
            raise AssertionError(f"a request appears twice in one step: {sorted(ids)}")
        if self.swapped_in_blocks and self.swapped_out_blocks:
            raise AssertionError("swap in and swap out never happen in the same step")
        if self.preempted and {r.request_id for r in self.preempted} & ids:
            raise AssertionError("a preempted request cannot also be scheduled")
        object.__setattr__(self, "num_prefill_tokens", prefill)
        object.__setattr__(self, "num_decode_tokens", decode)
        object.__setattr__(self, "num_tokens", prefill + decode)
        object.__setattr__(self, "num_decode_chunks", decode_chunks)

    @property
    def empty(self) -> bool:
        return not self.chunks and not self.swapped_in_blocks and not self.swapped_out_blocks

    def sequences(self) -> list[tuple[int, int]]:
        """(query tokens, key tokens) per chunk, for the attention cost."""
        return [(c.query_tokens, c.context_tokens + c.query_tokens) for c in self.chunks]


EMPTY_PLAN = StepPlan()
