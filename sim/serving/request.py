"""The mutable state of one request inside the serving simulator (the frozen per-request result
record is built from it when the run ends).

Token accounting follows vLLM V1: ``num_tokens = prompt_tokens + generated`` are the tokens known so
far, ``computed`` of them have KV in the cache. A step schedules ``num_tokens - computed`` new query
tokens (or a chunk of them); when a step brings ``computed`` up to ``num_tokens`` the model samples
the next token. A prefill is therefore the first such step, a decode step has one new query token
(plus k draft tokens under speculative decoding), and a recompute preemption simply sets ``computed``
back to 0.
"""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    TRANSFERRING = "transferring"  # KV on its way from a prefill to a decode replica
    FINISHED = "finished"
    REJECTED = "rejected"


class SimRequest:
    """One request's progress. Times are simulated seconds."""

    __slots__ = (
        "request_id", "arrival_s", "prompt_tokens", "output_tokens", "block_hashes", "session_id",
        "computed", "generated", "status", "first_scheduled_s", "first_token_s", "last_token_s",
        "finish_s", "token_times_s", "token_counts", "preemptions", "cached_tokens", "replica", "reject_reason", "swapped_blocks",
        "reserved_tokens", "prefill_replica", "kv_transfer_s",
    )

    def __init__(
        self,
        request_id: int,
        arrival_s: float,
        prompt_tokens: int,
        output_tokens: int,
        block_hashes: tuple[int, ...] = (),
        session_id: int | None = None,
    ) -> None:
        if prompt_tokens <= 0 or output_tokens <= 0:
            raise ValueError(
                f"request {request_id}: prompt_tokens {prompt_tokens} and output_tokens {output_tokens} must be > 0"
            )
        self.request_id = request_id
        self.arrival_s = arrival_s
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.block_hashes = block_hashes
        self.session_id = session_id
        self.computed = 0
        self.generated = 0
        self.status = Status.WAITING
        self.first_scheduled_s: float | None = None
        self.first_token_s: float | None = None
        self.last_token_s: float | None = None
        self.finish_s: float | None = None
        self.token_times_s: list[float] = []  # time of each emission of output tokens
        self.token_counts: list[int] = []  # tokens emitted at each of those times (> 1 with speculation)
        self.preemptions = 0
        self.cached_tokens = 0  # prompt tokens served from the prefix cache
        self.replica = -1
        self.reject_reason = ""
        self.swapped_blocks = 0
        self.reserved_tokens = 0  # orca / static: tokens reserved up front
        self.prefill_replica = -1  # disaggregated: where the prompt was processed
        self.kv_transfer_s = 0.0

    @property
    def num_tokens(self) -> int:
        return self.prompt_tokens + self.generated

    @property
    def remaining_tokens(self) -> int:
        """Known tokens whose KV is not computed yet (the next step's query tokens, unchunked)."""
        return self.prompt_tokens + self.generated - self.computed

    @property
    def in_decode(self) -> bool:
        """Exactly the last sampled token is uncomputed: the next step is a decode step."""
        return self.generated > 0 and self.prompt_tokens + self.generated - self.computed == 1

    @property
    def done(self) -> bool:
        return self.generated >= self.output_tokens

    def emit(self, tokens: int, now_s: float) -> None:
        """``tokens`` new output tokens reach the client at ``now_s``."""
        if self.first_token_s is None:
            self.first_token_s = now_s
        self.token_times_s.append(now_s)
        self.token_counts.append(tokens)
        self.last_token_s = now_s
        self.generated += tokens

    def __repr__(self) -> str:
        return (
            f"SimRequest({self.request_id}, prompt={self.prompt_tokens}, out={self.output_tokens}, "
            f"computed={self.computed}, generated={self.generated}, {self.status})"
        )
