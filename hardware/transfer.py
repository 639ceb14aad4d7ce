"""Transfers between memory tiers of one node: GPU HBM, host DRAM, NVMe.

time = per-hop latency + bytes / bandwidth of the slowest link on the path; a two-hop path that is
staged through host memory (NVMe <-> CPU <-> HBM without GPUDirect Storage) is store-and-forward, so
its hop times add. Pure function of the node and GPU specs.
"""

from __future__ import annotations

from hardware.cost import hbm_time_s, launch_overhead_s
from hardware.specs import GpuSpec, NodeSpec, Tier

# Fixed cost of one host<->device cudaMemcpy (driver call, DMA descriptor setup, completion). Fitted on
# te42kyfo/gpu-benches README cuda-memcpy (V100 PCIe, H2D): t = L + V / 12.35 GB/s over 256 KB..8 MB
# gives L = 25-31 us (e.g. 1 MB: 0.11 ms - 1.049 MB / 12.35 GB/s = 25 us; 4 MB: 0.37 - 0.340 = 30 us).
HOST_DEVICE_COPY_LATENCY_S = 28e-6
# One NVMe I/O round trip: ~20 us read, ~30 us write for a datacenter NVMe SSD (simplyblock, "NVMe
# Latency Explained", comparison table); large transfers are bandwidth-bound and these are negligible.
NVME_READ_LATENCY_S = 20e-6
NVME_WRITE_LATENCY_S = 30e-6


def _host_device_s(bytes_moved: float, node: NodeSpec, to_device: bool) -> float:
    bandwidth_Bps = node.host_to_device_Bps if to_device else node.device_to_host_Bps
    return HOST_DEVICE_COPY_LATENCY_S + bytes_moved / bandwidth_Bps


def _nvme_s(bytes_moved: float, node: NodeSpec, read: bool) -> float:
    if read:
        return NVME_READ_LATENCY_S + bytes_moved / node.nvme_read_Bps
    return NVME_WRITE_LATENCY_S + bytes_moved / node.nvme_write_Bps


def transfer_time_s(
    bytes_moved: float,
    src: Tier,
    dst: Tier,
    node: NodeSpec,
    gpu: GpuSpec,
    *,
    gpudirect: bool = False,
) -> float:
    """Seconds to move ``bytes_moved`` from tier ``src`` to tier ``dst`` for one GPU of ``node``.

    - HBM <-> CPU: the node's per-GPU copy-engine bandwidth (PCIe or C2C) + one memcpy latency.
    - CPU <-> NVMe: NVMe read/write bandwidth + one I/O latency.
    - HBM <-> NVMe: staged through a host bounce buffer (the two hops add), or with
      ``gpudirect=True`` (GPUDirect Storage; the node must have it) one DMA at the slower of NVMe and
      the host link, paying both latencies.
    - HBM -> HBM: a device-local copy kernel (reads and writes every byte).
    - CPU -> CPU: a host memcpy at the node's DRAM bandwidth (reads and writes every byte).
    ``gpudirect`` only changes HBM <-> NVMe paths. Zero bytes cost zero.
    """
    if bytes_moved < 0:
        raise ValueError(f"bytes_moved = {bytes_moved} must be >= 0")
    src, dst = Tier(src), Tier(dst)
    if gpudirect and not node.gpudirect_storage:
        raise ValueError(f"gpudirect = True but node {node.name} has gpudirect_storage = false")
    if bytes_moved == 0:
        return 0.0
    pair = (src, dst)
    if pair == (Tier.HBM, Tier.HBM):
        return hbm_time_s(gpu, 2.0 * bytes_moved) + launch_overhead_s(gpu)
    if pair == (Tier.CPU, Tier.CPU):
        return 2.0 * bytes_moved / node.cpu_dram_bandwidth_Bps
    if pair == (Tier.NVME, Tier.NVME):
        raise ValueError(f"transfer {src.value} -> {dst.value} is not a tier move; allowed: hbm, cpu, nvme pairs except nvme -> nvme")
    if pair == (Tier.CPU, Tier.HBM):
        return _host_device_s(bytes_moved, node, to_device=True)
    if pair == (Tier.HBM, Tier.CPU):
        return _host_device_s(bytes_moved, node, to_device=False)
    if pair == (Tier.NVME, Tier.CPU):
        return _nvme_s(bytes_moved, node, read=True)
    if pair == (Tier.CPU, Tier.NVME):
        return _nvme_s(bytes_moved, node, read=False)
    to_device = dst == Tier.HBM  # remaining pairs: NVMe <-> HBM
    if gpudirect:
        host_Bps = node.host_to_device_Bps if to_device else node.device_to_host_Bps
        nvme_Bps = node.nvme_read_Bps if to_device else node.nvme_write_Bps
        nvme_latency_s = NVME_READ_LATENCY_S if to_device else NVME_WRITE_LATENCY_S
        return HOST_DEVICE_COPY_LATENCY_S + nvme_latency_s + bytes_moved / min(host_Bps, nvme_Bps)
    return _nvme_s(bytes_moved, node, read=to_device) + _host_device_s(bytes_moved, node, to_device=to_device)
