"""Collective-communication cost model (NCCL-like): all-reduce, all-gather, reduce-scatter,
all-to-all, broadcast and send/recv over ring, tree, hierarchical and NVLS algorithms.

Model (a reduced port of NCCL ``src/graph/tuning.cc``; constants cited below). For an algorithm
``a`` and a protocol ``p`` in {LL, LL128, Simple}:

    T(a, p) = launch_overhead + baseLat(a, p) + sum of per-step hop latencies
              + bus_factor * S / (bus_bandwidth * protocol_fraction(a, p))

plus a pipeline fill, ``1/4 x bus_factor x min(S, nChannels x n x step) / bandwidth``: NCCL moves
each channel's share through a FIFO of 8 step slots, and until the per-rank per-channel share fills
a slot the slice pipeline is not in steady state, so mid-size messages (the 16-256 MiB of
tensor-parallel training) run at ~0.8 of the plateau bandwidth; NVLS pays the same over 128 KiB
chunks. The algorithm's time is the minimum over its protocols, as NCCL's tuner picks the protocol
with the least modelled time. This gives the size-dependent bus-bandwidth ramp physically: small
messages are latency-bound on LL (cheap per step, a quarter of the bandwidth), medium ones use
LL128, large ones Simple (full bandwidth, the most latency). The large-message plateau is a fabric
property: ``bus_bandwidth = link bandwidth x efficiency`` (``GroupLinks.intra_efficiency``,
``inter_efficiency``, ``nvls_efficiency``, filled by ``hardware.topology`` from the catalog).

Message size ``S`` is the full buffer for all-reduce and broadcast, the gathered output for
all-gather, the input for reduce-scatter, the per-rank send buffer for all-to-all and the bytes
sent for send/recv (the nccl-tests convention, so bus bandwidth = bus_factor x S / T).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from hardware import units


class Collective(StrEnum):
    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"
    BROADCAST = "broadcast"
    SEND_RECV = "send_recv"


# An MoE layer's node-deduplicating token dispatch / combine: an op's collective name priced from its
# routing by token_dispatch_time_s, not a Collective of collective_time_s
TOKEN_DISPATCH = "token_dispatch"


class Algorithm(StrEnum):
    RING = "ring"
    TREE = "tree"  # double binary tree across nodes, chain inside a node (all-reduce only)
    HIERARCHICAL = "hierarchical"  # intra-node reduce-scatter, inter-node all-reduce, intra-node all-gather
    NVLS = "nvls"  # NVLink SHARP: reduction in the NVSwitch (all-reduce inside one NVLink domain)


class Protocol(StrEnum):
    LL = "ll"
    LL128 = "ll128"
    SIMPLE = "simple"


# Per-call cost outside NCCL's own latency model: kernel launch, host enqueue and stream sync as
# a framework sees them. Derivation: the 8-GPU all-reduce floor is 43.8 us at 32 KiB on DGX A100
# (nccl-tests) and 38-40 us at 32-512 KiB on HGX H200 (torch all_reduce_bench) (stas00/ml-engineering
# network/README.md, reference microbenchmarks.md C2), while NCCL's modelled ring LL latency for
# 8 ranks is 6.6 + 14 x 0.6 = 15 us (tuning.cc, NCCL 2.2x); 43.8 - 15 = 28.8 us, rounded to 30 us.
COLLECTIVE_LAUNCH_OVERHEAD_S = 30.0 * units.us

# NCCL baseLat (us), NCCL 2.2x constants quoted in NVIDIA/nccl#1334 (reference C2).
_BASE_LATENCY_US: dict[Algorithm, dict[Protocol, float]] = {
    Algorithm.RING: {Protocol.LL: 6.6, Protocol.LL128: 14.0, Protocol.SIMPLE: 8.4},
    Algorithm.TREE: {Protocol.LL: 6.8, Protocol.LL128: 14.0, Protocol.SIMPLE: 0.0},
}
# NCCL hwLat (us) per step, by medium: NVLink and PCI from NCCL 2.2x (nccl#1334); NET ring from the
# NCCL 2.7 tuning.cc (commit 01afd20a; the 2.2x quote is truncated there), NET tree from 2.2x.
_HW_LATENCY_US: dict[str, dict[Algorithm, dict[Protocol, float]]] = {
    "nvlink": {
        Algorithm.TREE: {Protocol.LL: 0.6, Protocol.LL128: 1.25, Protocol.SIMPLE: 28.0},
        Algorithm.RING: {Protocol.LL: 0.6, Protocol.LL128: 1.9, Protocol.SIMPLE: 3.4},
    },
    "pci": {
        Algorithm.TREE: {Protocol.LL: 1.0, Protocol.LL128: 1.9, Protocol.SIMPLE: 28.0},
        Algorithm.RING: {Protocol.LL: 1.0, Protocol.LL128: 2.5, Protocol.SIMPLE: 5.7},
    },
    "net": {
        Algorithm.TREE: {Protocol.LL: 5.0, Protocol.LL128: 8.5, Protocol.SIMPLE: 28.0},
        Algorithm.RING: {Protocol.LL: 2.7, Protocol.LL128: 4.0, Protocol.SIMPLE: 9.6},
    },
}
# NVLS / NVLS-Tree hwLat, Simple only: 25 us (NCCL 2.2x, nccl#1334).
_NVLS_LATENCY_S = 25.0 * units.us

# ---- Channel / step structure (the mid-size ramp) ----
# NCCL splits a collective over nChannels rings; each channel moves its share through a FIFO of
# NCCL_STEPS = 8 slots (src/include/collectives.h / devcomm.h). One slot ("step") holds, per protocol:
#   Simple: NCCL_BUFFSIZE 4 MiB / 8 = 512 KiB;
#   LL128:  NCCL_LL128_ELEMS_PER_THREAD 120 x 8 B x NCCL_LL128_MAX_NTHREADS 640 = 614,400 B, of which
#           120/128 is data (8 B flag per 128 B line);
#   LL:     NCCL_LL_LINES_PER_THREAD 8 x 16 B x NCCL_LL_MAX_NTHREADS 512 = 64 KiB, half of it data.
# (aws-ofi-nccl's tuner ring model builds its window from the same buffer formulas.)
_NCCL_STEPS = 8
_STEP_DATA_BYTES: dict[Protocol, float] = {
    Protocol.SIMPLE: 4 * units.MiB / _NCCL_STEPS,
    Protocol.LL128: 120 * 8 * 640 * 120 / 128,
    Protocol.LL: 8 * 16 * 512 / 2,
}
# Pipeline fill. Every step of a ring is store-and-forward at slice granularity: a rank forwards
# a slice only once it has fully landed, and the FIFO holds NCCL_STEPS / ALLREDUCE_SLICESTEPS =
# 8 / 2 = 4 slices. While the slices a channel moves are smaller than a step slot the FIFO never
# reaches steady state, and each transfer costs 1 + 1/4 of its wire time (one slice in four is a
# bubble); once the per-rank per-channel share S / (n x nCh) reaches a full slot, NCCL loops over
# windows of nCh x n x step bytes whose bubbles overlap the next window, so the extra time stops
# growing: fill = 1/4 x bus_factor x min(S, nCh x n x step) / busBw. The fraction is taken from
# NCCL's slice-to-FIFO ratio rather than fitted per size; it reproduces the ~0.8 x peak plateau of
# the A100 sweep at 64-256 MiB and the return to peak beyond the 96 MiB window (tests check both).
_PIPELINE_FILL_FRACTION = 2 / _NCCL_STEPS
# NCCL's topology search builds rings of one NVLink each and duplicates them (two channels per
# link) up to MAXCHANNELS = 32 (src/graph/search.cc, src/include/comm.h); an NVLink3/4 link is
# 25 GB/s per direction, so one channel stands for 12.5 GB/s of link rate: DGX A100 300 / 12.5 =
# 24 channels, H100/H200 450 / 12.5 = 36 -> 32.
_CHANNEL_LINK_RATE_Bps = 12.5 * units.GBps
_MAX_CHANNELS = 32
# NVLS moves chunks of 128 KiB per channel (comm->nvlsChunkSize default, NCCL enqueue.cc) and
# pays the same fill over a window of nCh x n chunks. Assumption: the NVLS kernel runs on as many
# channels as the rings (32 on H100/H200); with 16 channels (NCCL_NVLS_NCHANNELS of early
# NVLS releases) the H200 sweep's 32-64 MiB points come out ~8 points more optimistic.
_NVLS_CHUNK_BYTES = 128 * units.KiB

# Protocol bandwidth fractions of the bus bandwidth (NCCL tuning.cc, ncclTopoTuneModel):
# ring LL busBw x 1/4 (all-reduce or multi-node) else 1/3; ring LL128 x 0.92 (0.7 with one rank
# per node); tree busBw x 0.92, then LL x 1/3.8, LL128 x 7/9 (one node) or 120/128 (several nodes).
_RING_LL128_FRACTION = 0.92
_RING_LL128_ONE_PER_NODE_FRACTION = 0.7
_TREE_FRACTION = 0.92
_TREE_LL_FRACTION = 1.0 / 3.8


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupLinks:
    """What one process group sees of the topology (from ``hardware.topology``).

    Bandwidths are link rates; the ``*_efficiency`` fields turn them into the achievable
    large-message bus bandwidth (defaults 1.0: an ideal fabric, as for pure alpha-beta inputs)."""

    size: int  # ranks in the group
    num_nodes: int  # distinct nodes (NVLink domains) the group spans
    ranks_per_node: int  # group ranks inside one node (the largest count when uneven)
    intra_bandwidth_Bps: float  # per rank, per direction, inside a node
    intra_latency_s: float  # per ring step inside a node (NCCL LL hop)
    inter_bandwidth_Bps: float  # per rank, per direction, across nodes (bottleneck incl. oversubscription)
    inter_latency_s: float  # per ring step across nodes (NIC + switch hops)
    nvls: bool  # NVLink SHARP usable by this group
    intra_efficiency: float = 1.0  # ring bus bandwidth / intra link rate at large messages
    inter_efficiency: float = 1.0  # achieved / NIC link rate at large messages
    nvls_efficiency: float = 1.0  # NVLS all-reduce algorithm bandwidth / intra link rate
    intra_fabric: str = "nvswitch"  # selects NCCL's PCI or NVLink per-step latencies
    launch_overhead_s: float = COLLECTIVE_LAUNCH_OVERHEAD_S
    # A serving stack's own all-reduce kernel launched inside its engine (TensorRT-LLM's AllReduce plugin):
    # all-reduces of at most ``kernel_all_reduce_max_bytes`` pay ``kernel_launch_s`` (one kernel launch)
    # per call instead of ``launch_overhead_s`` (0: every call pays the latter)
    kernel_all_reduce_max_bytes: float = 0.0
    kernel_launch_s: float = 0.0
    # The GPU's calibration profile (``hardware.calibration``) when the group lies inside one node;
    # its measured curve for (collective, size) replaces the model's kernel time in coverage.
    calibration: Any = None


def bus_factor(kind: Collective, num_ranks: int) -> float:
    """nccl-tests PERFORMANCE.md factor: bus bandwidth = factor x S / time."""
    n = num_ranks
    if kind == Collective.ALL_REDUCE:
        return 2.0 * (n - 1) / n
    if kind in (Collective.ALL_GATHER, Collective.REDUCE_SCATTER, Collective.ALL_TO_ALL):
        return (n - 1) / n
    return 1.0


def _ring_steps(kind: Collective, n: int) -> int:
    if kind == Collective.ALL_REDUCE:
        return 2 * (n - 1)
    if kind == Collective.SEND_RECV:
        return 1
    return n - 1


def ring_alpha_beta_time_s(
    kind: Collective, message_bytes: float, num_ranks: int, step_latency_s: float, bus_bandwidth_Bps: float
) -> float:
    """Textbook ring time: steps x alpha + bus_factor x S / BW (formulas.md 4.4), e.g. all-reduce
    2(n-1) alpha + 2(n-1)/n S/BW. Zero for one rank or an empty message."""
    if num_ranks <= 1 or message_bytes <= 0:
        return 0.0
    return _ring_steps(kind, num_ranks) * step_latency_s + bus_factor(kind, num_ranks) * message_bytes / bus_bandwidth_Bps


def _intra_medium(links: GroupLinks) -> str:
    return "pci" if links.intra_fabric == "pcie" else "nvlink"


def _step_latencies_s(links: GroupLinks, algorithm: Algorithm, protocol: Protocol) -> tuple[float, float]:
    """(intra, inter) per-step latency: the link's own latency (an LL ring hop) plus NCCL's extra
    per-step cost of this algorithm/protocol over an LL ring hop on the same medium."""
    intra_table = _HW_LATENCY_US[_intra_medium(links)]
    net_table = _HW_LATENCY_US["net"]
    intra_extra = intra_table[algorithm][protocol] - intra_table[Algorithm.RING][Protocol.LL]
    inter_extra = net_table[algorithm][protocol] - net_table[Algorithm.RING][Protocol.LL]
    return links.intra_latency_s + intra_extra * units.us, links.inter_latency_s + inter_extra * units.us


def _bus_bandwidth_Bps(links: GroupLinks) -> float:
    """Large-message ring bus bandwidth: NVLink inside a node, the node's NIC share across nodes."""
    intra = links.intra_bandwidth_Bps * links.intra_efficiency
    if links.num_nodes <= 1:
        return intra
    inter = links.ranks_per_node * links.inter_bandwidth_Bps * links.inter_efficiency
    return inter if links.ranks_per_node <= 1 else min(intra, inter)


def network_floor_s(kind: Collective, message_bytes: float, links: GroupLinks) -> float:
    """A lower bound on an all-reduce, reduce-scatter or all-gather across nodes, whatever the algorithm:
    each node must send (reduce-scatter, all-reduce) or receive (all-gather) the (n - 1)/n of the buffer
    that other ranks hold, at no more than the group's large-message network bandwidth; no latency,
    pipeline fill or slower protocol. (A ring all-reduce moves twice that; a tree or in-network
    reduction can come closer to it.) Zero for a group inside one node (NVLink, not the network)."""
    kind = _check(kind, message_bytes, links)
    if kind not in (Collective.ALL_REDUCE, Collective.REDUCE_SCATTER, Collective.ALL_GATHER):
        raise ValueError(f"network_floor_s: {kind} is not all_reduce, reduce_scatter or all_gather")
    if links.num_nodes <= 1 or message_bytes <= 0:
        return 0.0
    return (links.size - 1) / links.size * message_bytes / _bus_bandwidth_Bps(links)


def num_channels(links: GroupLinks) -> int:
    """Rings NCCL builds for this group: one per 12.5 GB/s of the bottleneck link rate (two per
    NVLink inside a node; across nodes the node's NIC rate), at least 1, at most MAXCHANNELS = 32."""
    rate_Bps = links.intra_bandwidth_Bps
    if links.num_nodes > 1:
        rate_Bps = min(rate_Bps, links.ranks_per_node * links.inter_bandwidth_Bps)
    return max(1, min(_MAX_CHANNELS, round(rate_Bps / _CHANNEL_LINK_RATE_Bps)))


def pipeline_fill_bytes(kind: Collective, message_bytes: float, links: GroupLinks, protocol: Protocol) -> float:
    """Extra bus bytes' worth of time a ring spends outside steady state (see
    _PIPELINE_FILL_FRACTION): 1/4 x bus_factor x min(S, nCh x n x step_p)."""
    if links.size <= 1 or message_bytes <= 0:
        return 0.0
    window = num_channels(links) * links.size * _STEP_DATA_BYTES[protocol]
    return _PIPELINE_FILL_FRACTION * bus_factor(kind, links.size) * min(message_bytes, window)


def _ring_fraction(kind: Collective, links: GroupLinks, protocol: Protocol) -> float:
    if protocol == Protocol.LL:
        return 0.25 if (links.num_nodes > 1 or kind == Collective.ALL_REDUCE) else 1.0 / 3.0
    if protocol == Protocol.LL128:
        return _RING_LL128_ONE_PER_NODE_FRACTION if links.ranks_per_node < 2 else _RING_LL128_FRACTION
    return 1.0


def _ring_time_s(kind: Collective, message_bytes: float, links: GroupLinks, protocol: Protocol) -> float:
    n = links.size
    steps = _ring_steps(kind, n)
    # A ring visits each node once per lap, so num_nodes of every n steps cross the network.
    inter_steps = round(steps * links.num_nodes / n) if links.num_nodes > 1 else 0
    intra_step_s, inter_step_s = _step_latencies_s(links, Algorithm.RING, protocol)
    latency_s = (
        links.launch_overhead_s
        + _BASE_LATENCY_US[Algorithm.RING][protocol] * units.us
        + (steps - inter_steps) * intra_step_s
        + inter_steps * inter_step_s
    )
    bandwidth = _bus_bandwidth_Bps(links) * _ring_fraction(kind, links, protocol)
    fill_s = pipeline_fill_bytes(kind, message_bytes, links, protocol) / bandwidth
    return latency_s + bus_factor(kind, n) * message_bytes / bandwidth + fill_s


def _tree_time_s(message_bytes: float, links: GroupLinks, protocol: Protocol) -> float:
    """NCCL tree all-reduce: latency 2((n/nodes - 1) intra + log2(nodes) inter), algBw = busBw / 2."""
    intra_step_s, inter_step_s = _step_latencies_s(links, Algorithm.TREE, protocol)
    per_node = max(links.size // max(links.num_nodes, 1), 1)
    latency_s = (
        links.launch_overhead_s
        + _BASE_LATENCY_US[Algorithm.TREE][protocol] * units.us
        + 2 * ((per_node - 1) * intra_step_s + int(math.log2(links.num_nodes)) * inter_step_s)
    )
    fraction = _TREE_FRACTION
    if protocol == Protocol.LL:
        fraction *= _TREE_LL_FRACTION
    elif protocol == Protocol.LL128:
        fraction *= 7.0 / 9.0 if links.num_nodes <= 1 else 120.0 / 128.0
    return latency_s + 2.0 * message_bytes / (_bus_bandwidth_Bps(links) * fraction)


def _nvls_time_s(message_bytes: float, links: GroupLinks) -> float:
    """NVLS all-reduce: each GPU sends and receives S once (the switch reduces), so the algorithm
    bandwidth is the link rate x nvls_efficiency; Simple protocol only."""
    bandwidth = links.intra_bandwidth_Bps * links.nvls_efficiency
    window = num_channels(links) * links.size * _NVLS_CHUNK_BYTES
    fill_s = _PIPELINE_FILL_FRACTION * min(message_bytes, window) / bandwidth
    return links.launch_overhead_s + _NVLS_LATENCY_S + message_bytes / bandwidth + fill_s


def all_to_all_traffic_bytes(message_bytes: float, links: GroupLinks) -> tuple[float, float]:
    """(intra-node, inter-node) bytes one rank sends in an all-to-all of ``message_bytes`` per rank:
    S/n to each other rank, (ranks_per_node - 1) of them in its node."""
    n = links.size
    if n <= 1:
        return 0.0, 0.0
    local_peers = min(links.ranks_per_node, n) - 1
    return message_bytes * local_peers / n, message_bytes * (n - 1 - local_peers) / n


def _all_to_all_time_s(message_bytes: float, links: GroupLinks) -> float:
    """Pairwise exchange (NCCL grouped send/recv, Simple): the intra- and inter-node parts run
    concurrently; latency (n-1) alpha as in formulas.md 4.4."""
    return _pairwise_exchange_time_s(*all_to_all_traffic_bytes(message_bytes, links), links)


def _pairwise_exchange_time_s(intra_bytes: float, inter_bytes: float, links: GroupLinks) -> float:
    """A rank sending ``intra_bytes`` to peers in its node and ``inter_bytes`` to other nodes, both
    parts concurrently at the group's achievable bandwidths, with (n-1) step latencies."""
    intra_step_s, inter_step_s = _step_latencies_s(links, Algorithm.RING, Protocol.SIMPLE)
    time_s = intra_bytes / (links.intra_bandwidth_Bps * links.intra_efficiency)
    step_s = intra_step_s
    if inter_bytes > 0:
        time_s = max(time_s, inter_bytes / (links.inter_bandwidth_Bps * links.inter_efficiency))
        step_s = inter_step_s
    return links.launch_overhead_s + _BASE_LATENCY_US[Algorithm.RING][Protocol.SIMPLE] * units.us + (links.size - 1) * step_s + time_s


def _routing_miss_probability(experts: int, top_k: int, held: int) -> float:
    """Probability that none of a token's ``top_k`` distinct experts, drawn uniformly from ``experts``,
    is among ``held`` of them: C(experts - held, top_k) / C(experts, top_k)."""
    if top_k > experts - held:
        return 0.0
    return math.prod((experts - held - i) / (experts - i) for i in range(top_k))


def token_dispatch_traffic_bytes(token_bytes: float, links: GroupLinks, *, experts: int, top_k: int) -> tuple[float, float]:
    """(intra-node, inter-node) bytes one rank sends in a node-deduplicating token dispatch (DeepEP's
    normal kernels "with NVLink and RDMA forwarding", deepseek-ai/DeepEP docs/legacy.md; NVIDIA's
    HybridEP: Megatron-Core's ``flex`` dispatcher) of ``token_bytes`` of
    distinct tokens, each routed to ``top_k`` of ``experts`` spread evenly over the group's ranks.

    A token crosses to another node once, to the rank of the same local index there, if any of its
    experts lives on that node, and that rank forwards it over NVLink to each other rank of its node
    holding one of them; inside its own node it goes once to each other rank holding one (an NCCL
    all-to-all of the permuted copies sends one copy per chosen expert instead). Uniform routing,
    whole nodes: per rank the inter-node bytes are T (N - 1) p_node and the NVLink bytes, its own
    node's copies plus the forwards of what it received, T N (g - 1) p_rank, where p_node and p_rank
    are the chances that a token picks at least one expert of a given node / rank
    (``_routing_miss_probability``)."""
    n, g = links.size, min(links.ranks_per_node, links.size)
    if n <= 1 or token_bytes <= 0:
        return 0.0, 0.0
    if experts % n or not 1 <= top_k <= experts:
        raise ValueError(f"token dispatch of top {top_k} of {experts} experts over {n} ranks: experts must divide evenly and top_k be 1..experts")
    nodes = -(-n // g)
    p_rank = 1.0 - _routing_miss_probability(experts, top_k, experts // n)
    p_node = 1.0 - _routing_miss_probability(experts, top_k, experts // n * g)
    return token_bytes * nodes * (g - 1) * p_rank, token_bytes * (nodes - 1) * p_node


def token_dispatch_time_s(token_bytes: float, links: GroupLinks, *, experts: int, top_k: int) -> float:
    """Seconds of a node-deduplicating token dispatch (or its mirror, the combine) of ``token_bytes``
    of distinct tokens per rank (``token_dispatch_traffic_bytes``): the NVLink and RDMA parts run
    concurrently at the group's achievable bandwidths, plus the all-to-all's launch and step latencies."""
    intra_bytes, inter_bytes = token_dispatch_traffic_bytes(token_bytes, links, experts=experts, top_k=top_k)
    if intra_bytes <= 0 and inter_bytes <= 0:
        return 0.0
    if inter_bytes <= 0:
        # inside one node: the measured all-to-all of the same NVLink bytes where the profile has one
        # (an all-to-all of M bytes per rank sends M (n - 1) / n of them), as an all-to-all is priced
        measured = calibrated_collective_s(Collective.ALL_TO_ALL, intra_bytes * links.size / (links.size - 1), links)
        if measured is not None:
            return measured + links.launch_overhead_s
    return _pairwise_exchange_time_s(intra_bytes, inter_bytes, links)


def _send_recv_time_s(message_bytes: float, links: GroupLinks) -> float:
    if links.num_nodes > 1:
        latency_s, bandwidth = links.inter_latency_s, links.inter_bandwidth_Bps * links.inter_efficiency
    else:
        latency_s, bandwidth = links.intra_latency_s, links.intra_bandwidth_Bps * links.intra_efficiency
    return links.launch_overhead_s + latency_s + message_bytes / bandwidth


def _hierarchical_time_s(kind: Collective, message_bytes: float, links: GroupLinks) -> float:
    """Two-level form of formulas.md 4.4 (n = n_l x n_g): all-reduce = intra reduce-scatter of S +
    inter all-reduce of S/n_l (n_l rings in parallel, one per local rank) + intra all-gather of S;
    reduce-scatter / all-gather = the intra and inter halves of it. Each phase is one NCCL call."""
    n_local, n_nodes = links.ranks_per_node, links.num_nodes
    intra = replace(links, size=n_local, num_nodes=1)
    inter = replace(links, size=n_nodes, ranks_per_node=1)
    shard = message_bytes / n_local
    if kind == Collective.ALL_REDUCE:
        return (
            _best_ring_s(Collective.REDUCE_SCATTER, message_bytes, intra)
            + _best_ring_s(Collective.ALL_REDUCE, shard, inter)
            + _best_ring_s(Collective.ALL_GATHER, message_bytes, intra)
        )
    return _best_ring_s(kind, message_bytes, intra) + _best_ring_s(kind, shard, inter)


def _best_ring_s(kind: Collective, message_bytes: float, links: GroupLinks) -> float:
    if links.size <= 1 or message_bytes <= 0:
        return 0.0
    return min(_ring_time_s(kind, message_bytes, links, p) for p in Protocol)


_HIERARCHICAL_KINDS = (Collective.ALL_REDUCE, Collective.REDUCE_SCATTER, Collective.ALL_GATHER)


def available_algorithms(kind: Collective, links: GroupLinks) -> tuple[Algorithm, ...]:
    """Algorithms that can run ``kind`` on this group (all-to-all and send/recv: ring = pairwise)."""
    algorithms = [Algorithm.RING]
    if kind == Collective.ALL_REDUCE:
        algorithms.append(Algorithm.TREE)
        if links.nvls and links.num_nodes <= 1:
            algorithms.append(Algorithm.NVLS)
    if kind in _HIERARCHICAL_KINDS and links.num_nodes > 1 and links.ranks_per_node > 1:
        algorithms.append(Algorithm.HIERARCHICAL)
    return tuple(algorithms)


def _time_s(kind: Collective, message_bytes: float, links: GroupLinks, algorithm: Algorithm) -> float:
    if kind == Collective.ALL_TO_ALL:
        return _all_to_all_time_s(message_bytes, links)
    if kind == Collective.SEND_RECV:
        return _send_recv_time_s(message_bytes, links)
    if algorithm == Algorithm.RING:
        return _best_ring_s(kind, message_bytes, links)
    if algorithm == Algorithm.TREE:
        return min(_tree_time_s(message_bytes, links, p) for p in Protocol)
    if algorithm == Algorithm.NVLS:
        return _nvls_time_s(message_bytes, links)
    return _hierarchical_time_s(kind, message_bytes, links)


def _check(kind: Collective, message_bytes: float, links: GroupLinks) -> Collective:
    kind = Collective(kind)
    if message_bytes < 0:
        raise ValueError(f"message_bytes {message_bytes} must be >= 0")
    if links.size < 1 or links.num_nodes < 1 or links.ranks_per_node < 1:
        raise ValueError(
            f"group size {links.size}, num_nodes {links.num_nodes}, ranks_per_node {links.ranks_per_node} must be >= 1"
        )
    return kind


def default_algorithm(kind: Collective, message_bytes: float, links: GroupLinks) -> Algorithm:
    """What an NCCL-like tuner picks: the least modelled time among ring, tree and NVLS. The
    hierarchical form is a framework-level composition NCCL does not choose by itself; tree is
    considered across nodes only, because inside one node NCCL's tree is a chain that its
    treeCorrectionFactor table (tuning.cc: x0.4-0.5 at 256 KiB-2 MiB) keeps from winning, and those
    per-size factors are not modelled here."""
    kind = _check(kind, message_bytes, links)
    candidates = [
        a
        for a in available_algorithms(kind, links)
        if a != Algorithm.HIERARCHICAL and not (a == Algorithm.TREE and links.num_nodes <= 1)
    ]
    if links.size <= 1 or message_bytes <= 0:
        return Algorithm.RING
    return min(candidates, key=lambda a: _time_s(kind, message_bytes, links, a))


def calibrated_collective_s(kind: Collective, message_bytes: float, links: GroupLinks) -> float | None:
    """Measured kernel seconds of this collective from the group's calibration profile (a group inside
    one node, a measured group size, a message size inside the measured range), else None."""
    calibration = links.calibration
    if calibration is None or links.num_nodes != 1:
        return None
    return calibration.collective_s(str(kind), links.size, message_bytes)


def collective_time_s(
    kind: Collective, message_bytes: float, links: GroupLinks, algorithm: Algorithm | None = None
) -> float:
    """Seconds for one collective of ``message_bytes`` (the full buffer for all-reduce, the gathered
    output for all-gather, the input for reduce-scatter, the per-rank send buffer for all-to-all)
    with ``algorithm`` (default: the calibration profile's measured curve in coverage, else
    ``default_algorithm``). Zero for one rank or an empty message;
    ValueError for an algorithm the group cannot run, naming the allowed ones."""
    kind = _check(kind, message_bytes, links)
    if links.size <= 1 or message_bytes <= 0:
        return 0.0
    if kind == Collective.ALL_REDUCE and message_bytes <= links.kernel_all_reduce_max_bytes:
        links = replace(links, launch_overhead_s=links.kernel_launch_s)
    if algorithm is None:
        measured_s = calibrated_collective_s(kind, message_bytes, links)
        if measured_s is not None:
            return measured_s + links.launch_overhead_s
        algorithm = default_algorithm(kind, message_bytes, links)
    else:
        algorithm = Algorithm(algorithm)
        allowed = available_algorithms(kind, links)
        if algorithm not in allowed:
            raise ValueError(
                f"algorithm '{algorithm}' cannot run {kind} on a group of {links.size} ranks over "
                f"{links.num_nodes} nodes (nvls={links.nvls}); allowed: {', '.join(allowed)}"
            )
    return _time_s(kind, message_bytes, links, algorithm)


def bus_bandwidth_Bps(
    kind: Collective, message_bytes: float, links: GroupLinks, algorithm: Algorithm | None = None
) -> float:
    """The bus bandwidth nccl-tests would report for this collective: bus_factor x S / time."""
    time_s = collective_time_s(kind, message_bytes, links, algorithm)
    if time_s <= 0:
        return 0.0
    return bus_factor(Collective(kind), links.size) * message_bytes / time_s
