"""Cluster topology: placement, group bottlenecks per network kind, graph consistency."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hardware import units
from hardware.catalog import get_gpu, get_network, get_node
from hardware.collectives import Collective, bus_bandwidth_Bps
from hardware.topology import Cluster, build_cluster


def _cluster(node: str, gpu: str, network: str, num_gpus: int) -> Cluster:
    return build_cluster(get_gpu(gpu), get_node(node), get_network(network), num_gpus)


def _a100(network: str = "ib-hdr-fat-tree", num_gpus: int = 64) -> Cluster:
    return _cluster("dgx-a100", "a100-sxm-80gb", network, num_gpus)


def test_placement() -> None:
    cluster = _a100(num_gpus=20)
    assert cluster.num_nodes == 3  # ceil(20 / 8)
    assert [cluster.node_of(r) for r in (0, 7, 8, 19)] == [0, 0, 1, 2]
    assert cluster.local_index(13) == 5


def test_tensor_parallel_group_inside_one_dgx() -> None:
    links = _a100().group_links(range(8))
    assert (links.num_nodes, links.ranks_per_node) == (1, 8)
    assert links.intra_bandwidth_Bps == pytest.approx(300 * units.GBps, rel=1e-12)  # catalog dgx-a100


def test_data_parallel_group_strided_across_four_nodes() -> None:
    links = _a100().group_links([0, 8, 16, 24])
    assert (links.num_nodes, links.ranks_per_node) == (4, 1)
    # One 200 Gb/s HDR NIC per GPU (DGX A100): 25 GB/s per rank (exact arithmetic).
    assert links.inter_bandwidth_Bps == pytest.approx(200 * units.Gbps, rel=1e-12)
    assert not links.nvls


def test_a_nic_runs_at_the_network_link_rate_when_that_is_slower() -> None:
    """A DGX H100's 400 Gb/s NICs on a 10 GbE fabric move 10 Gb/s each; on 400G InfiniBand, 400."""
    for network, gbps in (("ethernet-10g", 10), ("ethernet-100g", 100), ("ib-edr-fat-tree", 100), ("ib-ndr-fat-tree", 400)):
        links = _cluster("dgx-h100", "h100-sxm-80gb", network, 32).group_links([0, 8, 16, 24])
        assert links.inter_bandwidth_Bps == pytest.approx(gbps * units.Gbps, rel=1e-12)  # four nodes under one leaf


def test_rail_only_same_rail_vs_cross_rail() -> None:
    cluster = _cluster("dgx-h100", "h100-sxm-80gb", "rail-only-400g", 32)
    same_rail = cluster.group_links([0, 8, 16, 24])  # local GPU 0 everywhere: one rail switch
    cross_rail = cluster.group_links([0, 9, 18, 27])  # rails 0..3: forwarded over NVLink first
    assert cross_rail.inter_bandwidth_Bps == pytest.approx(same_rail.inter_bandwidth_Bps / 2, rel=1e-12)
    assert cross_rail.inter_latency_s > same_rail.inter_latency_s
    size = 256 * units.MiB
    assert bus_bandwidth_Bps(Collective.ALL_REDUCE, size, cross_rail) < bus_bandwidth_Bps(Collective.ALL_REDUCE, size, same_rail)
    # The graph routes cross-rail traffic through the NVSwitch and one rail switch (no spine).
    assert cluster.path_switch_hops(0, 8) == 1
    assert cluster.path_switch_hops(0, 9) == 1
    assert not any(v[0] == "spine" and v[1] == 0 for v in cluster.graph().nodes)


def test_oversubscribed_network_halves_cross_spine_bandwidth() -> None:
    # ib-ndr-fat-tree-2to1: 2:1 leaf oversubscription, 42 nodes per leaf (catalog).
    network = get_network("ib-ndr-fat-tree-2to1")
    per_leaf = network.nodes_per_leaf * 8
    cluster = _cluster("dgx-h100", "h100-sxm-80gb", network.name, 2 * per_leaf)
    same_leaf = cluster.group_links([0, 8])
    cross_spine = cluster.group_links([0, per_leaf])
    assert cross_spine.inter_bandwidth_Bps == pytest.approx(same_leaf.inter_bandwidth_Bps / 2, rel=1e-12)
    assert cluster.path_switch_hops(0, 8) == 1
    assert cluster.path_switch_hops(0, per_leaf) == 3
    non_blocking = _cluster("dgx-h100", "h100-sxm-80gb", "ib-ndr-fat-tree", 2 * per_leaf)
    assert non_blocking.group_links([0, per_leaf]).inter_bandwidth_Bps == pytest.approx(same_leaf.inter_bandwidth_Bps, rel=1e-12)


def test_rail_optimized_cross_rail_crosses_spine() -> None:
    cluster = _cluster("dgx-h100", "h100-sxm-80gb", "roce-400g-rail-optimized", 32)
    assert cluster.path_switch_hops(0, 8) == 1  # same rail leaf
    assert cluster.path_switch_hops(0, 9) in (1, 3)  # shortest graph path may forward over NVLink
    same_rail = cluster.group_links([0, 8])
    cross = cluster.group_links([0, 9])
    assert cross.inter_latency_s > same_rail.inter_latency_s


def test_gb200_nvl72_group_is_one_nvlink_domain() -> None:
    cluster = _cluster("gb200-nvl72", "gb200", get_node("gb200-nvl72").default_network, 144)
    links = cluster.group_links(range(72))
    assert (links.num_nodes, links.ranks_per_node) == (1, 72)
    assert links.nvls
    assert cluster.group_links([0, 72]).num_nodes == 2


def test_p2p_links() -> None:
    cluster = _a100()
    intra_bw, intra_lat = cluster.p2p_links(0, 1)
    inter_bw, inter_lat = cluster.p2p_links(0, 8)
    assert intra_bw > inter_bw and inter_lat > intra_lat
    # Inter-node: one HDR NIC x network efficiency 0.90 (catalog ib-hdr-fat-tree).
    assert inter_bw == pytest.approx(25e9 * 0.90, rel=1e-12)
    with pytest.raises(ValueError, match="same rank"):
        cluster.p2p_links(3, 3)


def test_graph_structure() -> None:
    cluster = _a100(num_gpus=16)
    graph = cluster.graph()
    kinds = [data["kind"] for _, data in graph.nodes(data=True)]
    assert kinds.count("gpu") == 16 and kinds.count("nic") == 16 and kinds.count("nvswitch") == 2
    assert all("bandwidth_Bps" in d and "latency_s" in d for _, _, d in graph.edges(data=True))
    assert cluster.path_switch_hops(0, 1) == 0


def test_bad_groups_raise_with_values() -> None:
    cluster = _a100(num_gpus=16)
    with pytest.raises(ValueError, match="rank 16"):
        cluster.group_links([0, 16])
    with pytest.raises(ValueError, match="duplicates"):
        cluster.group_links([1, 1])
    with pytest.raises(ValueError, match="topology 'torus'"):
        build_cluster(get_gpu("a100-sxm-80gb"), get_node("dgx-a100"), replace(get_network("ib-hdr-fat-tree"), topology="torus"), 8)
