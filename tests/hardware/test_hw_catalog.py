"""Integrity of the bundled hardware catalog (GPUs, nodes, networks) and of its strict loader.

Checks the required entry names, cross-references, physically true invariants, datasheet peak
derivations (clock x SMs x FLOP/clock/SM) and the measured efficiencies against the published
tables they were derived from (stas00/ml-engineering MAMF, te42kyfo/gpu-benches gpu-stream).
"""

from __future__ import annotations

import json
import shutil
import tomllib
from pathlib import Path

import pytest

from hardware import units
from hardware.catalog import CATALOG_DIR, default_catalog, get_gpu, load_catalog
from hardware.errors import CatalogError

CATALOG = default_catalog()

REQUIRED_GPUS = {
    "a100-sxm-40gb", "a100-sxm-80gb", "a100-pcie-80gb", "h100-sxm-80gb", "h100-pcie-80gb",
    "h200-sxm-141gb", "b200-sxm-180gb", "gb200", "mi250x-gcd", "mi300x", "l40s", "rtx-a6000",
    "rtx-4090", "t4", "v100-sxm-32gb",
}
REQUIRED_NODES = {
    "dgx-a100", "dgx-a100-40gb", "dgx-h100", "hgx-h200", "dgx-b200", "gb200-nvl72", "pcie-8x-l40s",
    "pcie-8x-rtx-4090", "pcie-1x-t4", "frontier", "pcie-1x-rtx-4090", "a6000-workstation",
    "pcie-8x-a100-80gb", "pcie-8x-h100", "mi300x-8x", "dgx-1-v100",
}
REQUIRED_NETWORKS = {
    "ib-hdr-fat-tree", "ib-ndr-fat-tree", "ib-ndr-fat-tree-2to1", "roce-400g-rail-optimized",
    "rail-only-400g", "slingshot-11", "ethernet-10g", "ethernet-25g", "ethernet-100g",
}
FABRICS = {"nvswitch", "nvlink-bridge", "infinity-fabric", "pcie"}  # as documented in hardware/specs.py


# ---- names, files, cross-references ---------------------------------------------------------------


def test_required_names_present() -> None:
    assert set(CATALOG.gpus) == REQUIRED_GPUS
    assert REQUIRED_NODES <= set(CATALOG.nodes)
    assert REQUIRED_NETWORKS <= set(CATALOG.networks)


@pytest.mark.parametrize("kind", ["gpus", "nodes", "networks"])
def test_file_name_matches_entry_name(kind: str) -> None:
    for path in sorted((CATALOG_DIR / kind).glob("*.toml")):
        with path.open("rb") as f:
            name = tomllib.load(f)["name"]
        assert path.stem == name.replace("-", "_").replace(".", "_"), path.name


@pytest.mark.parametrize("name", sorted(REQUIRED_GPUS))
def test_default_node_holds_the_gpu(name: str) -> None:
    gpu = CATALOG.gpus[name]
    assert CATALOG.nodes[gpu.default_node].gpu == name


def test_every_entry_cites_a_source() -> None:
    for gpu in CATALOG.gpus.values():
        assert gpu.source.strip() and gpu.efficiency.source.strip(), gpu.name
        if gpu.price_per_hour_usd is not None:
            assert gpu.price_per_hour_usd > 0 and gpu.price_source and "20" in gpu.price_source, gpu.name
    for entry in [*CATALOG.nodes.values(), *CATALOG.networks.values()]:
        assert entry.source.strip(), entry.name


# ---- GPU physics -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(REQUIRED_GPUS))
def test_gpu_invariants(name: str) -> None:
    gpu = CATALOG.gpus[name]
    node = CATALOG.nodes[gpu.default_node]
    assert gpu.hbm_capacity_bytes > 0 and gpu.sm_count > 0 and gpu.boost_clock_Hz > 0 and gpu.tdp_W > 0
    assert gpu.l2_cache_bytes > 0 and gpu.pcie_lanes == 16 and 3 <= gpu.pcie_generation <= 6
    # Device memory beats the host link, which is non-zero.
    assert gpu.hbm_bandwidth_Bps > node.host_to_device_Bps > 0
    assert gpu.hbm_bandwidth_Bps > node.device_to_host_Bps > 0
    # Device memory beats this GPU's share of CPU DRAM bandwidth.
    assert gpu.hbm_bandwidth_Bps > node.cpu_dram_bandwidth_Bps / node.gpus_per_node > 0
    # A GPU-to-GPU link, where present, beats the PCIe/C2C host link.
    if gpu.nvlink_bandwidth_Bps > 0:
        assert gpu.nvlink_bandwidth_Bps > node.host_to_device_Bps
    # A training format exists: bf16, or fp16 on pre-Ampere parts.
    assert "bf16" in gpu.peak_flops_per_s or "fp16" in gpu.peak_flops_per_s
    assert all(v > 0 for v in gpu.peak_flops_per_s.values())


@pytest.mark.parametrize("name", sorted(REQUIRED_GPUS))
def test_bf16_equals_fp16_where_both_exist(name: str) -> None:
    peaks = CATALOG.gpus[name].peak_flops_per_s
    if "bf16" in peaks and "fp16" in peaks:
        assert peaks["bf16"] == peaks["fp16"]


def test_no_bf16_on_turing_and_volta() -> None:
    for name in ("t4", "v100-sxm-32gb"):
        peaks = CATALOG.gpus[name].peak_flops_per_s
        assert "bf16" not in peaks and "fp8" not in peaks and "fp16" in peaks


@pytest.mark.parametrize(
    "name", ["h100-sxm-80gb", "h100-pcie-80gb", "h200-sxm-141gb", "b200-sxm-180gb", "gb200", "mi300x"]
)
def test_fp8_is_twice_bf16(name: str) -> None:
    peaks = CATALOG.gpus[name].peak_flops_per_s
    # Datasheets round each figure separately (1513 vs 2 x 756): allow 0.1 %.
    assert peaks["fp8"] == pytest.approx(2 * peaks["bf16"], rel=1e-3)


# (gpu, precision, dense FLOP per clock per SM/CU). The first three are the derivations in
# reference microbenchmarks.md C4 (A100 256 FMA x 2 x 4 TC; H100 512 FMA x 2 x 4 TC; MI300X 256 x 2
# x 4 matrix cores per CU); the rest use the same tensor-core widths from the architecture papers.
PEAK_DERIVATIONS = [
    ("a100-sxm-80gb", "bf16", 256 * 2 * 4),
    ("h100-sxm-80gb", "bf16", 512 * 2 * 4),
    ("mi300x", "bf16", 256 * 2 * 4),
    ("a100-sxm-40gb", "bf16", 256 * 2 * 4),
    ("a100-pcie-80gb", "bf16", 256 * 2 * 4),
    ("h100-pcie-80gb", "bf16", 512 * 2 * 4),
    ("h200-sxm-141gb", "bf16", 512 * 2 * 4),
    ("b200-sxm-180gb", "bf16", 1024 * 2 * 4),
    ("gb200", "bf16", 1024 * 2 * 4),
    ("mi250x-gcd", "bf16", 128 * 2 * 4),
    ("v100-sxm-32gb", "fp16", 64 * 2 * 8),
    ("t4", "fp16", 64 * 2 * 8),
    ("rtx-a6000", "bf16", 128 * 2 * 4),
    ("l40s", "bf16", 128 * 2 * 4),
    ("rtx-4090", "bf16", 64 * 2 * 4),  # GeForce: half-rate fp32 accumulation
]


@pytest.mark.parametrize("name,precision,flop_per_clock_per_sm", PEAK_DERIVATIONS)
def test_peak_equals_clock_times_units(name: str, precision: str, flop_per_clock_per_sm: int) -> None:
    gpu = CATALOG.gpus[name]
    derived = gpu.boost_clock_Hz * gpu.sm_count * flop_per_clock_per_sm
    assert gpu.peak(precision) == pytest.approx(derived, rel=0.02)  # 2 %: datasheet rounding (L40S 1.2 %)


def test_reference_peak_derivations_exact() -> None:
    # microbenchmarks.md C4: 312 = 1410e6 x 256 x 2 x 432; 989 = 1830e6 x 512 x 2 x 528.
    assert CATALOG.gpus["a100-sxm-80gb"].peak("bf16") == pytest.approx(1410e6 * 256 * 2 * 432, rel=1e-3)
    assert CATALOG.gpus["h100-sxm-80gb"].peak("bf16") == pytest.approx(1830e6 * 512 * 2 * 528, rel=1e-3)


def test_gpu_peak_lookup_errors_name_known_formats() -> None:
    with pytest.raises(KeyError, match="t4 has no bf16"):
        CATALOG.gpus["t4"].peak("bf16")


def test_mi250x_gcd_is_half_a_package() -> None:
    gcd = CATALOG.gpus["mi250x-gcd"]
    # Package: 383 bf16 TFLOP/s, 220 CUs, 128 GB (ml-engineering C4).
    assert 2 * gcd.peak("bf16") == pytest.approx(383 * units.TFLOPS, rel=1e-9)
    assert 2 * gcd.sm_count == 220
    assert 2 * gcd.hbm_capacity_bytes == pytest.approx(128 * units.GB)


# ---- efficiencies ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(REQUIRED_GPUS))
def test_efficiencies_in_unit_interval(name: str) -> None:
    eff = CATALOG.gpus[name].efficiency
    for value in (eff.gemm, eff.attention, eff.memory):
        assert 0.0 < value <= 1.0
    assert 0.0 < eff.launch_overhead_s < 100 * units.us


# Max achievable matmul TFLOP/s, bf16: stas00/ml-engineering compute/accelerator/README.md.
MAMF_TFLOPS = [
    ("a100-sxm-80gb", 271.2),
    ("a100-pcie-80gb", 252.9),
    ("h100-sxm-80gb", 794.5),
    ("h200-sxm-141gb", 794.5),  # "H100 SXM (H200 same)"
    ("b200-sxm-180gb", 1745.0),
    ("gb200", 1822.0),
    ("mi300x", 668.4),
]


@pytest.mark.parametrize("name,mamf_tflops", MAMF_TFLOPS)
def test_gemm_efficiency_reproduces_mamf(name: str, mamf_tflops: float) -> None:
    gpu = CATALOG.gpus[name]
    # 1 %: the efficiency is stored to three digits.
    assert gpu.efficiency.gemm * gpu.peak("bf16") == pytest.approx(mamf_tflops * units.TFLOPS, rel=0.01)


# gpu-stream max(scale, triad) GB/s on the GPU itself: te42kyfo/gpu-benches (reference C3).
STREAM_GBPS = [
    ("a100-sxm-40gb", 1381),
    ("a100-sxm-80gb", 1759),
    ("h100-pcie-80gb", 1832),
    ("h200-sxm-141gb", 3534),
]


@pytest.mark.parametrize("name,stream_GBps", STREAM_GBPS)
def test_memory_efficiency_reproduces_stream(name: str, stream_GBps: float) -> None:
    gpu = CATALOG.gpus[name]
    assert gpu.efficiency.memory * gpu.hbm_bandwidth_Bps == pytest.approx(stream_GBps * units.GBps, rel=0.01)


def test_vidur_prices() -> None:
    # Vidur paper, CoreWeave Feb 2024: H100 $4.25/h, A100 $2.21/h.
    assert CATALOG.gpus["h100-sxm-80gb"].price_per_hour_usd == 4.25
    assert CATALOG.gpus["a100-sxm-80gb"].price_per_hour_usd == 2.21


# ---- nodes and networks ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(REQUIRED_NODES))
def test_node_invariants(name: str) -> None:
    node = CATALOG.nodes[name]
    gpus = range(node.gpus_per_node)
    assert node.intra_node_fabric in FABRICS
    assert 1 <= node.nvlink_domain_gpus <= node.gpus_per_node
    assert node.gpus_per_node % node.nvlink_domain_gpus == 0
    if node.intra_node_fabric == "pcie":
        assert node.nvlink_domain_gpus == 1 and not node.nvls
    else:
        # NVLink / Infinity Fabric beats the PCIe/C2C host link.
        assert node.intra_node_bandwidth_Bps > node.host_to_device_Bps
    if node.nvls:
        assert node.intra_node_fabric == "nvswitch"
    assert node.intra_node_bandwidth_Bps > 0 and node.intra_node_latency_s > 0
    # GPUs sharing one host link: a whole number of switches per node (one GPU: its own link)
    assert 1 <= node.gpus_per_pcie_switch <= node.gpus_per_node
    assert node.gpus_per_node % node.gpus_per_pcie_switch == 0
    if node.gpus_per_node == 1:
        assert node.gpus_per_pcie_switch == 1
    # Each local GPU is served by exactly one NIC.
    assert len(node.nics.gpu_affinity) == node.nics.count
    served = sorted(g for group in node.nics.gpu_affinity for g in group)
    assert served == list(gpus)
    assert node.nics.bandwidth_Bps > 0
    assert node.cpu_dram_capacity_bytes > 0 and node.cpu_dram_bandwidth_Bps > 0
    # NVMe SSDs read at least as fast as they write, and slower than DRAM.
    assert 0 < node.nvme_write_Bps <= node.nvme_read_Bps < node.cpu_dram_bandwidth_Bps
    assert node.nvme_capacity_bytes > 0


def test_nvls_on_hopper_blackwell_switch_systems() -> None:
    for name in ("dgx-h100", "hgx-h200", "dgx-b200", "gb200-nvl72"):
        assert CATALOG.nodes[name].nvls, name
    assert not CATALOG.nodes["dgx-a100"].nvls  # NVLink SHARP arrived with NVLink4 / third-gen NVSwitch


def test_gb200_nvl72_is_one_72_gpu_nvlink_domain() -> None:
    node = CATALOG.nodes["gb200-nvl72"]
    assert node.gpus_per_node == node.nvlink_domain_gpus == 72
    assert node.nics.count == 72 and node.nics.bandwidth_Bps == pytest.approx(400 * units.Gbps)


def test_frontier_nics_serve_one_mi250x_each() -> None:
    node = CATALOG.nodes["frontier"]
    assert node.gpus_per_node == 8 and node.nics.count == 4
    assert node.nics.gpu_affinity == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert node.nics.bandwidth_Bps == pytest.approx(25 * units.GB)  # 200 Gb/s


def test_flexgen_t4_machine() -> None:
    # FlexGen (ICML 2023): 1x T4 16 GB, 208 GB DRAM, 1.5 TB SSD.
    node = CATALOG.nodes["pcie-1x-t4"]
    assert node.gpus_per_node == 1
    assert node.cpu_dram_capacity_bytes == pytest.approx(208 * units.GB)
    assert node.nvme_capacity_bytes == pytest.approx(1.5 * units.TB)


@pytest.mark.parametrize("name", sorted(REQUIRED_NETWORKS))
def test_network_invariants(name: str) -> None:
    net = CATALOG.networks[name]
    assert net.topology in {"fat-tree", "rail-optimized", "rail-only", "dragonfly", "ethernet"}
    assert 0.0 < net.efficiency <= 1.0
    assert net.oversubscription >= 1.0 and net.nodes_per_leaf >= 1
    assert 0 < net.per_hop_latency_s < net.endpoint_latency_s
    assert net.link_bandwidth_Bps > 0


def test_ndr_efficiency_matches_nccl_tests_290() -> None:
    # nccl-tests#290: expect 46-48 GB/s per 400G NIC.
    net = CATALOG.networks["ib-ndr-fat-tree"]
    assert 46 * units.GB <= net.efficiency * net.link_bandwidth_Bps <= 48 * units.GB
    assert CATALOG.networks["ib-ndr-fat-tree-2to1"].oversubscription == 2.0
    assert CATALOG.networks["rail-only-400g"].topology == "rail-only"


def test_node_nics_match_their_default_network_port_speed() -> None:
    for node in CATALOG.nodes.values():
        net = CATALOG.networks[node.default_network]
        assert node.nics.bandwidth_Bps <= net.link_bandwidth_Bps, node.name


# ---- the strict loader ---------------------------------------------------------------------------


@pytest.fixture()
def catalog_copy(tmp_path: Path) -> Path:
    root = tmp_path / "catalog"
    shutil.copytree(CATALOG_DIR, root, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def test_copy_loads(catalog_copy: Path) -> None:
    assert set(load_catalog(catalog_copy).gpus) == REQUIRED_GPUS


def test_loader_rejects_unknown_key(catalog_copy: Path) -> None:
    path = catalog_copy / "gpus" / "t4.toml"
    path.write_text("hbm_bandwith_GBps = 320\n" + path.read_text())
    with pytest.raises(CatalogError, match=r"t4\.toml.*unknown keys.*hbm_bandwith_GBps"):
        load_catalog(catalog_copy)


def test_loader_rejects_unknown_unit(catalog_copy: Path) -> None:
    path = catalog_copy / "networks" / "ethernet_10g.toml"
    path.write_text(path.read_text().replace("link_bandwidth_Gbps", "link_bandwidth_Mbps"))
    with pytest.raises(CatalogError, match="link_bandwidth"):
        load_catalog(catalog_copy)


def test_loader_rejects_duplicate_name(catalog_copy: Path) -> None:
    shutil.copy(catalog_copy / "nodes" / "dgx_h100.toml", catalog_copy / "nodes" / "zz_dgx_h100_copy.toml")
    with pytest.raises(CatalogError, match="duplicate name 'dgx-h100'"):
        load_catalog(catalog_copy)


@pytest.mark.parametrize(
    "relative,old,new,message",
    [
        ("gpus/l40s.toml", 'default_node = "pcie-8x-l40s"', 'default_node = "no-such-node"', "unknown default_node"),
        ("nodes/frontier.toml", 'default_network = "slingshot-11"', 'default_network = "nope"', "unknown default_network"),
        ("nodes/frontier.toml", 'gpu = "mi250x-gcd"', 'gpu = "mi250x"', "unknown gpu 'mi250x'"),
    ],
)
def test_loader_rejects_bad_cross_reference(catalog_copy: Path, relative: str, old: str, new: str, message: str) -> None:
    path = catalog_copy / relative
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    with pytest.raises(CatalogError, match=message):
        load_catalog(catalog_copy)


# ---- CLI ---------------------------------------------------------------------------------------------


def test_cli_lists_all_gpus_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    from sim.cli import main

    assert main(["catalog", "gpus", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {g["name"] for g in data["gpus"]} == REQUIRED_GPUS
    h100 = next(g for g in data["gpus"] if g["name"] == "h100-sxm-80gb")
    assert h100["peak_flops_per_s"]["bf16"] == pytest.approx(989e12)
    assert h100["hbm_bandwidth_Bps"] == pytest.approx(3.35e12)


@pytest.mark.parametrize("kind,required", [("nodes", REQUIRED_NODES), ("networks", REQUIRED_NETWORKS)])
def test_cli_lists_nodes_and_networks(kind: str, required: set[str], capsys: pytest.CaptureFixture[str]) -> None:
    from sim.cli import main

    assert main(["catalog", kind, "--format", "json"]) == 0
    assert required <= {e["name"] for e in json.loads(capsys.readouterr().out)[kind]}
    assert main(["catalog", kind]) == 0  # the table form renders every entry
    table = capsys.readouterr().out
    assert all(name in table for name in required)


def test_pcie_switch_sharing_from_the_system_topologies() -> None:
    """DGX A100 / DGX H100: four PCIe switches, two GPUs each (system topology documents); GB200's
    host link figure is already per GPU (its Grace's C2C shared by two GPUs)."""
    assert CATALOG.nodes["dgx-a100"].gpus_per_pcie_switch == 2
    assert CATALOG.nodes["dgx-h100"].gpus_per_pcie_switch == 2
    assert CATALOG.nodes["gb200-nvl72"].gpus_per_pcie_switch == 1


@pytest.mark.parametrize(
    "gpu_file,old,new,message",
    [
        ("a100_sxm_80gb", "sustained_clock_MHz = 1305", "sustained_clock_MHz = 1500",
         r"sustained_clock = 1500 MHz must be in \(0, boost_clock = 1410 MHz\]"),
        ("a100_sxm_80gb", 'sustained_clock_source = "', 'notes = "', "sustained_clock_MHz needs sustained_clock_source"),
        ("h100_sxm_80gb", "reported_memory_MiB = 81559", "reported_memory_MiB = 82000",
         "reported_memory = 82000 MiB must be at most hbm_capacity = 81920 MiB"),
        ("h100_sxm_80gb", 'reported_memory_source = "', 'notes = "', "reported_memory needs reported_memory_source"),
        ("h100_sxm_80gb", "runtime_memory_GiB = 79.11", "runtime_memory_GiB = 79.9",
         r"runtime_memory = 81817.6 MiB must be at most the driver's total \(reported_memory, else hbm_capacity\) = 81559 MiB"),
        ("h100_sxm_80gb", 'runtime_memory_source = "', 'notes = "', "runtime_memory needs runtime_memory_source"),
        ("h100_sxm_80gb", "memory_kernels = 0.807", "memory_kernels = 1.2",
         r"efficiency.memory_kernels = 1.2 must be in \(0, 1\]"),
    ],
)
def test_loader_checks_the_sustained_clock_and_reported_memory(
    catalog_copy: Path, gpu_file: str, old: str, new: str, message: str
) -> None:
    path = catalog_copy / "gpus" / f"{gpu_file}.toml"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    with pytest.raises(CatalogError, match=message):
        load_catalog(catalog_copy)


def test_engine_memory_is_the_runtime_total_where_given() -> None:
    """Serving engines size their KV cache from the memory the CUDA runtime reports (cudaMemGetInfo):
    79.11 GiB on an H100 SXM 80GB, less than NVML's 81,559 MiB (nvidia-smi, what trtllm-bench's
    heuristic reads), itself less than the datasheet 80 GiB; the datasheet where the catalog gives
    neither figure."""
    h100, a100 = get_gpu("h100-sxm-80gb"), get_gpu("a100-sxm-80gb")
    assert h100.engine_memory_bytes == 79.11 * units.GiB < h100.driver_memory_bytes == 81559 * units.MiB
    assert h100.driver_memory_bytes < h100.hbm_capacity_bytes == 80 * units.GiB
    assert a100.reported_memory_bytes is None and a100.runtime_memory_bytes is None
    assert a100.engine_memory_bytes == a100.driver_memory_bytes == a100.hbm_capacity_bytes
