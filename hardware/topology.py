"""Cluster topology (networkx): nodes, GPUs, NVLink domains, NICs, leaf and spine switches; rank
placement; the links a process group or a point-to-point transfer sees.

PROVISIONAL: a minimal version; the full graph and bottleneck analysis replace it while keeping
``build_cluster``, ``Cluster.group_links`` and ``Cluster.p2p_links``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from hardware.collectives import GroupLinks
from hardware.specs import GpuSpec, NetworkSpec, NodeSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class Cluster:
    """``num_gpus`` GPUs in nodes of ``node`` joined by ``network``; rank r is GPU r % gpus_per_node
    of node r // gpus_per_node."""

    gpu: GpuSpec
    node: NodeSpec
    network: NetworkSpec
    num_gpus: int

    @property
    def num_nodes(self) -> int:
        return -(-self.num_gpus // self.node.gpus_per_node)

    def node_of(self, rank: int) -> int:
        return rank // self.node.gpus_per_node

    def _inter_bandwidth_per_gpu_Bps(self) -> float:
        nic_total = self.node.nics.count * self.node.nics.bandwidth_Bps
        return nic_total / self.node.gpus_per_node * self.network.efficiency / self.network.oversubscription

    def group_links(self, ranks: Sequence[int]) -> GroupLinks:
        nodes = {self.node_of(r) for r in ranks}
        return GroupLinks(
            size=len(ranks),
            num_nodes=len(nodes),
            ranks_per_node=len(ranks) // len(nodes),
            intra_bandwidth_Bps=self.node.intra_node_bandwidth_Bps,
            intra_latency_s=self.node.intra_node_latency_s,
            inter_bandwidth_Bps=self._inter_bandwidth_per_gpu_Bps(),
            inter_latency_s=self.network.endpoint_latency_s + 3 * self.network.per_hop_latency_s,
            nvls=self.node.nvls and len(nodes) == 1,
        )

    def p2p_links(self, src: int, dst: int) -> tuple[float, float]:
        """(bandwidth_Bps, latency_s) of a point-to-point transfer from rank ``src`` to ``dst``."""
        if self.node_of(src) == self.node_of(dst):
            return self.node.intra_node_bandwidth_Bps, self.node.intra_node_latency_s
        return self._inter_bandwidth_per_gpu_Bps(), self.network.endpoint_latency_s + 3 * self.network.per_hop_latency_s


def build_cluster(gpu: GpuSpec, node: NodeSpec, network: NetworkSpec, num_gpus: int) -> Cluster:
    """A cluster of ``num_gpus`` GPUs; raises ValueError when the node does not hold this GPU."""
    if num_gpus <= 0:
        raise ValueError(f"num_gpus {num_gpus} must be > 0")
    if node.gpu != gpu.name:
        raise ValueError(f"node {node.name} holds {node.gpu}, not {gpu.name}")
    return Cluster(gpu=gpu, node=node, network=network, num_gpus=num_gpus)
