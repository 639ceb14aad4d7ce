"""A whole iteration's priced work: stages grouped into classes of identical chunks and links,
each priced once, then expanded to the ``PipelineWork`` the DES runs or summed in closed form."""

from __future__ import annotations

from dataclasses import dataclass, fields
from operator import attrgetter
from typing import Any, Mapping, NamedTuple

from hardware.collectives import GroupLinks
from hardware.topology import spanning_p2p_links

from sim.training.analytic import ChunkTimes, DataParallelTimes, chunk_times, data_parallel_times
from sim.training.config import TrainingSetup, dp_overlap_slowdown
from sim.training.costs import (
    GROUP_AXES,
    LayerCost,
    chunk_link_axes,
    chunk_cost,
    chunk_layer_kinds,
    collective_axes,
    ep_overlap_unpaired_share,
    fp8_weight_cast_s,
    group_links,
    layer_kind_ops,
    price_layer,
    rank_of,
)
from sim.training.data_parallel import (
    ChunkSignature,
    closing_gradient_parameters,
    grad_sync_for_parameters,
    optimizer_time_for_parameters_s,
    param_gather_for_parameters,
    paces_param_gather,
    signature_parameter_split,
    stage_signatures,
)
from sim.training.hetero import group_setup, setup_memory, stage_rank
from sim.training.memory import stage_memory_classes
from sim.training.pricing_cache import PricingCache
from sim.training.work import PipelineWork, StageWork
from sim.training.schedules import chunk_ends, placement_kind, plan_layer_counts, plan_placement
from workloads.graph import Op
from workloads.plan import ParallelPlan, TrainingJob

_DURATION = attrgetter("duration_s")

@dataclass(frozen=True, slots=True, kw_only=True)
class IterationWork:
    """The priced pipeline plus the FLOP counts the metrics need."""

    pipeline: PipelineWork
    hardware_flops_per_replica: float  # everything executed by one pipeline replica's stage ranks x tp x cp
    recompute_flops_per_replica: float


def p2p_links(setup: TrainingSetup, cache: PricingCache | None = None) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Bandwidth and latency between stage i and stage (i + 1) % pp (first ranks of each stage)."""
    pp = setup.plan.pp
    cluster = setup.cluster
    if setup.groups:
        return _spanning_p2p_links(setup)
    cluster_id = cache.cluster_id(cluster) if cache is not None else None
    bandwidth, latency = [], []
    for stage in range(pp):
        src, dst = rank_of(setup, pp=stage), rank_of(setup, pp=(stage + 1) % pp)
        if src == dst:
            bandwidth.append(float("inf"))
            latency.append(0.0)
        else:
            if cache is None:
                bw, lat = cluster.p2p_links(src, dst)
            else:
                bw, lat = cache.memo("p2p", (cluster_id, src, dst), lambda: cluster.p2p_links(src, dst))
            bandwidth.append(bw)
            latency.append(lat)
    return tuple(bandwidth), tuple(latency)


def _spanning_p2p_links(setup: TrainingSetup) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """``p2p_links`` on a heterogeneous cluster: between the first ranks of consecutive stages, inside
    one group over its own links, between groups across the spine at the slower NIC share."""
    pp = setup.plan.pp
    bandwidth, latency = [], []
    for stage in range(pp):
        src, dst = stage_rank(setup, stage), stage_rank(setup, (stage + 1) % pp)
        if src[0] is dst[0] and src[1] == dst[1]:
            bw, lat = float("inf"), 0.0
        else:
            bw, lat = spanning_p2p_links(src, dst)
        bandwidth.append(bw)
        latency.append(lat)
    return tuple(bandwidth), tuple(latency)


def class_setup(setup: TrainingSetup, layout: "StageLayout", index: int, keys: "PricingKeys", cache: PricingCache) -> tuple[TrainingSetup, "PricingKeys"]:
    """The setup (and its keys) stage class ``index`` is priced with: ``setup`` itself, or on a
    heterogeneous cluster the setup of the class's group (its GPU, node and calibration)."""
    if not setup.groups:
        return setup, keys
    sub = group_setup(setup, layout.class_group[index])
    return sub, pricing_keys(sub, cache)


# ParallelPlan fields a chunk's price does not depend on (they shape stages, links and the
# optimizer, which other keys carry); every other field, including any added later, is in the key.
# (recompute_layers reaches a chunk through its signature)
_NOT_CHUNK_FIELDS = (
    "pp", "dp", "zero", "hsdp", "hsdp_shard", "schedule", "virtual_stages", "layers_per_stage", "recompute_layers", "offload",
)
_CHUNK_PLAN_FIELDS = tuple(f.name for f in fields(ParallelPlan) if f.name not in _NOT_CHUNK_FIELDS)
_chunk_plan_values = attrgetter(*_CHUNK_PLAN_FIELDS)  # plan -> tuple of those fields' values


# Keys hold the field values of plans and jobs rather than the objects: tuples of plain values
# keep no spec alive and are not tracked by the garbage collector, whose full passes over a large
# cache would otherwise cost a search more than the lookups.
job_values = attrgetter(*(f.name for f in fields(TrainingJob)))
plan_values = attrgetter(*(f.name for f in fields(ParallelPlan)))


class PricingKeys(NamedTuple):
    """One evaluation's cache keys as interned ids, computed once (``pricing_keys``)."""

    chunk: int  # everything a chunk's price depends on besides its links and layers
    setup: int  # everything a ``build_iteration`` result depends on
    data_parallel: int  # everything a stage's data-parallel work depends on besides parameters and links
    model: int  # cache.model_id(setup.model)
    cluster: int  # cache.cluster_id(setup.cluster)


# Fields the data-parallel part of a stage (gradient buckets, ZeRO-3 gathers, optimizer step) does
# not depend on beyond its parameter count and links, which its key carries; every other field,
# including any added later, is in the key.
_NOT_DP_PLAN_FIELDS = (
    "tp", "pp", "cp", "ep", "sequence_parallel", "schedule", "recompute", "recompute_layers", "layers_per_stage",
    "tp_comm_overlap", "cp_comm",
)
_DP_PLAN_FIELDS = tuple(f.name for f in fields(ParallelPlan) if f.name not in _NOT_DP_PLAN_FIELDS)
_DP_JOB_FIELDS = tuple(f.name for f in fields(TrainingJob) if f.name not in ("seq_len", "global_batch", "micro_batch"))
_dp_plan_values = attrgetter(*_DP_PLAN_FIELDS)
_dp_job_values = attrgetter(*_DP_JOB_FIELDS)


# TrainingSetup fields no memoized result depends on: the goodput fields are computed from the
# memoized metrics afterwards (``sim.training.run.with_goodput``), so they stay out of every key.
SETUP_FIELDS_AFTER_MEMO = ("checkpoint", "failures")


def pricing_keys(setup: TrainingSetup, cache: PricingCache) -> PricingKeys:
    """The interned keys of ``setup``: chunk context, whole setup and data-parallel context (with
    the model and cluster ids they are built from); between them they name every setup field."""
    plan, job = setup.plan, setup.job
    ids = cache.spec_ids(setup.model, setup.cluster)
    if setup.groups:  # a heterogeneous cluster: every group's cluster and slowdown, every stage's group
        hetero = cache.intern((
            "groups", tuple((cache.cluster_id(g.cluster), g.overlap_slowdown) for g in setup.groups), setup.stage_group,
        ))
        ids = ids._replace(cluster=hetero, gpu=hetero)
    chunk_context = cache.intern((
        "chunk", ids.gpu, ids.model, job_values(job), setup.attention_kernel, setup.expert_load_imbalance,
        setup.overlap_slowdown, _chunk_plan_values(plan), plan.pp if plan.vocab_parallel else 0,
        setup.main_grad_accumulation, setup.grad_reduce_dtype,
        setup.fp8_recipe, setup.fp8_bf16_edge_layers, setup.pipeline_p2p, setup.tp_overlap_method, setup.linear_bias,
        setup.fp8_cast_fusion, setup.fp8_all_gather, setup.cross_entropy, setup.fp8_scale_update,
        setup.fp8_backward_accumulation, setup.qkv_split, setup.moe_expert_gemm, setup.moe_dispatcher, setup.host_forward_op_s,
        setup.host_backward_op_s, ep_overlap_unpaired_share(setup) if plan.ep_comm_overlap else 0.0,
    ))
    dp_context = cache.intern(
        ("dp", ids.cluster, setup.dp_comm_overlap, setup.grad_reduce_dtype, setup.optimizer_kernels, setup.grad_buffer_passes,
         setup.fsdp_unit, setup.fsdp_kept_after_forward, setup.param_gather_pacing,
         setup.main_grad_accumulation,
         _dp_job_values(job),
         _dp_plan_values(plan))
    )
    # the data-parallel settings (optimizer kernels, gradient-buffer passes, FSDP units) are in it
    # through dp_context: a config may override them under the same framework
    setup_context = cache.intern(
        ("setup", chunk_context, dp_context, ids.cluster, plan_values(plan), setup.dp_comm_overlap, setup.framework,
         setup.data_parallel_overlap_slowdown)
    )
    return PricingKeys(
        chunk=chunk_context, setup=setup_context, data_parallel=dp_context, model=ids.model, cluster=ids.cluster
    )


class StageClassWork(NamedTuple):
    """The work of every pipeline stage with the same chunk signature and process-group links:
    everything of a ``StageWork`` but its index and static memory (which ``build_iteration`` adds
    per stage), in the form the closed form reads, plus the per-micro-batch FLOPs."""

    chunk: ChunkTimes  # the chunks and their F, B, W sums
    data_parallel: DataParallelTimes  # gradient buckets, parameter gathers, optimizer step
    chunk_flops: tuple[tuple[float, float], ...]  # per chunk: (hardware FLOPs, recompute FLOPs) per micro-batch


class StageLayout(NamedTuple):
    """How a plan's stages fall into classes: equal chunk signatures and equal links. (A NamedTuple,
    as the other per-evaluation records here: built once per candidate, and cheaper to build than a
    frozen dataclass.)"""

    key: int  # interned id of everything the layout depends on (``stage_layout``)
    signatures: tuple[tuple[ChunkSignature, ...], ...]  # per class
    links: tuple[dict[str, GroupLinks], ...]  # per class
    links_keys: tuple[tuple[int, ...], ...]  # per class: interned links per GROUP_AXES axis
    chunk_ranges: tuple[tuple[tuple[range, bool, bool], ...], ...]  # per class: its first stage's chunks
    stage_class: tuple[int, ...]  # class index of every stage
    memory_kinds: tuple[tuple[int, int, bool, bool, int], ...]  # memory.stage_memory_classes(model, plan)
    memory_class: tuple[int, ...]
    memory_first_stage: tuple[int, ...]  # per memory kind: its first stage
    p2p_bandwidth_Bps: tuple[float, ...]  # p2p_links: stage i -> (i + 1) % pp
    p2p_latency_s: tuple[float, ...]
    class_group: tuple[int, ...] = ()  # per class: its group of a heterogeneous cluster (0 otherwise)


def stage_layout(setup: TrainingSetup, cache: PricingCache, keys: PricingKeys | None = None) -> StageLayout:
    """The plan's stage classes, memoized on the few inputs they depend on (``keys``:
    ``pricing_keys(setup, cache)`` when the caller has them)."""
    model, plan = setup.model, setup.plan
    if keys is None and setup.groups:
        keys = pricing_keys(setup, cache)
    cluster_id = keys.cluster if keys is not None else cache.cluster_id(setup.cluster)
    key = cache.intern((
        "layout", cluster_id, model.layers, model.dense_layers if model.is_moe else model.layers,
        plan.pp, plan.virtual_stages, placement_kind(plan.schedule), plan.vocab_parallel, plan.layers_per_stage, plan.recompute_layers,
        plan.tp, plan.cp, plan.dp, plan.ep, plan.expert_tp, plan.hsdp, plan.hsdp_shard, setup.pipeline_p2p,
    ))
    return cache.memo("layout", key, lambda: _stage_layout(setup, key, cache))


def _stage_layout(setup: TrainingSetup, key: int, cache: PricingCache) -> StageLayout:
    plan = setup.plan
    counts = plan_layer_counts(setup.model.layers, plan)
    place = plan_placement(plan)
    ends = chunk_ends(plan)
    starts = [sum(counts[:c]) for c in range(len(counts))]
    num_chunks = len(counts)
    classes: dict[tuple[Any, ...], int] = {}
    signatures, links_list, links_keys, chunk_ranges, stage_class, class_group = [], [], [], [], [], []
    for stage, signature in enumerate(stage_signatures(setup)):
        links = group_links(setup, stage, cache)
        links_key = tuple(cache.links_id(links[axis]) for axis in GROUP_AXES)
        group = setup.stage_group[stage] if setup.groups else 0
        index = classes.setdefault((signature, links_key, group), len(classes))
        if index == len(signatures):
            class_group.append(group)
            signatures.append(signature)
            links_list.append(links)
            links_keys.append(links_key)
            chunk_ranges.append(tuple(
                (range(starts[chunk], starts[chunk] + counts[chunk]), *ends[chunk])
                for chunk in range(num_chunks)
                if place[chunk] == stage
            ))
        stage_class.append(index)
    memory_kinds, memory_class = stage_memory_classes(setup.model, plan)
    bandwidth, latency = p2p_links(setup, cache)
    if setup.pipeline_p2p == "blocking":  # the chunks' F and B already hold the transfers (costs.blocking_p2p_s)
        bandwidth, latency = (float("inf"),) * len(bandwidth), (0.0,) * len(latency)
    return StageLayout(
        key=key,
        signatures=tuple(signatures),
        links=tuple(links_list),
        links_keys=tuple(links_keys),
        chunk_ranges=tuple(chunk_ranges),
        stage_class=tuple(stage_class),
        memory_kinds=memory_kinds,
        memory_class=memory_class,
        memory_first_stage=tuple(memory_class.index(k) for k in range(len(memory_kinds))),
        p2p_bandwidth_Bps=bandwidth,
        p2p_latency_s=latency,
        class_group=tuple(class_group),
    )


def _chunks_of_class(
    setup: TrainingSetup, layout: StageLayout, index: int, chunk_context: int, cache: PricingCache
) -> tuple[ChunkTimes, tuple[tuple[float, float], ...]]:
    """(chunks with their sums, per-chunk (FLOPs, recompute FLOPs)) of stage class ``index``.

    A layer's price depends on the links only through the groups of its collectives' axes
    (``costs.collective_axes``), a chunk's through those of its layers and its blocking p2p
    and fp8 amax all-reduces (``costs.chunk_link_axes``), so layers and chunks are memoized per chunk context and the links
    of those axes alone: plans differing only in data-parallel or pipeline degree (other dp, pp and
    dp-shard groups) share them. The ops of each layer kind are built once per chunk context."""
    signature, links = layout.signatures[index], layout.links[index]
    kind_ops: dict[Any, tuple[tuple[list[Op], list[Op], list[Op]], frozenset[str]]] = cache.memo(
        "layer_ops", chunk_context, dict
    )

    def ops_of(kind: Any) -> tuple[tuple[list[Op], list[Op], list[Op]], frozenset[str]]:
        found = kind_ops.get(kind)
        if found is None:
            ops = layer_kind_ops(setup, kind)
            found = kind_ops[kind] = (ops, collective_axes(ops))
        return found

    def links_key(axes: tuple[str, ...]) -> tuple[int, ...]:
        return tuple(-1 if links.get(axis) is None else cache.links_id(links[axis]) for axis in axes)

    def price(kind: Any) -> LayerCost:
        ops, axes = ops_of(kind)
        ordered = tuple(sorted(axes))
        return cache.memo("layer", (chunk_context, kind, ordered, links_key(ordered)),
                          lambda: price_layer(setup, ops, links, cache))

    def prices(kinds: tuple[Any, ...]) -> list[LayerCost]:
        # a chunk's layers repeat a few kinds: each distinct kind looked up once (a pure memo)
        of = {kind: price(kind) for kind in dict.fromkeys(kinds)}
        return [of[kind] for kind in kinds]

    def kinds_of(layers: range, first: bool, last: bool, recomputed: int) -> tuple[tuple[Any, ...], tuple[str, ...]]:
        kinds = tuple(chunk_layer_kinds(setup, layers=layers, first=first, last=last, recomputed=recomputed))
        return kinds, tuple(sorted(frozenset(chunk_link_axes(setup)).union(*(ops_of(k)[1] for k in set(kinds)))))

    costs = []
    for (layers, first, last), chunk_signature in zip(layout.chunk_ranges[index], signature):
        # the chunk's layer kinds follow from its signature (dense and MoE counts, ends, recomputed, bf16)
        kinds, axes = cache.memo("chunk_kinds", (chunk_context, chunk_signature),
                                 lambda: kinds_of(layers, first, last, chunk_signature[4]))
        costs.append(cache.memo(
            "chunk",
            (chunk_context, axes, links_key(axes), chunk_signature),
            lambda: chunk_cost(
                setup, layers=layers, first=first, last=last, recomputed=chunk_signature[4], links=links,
                layer_cache={}, cache=cache, layer_costs=prices(kinds),
            ),
        ))
    return chunk_times(tuple(c.work for c in costs)), tuple((c.flops, c.recompute_flops) for c in costs)


def _data_parallel_work(
    setup: TrainingSetup, params: float, links: Mapping[str, GroupLinks], cache: PricingCache,
    weight_cast_s: float = 0.0, signature: tuple[ChunkSignature, ...] = (), expert: float = 0.0,
) -> DataParallelTimes:
    """Gradient buckets left to overlap the backward, parameter gathers, the buckets' seconds run
    serially after the backward when they do not overlap (``dp_comm_overlap = false``), and the
    optimizer seconds of a stage holding ``params`` parameters per rank (``expert`` of them routed
    experts, data-parallel over their own groups: their gradient buckets, optimizer shard and
    ZeRO-1/2/3 parameter gathers, ``data_parallel.data_parallel_groups``), with the step's once-per-step
    fp8 weight casts (``weight_cast_s``, ``costs.fp8_weight_cast_s``: run in the first micro-batch, a
    per-step cost of the stage like its optimizer step, so priced beside it)."""
    grad_sync = grad_sync_for_parameters(setup, params, links, cache, closing_gradient_parameters(setup, signature),
                                         expert=expert)
    optimizer_s = optimizer_time_for_parameters_s(setup, params, links, cache, expert=expert) + weight_cast_s
    gathers = param_gather_for_parameters(setup, params, links, cache, signature, expert=expert)
    backward = {"param_gather_backward": gathers.backward, "backward_gather_first_s": gathers.backward_first_unit_s,
                "backward_gather_tail_share": gathers.backward_tail_share}
    if setup.dp_comm_overlap:
        return data_parallel_times(grad_sync, gathers.gathers, optimizer_s, gather_first_s=gathers.first_unit_s,
                                   gather_tail_share=gathers.tail_share, gather_first_forward_only=gathers.first_forward_only,
                                   **backward)
    return data_parallel_times((), gathers.gathers, optimizer_s, serial_grad_sync_s=sum(map(_DURATION, grad_sync)),
                               gather_first_s=gathers.first_unit_s, gather_tail_share=gathers.tail_share, **backward)


class ClassChunks(NamedTuple):
    """The chunks of every stage class of one (chunk context, layout) and the replica's FLOPs."""

    chunks: tuple[ChunkTimes, ...]  # per class: its chunks and their F, B, W sums
    chunk_flops: tuple[tuple[tuple[float, float], ...], ...]  # per class, per chunk: (FLOPs, recompute FLOPs)
    flops: float  # per micro-batch, one replica's stages summed stage by stage, chunk by chunk
    recompute_flops: float


def _class_chunks(setup: TrainingSetup, layout: StageLayout, chunk_context: int, cache: PricingCache) -> ClassChunks:
    """Every class's chunks (memoized per chunk context, links and chunk signatures) and the FLOP sums."""
    if setup.groups:  # each class priced on its own group's GPU, under that group's chunk context
        priced_with = [class_setup(setup, layout, index, None, cache) for index in range(len(layout.signatures))]
        contexts = [(sub, sub_keys.chunk) for sub, sub_keys in priced_with]
    else:
        contexts = [(setup, chunk_context)] * len(layout.signatures)
    per_class = tuple(
        cache.memo(
            "stage_chunks",
            (context, layout.links_keys[index], layout.signatures[index]),
            lambda: _chunks_of_class(sub, layout, index, context, cache),
        )
        for index, (sub, context) in enumerate(contexts)
    )
    flops = recompute_flops = 0.0
    for index in layout.stage_class:
        for chunk_flop, chunk_recompute_flop in per_class[index][1]:
            flops += chunk_flop
            recompute_flops += chunk_recompute_flop
    return ClassChunks(
        chunks=tuple(c for c, _ in per_class), chunk_flops=tuple(f for _, f in per_class), flops=flops,
        recompute_flops=recompute_flops,
    )


def _class_data_parallel(
    base: TrainingSetup, layout: StageLayout, base_keys: PricingKeys, cache: PricingCache
) -> tuple[DataParallelTimes, ...]:
    """Per class: its data-parallel work (memoized per data-parallel context, links and parameter count)."""
    plan = base.plan
    out = []
    for index, (signature, links, links_key) in enumerate(zip(layout.signatures, layout.links, layout.links_keys)):
        setup, keys = class_setup(base, layout, index, base_keys, cache)
        # (all, routed-expert) parameters per rank
        params, expert = cache.memo(
            "parameters",
            (keys.model, plan.tp, plan.ep, plan.expert_tp, plan.pp if plan.vocab_parallel else plan.pp > 1, signature),
            lambda: signature_parameter_split(setup, signature),
        )
        cast_s = cache.memo("fp8_weight_cast", (keys.chunk, signature),
                            lambda: fp8_weight_cast_s(setup, signature, links))
        # per-layer FSDP units depend on the chunks' layers and ends, not only on the parameter count,
        # ZeRO-1/2's paced gathers on each chunk's buckets, and the last bucket on the embedding
        per_chunk = ((plan.zero == 3 and setup.fsdp_unit == "layer") or paces_param_gather(setup)
                     or any(chunk[2] for chunk in signature))
        units = (keys.model, tuple(chunk[:4] for chunk in signature)) if per_chunk else None
        out.append(cache.memo(
            "data_parallel", (keys.data_parallel, links_key, params, expert, cast_s, units),
            lambda: _data_parallel_work(setup, params, links, cache, cast_s, signature, expert),
        ))
    return tuple(out)


class IterationClasses(NamedTuple):
    """``build_iteration``'s result with every distinct stage priced once: ``classes[stage_class[s]]``
    is stage s's work. The analytic fidelity reads this directly; the DES expands it to stages.
    The per-class parts are kept as the memoized tuples they come from (``chunks``,
    ``data_parallel``, ``chunk_flops``); ``classes`` zips them."""

    keys: PricingKeys  # the interned keys it was priced under
    layout: StageLayout
    chunks: tuple[ChunkTimes, ...]  # per class
    data_parallel: tuple[DataParallelTimes, ...]  # per class
    chunk_flops: tuple[tuple[tuple[float, float], ...], ...]  # per class, per chunk: (FLOPs, recompute FLOPs)
    schedule: str
    num_microbatches: int
    virtual_stages: int
    p2p_bandwidth_Bps: tuple[float, ...]
    p2p_latency_s: tuple[float, ...]
    overlap_slowdown: float
    hardware_flops_per_replica: float
    recompute_flops_per_replica: float

    @property
    def classes(self) -> tuple[StageClassWork, ...]:
        """Every class's work in one record each."""
        return tuple(StageClassWork(*parts) for parts in zip(self.chunks, self.data_parallel, self.chunk_flops))


def data_parallel_overlap_slowdown(setup: TrainingSetup, layout: StageLayout) -> float:
    """The compute slowdown while the data-parallel stream overlaps compute (``PipelineWork.overlap_slowdown``):
    the set ``[parallel] overlap_slowdown``, else from the SMs NCCL's channels hold on stage 0's
    data-parallel group (the FSDP shard group under HSDP; ``config.dp_overlap_slowdown``)."""
    if setup.data_parallel_overlap_slowdown is not None:
        return setup.data_parallel_overlap_slowdown
    links = layout.links[0]
    group = links["dp_shard"] if setup.plan.hsdp else links["dp"]
    if group.size <= 1:
        return setup.overlap_slowdown
    cluster = setup.groups[layout.class_group[0]].cluster if setup.groups else setup.cluster
    return dp_overlap_slowdown(group, cluster.gpu.sm_count)


def build_iteration_classes(
    setup: TrainingSetup, cache: PricingCache | None = None, *, keys: PricingKeys | None = None
) -> IterationClasses:
    """Price each stage class's chunks, gradient buckets and optimizer step once (see ``build_iteration``).
    ``keys``: ``pricing_keys(setup, cache)`` when the caller has them."""
    cache = cache if cache is not None else PricingCache()
    plan = setup.plan
    if keys is None:
        keys = pricing_keys(setup, cache)
    layout = stage_layout(setup, cache, keys)
    # chunks of every class and the FLOP sums: one entry per (chunk context, layout); the
    # data-parallel work of every class: one per (data-parallel context, layout, model)
    chunks = cache.memo(
        "class_chunks", (keys.chunk, layout.key), lambda: _class_chunks(setup, layout, keys.chunk, cache)
    )
    data_parallel = cache.memo(
        "class_data_parallel",
        (keys.data_parallel, layout.key, keys.model),
        lambda: _class_data_parallel(setup, layout, keys, cache),
    )
    m = setup.num_microbatches
    ranks_per_stage = plan.tp * plan.cp
    return IterationClasses(
        keys=keys,
        layout=layout,
        chunks=chunks.chunks,
        data_parallel=data_parallel,
        chunk_flops=chunks.chunk_flops,
        schedule=plan.schedule,
        num_microbatches=m,
        virtual_stages=plan.virtual_stages,
        p2p_bandwidth_Bps=layout.p2p_bandwidth_Bps,
        p2p_latency_s=layout.p2p_latency_s,
        overlap_slowdown=data_parallel_overlap_slowdown(setup, layout),
        hardware_flops_per_replica=chunks.flops * m * ranks_per_stage,
        recompute_flops_per_replica=chunks.recompute_flops * m * ranks_per_stage,
    )


def build_iteration(setup: TrainingSetup, cache: PricingCache | None = None) -> IterationWork:
    """Price every stage's chunks, gradient buckets and optimizer step.

    ``cache`` (a search passes one for all its evaluations) memoizes exact intermediate results;
    without it a fresh one still prices each stage class (same chunks, links) once.
    """
    cache = cache if cache is not None else PricingCache()
    plan, model = setup.plan, setup.model
    priced = build_iteration_classes(setup, cache)
    setup_context = priced.keys.setup
    flash = setup.fused_attention
    memory = cache.memo("memory", (setup_context, flash), lambda: setup_memory(setup))
    stages = []
    classes = priced.classes
    for stage, index in enumerate(priced.layout.stage_class):
        work, breakdown = classes[index], memory[stage]
        stages.append(
            StageWork(
                stage=stage,
                chunks=work.chunk.chunks,
                grad_sync=work.data_parallel.grad_sync,
                param_gather=work.data_parallel.param_gather,
                serial_grad_sync_s=work.data_parallel.serial_grad_sync_s,
                param_gather_first_s=work.data_parallel.gather_first_s,
                param_gather_tail_share=work.data_parallel.gather_tail_share,
                param_gather_first_forward_only=work.data_parallel.gather_first_forward_only,
                param_gather_backward=work.data_parallel.param_gather_backward,
                param_gather_backward_first_s=work.data_parallel.backward_gather_first_s,
                param_gather_backward_tail_share=work.data_parallel.backward_gather_tail_share,
                optimizer_s=work.data_parallel.optimizer_s,
                static_memory_bytes=breakdown.total_bytes - breakdown.activations_bytes,
            )
        )
    pipeline = PipelineWork(
        schedule=priced.schedule,
        num_microbatches=priced.num_microbatches,
        virtual_stages=priced.virtual_stages,
        stages=tuple(stages),
        p2p_bandwidth_Bps=priced.p2p_bandwidth_Bps,
        p2p_latency_s=priced.p2p_latency_s,
        overlap_slowdown=priced.overlap_slowdown,
    )
    return IterationWork(
        pipeline=pipeline,
        hardware_flops_per_replica=priced.hardware_flops_per_replica,
        recompute_flops_per_replica=priced.recompute_flops_per_replica,
    )
