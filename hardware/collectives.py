"""Collective-communication cost model (NCCL-like): all-reduce, all-gather, reduce-scatter,
all-to-all, broadcast and send/recv over ring, tree, hierarchical and NVLS algorithms.

PROVISIONAL: alpha-beta ring bodies; the size-dependent bus-bandwidth efficiency, tree/NVLS and
hierarchical variants and the default chooser replace them while keeping these signatures.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Collective(StrEnum):
    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"
    BROADCAST = "broadcast"
    SEND_RECV = "send_recv"


class Algorithm(StrEnum):
    RING = "ring"
    TREE = "tree"
    HIERARCHICAL = "hierarchical"  # intra-node reduce-scatter, inter-node all-reduce, intra-node all-gather
    NVLS = "nvls"  # NVLink SHARP: reduction in the NVSwitch


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupLinks:
    """What one process group sees of the topology (from ``hardware.topology``)."""

    size: int  # ranks in the group
    num_nodes: int  # distinct nodes (NVLink domains) the group spans
    ranks_per_node: int  # group ranks inside one node (assumed equal across nodes)
    intra_bandwidth_Bps: float  # per rank, per direction, inside a node
    intra_latency_s: float
    inter_bandwidth_Bps: float  # per rank, per direction, across nodes (bottleneck incl. oversubscription)
    inter_latency_s: float
    nvls: bool  # NVLink SHARP usable by this group


def collective_time_s(
    kind: Collective, message_bytes: float, links: GroupLinks, algorithm: Algorithm | None = None
) -> float:
    """Seconds for one collective of ``message_bytes`` (the full buffer for all-reduce, the gathered
    output for all-gather, the input for reduce-scatter, the per-rank send buffer for all-to-all)."""
    n = links.size
    if n <= 1 or message_bytes <= 0:
        return 0.0
    if links.num_nodes > 1:
        bandwidth, latency = min(links.intra_bandwidth_Bps, links.inter_bandwidth_Bps), links.inter_latency_s
    else:
        bandwidth, latency = links.intra_bandwidth_Bps, links.intra_latency_s
    if kind == Collective.ALL_REDUCE:
        steps, factor = 2 * (n - 1), 2.0 * (n - 1) / n
    elif kind == Collective.SEND_RECV:
        steps, factor = 1, 1.0
    else:
        steps, factor = n - 1, (n - 1) / n
    return steps * latency + factor * message_bytes / bandwidth
