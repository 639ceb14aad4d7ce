"""Collective cost model: closed-form oracles, invariants and published nccl-tests numbers."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hardware import units
from hardware.catalog import analytic_gpu as get_gpu, get_network, get_node  # the analytic model (no calibration profile) is under test
from hardware.collectives import (
    Algorithm,
    Collective,
    GroupLinks,
    all_to_all_traffic_bytes,
    available_algorithms,
    bus_bandwidth_Bps,
    collective_time_s,
    default_algorithm,
    network_floor_s,
    num_channels,
    pipeline_fill_bytes,
    ring_alpha_beta_time_s,
)
from hardware.collectives import Protocol
from hardware.specs import NicSpec
from hardware.topology import build_cluster

KiB, MiB, GiB = units.KiB, units.MiB, units.GiB

# 8-GPU all-reduce sweeps, size -> busbw GB/s, stas00/ml-engineering network/README.md
# (reference microbenchmarks.md C2): DGX A100 nccl-tests all_reduce_perf; HGX H200 torch
# all_reduce_bench.py with NVLS on.
A100_SWEEP = [
    (32 * KiB, 1.31), (64 * KiB, 2.45), (128 * KiB, 4.43), (256 * KiB, 7.47), (512 * KiB, 11.41),
    (1 * MiB, 18.00), (2 * MiB, 36.18), (4 * MiB, 72.33), (8 * MiB, 109.93), (16 * MiB, 106.16),
    (32 * MiB, 138.49), (64 * MiB, 171.54), (128 * MiB, 176.92), (256 * MiB, 194.07), (512 * MiB, 222.72),
    (1 * GiB, 229.04), (2 * GiB, 231.41), (4 * GiB, 233.88), (8 * GiB, 234.61), (16 * GiB, 234.89),
]
H200_NVLS_SWEEP = [
    (32 * KiB, 1.44), (64 * KiB, 2.93), (128 * KiB, 5.73), (256 * KiB, 11.74), (512 * KiB, 23.94),
    (1 * MiB, 39.93), (2 * MiB, 64.53), (4 * MiB, 107.16), (8 * MiB, 155.53), (16 * MiB, 219.89),
    (32 * MiB, 275.84), (64 * MiB, 346.51), (128 * MiB, 401.93), (256 * MiB, 436.15), (512 * MiB, 450.29),
    (1 * GiB, 463.58), (2 * GiB, 469.17), (4 * GiB, 473.10), (8 * GiB, 477.45), (16 * GiB, 482.26),
]
# Thresholds: 20 % per point from 2 MiB (the mid-size task's target; the channel/pipeline-fill
# model reaches at most 15 % there), 30 % at 1 MiB (the latency floor of 100 us at 1-4 MiB on A100
# is a launch/protocol-switch effect the model gets to 25 %), a factor 2 below 1 MiB (protocol
# switch points and launch noise dominate small messages).
LARGE_REL = 0.20
ONE_MIB_REL = 0.30
SMALL_FACTOR = 2.0
# Mean |error| over the tensor-parallel message band (8-256 MiB) must stay below 10 %: this is the
# range the pipeline fill corrects (before it: +16..+34 % on A100, +8..+20 % on H200).
TP_BAND_MEAN_REL = 0.10


def _single_node(node_name: str, gpu_name: str) -> GroupLinks:
    node = get_node(node_name)
    cluster = build_cluster(get_gpu(gpu_name), node, get_network(node.default_network), node.gpus_per_node)
    return cluster.group_links(range(node.gpus_per_node))


def _ideal(size: int = 8, **kw: object) -> GroupLinks:
    fields: dict = dict(
        size=size, num_nodes=1, ranks_per_node=size, intra_bandwidth_Bps=100e9, intra_latency_s=1e-6,
        inter_bandwidth_Bps=10e9, inter_latency_s=5e-6, nvls=False, launch_overhead_s=0.0,
    )
    fields.update(kw)
    return GroupLinks(**fields)


# ---------- closed-form oracles ----------

@pytest.mark.parametrize("n", [2, 3, 8, 64])
def test_ring_all_reduce_alpha_beta_formula(n: int) -> None:
    alpha, bandwidth, size = 3e-6, 50e9, 123_456_789.0
    expected = 2 * (n - 1) * alpha + 2 * (n - 1) / n * size / bandwidth  # formulas.md 4.4
    assert ring_alpha_beta_time_s(Collective.ALL_REDUCE, size, n, alpha, bandwidth) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("n", [2, 8, 16])
def test_reduce_scatter_plus_all_gather_equals_all_reduce(n: int) -> None:
    alpha, bandwidth, size = 2e-6, 80e9, 1e9
    rs = ring_alpha_beta_time_s(Collective.REDUCE_SCATTER, size, n, alpha, bandwidth)
    ag = ring_alpha_beta_time_s(Collective.ALL_GATHER, size, n, alpha, bandwidth)
    ar = ring_alpha_beta_time_s(Collective.ALL_REDUCE, size, n, alpha, bandwidth)
    assert rs + ag == pytest.approx(ar, rel=1e-12)


def test_ring_large_message_tends_to_bus_bandwidth() -> None:
    # At 64 GiB latency is negligible: busbw -> intra link x efficiency (pure arithmetic, 1e-3).
    links = _ideal(intra_efficiency=0.8)
    assert bus_bandwidth_Bps(Collective.ALL_REDUCE, 64 * GiB, links, Algorithm.RING) == pytest.approx(80e9, rel=1e-3)


@pytest.mark.parametrize("kind", list(Collective))
def test_single_rank_and_empty_message_cost_nothing(kind: Collective) -> None:
    assert collective_time_s(kind, 1e9, _ideal(size=1)) == 0.0
    assert collective_time_s(kind, 0.0, _ideal()) == 0.0
    assert ring_alpha_beta_time_s(kind, 1e9, 1, 1e-6, 1e9) == 0.0


@pytest.mark.parametrize("kind", list(Collective))
@pytest.mark.parametrize("size", [4 * KiB, 1 * MiB, 256 * MiB])
def test_more_bandwidth_never_slower(kind: Collective, size: float) -> None:
    multi = _ideal(size=16, num_nodes=2, ranks_per_node=8)
    for links in (_ideal(), multi):
        base = collective_time_s(kind, size, links)
        faster_intra = collective_time_s(kind, size, replace(links, intra_bandwidth_Bps=links.intra_bandwidth_Bps * 2))
        faster_inter = collective_time_s(kind, size, replace(links, inter_bandwidth_Bps=links.inter_bandwidth_Bps * 2))
        assert faster_intra <= base and faster_inter <= base


@pytest.mark.parametrize("kind", [Collective.ALL_REDUCE, Collective.ALL_GATHER, Collective.ALL_TO_ALL])
def test_time_grows_with_message_size(kind: Collective) -> None:
    links = _single_node("dgx-a100", "a100-sxm-80gb")
    times = [collective_time_s(kind, 2.0**k, links) for k in range(10, 35)]
    assert all(b >= a for a, b in zip(times, times[1:]))


@pytest.mark.parametrize("n,per_node", [(8, 8), (16, 8), (32, 4), (6, 1)])
def test_all_to_all_bytes_conserved(n: int, per_node: int) -> None:
    size = 96 * MiB
    links = _ideal(size=n, num_nodes=n // per_node, ranks_per_node=per_node)
    intra, inter = all_to_all_traffic_bytes(size, links)
    # Each rank keeps S/n and sends S/n to each of n-1 peers: sent = (n-1)/n S per rank, and
    # summed over ranks the bytes sent equal the bytes received (each rank receives S/n from n-1 peers).
    assert intra + inter == pytest.approx((n - 1) / n * size, rel=1e-12)
    assert n * (intra + inter) == pytest.approx(n * (n - 1) * (size / n), rel=1e-12)
    assert intra == pytest.approx((per_node - 1) * size / n, rel=1e-12)


def test_unavailable_algorithm_names_allowed() -> None:
    with pytest.raises(ValueError, match="allowed: ring, tree"):
        collective_time_s(Collective.ALL_REDUCE, 1e6, _ideal(), Algorithm.NVLS)
    with pytest.raises(ValueError, match="message_bytes"):
        collective_time_s(Collective.ALL_REDUCE, -1.0, _ideal())


def test_hierarchical_matches_two_level_formula_for_large_messages() -> None:
    # formulas.md 4.4: intra RS + inter AR on S/n_l + intra AG; latency negligible at 64 GiB.
    n_l, n_g, size = 8, 4, 64 * GiB
    links = _ideal(size=n_l * n_g, num_nodes=n_g, ranks_per_node=n_l, inter_efficiency=0.9)
    bw_l, bw_g = 100e9, 10e9 * 0.9
    expected = 2 * (n_l - 1) / n_l * size / bw_l + 2 * (n_g - 1) / n_g * size / (n_l * bw_g)
    assert collective_time_s(Collective.ALL_REDUCE, size, links, Algorithm.HIERARCHICAL) == pytest.approx(expected, rel=1e-3)


# ---------- published numbers ----------

def test_dgx_a100_all_reduce_1gib() -> None:
    # 229.04 GB/s busbw at 1 GiB (ml-engineering, C2); nccl-tests#175: 232.54 single node. 5 %.
    busbw = bus_bandwidth_Bps(Collective.ALL_REDUCE, GiB, _single_node("dgx-a100", "a100-sxm-80gb"))
    assert busbw == pytest.approx(229.04e9, rel=0.05)


@pytest.mark.parametrize("node,gpu", [("dgx-h100", "h100-sxm-80gb"), ("hgx-h200", "h200-sxm-141gb")])
def test_hopper_ring_and_nvls_all_reduce(node: str, gpu: str) -> None:
    links = _single_node(node, gpu)
    # Ring only (NCCL_NVLS_ENABLE=0): 367.61 GB/s busbw (ml-engineering, C2; nccl-tests#212 ~370). 5 %.
    assert bus_bandwidth_Bps(Collective.ALL_REDUCE, GiB, links, Algorithm.RING) == pytest.approx(367.61e9, rel=0.05)
    # NVLS: 463.58 GB/s at 1 GiB, 482.26 at 16 GiB (H200 sweep, C2; nccl-tests#212 ~480 on H100). 5 %.
    assert bus_bandwidth_Bps(Collective.ALL_REDUCE, GiB, links) == pytest.approx(463.58e9, rel=0.05)
    assert bus_bandwidth_Bps(Collective.ALL_REDUCE, 16 * GiB, links) == pytest.approx(482.26e9, rel=0.05)
    assert default_algorithm(Collective.ALL_REDUCE, GiB, links) == Algorithm.NVLS


def test_chooser_never_picks_nvls_on_a100() -> None:
    links = _single_node("dgx-a100", "a100-sxm-80gb")
    assert Algorithm.NVLS not in available_algorithms(Collective.ALL_REDUCE, links)
    assert {default_algorithm(Collective.ALL_REDUCE, 2.0**k, links) for k in range(10, 35)} == {Algorithm.RING}


def _check_sweep(links: GroupLinks, sweep: list[tuple[float, float]]) -> None:
    failures, band_errors = [], []
    for size, measured_GBps in sweep:
        ratio = bus_bandwidth_Bps(Collective.ALL_REDUCE, size, links) / (measured_GBps * units.GBps)
        if size >= 2 * MiB:
            ok = abs(ratio - 1) <= LARGE_REL
        elif size >= MiB:
            ok = abs(ratio - 1) <= ONE_MIB_REL
        else:
            ok = 1 / SMALL_FACTOR <= ratio <= SMALL_FACTOR
        if not ok:
            failures.append((size, measured_GBps, ratio))
        if 8 * MiB <= size <= 256 * MiB:
            band_errors.append(abs(ratio - 1))
    assert not failures
    assert sum(band_errors) / len(band_errors) <= TP_BAND_MEAN_REL


def test_a100_all_reduce_sweep() -> None:
    _check_sweep(_single_node("dgx-a100", "a100-sxm-80gb"), A100_SWEEP)


def test_h200_nvls_all_reduce_sweep() -> None:
    _check_sweep(_single_node("hgx-h200", "h200-sxm-141gb"), H200_NVLS_SWEEP)


def test_two_dgx_a100_all_reduce_over_four_hdr_nics() -> None:
    # NVIDIA/nccl-tests#175: 2 nodes x 8 A100 with 4x 200 Gb/s HDR per node: 86 GB/s busbw at large
    # sizes ("vs ~100 theoretical" = 4 x 25 GB/s). The system has 4 NICs (2 GPUs each),
    # unlike the 8-NIC DGX A100 catalog entry, so the node is adjusted to the measured hardware. 15 %.
    base = get_node("dgx-a100")
    node = replace(base, nics=NicSpec(count=4, bandwidth_Bps=200 * units.Gbps, gpu_affinity=((0, 1), (2, 3), (4, 5), (6, 7))))
    cluster = build_cluster(get_gpu("a100-sxm-80gb"), node, get_network("ib-hdr-fat-tree"), 16)
    busbw = bus_bandwidth_Bps(Collective.ALL_REDUCE, 4 * GiB, cluster.group_links(range(16)))
    assert busbw == pytest.approx(86e9, rel=0.15)


# Vidur profiling CSVs (microsoft/vidur data/profiling/network/*/all_reduce.csv, fp16
# torch.distributed all_reduce, median; busbw = bytes / time x 2(n-1)/n, reference C2), MiB sizes.
# Thresholds: 25 % from 32 MiB (bandwidth-dominated), 40 % at 4 MiB (Vidur's torch timings carry a
# different per-call floor than nccl-tests: its 2 KiB points run 7-62 us against our 30 us launch
# overhead). The 512 KiB and 2 KiB columns are latency-floor points and are not checked here.
VIDUR_ALL_REDUCE = [
    ("dgx-h100", "h100-sxm-80gb", 2, 4, 97.5), ("dgx-h100", "h100-sxm-80gb", 2, 32, 246.7),
    ("dgx-h100", "h100-sxm-80gb", 2, 64, 273.9), ("dgx-h100", "h100-sxm-80gb", 4, 4, 133.9),
    ("dgx-h100", "h100-sxm-80gb", 4, 32, 301.4), ("dgx-h100", "h100-sxm-80gb", 4, 64, 316.6),
    ("dgx-h100", "h100-sxm-80gb", 8, 4, 143.9), ("dgx-h100", "h100-sxm-80gb", 8, 32, 299.6),
    ("dgx-h100", "h100-sxm-80gb", 8, 64, 364.7), ("dgx-a100", "a100-sxm-80gb", 2, 4, 66.6),
    ("dgx-a100", "a100-sxm-80gb", 2, 32, 135.8), ("dgx-a100", "a100-sxm-80gb", 2, 64, 156.1),
    ("dgx-a100", "a100-sxm-80gb", 4, 4, 74.0), ("dgx-a100", "a100-sxm-80gb", 4, 32, 157.8),
    ("dgx-a100", "a100-sxm-80gb", 4, 64, 166.9), ("dgx-a100", "a100-sxm-80gb", 8, 4, 74.1),
    ("dgx-a100", "a100-sxm-80gb", 8, 32, 142.9), ("dgx-a100", "a100-sxm-80gb", 8, 64, 174.0),
]


@pytest.mark.parametrize("node,gpu,ranks,size_MiB,busbw_GBps", VIDUR_ALL_REDUCE)
def test_vidur_all_reduce_points(node: str, gpu: str, ranks: int, size_MiB: int, busbw_GBps: float) -> None:
    base = get_node(node)
    cluster = build_cluster(get_gpu(gpu), base, get_network(base.default_network), base.gpus_per_node)
    links = cluster.group_links(range(ranks))
    predicted = bus_bandwidth_Bps(Collective.ALL_REDUCE, size_MiB * MiB, links)
    assert predicted == pytest.approx(busbw_GBps * units.GBps, rel=0.25 if size_MiB >= 32 else 0.40)


# ---------- channel / pipeline-fill structure ----------

def test_channel_counts() -> None:
    # Two channels per 25 GB/s NVLink, capped at MAXCHANNELS = 32 (exact integers).
    assert num_channels(_single_node("dgx-a100", "a100-sxm-80gb")) == 24
    assert num_channels(_single_node("hgx-h200", "h200-sxm-141gb")) == 32
    assert num_channels(_ideal(intra_bandwidth_Bps=100e9)) == 8
    # Across nodes the NIC rate of the node bounds the rings: 8 ranks x 10 GB/s = 80 GB/s -> 6.
    assert num_channels(_ideal(size=16, num_nodes=2, ranks_per_node=8)) == 6


def test_pipeline_fill_ramps_then_saturates() -> None:
    links = _ideal(intra_bandwidth_Bps=100e9)  # 8 channels, 8 ranks
    window = 8 * 8 * 512 * KiB  # nCh x n x Simple step = 32 MiB
    factor = 2 * 7 / 8
    # Below the window: a quarter of the bus bytes; above: a quarter of the window (arithmetic).
    assert pipeline_fill_bytes(Collective.ALL_REDUCE, 4 * MiB, links, Protocol.SIMPLE) == pytest.approx(0.25 * factor * 4 * MiB, rel=1e-12)
    assert pipeline_fill_bytes(Collective.ALL_REDUCE, 1 * GiB, links, Protocol.SIMPLE) == pytest.approx(0.25 * factor * window, rel=1e-12)
    assert pipeline_fill_bytes(Collective.ALL_REDUCE, 0.0, links, Protocol.SIMPLE) == 0.0


def test_mid_size_ring_runs_at_four_fifths_of_plateau() -> None:
    # Zero link latency, no launch: 16 MiB is below the 32 MiB window, so Simple takes
    # baseLat 8.4 us + 14 steps x (3.4 - 0.6) us + 1.25 x bf S / BW (Simple beats LL128's 92 %
    # bandwidth here); pure arithmetic, 1e-12. Far above the window busbw returns to BW.
    links = _ideal(intra_bandwidth_Bps=100e9, intra_latency_s=0.0)
    expected_s = (8.4 + 14 * (3.4 - 0.6)) * units.us + 1.25 * 2 * 7 / 8 * 16 * MiB / 100e9
    assert collective_time_s(Collective.ALL_REDUCE, 16 * MiB, links, Algorithm.RING) == pytest.approx(expected_s, rel=1e-12)
    assert bus_bandwidth_Bps(Collective.ALL_REDUCE, 16 * GiB, links, Algorithm.RING) == pytest.approx(100e9, rel=2e-3)


def test_mid_size_busbw_below_plateau_on_a100() -> None:
    # nccl-tests A100 (C2): 64-256 MiB run at 73-83 % of the 16 GiB plateau; the model must too.
    links = _single_node("dgx-a100", "a100-sxm-80gb")
    plateau = bus_bandwidth_Bps(Collective.ALL_REDUCE, 16 * GiB, links)
    for size in (64 * MiB, 128 * MiB, 256 * MiB):
        assert 0.70 <= bus_bandwidth_Bps(Collective.ALL_REDUCE, size, links) / plateau <= 0.90


# ---------- network floor ----------
def test_network_floor_is_the_cross_node_share_at_the_nic_rate() -> None:
    # 4 nodes x 8 ranks, 10 GB/s NIC per rank at efficiency 0.5: 40 GB/s per node; 1 GB all-gather:
    # each node must receive 31/32 of it -> 0.96875 GB / 40 GB/s
    links = _ideal(32, num_nodes=4, ranks_per_node=8, inter_efficiency=0.5, intra_efficiency=1.0)
    assert network_floor_s(Collective.ALL_GATHER, 1e9, links) == pytest.approx(31 / 32 * 1e9 / 40e9, rel=1e-12)
    # an all-reduce's floor is a reduce-scatter's (in-network reduction sends each byte once), not a ring's 2x
    assert network_floor_s(Collective.ALL_REDUCE, 1e9, links) == network_floor_s(Collective.REDUCE_SCATTER, 1e9, links)
    # never above what the model prices, for every algorithm it can run
    for kind in (Collective.ALL_GATHER, Collective.REDUCE_SCATTER, Collective.ALL_REDUCE):
        for algorithm in available_algorithms(kind, links):
            assert network_floor_s(kind, 1e9, links) < collective_time_s(kind, 1e9, links, algorithm)
    # inside one node there is no network floor; all-to-all has none defined
    assert network_floor_s(Collective.ALL_GATHER, 1e9, _ideal(8)) == 0.0
    with pytest.raises(ValueError, match="network_floor_s"):
        network_floor_s(Collective.ALL_TO_ALL, 1e9, links)
