"""Tier transfers against published host<->device copy numbers (reference/microbenchmarks.md C3)."""

from __future__ import annotations

import dataclasses

import pytest

from hardware import cost, units
from hardware.catalog import default_catalog, get_gpu, get_node
from hardware.specs import NodeSpec, Tier
from hardware.transfer import HOST_DEVICE_COPY_LATENCY_S, transfer_time_s


def _node_or_skip(name: str) -> NodeSpec:
    if name not in default_catalog().nodes:
        pytest.skip(f"node {name} not in the catalog yet")
    return get_node(name)


def _rate_GBps(bytes_moved: float, src: Tier, dst: Tier, node: NodeSpec, **kwargs: bool) -> float:
    gpu = get_gpu(node.gpu)
    return bytes_moved / transfer_time_s(bytes_moved, src, dst, node, gpu, **kwargs) / units.GB


# (node, direction, published GB/s, transfer size): nvbandwidth memcpy plateaus and gpu-benches cuda-memcpy.
HOST_DEVICE = [
    ("dgx-a100", Tier.CPU, Tier.HBM, 25.13, 512 * units.MB),  # NVIDIA/nvbandwidth#42, 512 MB-1 GB
    ("dgx-h100", Tier.CPU, Tier.HBM, 35.2, 512 * units.MB),  # NVIDIA/nvbandwidth#24 host_to_device_memcpy_sm
    ("dgx-h100", Tier.HBM, Tier.CPU, 52.8, 512 * units.MB),  # same report, device_to_host_memcpy_sm
    ("pcie-8x-rtx-4090", Tier.CPU, Tier.HBM, 25.0, 512 * units.MB),  # nvbandwidth#15: 23.9-26.4 per GPU
    ("dgx-1-v100", Tier.CPU, Tier.HBM, 12.35, 256 * units.MB),  # gpu-benches README cuda-memcpy plateau >= 256 MB
]


@pytest.mark.parametrize(("node_name", "src", "dst", "published_GBps", "size_bytes"), HOST_DEVICE)
def test_host_device_bandwidth_matches_published(node_name: str, src: Tier, dst: Tier, published_GBps: float, size_bytes: float) -> None:
    node = _node_or_skip(node_name)
    assert _rate_GBps(size_bytes, src, dst, node) == pytest.approx(published_GBps, rel=0.06)  # 4090 range is +-5 %


# te42kyfo/gpu-benches README, cuda-memcpy on a V100 PCIe (Gen3): size -> GB/s on the way to the plateau.
V100_MEMCPY_CURVE = [(512 * units.KiB, 7.53), (1 * units.MiB, 9.25), (4 * units.MiB, 11.41), (16 * units.MiB, 12.11)]


@pytest.mark.parametrize(("size_bytes", "published_GBps"), V100_MEMCPY_CURVE)
def test_copy_latency_reproduces_small_copy_ramp(size_bytes: float, published_GBps: float) -> None:
    node = _node_or_skip("dgx-1-v100")
    assert _rate_GBps(size_bytes, Tier.CPU, Tier.HBM, node) == pytest.approx(published_GBps, rel=0.10)


def test_additive_in_bytes_for_large_sizes() -> None:
    node = get_node("dgx-a100")
    gpu = get_gpu(node.gpu)
    for src, dst in [(Tier.CPU, Tier.HBM), (Tier.HBM, Tier.CPU), (Tier.NVME, Tier.CPU), (Tier.NVME, Tier.HBM), (Tier.HBM, Tier.HBM)]:
        one = transfer_time_s(1e9, src, dst, node, gpu)
        two = transfer_time_s(2e9, src, dst, node, gpu)
        halves = 2 * transfer_time_s(1e9, src, dst, node, gpu)
        assert two < halves  # one transfer pays the latency once
        assert two == pytest.approx(halves, rel=5e-3)  # ... which is negligible at GB sizes (< 0.3 %)
        assert two - one == pytest.approx(transfer_time_s(3e9, src, dst, node, gpu) - two, rel=1e-9)


def test_exact_small_cases() -> None:
    node = get_node("dgx-a100")
    gpu = get_gpu(node.gpu)
    assert transfer_time_s(0, Tier.CPU, Tier.HBM, node, gpu) == 0.0
    assert transfer_time_s(25.1e9, Tier.CPU, Tier.HBM, node, gpu) == pytest.approx(1.0 + HOST_DEVICE_COPY_LATENCY_S, rel=1e-12)
    assert transfer_time_s(409.6e9, Tier.CPU, Tier.CPU, node, gpu) == pytest.approx(2.0, rel=1e-12)  # read + write
    local = transfer_time_s(1e9, Tier.HBM, Tier.HBM, node, gpu)
    assert local == pytest.approx(cost.memory_op_time_s(gpu, 2e9), rel=1e-12)


def test_nvme_slower_than_dram_and_gpudirect() -> None:
    node = get_node("dgx-a100")
    gpu = get_gpu(node.gpu)
    size = 4e9
    to_hbm_from_cpu = transfer_time_s(size, Tier.CPU, Tier.HBM, node, gpu)
    staged = transfer_time_s(size, Tier.NVME, Tier.HBM, node, gpu)
    direct = transfer_time_s(size, Tier.NVME, Tier.HBM, node, gpu, gpudirect=True)
    assert to_hbm_from_cpu < staged
    assert transfer_time_s(size, Tier.NVME, Tier.CPU, node, gpu) > transfer_time_s(size, Tier.CPU, Tier.CPU, node, gpu)
    # Staged: the two hops add (25 GB/s NVMe then 25.1 GB/s PCIe); GPUDirect: the slower link only.
    assert staged == pytest.approx(size / node.nvme_read_Bps + size / node.host_to_device_Bps, rel=1e-3)
    assert direct == pytest.approx(size / min(node.nvme_read_Bps, node.host_to_device_Bps), rel=1e-3)
    assert direct < staged
    # Writes to NVMe use the write bandwidth (10 GB/s on DGX A100): slower than reads.
    assert transfer_time_s(size, Tier.HBM, Tier.NVME, node, gpu) > staged


def test_rejects_nonsense() -> None:
    node = get_node("dgx-a100")
    gpu = get_gpu(node.gpu)
    with pytest.raises(ValueError, match="bytes_moved"):
        transfer_time_s(-1, Tier.CPU, Tier.HBM, node, gpu)
    no_gds = dataclasses.replace(node, gpudirect_storage=False)
    with pytest.raises(ValueError, match="gpudirect_storage"):
        transfer_time_s(1e6, Tier.NVME, Tier.HBM, no_gds, gpu, gpudirect=True)
    with pytest.raises(ValueError, match="nvme -> nvme"):
        transfer_time_s(1e6, Tier.NVME, Tier.NVME, node, gpu)
    with pytest.raises(ValueError):
        transfer_time_s(1e6, "disk", Tier.HBM, node, gpu)  # type: ignore[arg-type]
