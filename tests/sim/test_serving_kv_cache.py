"""Paged KV block accounting: exact capacity, conservation, prefix-cache hits and LRU eviction."""

from __future__ import annotations

import pytest

from sim.serving.kv_cache import BlockManager, NoFreeBlocksError, blocks_for


def test_blocks_for_is_ceil_division() -> None:
    assert [blocks_for(t, 16) for t in (0, 1, 16, 17, 32, 33)] == [0, 1, 1, 2, 2, 3]


def test_allocation_fails_exactly_at_capacity() -> None:
    blocks = BlockManager(10, 16)
    blocks.allocate(1, 6)
    blocks.allocate(2, 4)  # exactly full: allowed
    assert blocks.available == 0 and blocks.used == 10
    with pytest.raises(NoFreeBlocksError):
        blocks.allocate(3, 1)
    blocks.free_request(1)
    assert blocks.available == 6
    blocks.check()


def test_ensure_allocates_only_missing_blocks() -> None:
    blocks = BlockManager(10, 16)
    assert blocks.ensure(7, 17) == 2
    assert blocks.ensure(7, 32) == 0
    assert blocks.ensure(7, 33) == 1
    assert blocks.held(7) == 3


def test_prefix_cache_hit_skips_blocks_and_keeps_one_token() -> None:
    blocks = BlockManager(20, 4, prefix_caching=True)
    hashes = (11, 12, 13)
    blocks.ensure(1, 12)  # a 12-token prompt = 3 full blocks
    blocks.publish(1, hashes, 12)
    assert blocks.held(1) == 3 and len(blocks.refcount) == 3
    # same prompt again: at most (12 - 1) // 4 = 2 blocks are reused, the last token is recomputed
    assert blocks.acquire_prefix(2, hashes, 12) == 8
    assert blocks.refcount[11] == 2 and blocks.refcount[13] == 1
    blocks.free_request(1)
    blocks.free_request(2)
    assert list(blocks.evictable) == [13, 11, 12]  # LRU order: unreferenced first by release
    assert blocks.available == 20
    blocks.check()


def test_lru_eviction_when_free_blocks_run_out() -> None:
    blocks = BlockManager(3, 4, prefix_caching=True)
    blocks.ensure(1, 8)
    blocks.publish(1, (5, 6), 8)
    blocks.free_request(1)
    assert blocks.free == 1 and len(blocks.evictable) == 2
    blocks.allocate(2, 2)  # takes the free block, then evicts the least recently used cached block
    assert 5 not in blocks.refcount and 6 in blocks.refcount
    assert blocks.cached_prefix_blocks((5, 6)) == 0  # chain broken at its first block
    blocks.check()
