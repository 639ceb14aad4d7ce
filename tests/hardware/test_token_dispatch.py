"""The node-deduplicating MoE token dispatch (DeepEP / HybridEP: ``moe_dispatcher = "flex"``)."""

from __future__ import annotations

from dataclasses import replace
from math import comb

import pytest

from hardware.collectives import (
    Collective, GroupLinks, all_to_all_traffic_bytes, collective_time_s, token_dispatch_time_s,
    token_dispatch_traffic_bytes,
)

MB = 1e6


def _links(size: int, ranks_per_node: int) -> GroupLinks:
    return GroupLinks(size=size, num_nodes=-(-size // ranks_per_node), ranks_per_node=ranks_per_node,
                      intra_bandwidth_Bps=450e9, intra_latency_s=1e-6, inter_bandwidth_Bps=50e9,
                      inter_latency_s=5e-6, nvls=False)


def test_traffic_matches_the_closed_form() -> None:
    # Qwen3 30B-A3B on EP 16 over two 8-GPU nodes: 128 experts, 8 per rank, top 8
    tokens = 10 * MB
    p_rank = 1 - comb(120, 8) / comb(128, 8)
    p_node = 1 - comb(64, 8) / comb(128, 8)
    intra, inter = token_dispatch_traffic_bytes(tokens, _links(16, 8), experts=128, top_k=8)
    assert inter == pytest.approx(tokens * 1 * p_node, rel=1e-12)
    assert intra == pytest.approx(tokens * 2 * 7 * p_rank, rel=1e-12)
    # an all-to-all of the 8 permuted copies sends half of them across: four times the deduplicated bytes
    assert all_to_all_traffic_bytes(8 * tokens, _links(16, 8))[1] / inter == pytest.approx(4.0 / p_node, rel=1e-12)


def test_one_expert_per_token_crosses_nodes_as_the_all_to_all_does() -> None:
    links = _links(32, 8)
    _, inter = token_dispatch_traffic_bytes(10 * MB, links, experts=64, top_k=1)
    assert inter == pytest.approx(all_to_all_traffic_bytes(10 * MB, links)[1], rel=1e-12)


def test_inside_one_node_each_rank_gets_a_token_once() -> None:
    # EP 8 in one node, 128 experts, top 8: a token reaches 7 x p_rank other ranks, not 7 of its 8 copies
    intra, inter = token_dispatch_traffic_bytes(10 * MB, _links(8, 8), experts=128, top_k=8)
    assert inter == 0.0
    assert intra == pytest.approx(10 * MB * 7 * (1 - comb(112, 8) / comb(128, 8)), rel=1e-12)
    assert intra < all_to_all_traffic_bytes(8 * 10 * MB, _links(8, 8))[0]


@pytest.mark.parametrize("size,per_node", [(8, 8), (16, 8), (64, 8), (16, 4)])
def test_never_slower_than_the_all_to_all_of_the_copies(size: int, per_node: int) -> None:
    links = _links(size, per_node)
    flex = token_dispatch_time_s(8 * MB, links, experts=128, top_k=8)
    assert 0.0 < flex <= collective_time_s(Collective.ALL_TO_ALL, 8 * 8 * MB, links)
    assert token_dispatch_time_s(8 * MB, replace(links, inter_bandwidth_Bps=100e9), experts=128, top_k=8) <= flex


def test_uneven_experts_are_refused() -> None:
    with pytest.raises(ValueError, match="experts must divide evenly"):
        token_dispatch_traffic_bytes(MB, _links(16, 8), experts=100, top_k=8)


class _MeasuredAllToAll:
    """A calibration profile holding one all-to-all curve: 1 ms per MB of per-rank send buffer."""

    def collective_s(self, kind: str, ranks: int, message_bytes: float) -> float | None:
        return message_bytes / MB * 1e-3 if kind == "all_to_all" else None


def test_inside_one_node_a_measured_all_to_all_prices_the_same_nvlink_bytes() -> None:
    # as an all-to-all is priced there: M bytes per rank send M (n - 1) / n, so the flex dispatch's
    # NVLink bytes are those of an all-to-all of intra x n / (n - 1)
    links = replace(_links(8, 8), calibration=_MeasuredAllToAll())
    intra, _ = token_dispatch_traffic_bytes(10 * MB, links, experts=128, top_k=8)
    expected = intra * 8 / 7 / MB * 1e-3 + links.launch_overhead_s
    assert token_dispatch_time_s(10 * MB, links, experts=128, top_k=8) == pytest.approx(expected, rel=1e-12)
    # one expert per rank and top 1: exactly the all-to-all of the token copies
    assert token_dispatch_time_s(10 * MB, links, experts=8, top_k=1) == pytest.approx(
        collective_time_s(Collective.ALL_TO_ALL, 10 * MB, links), rel=1e-12)
