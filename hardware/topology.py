"""Cluster topology (networkx): nodes, GPUs, NVLink domains, NICs, leaf and spine switches; rank
placement; the links a process group or a point-to-point transfer sees.

Placement: rank r is local GPU r % gpus_per_node of node (server) r // gpus_per_node. An NVLink
domain is one node, or ``nvlink_domain_gpus`` consecutive ranks when the domain spans several
servers (GB200 NVL72: 72 GPUs). Switches:
- fat-tree, ethernet, dragonfly: every NIC of a node goes to the node's leaf (node // nodes_per_leaf);
  leaves meet at a spine whose up-links are thinner by ``oversubscription``.
- rail-optimized: one leaf per (block of nodes_per_leaf nodes, rail = local GPU index); a group
  whose nodes all use the same rails stays on the rail leaves, anything else crosses the spine.
- rail-only (Wang et al. 2023, no spine): one switch tree per rail spanning all nodes; traffic
  between different rails is first forwarded over NVLink to the GPU on the right rail (PXN), so that
  GPU's rail NIC carries its own and the forwarded traffic (half each when all GPUs are busy).
``group_links`` is closed-form (fast for search loops); ``graph()`` builds the same structure as a
networkx graph with bandwidth_Bps / latency_s edge attributes, and ``path_switch_hops`` checks it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import networkx as nx

from hardware import units
from hardware.collectives import GroupLinks
from hardware.specs import GpuSpec, NetworkSpec, NodeSpec

TOPOLOGIES = ("fat-tree", "rail-optimized", "rail-only", "dragonfly", "ethernet")

# Large-message ring all-reduce bus bandwidth / per-GPU link rate, used when a node entry does not
# state ``intra_node_efficiency``, per NVLink generation (keyed by its per-GPU rate in GB/s), from
# 8-GPU sweeps in stas00/ml-engineering network/README.md (reference C2):
# NVLink3 (DGX A100): 234.89 GB/s busbw at 16 GiB / 300 GB/s; NVLink4 (HGX H200, NCCL_NVLS_ENABLE=0):
# 367.61 / 450 (nccl-tests#212 reports ~370 on H100). Other fabrics have no measurement in the
# references and use the NVLink3 value until their catalog entry states one.
DEFAULT_INTRA_NODE_EFFICIENCY = 234.89 / 300.0
_DEFAULT_INTRA_EFFICIENCY_BY_LINK_GBPS = {300: 234.89 / 300.0, 450: 367.61 / 450.0}
# NVLS all-reduce algorithm bandwidth / per-GPU link rate: HGX H200 algbw 275.58 GB/s at 16 GiB
# over 450 GB/s NVLink4 (same source; nccl-tests#212 reports algbw ~275 on H100).
DEFAULT_NVLS_EFFICIENCY = 275.58 / 450.0
# Switch hops of an inter-node path: NIC -> leaf -> NIC, or NIC -> leaf -> spine -> leaf -> NIC.
_LEAF_HOPS = 1
_SPINE_HOPS = 3


def intra_node_efficiency(node: NodeSpec) -> float:
    """The node's stated ``intra_node_efficiency``, else the NVLink-generation default above."""
    if node.intra_node_efficiency is not None:
        return node.intra_node_efficiency
    if node.intra_node_fabric == "nvswitch":
        link_GBps = round(node.intra_node_bandwidth_Bps / units.GBps)
        return _DEFAULT_INTRA_EFFICIENCY_BY_LINK_GBPS.get(link_GBps, DEFAULT_INTRA_NODE_EFFICIENCY)
    return DEFAULT_INTRA_NODE_EFFICIENCY


def nvls_efficiency(node: NodeSpec) -> float:
    """The node's stated ``nvls_efficiency``, else the NVLink4 measurement above."""
    return node.nvls_efficiency if node.nvls_efficiency is not None else DEFAULT_NVLS_EFFICIENCY


@dataclass(frozen=True, slots=True, kw_only=True)
class Cluster:
    """``num_gpus`` GPUs in nodes of ``node`` joined by ``network``; rank r is GPU r % gpus_per_node
    of node r // gpus_per_node."""

    gpu: GpuSpec
    node: NodeSpec
    network: NetworkSpec
    num_gpus: int
    _cache: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def num_nodes(self) -> int:
        return -(-self.num_gpus // self.node.gpus_per_node)

    @property
    def domain_gpus(self) -> int:
        """GPUs in one NVLink domain: the node, or a multi-node domain such as GB200 NVL72."""
        return max(self.node.gpus_per_node, self.node.nvlink_domain_gpus)

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.num_gpus:
            raise ValueError(f"rank {rank} must be in [0, {self.num_gpus}) for a cluster of {self.num_gpus} GPUs")

    def node_of(self, rank: int) -> int:
        return rank // self.node.gpus_per_node

    def local_index(self, rank: int) -> int:
        """The GPU index inside its node (the rail it uses on rail networks)."""
        return rank % self.node.gpus_per_node

    def domain_of(self, rank: int) -> int:
        return rank // self.domain_gpus

    def leaf_of(self, rank: int) -> tuple[int, int]:
        """(block of nodes, rail) of the leaf switch serving this rank's NIC; rail is -1 where all
        NICs of a node share a leaf."""
        block = self.node_of(rank) // self.network.nodes_per_leaf
        if self.network.topology in ("rail-optimized", "rail-only"):
            return block, self.local_index(rank)
        return block, -1

    def nic_share_Bps(self, local_gpu: int) -> float:
        """NIC bandwidth one GPU gets when every GPU of the node sends at once: each NIC runs at the
        slower of its own rate and the network's link rate (a 400 Gb/s NIC on a 10 GbE port moves
        10 Gb/s), split evenly among the GPUs in its affinity list."""
        nics = self.node.nics
        rate = min(nics.bandwidth_Bps, self.network.link_bandwidth_Bps)
        share = sum(rate / len(group) for group in nics.gpu_affinity if local_gpu in group and group)
        if share == 0.0:
            share = nics.count * rate / self.node.gpus_per_node
        return share

    def _inter_path(self, ranks: Sequence[int]) -> tuple[float, int, bool]:
        """(bandwidth factor, switch hops, NVLink forwarding) of the group's inter-node traffic."""
        topology = self.network.topology
        local_sets = {}
        for r in ranks:
            local_sets.setdefault(self.node_of(r), set()).add(self.local_index(r))
        rail_aligned = len({frozenset(s) for s in local_sets.values()}) == 1
        blocks = {self.node_of(r) // self.network.nodes_per_leaf for r in ranks}
        if topology == "rail-only":
            hops = _LEAF_HOPS if len(blocks) == 1 else _SPINE_HOPS
            factor = 1.0 if len(blocks) == 1 else 1.0 / self.network.oversubscription
            if rail_aligned:
                return factor, hops, False
            return factor * 0.5, hops, True
        if topology == "rail-optimized":
            crosses_spine = not rail_aligned or len(blocks) > 1
        else:
            crosses_spine = len(blocks) > 1
        if crosses_spine:
            return 1.0 / self.network.oversubscription, _SPINE_HOPS, False
        return 1.0, _LEAF_HOPS, False

    def group_links(self, ranks: Sequence[int]) -> GroupLinks:
        """The bottleneck links a process group of these ranks sees (ranks_per_node: the most
        group ranks in one NVLink domain)."""
        ranks = list(ranks)
        if not ranks:
            raise ValueError("a process group needs at least one rank; got ranks = []")
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"ranks {ranks} contain duplicates")
        for r in ranks:
            self._check_rank(r)
        counts: dict[int, int] = {}
        for r in ranks:
            counts[self.domain_of(r)] = counts.get(self.domain_of(r), 0) + 1
        num_domains = len(counts)
        inter_bandwidth = min(self.nic_share_Bps(self.local_index(r)) for r in ranks)
        inter_latency = self.network.endpoint_latency_s + _LEAF_HOPS * self.network.per_hop_latency_s
        if num_domains > 1:
            factor, hops, forwarded = self._inter_path(ranks)
            inter_bandwidth *= factor
            inter_latency = self.network.endpoint_latency_s + hops * self.network.per_hop_latency_s
            if forwarded:
                inter_latency += self.node.intra_node_latency_s
        return GroupLinks(
            size=len(ranks),
            num_nodes=num_domains,
            ranks_per_node=max(counts.values()),
            intra_bandwidth_Bps=self.node.intra_node_bandwidth_Bps,
            intra_latency_s=self.node.intra_node_latency_s,
            inter_bandwidth_Bps=inter_bandwidth,
            inter_latency_s=inter_latency,
            nvls=self.node.nvls and num_domains == 1,
            intra_efficiency=intra_node_efficiency(self.node),
            inter_efficiency=self.network.efficiency,
            nvls_efficiency=nvls_efficiency(self.node),
            intra_fabric=self.node.intra_node_fabric,
            calibration=self.gpu.calibration if num_domains == 1 else None,
        )

    def p2p_links(self, src: int, dst: int) -> tuple[float, float]:
        """(bandwidth_Bps, latency_s) of a point-to-point transfer from rank ``src`` to ``dst``:
        achievable bandwidth (link rate x efficiency) and one-way latency."""
        if src == dst:
            raise ValueError(f"p2p source and destination are the same rank {src}")
        links = self.group_links([src, dst])
        if links.num_nodes == 1:
            return links.intra_bandwidth_Bps * links.intra_efficiency, links.intra_latency_s
        return links.inter_bandwidth_Bps * links.inter_efficiency, links.inter_latency_s

    def graph(self) -> nx.Graph:
        """The cluster as a networkx graph (built once, then cached). Vertices: ("gpu", r),
        ("nvswitch", domain), ("nic", node, i), ("leaf", block, rail), ("spine", 0); every vertex has
        a ``kind`` and GPUs/NICs a ``node``. Edges carry ``bandwidth_Bps`` and ``latency_s``."""
        if "graph" not in self._cache:
            self._cache["graph"] = _build_graph(self)
        graph: nx.Graph = self._cache["graph"]
        return graph

    def path_switch_hops(self, src: int, dst: int) -> int:
        """Network switches (leaf/spine) on the shortest graph path between two ranks."""
        path = nx.shortest_path(self.graph(), ("gpu", src), ("gpu", dst))
        return sum(1 for v in path if v[0] in ("leaf", "spine"))


def _build_graph(cluster: Cluster) -> nx.Graph:
    node, network = cluster.node, cluster.network
    graph = nx.Graph()
    spine = ("spine", 0)
    has_spine = network.topology != "rail-only"
    leaves: set[tuple[str, int, int]] = set()
    for r in range(cluster.num_gpus):
        graph.add_node(("gpu", r), kind="gpu", node=cluster.node_of(r), local_index=cluster.local_index(r))
        switch = ("nvswitch", cluster.domain_of(r))
        graph.add_node(switch, kind="nvswitch")
        graph.add_edge(("gpu", r), switch, bandwidth_Bps=node.intra_node_bandwidth_Bps, latency_s=node.intra_node_latency_s)
    for n in range(cluster.num_nodes):
        for i, group in enumerate(node.nics.gpu_affinity or tuple((g,) for g in range(node.gpus_per_node))):
            nic = ("nic", n, i)
            graph.add_node(nic, kind="nic", node=n)
            for local in group:
                rank = n * node.gpus_per_node + local
                if rank < cluster.num_gpus:
                    graph.add_edge(("gpu", rank), nic, bandwidth_Bps=node.nics.bandwidth_Bps, latency_s=0.0)
            rail = group[0] if network.topology in ("rail-optimized", "rail-only") and group else -1
            leaf = ("leaf", n // network.nodes_per_leaf, rail)
            graph.add_node(leaf, kind="leaf")
            leaves.add(leaf)
            graph.add_edge(nic, leaf, bandwidth_Bps=network.link_bandwidth_Bps, latency_s=network.per_hop_latency_s + network.endpoint_latency_s)
    # Leaf up-links: the leaf's down-link capacity divided by the oversubscription ratio.
    ports_per_leaf = network.nodes_per_leaf * (node.nics.count if network.topology not in ("rail-optimized", "rail-only") else 1)
    uplink_Bps = ports_per_leaf * network.link_bandwidth_Bps / network.oversubscription
    for leaf in sorted(leaves):
        if has_spine:
            graph.add_node(spine, kind="spine")
            graph.add_edge(leaf, spine, bandwidth_Bps=uplink_Bps, latency_s=network.per_hop_latency_s)
        else:
            rail_spine = ("spine", 1 + leaf[2])  # rail-only: each rail's own upper level
            graph.add_node(rail_spine, kind="spine")
            graph.add_edge(leaf, rail_spine, bandwidth_Bps=uplink_Bps, latency_s=network.per_hop_latency_s)
    return graph


def build_cluster(gpu: GpuSpec, node: NodeSpec, network: NetworkSpec, num_gpus: int) -> Cluster:
    """A cluster of ``num_gpus`` GPUs; raises ValueError when the node does not hold this GPU or a
    field is out of range."""
    if num_gpus <= 0:
        raise ValueError(f"num_gpus {num_gpus} must be > 0")
    if node.gpu != gpu.name:
        raise ValueError(f"node {node.name} holds {node.gpu}, not {gpu.name}")
    if network.topology not in TOPOLOGIES:
        raise ValueError(f"network {network.name}: topology '{network.topology}' must be one of {', '.join(TOPOLOGIES)}")
    if network.nodes_per_leaf < 1:
        raise ValueError(f"network {network.name}: nodes_per_leaf {network.nodes_per_leaf} must be >= 1")
    if network.oversubscription < 1.0:
        raise ValueError(f"network {network.name}: oversubscription {network.oversubscription} must be >= 1.0")
    return Cluster(gpu=gpu, node=node, network=network, num_gpus=num_gpus)


def spanning_links(parts: Sequence[tuple[Cluster, Sequence[int]]]) -> GroupLinks:
    """The bottleneck links of one process group whose ranks lie in several clusters (the groups of
    a heterogeneous job: their own nodes, joined by one network): ``parts`` holds each cluster with
    its ranks of the group. A group inside one cluster sees that cluster's links; across clusters its
    traffic leaves through the slowest NIC share of any member, crosses the spine (the clusters hold
    different nodes, so different leaves: 1/oversubscription and leaf-spine-leaf hops), and every
    per-node term takes the slowest cluster's value."""
    used = [(c, list(r)) for c, r in parts if len(r)]
    if not used:
        raise ValueError("a process group needs at least one rank; got none in any cluster")
    if len(used) == 1:
        return used[0][0].group_links(used[0][1])
    each = [c.group_links(r) for c, r in used]
    network = used[0][0].network
    if any(c.network != network for c, _ in used):
        raise ValueError("clusters joined in one process group must share one network")
    nic = min(c.nic_share_Bps(c.local_index(rank)) for c, ranks in used for rank in ranks)
    return GroupLinks(
        size=sum(g.size for g in each),
        num_nodes=sum(g.num_nodes for g in each),
        ranks_per_node=max(g.ranks_per_node for g in each),
        intra_bandwidth_Bps=min(g.intra_bandwidth_Bps for g in each),
        intra_latency_s=max(g.intra_latency_s for g in each),
        inter_bandwidth_Bps=nic / network.oversubscription,
        inter_latency_s=network.endpoint_latency_s + _SPINE_HOPS * network.per_hop_latency_s,
        nvls=False,
        intra_efficiency=min(g.intra_efficiency for g in each),
        inter_efficiency=network.efficiency,
        nvls_efficiency=min(g.nvls_efficiency for g in each),
        intra_fabric=each[min(range(len(each)), key=lambda k: each[k].intra_bandwidth_Bps)].intra_fabric,
        calibration=None,
    )


def spanning_p2p_links(src: tuple[Cluster, int], dst: tuple[Cluster, int]) -> tuple[float, float]:
    """``Cluster.p2p_links`` between a rank of one cluster and a rank of another (or the same)."""
    if src[0] is dst[0]:
        return src[0].p2p_links(src[1], dst[1])
    links = spanning_links([(src[0], [src[1]]), (dst[0], [dst[1]])])
    return links.inter_bandwidth_Bps * links.inter_efficiency, links.inter_latency_s
