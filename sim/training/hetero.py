"""Heterogeneous training clusters: ``[cluster] groups`` of different GPUs and nodes in one job, with
each pipeline stage placed whole on one group (``[parallel] stage_groups``).

A group is a homogeneous cluster of its own (its GPU with that GPU's calibration profile, its node
with its NVLink and NICs, and the job's one network); the j-th stage placed on a group occupies that
group's ranks j x B .. (j + 1) x B - 1 (B = tp x cp x dp, Megatron order inside the stage). So every
stage's tensor-, context-, expert- and data-parallel groups lie inside its group, and its compute,
its collectives and its memory capacity are its own GPU's and node's. What spans groups (the
point-to-point transfers between stages on different groups and the pipeline group the vocabulary-
parallel collectives use) runs at the slowest member's NIC share across the spine
(``hardware.topology.spanning_links``). Uneven ``layers_per_stage`` balance the stages (the plan
search's stage-assignment MILP chooses them from per-stage costs).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from hardware.catalog import get_gpu, get_network, get_node
from hardware.errors import CatalogError
from hardware.topology import Cluster, build_cluster
from sim.errors import ConfigError
from workloads.errors import InvalidPlanError

GROUP_KEYS = ("gpu", "num_gpus", "node", "calibration")
# [cluster] keys that describe one GPU type and so belong in each group when groups are given
PER_GROUP_CLUSTER_KEYS = ("gpu", "node", "calibration")


@dataclass(frozen=True, slots=True, kw_only=True)
class StageGroup:
    """One group of a heterogeneous cluster: its GPUs as a cluster of their own."""

    cluster: Cluster  # the group's GPU (with its calibration profile), node, the job's network, its GPU count
    first_rank: int  # its first rank in the whole job (groups are numbered in the order given)
    overlap_slowdown: float  # compute slowdown while communication overlaps, for this group's GPU


def resolve_groups(table: Mapping[str, Any]) -> tuple[tuple[Cluster, ...], int]:
    """``[cluster] groups`` as one cluster per group, and the job's GPU count (their sum)."""
    from sim.config import CLUSTER_KEYS, MAX_NUM_GPUS, reject_unknown_keys, with_calibration

    reject_unknown_keys(table, "cluster", CLUSTER_KEYS)
    groups = table["groups"]
    if not isinstance(groups, list) or not groups or not all(isinstance(g, dict) for g in groups):
        raise ConfigError(f"[cluster] groups = {groups!r} must be a non-empty list of tables {{gpu = ..., num_gpus = ..., node = ...}}")
    for key in PER_GROUP_CLUSTER_KEYS:
        if key in table:
            raise ConfigError(f"[cluster] {key} = {table[key]!r} cannot be given with groups; give {key} in each group")
    try:
        network_name = table.get("network")
        clusters = []
        for index, group in enumerate(groups):
            where = f"[cluster] groups[{index}]"
            for key in group:
                if key not in GROUP_KEYS:
                    raise ConfigError(f"{where} unknown key '{key}'; allowed: {', '.join(GROUP_KEYS)}")
            if "gpu" not in group or not isinstance(group["gpu"], str):
                raise ConfigError(f"{where} needs 'gpu' (a catalog GPU name; see `llmsim catalog gpus`)")
            count = group.get("num_gpus")
            if not isinstance(count, int) or isinstance(count, bool) or not 0 < count <= MAX_NUM_GPUS:
                raise ConfigError(f"{where} num_gpus = {count!r} must be a positive integer (at most {MAX_NUM_GPUS:,})")
            gpu = get_gpu(group["gpu"])
            if "calibration" in group:
                gpu = with_calibration(gpu, group["calibration"])
            node = get_node(str(group.get("node", gpu.default_node)))
            if node.gpu != gpu.name:
                raise ConfigError(f"{where} node '{node.name}' holds {node.gpu}, not gpu '{gpu.name}'")
            if network_name is None:
                network_name = node.default_network  # the first group's node names the job's fabric
            clusters.append((gpu, node, count))
        network = get_network(str(network_name))
    except CatalogError as exc:
        raise ConfigError(f"[cluster] {exc}") from None
    total = sum(count for _, _, count in clusters)
    given = table.get("num_gpus", total)
    if given != total:
        raise ConfigError(f"[cluster] num_gpus = {given!r} must equal the groups' GPUs summed ({total}), or be left out")
    if total > MAX_NUM_GPUS:
        raise ConfigError(f"[cluster] groups hold {total} GPUs, past the limit {MAX_NUM_GPUS:,}")
    return tuple(build_cluster(gpu, node, network, count) for gpu, node, count in clusters), total


def place_stages(
    clusters: Sequence[Cluster], given: Any, *, pp: int, tp: int, ranks_per_stage: int
) -> tuple[int, ...]:
    """The group of every pipeline stage: ``[parallel] stage_groups`` checked against the groups
    (each group holds exactly its stages' ranks; tp fits its node's NVLink domain), or, when empty,
    the groups in order, each taking num_gpus / (tp x cp x dp) consecutive stages."""
    for index, cluster in enumerate(clusters):
        if tp > cluster.domain_gpus:
            raise InvalidPlanError(
                f"parallel.tp = {tp} does not fit group {index}'s node {cluster.node.name} "
                f"({cluster.domain_gpus} GPUs per NVLink domain); allowed: tp <= {cluster.domain_gpus}"
            )
    if given is None or given == []:
        placement: list[int] = []
        for index, cluster in enumerate(clusters):
            if cluster.num_gpus % ranks_per_stage:
                raise InvalidPlanError(
                    f"[cluster] groups[{index}] num_gpus = {cluster.num_gpus} must be a multiple of the "
                    f"{ranks_per_stage} GPUs of one pipeline stage (tp x cp x dp)"
                )
            placement += [index] * (cluster.num_gpus // ranks_per_stage)
        if len(placement) != pp:
            raise InvalidPlanError(f"the groups hold {len(placement)} pipeline stages of {ranks_per_stage} GPUs; needs pp = {pp}")
        return tuple(placement)
    if not isinstance(given, list) or not all(isinstance(g, int) and not isinstance(g, bool) for g in given):
        raise ConfigError(f"[parallel] stage_groups = {given!r} must be a list of group indices (integers)")
    if len(given) != pp:
        raise InvalidPlanError(f"parallel.stage_groups = {given} has {len(given)} entries; needs pp = {pp} (one group per stage)")
    for g in given:
        if not 0 <= g < len(clusters):
            raise InvalidPlanError(f"parallel.stage_groups entry {g} is not a group; allowed: 0..{len(clusters) - 1}")
    for index, cluster in enumerate(clusters):
        needed = given.count(index) * ranks_per_stage
        if needed != cluster.num_gpus:
            raise InvalidPlanError(
                f"parallel.stage_groups places {given.count(index)} stages of {ranks_per_stage} GPUs (tp x cp x dp) "
                f"on group {index}, which has num_gpus = {cluster.num_gpus}; they must match"
            )
    return tuple(given)


def stage_groups_for(clusters: Sequence[Cluster], overlap_slowdowns: Sequence[float]) -> tuple[StageGroup, ...]:
    """The ``StageGroup`` records of ``clusters`` (ranks numbered group after group)."""
    out, first = [], 0
    for cluster, slowdown in zip(clusters, overlap_slowdowns):
        out.append(StageGroup(cluster=cluster, first_rank=first, overlap_slowdown=slowdown))
        first += cluster.num_gpus
    return tuple(out)


def stage_setup(setup: Any, stage: int) -> tuple[Any, int]:
    """(the setup stage ``stage`` is priced with, its stage index there): a homogeneous setup and
    the stage itself, or, on a heterogeneous cluster, the setup of the stage's group alone (its
    cluster and overlap slowdown) and the stage's position among that group's stages."""
    if not setup.groups:
        return setup, stage
    group = setup.stage_group[stage]
    return group_setup(setup, group), setup.stage_group[:stage].count(group)


def group_setup(setup: Any, group: int) -> Any:
    """``setup`` as if the job ran on group ``group``'s cluster alone."""
    g = setup.groups[group]
    return replace(setup, cluster=g.cluster, overlap_slowdown=g.overlap_slowdown, groups=(), stage_group=())


def stage_rank(setup: Any, stage: int, offset: int = 0) -> tuple[Cluster, int]:
    """(cluster, rank in it) of the rank ``offset`` of stage ``stage`` (Megatron order inside the stage)."""
    plan = setup.plan
    per_stage = plan.tp * plan.cp * plan.dp
    sub, local = stage_setup(setup, stage)
    return sub.cluster, local * per_stage + offset


def peak_flops_per_s(setup: Any, precision: str) -> float:
    """The job's summed dense peak: every group's GPUs at their own GPU's peak."""
    if not setup.groups:
        return setup.cluster.num_gpus * setup.cluster.gpu.peak(precision)
    return sum(g.cluster.num_gpus * g.cluster.gpu.peak(precision) for g in setup.groups)


def describe(setup: Any) -> str:
    """'8 x a100-sxm-80gb (dgx-a100) + 8 x h100-sxm-80gb (dgx-h100)' for a table header."""
    return " + ".join(f"{g.cluster.num_gpus} x {g.cluster.gpu.name} ({g.cluster.node.name})" for g in setup.groups)


def setup_memory(setup: Any) -> tuple[Any, ...]:
    """``memory.memory_per_stage`` of the setup, every stage checked against its own GPU's capacity."""
    from sim.training.memory import memory_per_stage

    flash = setup.fused_attention
    if not setup.groups:
        capacity = setup.cluster.gpu.hbm_capacity_bytes
        return memory_per_stage(setup.model, setup.plan, setup.job, capacity_bytes=capacity, flash_attention=flash)
    by_capacity: dict[float, tuple[Any, ...]] = {}
    out = []
    for stage, group in enumerate(setup.stage_group):
        capacity = setup.groups[group].cluster.gpu.hbm_capacity_bytes
        if capacity not in by_capacity:
            by_capacity[capacity] = memory_per_stage(setup.model, setup.plan, setup.job, capacity_bytes=capacity, flash_attention=flash)
        out.append(by_capacity[capacity][stage])
    return tuple(out)
