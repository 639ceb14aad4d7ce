"""Paged KV cache of one serving replica: fixed-size token blocks, lazily allocated, with an optional
prefix cache (block hashes, reference counts, LRU eviction of unreferenced cached blocks).

Accounting only, no SimPy: ``used + free + evictable == capacity`` holds after every call, and an
allocation beyond the available blocks raises ``NoFreeBlocksError`` exactly at capacity (as vLLM's
block allocator does). Schedulers ask ``can_allocate`` first.
"""

from __future__ import annotations

from collections import OrderedDict

from sim.errors import CapacityExceededError


class NoFreeBlocksError(CapacityExceededError):
    """More KV blocks were requested than are free (an internal invariant: schedulers check first)."""


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks that hold ``tokens`` tokens (ceil division)."""
    return -(-tokens // block_size)


class BlockManager:
    """KV blocks of one replica. Each request holds ``owned`` private blocks plus, with prefix
    caching, references to shared cached blocks identified by their content hash."""

    __slots__ = ("capacity", "block_size", "free", "owned", "shared", "prefix_caching", "refcount", "evictable",
                 "peak_used", "hits_tokens", "queried_tokens")

    def __init__(self, capacity_blocks: int, block_size: int, prefix_caching: bool = False) -> None:
        if capacity_blocks < 0:
            raise ValueError(f"KV capacity {capacity_blocks} blocks must be >= 0")
        if block_size <= 0:
            raise ValueError(f"block_size {block_size} must be > 0")
        self.capacity = capacity_blocks
        self.block_size = block_size
        self.free = capacity_blocks  # blocks holding nothing
        self.owned: dict[int, int] = {}  # request id -> private blocks
        self.shared: dict[int, list[int]] = {}  # request id -> hashes of cached blocks it references
        self.prefix_caching = prefix_caching
        self.refcount: dict[int, int] = {}  # block hash -> references (cached blocks only)
        self.evictable: OrderedDict[int, None] = OrderedDict()  # cached, unreferenced, LRU first
        self.peak_used = 0
        self.hits_tokens = 0
        self.queried_tokens = 0

    # ---- queries --------------------------------------------------------------------------------
    @property
    def available(self) -> int:
        """Blocks an allocation can take now: free ones plus evictable cached ones."""
        return self.free + len(self.evictable)

    @property
    def used(self) -> int:
        """Blocks referenced by at least one request."""
        return self.capacity - self.available

    def held(self, request_id: int) -> int:
        """Blocks request ``request_id`` holds (private and shared)."""
        return self.owned.get(request_id, 0) + len(self.shared.get(request_id, ()))

    def can_allocate(self, blocks: int, reserve: int = 0) -> bool:
        """Whether ``blocks`` more can be taken while leaving ``reserve`` available (vLLM's watermark)."""
        return blocks + reserve <= self.available

    # ---- allocation -----------------------------------------------------------------------------
    def allocate(self, request_id: int, blocks: int) -> None:
        """Give ``request_id`` ``blocks`` more private blocks, evicting LRU cached blocks if needed."""
        if blocks < 0:
            raise ValueError(f"cannot allocate {blocks} blocks")
        if blocks > self.available:
            raise NoFreeBlocksError(
                f"request {request_id} needs {blocks} KV blocks but {self.available} of {self.capacity} are available"
            )
        from_free = min(blocks, self.free)
        self.free -= from_free
        for _ in range(blocks - from_free):
            block_hash, _ = self.evictable.popitem(last=False)
            del self.refcount[block_hash]
        self.owned[request_id] = self.owned.get(request_id, 0) + blocks
        used = self.capacity - self.available
        if used > self.peak_used:
            self.peak_used = used

    def ensure(self, request_id: int, tokens: int) -> int:
        """Allocate so the request holds blocks for ``tokens`` tokens; return blocks added."""
        need = blocks_for(tokens, self.block_size) - self.held(request_id)
        if need > 0:
            self.allocate(request_id, need)
            return need
        return 0

    def free_request(self, request_id: int) -> None:
        """Release every block of the request; its cached blocks become evictable when unreferenced."""
        self.free += self.owned.pop(request_id, 0)
        for block_hash in self.shared.pop(request_id, ()):
            count = self.refcount[block_hash] - 1
            self.refcount[block_hash] = count
            if count == 0:
                self.evictable[block_hash] = None

    # ---- prefix cache -----------------------------------------------------------------------------
    def cached_prefix_blocks(self, hashes: tuple[int, ...]) -> int:
        """Leading blocks of ``hashes`` present in the cache (0 without prefix caching)."""
        if not self.prefix_caching:
            return 0
        hit = 0
        for block_hash in hashes:
            if block_hash not in self.refcount:
                break
            hit += 1
        return hit

    def acquire_prefix(self, request_id: int, hashes: tuple[int, ...], prompt_tokens: int) -> int:
        """Reference the cached leading blocks of a new request; return the prompt tokens they cover.

        At least one prompt token is always left to compute (its logits give the first output token),
        as vLLM does on a full hit.
        """
        self.queried_tokens += prompt_tokens
        hit = self.cached_prefix_blocks(hashes)
        hit = min(hit, (prompt_tokens - 1) // self.block_size)
        if hit <= 0:
            return 0
        refs = self.shared.setdefault(request_id, [])
        for block_hash in hashes[:hit]:
            count = self.refcount[block_hash]
            if count == 0:
                del self.evictable[block_hash]
            self.refcount[block_hash] = count + 1
            refs.append(block_hash)
        used = self.capacity - self.available
        if used > self.peak_used:
            self.peak_used = used
        tokens = hit * self.block_size
        self.hits_tokens += tokens
        return tokens

    def publish(self, request_id: int, hashes: tuple[int, ...], computed_tokens: int) -> None:
        """Turn the request's private blocks that now hold complete hashed prompt blocks into cached
        blocks (first writer wins; a duplicate stays private)."""
        if not self.prefix_caching or not hashes:
            return
        refs = self.shared.setdefault(request_id, [])
        full = min(len(hashes), computed_tokens // self.block_size)
        index = len(refs)
        while index < full:
            block_hash = hashes[index]
            if block_hash in self.refcount or self.owned.get(request_id, 0) == 0:
                break  # someone else cached it first: keep ours private, stop extending the chain
            self.owned[request_id] -= 1
            self.refcount[block_hash] = 1
            refs.append(block_hash)
            index += 1

    def check(self) -> None:
        """Internal invariant: blocks are conserved and never exceed capacity."""
        private = sum(self.owned.values())
        cached = len(self.refcount)
        if private + cached + self.free != self.capacity or self.free < 0:
            raise CapacityExceededError(
                f"KV accounting broken: private {private} + cached {cached} + free {self.free} != {self.capacity}"
            )
