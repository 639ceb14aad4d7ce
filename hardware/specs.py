"""Frozen hardware specifications: GPUs, nodes and inter-node networks.

All quantities are SI: bytes, bytes/s, FLOP/s, seconds, watts, hertz. Catalog TOML files carry
human units in their key names (``hbm_capacity_GB``); ``hardware.catalog`` converts them exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:
    from hardware.calibration import CalibrationProfile

from hardware.errors import MissingPrecisionError


class Precision(StrEnum):
    """Numeric formats a GPU may have a dense peak for."""

    FP64 = "fp64"
    FP32 = "fp32"
    TF32 = "tf32"
    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"
    INT8 = "int8"
    INT4 = "int4"


class Tier(StrEnum):
    """Memory tiers a tensor can live in."""

    HBM = "hbm"
    CPU = "cpu"
    NVME = "nvme"


def frozen_mapping(values: Mapping[str, float]) -> Mapping[str, float]:
    """A read-only copy of ``values`` (frozen dataclasses must not hold mutable dicts)."""
    return MappingProxyType(dict(values))


@dataclass(frozen=True, slots=True, kw_only=True)
class EfficiencySpec:
    """Achievable fractions of peak, measured on this GPU (or transferred from a sibling; see ``source``).

    These are the analytic defaults of the cost model; a calibration profile overrides them.
    """

    gemm: float  # best-case dense GEMM FLOP/s / dense peak (max achievable matmul, MAMF)
    attention: float  # fused-attention asymptotic FLOP/s / dense peak at large head_dim and sequence
    memory: float  # achievable HBM bandwidth / spec (STREAM-like copy)
    launch_overhead_s: float  # fixed cost per kernel launch
    source: str
    # Achievable HBM bandwidth / spec while a memory-bound GEMM streams its weights (decode GEMV);
    # None: the STREAM-copy ``memory`` fraction is used.
    gemm_memory: float | None = None
    # Best-case fp8 GEMM FLOP/s / fp8 dense peak (fp8 MAMF); None: the bf16 ``gemm`` fraction is used.
    # mamf-finder times ``torch._scaled_mm`` with its default ``use_fast_accum=False``: the fraction of
    # an fp8 GEMM with the split accumulator (cuBLASLt FAST_ACCUM off: the tensor cores' partial sums
    # are promoted to fp32 registers every few k-blocks).
    gemm_fp8: float | None = None
    # Rate of an fp8 GEMM with fast accumulation (cuBLASLt CUBLASLT_MATMUL_DESC_FAST_ACCUM = 1: partial
    # sums stay in the tensor cores' accumulator) over the split-accumulator rate ``gemm_fp8``; 1 where
    # the tensor cores accumulate in fp32 anyway or no fp8 rate is measured.
    gemm_fp8_fast_accumulation: float = 1.0
    # Rate of the memory-bound kernels a training or serving framework runs (norms, fused elementwise
    # chains, row reductions, optimizer passes) over the STREAM rate ``memory``, per byte the model
    # counts for them: 1 where no published timing of such kernels on this GPU exists. STREAM is the
    # best case (one contiguous stream per operand, full occupancy); framework kernels reduce along
    # rows, draw dropout's random numbers, read broadcast operands and run in several launches.
    memory_kernels: float = 1.0

    def gemm_fraction(self, precision: str, *, split_accumulator: bool = False) -> float:
        """The best-case GEMM fraction of the dense peak at ``precision``; an fp8 GEMM runs at the
        fast-accumulation rate unless ``split_accumulator``."""
        if precision == "fp8" and self.gemm_fp8 is not None:
            return self.gemm_fp8 if split_accumulator else self.gemm_fp8 * self.gemm_fp8_fast_accumulation
        return self.gemm


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSpec:
    """One GPU model (one device as the framework counts devices: an MI250X GCD is one GPU)."""

    name: str
    vendor: str  # "nvidia" | "amd"
    peak_flops_per_s: Mapping[str, float]  # dense (no sparsity) peak per Precision value
    hbm_capacity_bytes: float
    hbm_bandwidth_Bps: float
    memory_type: str  # "HBM2e", "GDDR6", ...
    sm_count: int  # SMs (NVIDIA) or CUs (AMD)
    boost_clock_Hz: float
    l2_cache_bytes: float
    nvlink_bandwidth_Bps: float  # per direction, per GPU; 0.0 without NVLink / Infinity Fabric
    pcie_generation: int
    pcie_lanes: int
    tdp_W: float
    default_node: str
    efficiency: EfficiencySpec
    source: str
    price_per_hour_usd: float | None = None
    price_source: str | None = None  # where and when the price was published
    notes: str = ""
    # Measured L2 read bandwidth (bytes/s) for a working set that fits in L2; 0.0 when not measured.
    l2_bandwidth_Bps: float = 0.0
    # Microarchitecture family ("ampere", "hopper", ...); selects the GEMM tile/scheduling description
    # in ``hardware.cost``. None: the generic (Ampere-style) description.
    architecture: str | None = None
    # SM clock a compute-bound kernel sustains under the board power limit when tensor-core work runs
    # back to back (training steps, long prefills); None: not measured, the boost clock is kept.
    # ``hardware.cost.sustained_clock_factor`` applies it to the GEMM efficiency, whose constant
    # (MAMF) was measured between idle gaps (see that function).
    sustained_clock_Hz: float | None = None
    sustained_clock_source: str = ""
    # Device memory the driver reports (NVML total: what nvidia-smi prints and what trtllm-bench's
    # engine heuristic reads); None: not given, the datasheet ``hbm_capacity_bytes`` is used
    # (``driver_memory_bytes``). The H100 SXM 80GB reports 81,559 MiB of its 80 GiB.
    reported_memory_bytes: float | None = None
    reported_memory_source: str = ""
    # Device memory the CUDA runtime reports (cudaMemGetInfo's total, torch.cuda.mem_get_info): what
    # serving engines size their KV cache from (``engine_memory_bytes``), a little less than NVML's
    # total (79.11 GiB of the H100 SXM 80GB's 81,559 MiB); None: not given, NVML's total is used.
    runtime_memory_bytes: float | None = None
    runtime_memory_source: str = ""
    # Measured corrections of the cost model (``hardware.calibration``): the shipped profile of this
    # GPU, a ``[cluster] calibration`` file, or None for the analytic defaults alone.
    calibration: CalibrationProfile | None = None

    @property
    def driver_memory_bytes(self) -> float:
        """Device memory NVML reports (nvidia-smi's total) where the catalog gives it, else the
        datasheet capacity."""
        return self.reported_memory_bytes if self.reported_memory_bytes is not None else self.hbm_capacity_bytes

    @property
    def engine_memory_bytes(self) -> float:
        """Device memory a serving engine sees and sizes its KV cache from: the CUDA runtime's total
        where the catalog gives it, else ``driver_memory_bytes``."""
        return self.runtime_memory_bytes if self.runtime_memory_bytes is not None else self.driver_memory_bytes

    def peak(self, precision: str) -> float:
        """Dense peak FLOP/s at ``precision``; raises if the chip has no such format."""
        try:
            return self.peak_flops_per_s[precision]
        except KeyError:
            known = ", ".join(self.peak_flops_per_s)
            raise MissingPrecisionError(
                f"gpu {self.name} has no {precision} peak; known: {known}"
            ) from None


@dataclass(frozen=True, slots=True, kw_only=True)
class NicSpec:
    """A group of identical network adapters in a node."""

    count: int
    bandwidth_Bps: float  # per NIC, per direction
    gpu_affinity: tuple[tuple[int, ...], ...]  # for each NIC, the local GPU indices it serves


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSpec:
    """A server: GPUs, its intra-node fabric, NICs and host memory tiers."""

    name: str
    gpu: str  # GPU catalog name
    gpus_per_node: int
    intra_node_fabric: str  # "nvswitch" | "nvlink-bridge" | "infinity-fabric" | "pcie"
    intra_node_bandwidth_Bps: float  # per GPU, per direction, to the other GPUs of the node
    intra_node_latency_s: float
    nvlink_domain_gpus: int  # GPUs that share one NVLink domain (72 for GB200 NVL72; 1 without NVLink)
    nvls: bool  # NVLink SHARP (in-switch reduction) available
    nics: NicSpec
    cpu_dram_capacity_bytes: float
    cpu_dram_bandwidth_Bps: float
    host_to_device_Bps: float  # per GPU, achievable copy-engine bandwidth (PCIe or C2C)
    device_to_host_Bps: float
    # GPUs that share one link to host memory (a PCIe switch's x16 uplink on an HGX/DGX baseboard):
    # when all of them copy at once each gets host_to_device / device_to_host divided by this
    gpus_per_pcie_switch: int = 1
    nvme_capacity_bytes: float
    nvme_read_Bps: float
    nvme_write_Bps: float
    gpudirect_storage: bool
    default_network: str
    source: str
    notes: str = ""
    # Achievable all-reduce bus bandwidth / intra_node_bandwidth_Bps at large messages (ring); None:
    # the per-fabric default in ``hardware.topology.intra_node_efficiency``.
    intra_node_efficiency: float | None = None
    # NVLS all-reduce algorithm bandwidth / intra_node_bandwidth_Bps at large messages; None: default.
    nvls_efficiency: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class NetworkSpec:
    """An inter-node fabric."""

    name: str
    topology: str  # "fat-tree" | "rail-optimized" | "rail-only" | "dragonfly" | "ethernet"
    link_bandwidth_Bps: float  # per port, per direction
    per_hop_latency_s: float  # switch + cable latency per hop
    endpoint_latency_s: float  # NIC + software latency per message (injection)
    oversubscription: float  # leaf down-link / up-link bandwidth ratio (1.0 = non-blocking)
    nodes_per_leaf: int  # nodes under one leaf (or rail) switch group
    efficiency: float  # achievable fraction of link bandwidth for large messages
    source: str
    notes: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class HardwareCatalog:
    """All hardware entries, keyed by name."""

    gpus: Mapping[str, GpuSpec] = field(default_factory=dict)
    nodes: Mapping[str, NodeSpec] = field(default_factory=dict)
    networks: Mapping[str, NetworkSpec] = field(default_factory=dict)
