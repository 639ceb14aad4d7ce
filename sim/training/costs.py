"""Price one training iteration's work: from (model, plan, job, cluster) to a ``PipelineWork``.

Ranks follow Megatron-LM's default order (tp fastest, then cp, then dp, then pp), so a tensor-
parallel group sits inside a node and data-parallel peers are tp x cp ranks apart. By symmetry one
rank per pipeline stage is priced: every data-parallel replica and every tp/cp peer does the same.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from operator import attrgetter
from typing import Any, Mapping, NamedTuple

from hardware.collectives import Collective, GroupLinks, collective_time_s
from hardware.specs import Tier
from hardware.transfer import transfer_time_s
from sim import costmodel
from sim.training.config import TrainingSetup
from sim.training.analytic import ChunkTimes, DataParallelTimes, chunk_times, data_parallel_times
from sim.training.memory import activation_bytes_per_layer, memory_per_stage, shard_degrees, stage_memory_classes
from sim.training.pricing_cache import PricingCache
from sim.training.work import ChunkWork, CommWork, PipelineWork, StageWork
from workloads.graph import Op, Sharding, backward_ops, embedding_ops, layer_forward_ops, lm_head_ops
from workloads.plan import ParallelPlan, TrainingJob, stage_layer_counts
from workloads.precision import bytes_per_element

# Enum members looked up once (attribute access on an Enum class is slow in a search loop)
_ALL_REDUCE, _REDUCE_SCATTER = Collective.ALL_REDUCE, Collective.REDUCE_SCATTER
_COLLECTIVE_NAMES = {kind: kind.value for kind in Collective}
_DURATION = attrgetter("duration_s")

# Megatron-LM's DDP gradient bucket: max(40M, 1M x dp) parameters (megatron/core/distributed,
# `bucket_size = max(40000000, 1000000 * dp_size)`).
BUCKET_PARAMETERS = 40_000_000

# HBM bytes touched per parameter of the local optimizer shard by one mixed-precision step, after
# Megatron-LM's optimizer (megatron/core/optimizer): fused Adam reads the fp32 gradient, master
# weight, m and v (16) and writes master, m and v (12); copying master weights into the 16-bit
# model weights reads 4 and writes 2; the gradient-norm for clipping reads every fp32 gradient (4);
# zeroing the gradient buffer for the next iteration writes it (4). With fp16 the loss-scale step
# also unscales the gradients and checks them for inf/NaN (read and write, 8).
ADAM_BYTES_PER_PARAMETER = 16.0 + 12.0
SGD_BYTES_PER_PARAMETER = 8.0 + 4.0  # read gradient and master weight, write master weight
MASTER_TO_MODEL_BYTES_PER_PARAMETER = 4.0 + 2.0
GRAD_NORM_BYTES_PER_PARAMETER = 4.0
ZERO_GRAD_BYTES_PER_PARAMETER = 4.0
FP16_UNSCALE_BYTES_PER_PARAMETER = 8.0


def optimizer_bytes_per_parameter(optimizer: str, precision: str) -> float:
    """HBM traffic of one optimizer step per parameter of the rank's shard (see the constants)."""
    update = ADAM_BYTES_PER_PARAMETER if optimizer == "adam" else SGD_BYTES_PER_PARAMETER
    extra = MASTER_TO_MODEL_BYTES_PER_PARAMETER + GRAD_NORM_BYTES_PER_PARAMETER + ZERO_GRAD_BYTES_PER_PARAMETER
    if precision == "fp16":
        extra += FP16_UNSCALE_BYTES_PER_PARAMETER
    return update + extra


@dataclass(frozen=True, slots=True, kw_only=True)
class Ranks:
    """Rank numbers of stage ``stage``'s process groups (Megatron order tp, cp, dp, pp)."""

    tp: tuple[int, ...]
    cp: tuple[int, ...]
    dp: tuple[int, ...]  # the data-parallel x context-parallel group ZeRO shards and reduces over
    ep: tuple[int, ...]
    dp_shard: tuple[int, ...]  # HSDP: the in-node part of the dp group (== dp without HSDP)
    dp_replicate: tuple[int, ...]  # HSDP: one rank per shard group (a single rank without HSDP)


def rank_of(setup: TrainingSetup, *, tp: int = 0, cp: int = 0, dp: int = 0, pp: int = 0) -> int:
    plan = setup.plan
    return tp + plan.tp * (cp + plan.cp * (dp + plan.dp * pp))


def stage_ranks(setup: TrainingSetup, stage: int) -> Ranks:
    plan = setup.plan
    ep_ranks = []
    for j in range(plan.ep):  # expert group: consecutive ranks of the (cp x dp) space
        cp_index, dp_index = j % plan.cp, j // plan.cp
        ep_ranks.append(rank_of(setup, cp=cp_index, dp=dp_index, pp=stage))
    dp_cp = tuple(rank_of(setup, cp=j % plan.cp, dp=j // plan.cp, pp=stage) for j in range(plan.cp * plan.dp))
    shard, _ = shard_degrees(plan, setup.cluster.node.gpus_per_node)
    return Ranks(
        tp=tuple(rank_of(setup, tp=t, pp=stage) for t in range(plan.tp)),
        cp=tuple(rank_of(setup, cp=c, pp=stage) for c in range(plan.cp)),
        dp=dp_cp,
        ep=tuple(ep_ranks),
        dp_shard=dp_cp[:shard],
        dp_replicate=dp_cp[::shard],
    )


GROUP_AXES = ("tp", "cp", "dp", "ep", "dp_shard", "dp_replicate")


def stage_groups(setup: TrainingSetup, stage: int) -> dict[str, tuple[int, int, int]]:
    """``stage_ranks`` as arithmetic progressions (first rank, stride, count) per axis: in Megatron
    order every group of a stage is evenly spaced (tp by 1; cp, dp x cp and ep by tp; the HSDP
    replicate group by tp x shard), which lets a search cache the links without listing ranks."""
    plan = setup.plan
    base = rank_of(setup, pp=stage)
    dp_cp = plan.cp * plan.dp
    shard, _ = shard_degrees(plan, setup.cluster.node.gpus_per_node)
    return {
        "tp": (base, 1, plan.tp),
        "cp": (base, plan.tp, plan.cp),
        "dp": (base, plan.tp, dp_cp),
        "ep": (base, plan.tp, plan.ep),
        "dp_shard": (base, plan.tp, min(shard, dp_cp)),
        "dp_replicate": (base, plan.tp * shard, -(-dp_cp // shard)),
    }


def group_links(setup: TrainingSetup, stage: int, cache: PricingCache | None = None) -> dict[str, GroupLinks]:
    """The links each process group of ``stage`` sees (see ``stage_groups``)."""
    cache = cache if cache is not None else PricingCache()
    cluster = setup.cluster
    return {axis: cache.group_links(cluster, *spec) for axis, spec in stage_groups(setup, stage).items()}


def _sharding(setup: TrainingSetup) -> Sharding:
    plan = setup.plan
    return Sharding(
        tp=plan.tp,
        sequence_parallel=plan.sequence_parallel,
        cp=plan.cp,
        ep=plan.ep,
        expert_load_imbalance=setup.expert_load_imbalance,
        cp_comm=plan.cp_comm,
    )


def attention_sequences(setup: TrainingSetup) -> tuple[tuple[tuple[int, int], ...], bool]:
    """(query, key) pairs of one rank's micro-batch and whether the kernel masks causally.

    Context parallel with load balancing gives each rank two sequence chunks whose queries see on
    average half the sequence: priced as s/cp queries against s/2 keys, unmasked (exact in FLOPs).
    A sliding window w < s caps each query's keys: priced as s queries against the mean key count.
    """
    s, b, cp = setup.job.seq_len, setup.job.micro_batch, setup.plan.cp
    window = setup.model.sliding_window
    if cp > 1:
        keys = s // 2 if window is None else min(window, s // 2)
        return tuple([(s // cp, keys)] * b), False
    if window is not None and window < s:
        keys_seen = window * (window + 1) / 2 + (s - window) * window
        return tuple([(s, round(keys_seen / s))] * b), False
    return tuple([(s, s)] * b), True


def layer_passes(setup: TrainingSetup, moe: bool) -> tuple[list[Op], list[Op], list[Op]]:
    """(F, B, W) ops of one layer for one micro-batch; B starts with the recomputed forward ops."""
    job, plan = setup.job, setup.plan
    sequences, causal = attention_sequences(setup)
    forward = layer_forward_ops(
        setup.model,
        tokens=job.micro_batch * job.seq_len // plan.cp,
        sequences=sequences,
        sharding=_sharding(setup),
        moe=moe,
        bytes_per_element=bytes_per_element("bf16" if job.precision == "fp8" else job.precision),
        # fp8 training (Transformer Engine) casts both GEMM operands to fp8; activations stay bf16
        weight_bytes_per_element=bytes_per_element(job.precision),
        causal=causal,
        fused_attention=setup.attention_kernel == "flash",
    )
    if plan.recompute == "full":
        recompute = forward
    elif plan.recompute == "selective":
        recompute = [op for op in forward if op.kind == "attention" or op.name.startswith("attention_")
                     and op.kind != "collective"]
    else:
        recompute = []
    b_ops, w_ops = backward_ops(forward, recompute=recompute)
    return forward, b_ops, w_ops


@dataclass(frozen=True, slots=True, kw_only=True)
class PassCost:
    """Seconds of one pass: compute, communication per axis, and the part that stays exposed."""

    compute_s: float
    exposed_comm_s: dict[str, float]
    flops: float
    recompute_flops: float

    @property
    def total_s(self) -> float:
        return self.compute_s + sum(self.exposed_comm_s.values())


def price_pass(
    setup: TrainingSetup, ops: list[Op], links: Mapping[str, GroupLinks], cache: PricingCache | None = None
) -> PassCost:
    """Compute plus the communication left on the critical path.

    TP collectives block the compute stream unless ``tp_comm_overlap`` (then they hide behind the
    pass's GEMMs, which run slower by ``overlap_slowdown`` while overlapped); the context-parallel
    K/V ring overlaps the attention kernel (the all-gather variant blocks); expert all-to-alls block.
    """
    gpu, precision = setup.cluster.gpu, setup.job.precision
    collective_time = cache.collective_s if cache is not None else collective_time_s
    compute = gemm = attention = flops = recompute_flops = cp_ring = 0.0
    comm: dict[str, float] = {}
    for op in ops:
        seconds = costmodel.op_time_s(op, gpu, precision=precision, links=links, collective_time=collective_time)
        if op.kind == "collective":
            comm[op.axis] = comm.get(op.axis, 0.0) + seconds
            if op.axis == "cp" and op.collective == "send_recv":
                cp_ring += seconds
            continue
        compute += seconds
        op_flops = costmodel.op_flops(op)
        flops += op_flops
        if op.recompute:
            recompute_flops += op_flops
        if op.kind == "gemm":
            gemm += seconds
        elif op.kind == "attention":
            attention += seconds
    slowdown = setup.overlap_slowdown - 1.0
    exposed: dict[str, float] = {}
    for axis, seconds in comm.items():
        if axis == "tp" and setup.plan.tp_comm_overlap:
            hidden = min(seconds, gemm)
        elif axis == "cp":
            hidden = min(cp_ring, attention)  # ring passes overlap attention; an all-gather blocks
        else:
            hidden = 0.0
        compute += hidden * slowdown
        exposed[axis] = seconds - hidden
    return PassCost(compute_s=compute, exposed_comm_s=exposed, flops=flops, recompute_flops=recompute_flops)


def _add(total: dict[str, float], extra: Mapping[str, float]) -> None:
    for axis, seconds in extra.items():
        total[axis] = total.get(axis, 0.0) + seconds


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerCost:
    """One layer's (or one pipeline end's) F, B and W for one micro-batch."""

    forward: PassCost
    backward_input: PassCost
    backward_weight: PassCost
    recompute_s: float  # part of backward_input spent re-running forward ops


def price_layer(
    setup: TrainingSetup,
    ops: tuple[list[Op], list[Op], list[Op]],
    links: Mapping[str, GroupLinks],
    cache: PricingCache | None = None,
) -> LayerCost:
    f_ops, b_ops, w_ops = ops
    recompute = [op for op in b_ops if op.recompute]
    return LayerCost(
        forward=price_pass(setup, f_ops, links, cache),
        backward_input=price_pass(setup, b_ops, links, cache),
        backward_weight=price_pass(setup, w_ops, links, cache),
        recompute_s=price_pass(setup, recompute, links, cache).total_s if recompute else 0.0,
    )


def end_ops(setup: TrainingSetup, *, first: bool, last: bool) -> list[tuple[list[Op], list[Op], list[Op]]]:
    """F, B, W ops of the embedding (first chunk) and LM head + loss (last chunk)."""
    model, job, plan = setup.model, setup.job, setup.plan
    tokens = job.micro_batch * job.seq_len // plan.cp
    act = bytes_per_element("bf16" if job.precision == "fp8" else job.precision)
    sharding = _sharding(setup)
    ends = []
    if first:
        ends.append(embedding_ops(model, tokens=tokens, sharding=sharding, bytes_per_element=act))
    if last:
        ends.append(lm_head_ops(model, tokens=tokens, sharding=sharding, bytes_per_element=act))
    return [(forward, *backward_ops(forward)) for forward in ends]


@dataclass(frozen=True, slots=True, kw_only=True)
class ChunkCost:
    work: ChunkWork
    flops: float  # hardware FLOPs of F + B + W for one micro-batch (recompute included)
    recompute_flops: float


def chunk_cost(
    setup: TrainingSetup,
    *,
    layers: range,
    first: bool,
    last: bool,
    links: Mapping[str, GroupLinks],
    layer_cache: dict[bool, LayerCost],
    cache: PricingCache | None = None,
) -> ChunkCost:
    """F, B and W of one micro-batch through a chunk holding ``layers`` (global layer indices)."""
    model, job, plan = setup.model, setup.job, setup.plan
    costs: list[LayerCost] = []
    for layer in layers:
        moe = model.is_moe and layer >= model.dense_layers
        if moe not in layer_cache:
            layer_cache[moe] = price_layer(setup, layer_passes(setup, moe), links, cache)
        costs.append(layer_cache[moe])
    costs += [price_layer(setup, ops, links, cache) for ops in end_ops(setup, first=first, last=last)]
    exposed: dict[str, float] = {}
    flops = recompute_flops = 0.0
    for cost in costs:
        for pass_cost in (cost.forward, cost.backward_input, cost.backward_weight):
            _add(exposed, pass_cost.exposed_comm_s)
            flops += pass_cost.flops
            recompute_flops += pass_cost.recompute_flops
    tokens = job.micro_batch * job.seq_len // plan.cp
    send = tokens * model.hidden * bytes_per_element("bf16" if job.precision == "fp8" else job.precision)
    if plan.tp > 1:
        # Megatron's scatter/gather optimisation (Narayanan et al. 2021 Sec. 4.1): each TP rank sends
        # its 1/tp slice between stages and the receiver all-gathers it over NVLink
        send /= plan.tp
    per_layer_activation = activation_bytes_per_layer(model, plan, job, flash_attention=setup.attention_kernel == "flash")
    work = ChunkWork(
        forward_s=sum(c.forward.total_s for c in costs),
        backward_input_s=sum(c.backward_input.total_s for c in costs),
        backward_weight_s=sum(c.backward_weight.total_s for c in costs),
        exposed_comm_s=exposed,
        recompute_s=sum(c.recompute_s for c in costs),
        activation_bytes=len(layers) * per_layer_activation,
        send_bytes=send,
        layers=len(layers),
    )
    return ChunkCost(work=work, flops=flops, recompute_flops=recompute_flops)


ChunkSignature = tuple[int, int, bool, bool]  # (dense layers, layers, holds embedding, holds LM head)


def stage_signatures(setup: TrainingSetup) -> tuple[tuple[ChunkSignature, ...], ...]:
    """Every stage's chunks as signatures, in model order. A chunk's price and parameters depend on its
    layers only through how many are dense and how many MoE (dense layers come first) and on whether
    it holds the embedding / LM head."""
    model, plan = setup.model, setup.plan
    counts = stage_layer_counts(model.layers, plan)
    dense_layers = model.dense_layers if model.is_moe else model.layers
    last_chunk = len(counts) - 1
    signatures: list[list[ChunkSignature]] = [[] for _ in range(plan.pp)]
    start = 0
    for chunk, count in enumerate(counts):
        dense = min(max(dense_layers - start, 0), count)
        signatures[chunk % plan.pp].append((dense, count, chunk == 0, chunk == last_chunk))
        start += count
    return tuple(tuple(stage) for stage in signatures)


def _signature_parameters(setup: TrainingSetup, signature: tuple[ChunkSignature, ...]) -> float:
    """``stage_parameters_per_rank`` of the stage whose chunks are ``signature`` (layer by layer in
    model order, so the float sum is the one of every stage with this signature)."""
    model, plan = setup.model, setup.plan
    per_layer: dict[bool, float] = {}  # parameters per rank of a dense / MoE layer, computed once
    params = 0.0
    for dense, count, _, _ in signature:
        for index in range(count):
            moe = model.is_moe and index >= dense
            if moe not in per_layer:
                if moe:
                    experts = model.experts * model.mlp_parameters(model.expert_ffn_hidden)
                    moe_dense = model.layer_parameters(moe=True) - experts
                    per_layer[moe] = moe_dense / plan.tp + experts / (plan.tp * plan.ep)
                else:
                    per_layer[moe] = model.layer_parameters(moe=False) / plan.tp
            params += per_layer[moe]
    table = model.vocab * model.hidden / plan.tp
    if any(first for _, _, first, _ in signature):
        params += table
    if any(last for _, _, _, last in signature) and (not model.tied_embeddings or plan.pp > 1):
        params += table
    return params


def stage_parameters_per_rank(setup: TrainingSetup, stage: int) -> float:
    """Parameters one rank of ``stage`` holds before any ZeRO sharding: its layers (all its virtual
    chunks) divided by tp (experts also by ep), plus the embedding on stage 0 and the LM head on the
    last stage (a tied head is a second copy there when pp > 1, as Megatron keeps it)."""
    return _signature_parameters(setup, stage_signatures(setup)[stage])


def grad_sync_work(
    setup: TrainingSetup, stage: int, links: Mapping[str, GroupLinks], cache: PricingCache | None = None
) -> tuple[CommWork, ...]:
    """Data-parallel gradient buckets of one stage (empty when dp == 1).

    ZeRO 0 all-reduces gradients; ZeRO 1/2/3 reduce-scatter them (the matching parameter
    all-gather of ZeRO 1/2 runs after the optimizer, see ``optimizer_time_s``); HSDP reduce-scatters
    inside the node and all-reduces the 1/shard result across nodes. Gradients travel in
    fp32 for bf16/fp8 training (Megatron accumulates and reduces main grads in fp32 for bf16) and in
    fp16 for fp16 training. All full buckets have one size, so they are priced once.
    """
    return _grad_sync(setup, stage_parameters_per_rank(setup, stage), links, cache)


def _grad_sync(
    setup: TrainingSetup, params: float, links: Mapping[str, GroupLinks], cache: PricingCache | None
) -> tuple[CommWork, ...]:
    plan = setup.plan
    cache = cache if cache is not None else PricingCache()
    collective = cache.collective_s
    group = links["dp"]
    if group.size <= 1:
        return ()
    grad_bytes = 2.0 if setup.job.precision == "fp16" else 4.0
    bucket = max(BUCKET_PARAMETERS, 1_000_000 * plan.dp)
    kind = _ALL_REDUCE if plan.zero == 0 else _REDUCE_SCATTER
    shard = links["dp_shard"].size if plan.hsdp else group.size

    def seconds(message: float) -> float:
        if not plan.hsdp:
            return collective(kind, message, group)
        return collective(_REDUCE_SCATTER, message, links["dp_shard"]) + collective(
            _ALL_REDUCE, message / shard, links["dp_replicate"]
        )

    # Full buckets, then the remainder. Subtracting the integer bucket from a float parameter count
    # below 2**53 is exact, so one subtraction of k buckets equals k successive ones.
    full = 0
    remaining = params
    if remaining < 2.0**53:
        full = max(int(remaining // bucket), 0)
        remaining -= full * bucket
    while remaining >= bucket:
        full += 1
        remaining -= bucket
    message = bucket * grad_bytes
    kind_name = _COLLECTIVE_NAMES[kind]
    buckets = (CommWork(axis="dp", kind=kind_name, message_bytes=message, duration_s=seconds(message)),) * full
    if remaining > 0:
        message = remaining * grad_bytes
        buckets += (CommWork(axis="dp", kind=kind_name, message_bytes=message, duration_s=seconds(message)),)
    return buckets


def param_gather_work(
    setup: TrainingSetup, stage: int, links: Mapping[str, GroupLinks], cache: PricingCache | None = None
) -> tuple[CommWork, ...]:
    """ZeRO-3 / FSDP: one parameter all-gather per local chunk (issued before its F and again before its B)."""
    return _param_gather(setup, stage_parameters_per_rank(setup, stage), links, cache)


def _param_gather(
    setup: TrainingSetup, params: float, links: Mapping[str, GroupLinks], cache: PricingCache | None
) -> tuple[CommWork, ...]:
    plan = setup.plan
    group = links["dp_shard"] if plan.hsdp else links["dp"]
    if plan.zero != 3 or group.size <= 1:
        return ()
    per_chunk = params / plan.virtual_stages * 2.0  # 16-bit parameters
    seconds = (cache.collective_s if cache is not None else collective_time_s)(Collective.ALL_GATHER, per_chunk, group)
    gather = CommWork(axis="dp", kind=Collective.ALL_GATHER.value, message_bytes=per_chunk, duration_s=seconds)
    return (gather,) * plan.virtual_stages


def optimizer_time_s(
    setup: TrainingSetup, stage: int, links: Mapping[str, GroupLinks], cache: PricingCache | None = None
) -> float:
    """The optimizer step of one rank, with the traffic it implies.

    On the GPU it is memory-bound over the rank's optimizer shard (ZeRO >= 1 shards it dp ways).
    ZeRO 1/2 then all-gather the updated 16-bit parameters (hidden under the next forward when
    dp_comm_overlap, as Megatron's --overlap-param-gather). Offloaded optimizers run CPU Adam over
    host DRAM bandwidth and move gradients down and parameters up over PCIe (ZeRO-Offload); NVMe
    offload also reads and writes the optimizer states from NVMe (ZeRO-Infinity).
    """
    return _optimizer_time_s(setup, stage_parameters_per_rank(setup, stage), links, cache)


def _optimizer_time_s(
    setup: TrainingSetup, params: float, links: Mapping[str, GroupLinks], cache: PricingCache | None
) -> float:
    plan, gpu, node = setup.plan, setup.cluster.gpu, setup.cluster.node
    sharded_over = links["dp_shard"].size if plan.hsdp else links["dp"].size
    shard = params / sharded_over if plan.zero >= 1 else params
    per_param = optimizer_bytes_per_parameter(setup.job.optimizer, setup.job.precision)
    if plan.offload == "none":
        seconds = costmodel.op_time_s(Op(name="optimizer", kind="memory", bytes_moved=shard * per_param), gpu, precision=setup.job.precision, links=links)
    else:
        dram_share_Bps = node.cpu_dram_bandwidth_Bps / node.gpus_per_node
        seconds = shard * per_param / dram_share_Bps
        seconds += transfer_time_s(shard * 2.0, Tier.CPU, Tier.HBM, node, gpu)  # updated 16-bit parameters up
        if plan.offload == "nvme":
            state_bytes = shard * 12.0  # fp32 master, m and v: read from and written back to NVMe
            seconds += transfer_time_s(state_bytes, Tier.NVME, Tier.CPU, node, gpu) + transfer_time_s(state_bytes, Tier.CPU, Tier.NVME, node, gpu)
    if plan.zero in (1, 2) and links["dp"].size > 1 and not setup.dp_comm_overlap:
        collective = cache.collective_s if cache is not None else collective_time_s
        seconds += collective(Collective.ALL_GATHER, params * 2.0, links["dp"])
    return seconds


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


# ParallelPlan fields a chunk's price does not depend on (they shape stages, links and the
# optimizer, which other keys carry); every other field, including any added later, is in the key.
_NOT_CHUNK_FIELDS = ("pp", "dp", "zero", "hsdp", "schedule", "virtual_stages", "layers_per_stage", "offload")
_CHUNK_PLAN_FIELDS = tuple(f.name for f in fields(ParallelPlan) if f.name not in _NOT_CHUNK_FIELDS)


def pricing_keys(setup: TrainingSetup, cache: PricingCache) -> tuple[int, int]:
    """(chunk context, whole setup) as interned ids: the first names everything a chunk's price
    depends on besides its links and layers, the second everything a ``build_iteration`` result does."""
    plan = setup.plan
    chunk_context = cache.intern((
        "chunk", cache.gpu_id(setup.cluster.gpu), cache.model_id(setup.model), setup.job, setup.attention_kernel,
        setup.expert_load_imbalance, setup.overlap_slowdown, tuple(getattr(plan, f) for f in _CHUNK_PLAN_FIELDS),
    ))
    setup_context = cache.intern(("setup", chunk_context, cache.cluster_id(setup.cluster), plan, setup.dp_comm_overlap))
    return chunk_context, setup_context


# Fields the data-parallel part of a stage (gradient buckets, ZeRO-3 gathers, optimizer step) does
# not depend on beyond its parameter count and links, which its key carries; every other field,
# including any added later, is in the key.
_NOT_DP_PLAN_FIELDS = (
    "tp", "pp", "cp", "ep", "sequence_parallel", "schedule", "recompute", "layers_per_stage", "tp_comm_overlap", "cp_comm",
)
_DP_PLAN_FIELDS = tuple(f.name for f in fields(ParallelPlan) if f.name not in _NOT_DP_PLAN_FIELDS)
_DP_JOB_FIELDS = tuple(f.name for f in fields(TrainingJob) if f.name not in ("seq_len", "global_batch", "micro_batch"))


def _dp_context(setup: TrainingSetup, cache: PricingCache) -> int:
    """Interned id of everything a stage's data-parallel work depends on besides parameters and links."""
    plan, job = setup.plan, setup.job
    return cache.intern((
        "dp", cache.cluster_id(setup.cluster), setup.dp_comm_overlap,
        tuple(getattr(job, f) for f in _DP_JOB_FIELDS), tuple(getattr(plan, f) for f in _DP_PLAN_FIELDS),
    ))


class StageClassWork(NamedTuple):
    """The work of every pipeline stage with the same chunk signature and process-group links:
    everything of a ``StageWork`` but its index and static memory (which ``build_iteration`` adds
    per stage), in the form the closed form reads, plus the per-micro-batch FLOPs."""

    chunk: ChunkTimes  # the chunks and their F, B, W sums
    data_parallel: DataParallelTimes  # gradient buckets, parameter gathers, optimizer step
    chunk_flops: tuple[tuple[float, float], ...]  # per chunk: (hardware FLOPs, recompute FLOPs) per micro-batch


@dataclass(frozen=True, slots=True, kw_only=True)
class StageLayout:
    """How a plan's stages fall into classes: equal chunk signatures and equal links."""

    signatures: tuple[tuple[ChunkSignature, ...], ...]  # per class
    links: tuple[dict[str, GroupLinks], ...]  # per class
    links_keys: tuple[tuple[int, ...], ...]  # per class: interned links per GROUP_AXES axis
    chunk_ranges: tuple[tuple[tuple[range, bool, bool], ...], ...]  # per class: its first stage's chunks
    stage_class: tuple[int, ...]  # class index of every stage
    memory_kinds: tuple[tuple[int, int, bool, bool], ...]  # memory.stage_memory_classes(model, plan)
    memory_class: tuple[int, ...]


def stage_layout(setup: TrainingSetup, cache: PricingCache) -> StageLayout:
    """The plan's stage classes, memoized on the few inputs they depend on."""
    model, plan = setup.model, setup.plan
    key = (
        cache.cluster_id(setup.cluster), model.layers, model.dense_layers if model.is_moe else model.layers,
        plan.pp, plan.virtual_stages, plan.layers_per_stage, plan.tp, plan.cp, plan.dp, plan.ep, plan.hsdp,
    )
    return cache.memo("layout", key, lambda: _stage_layout(setup, cache))


def _stage_layout(setup: TrainingSetup, cache: PricingCache) -> StageLayout:
    plan = setup.plan
    counts = stage_layer_counts(setup.model.layers, plan)
    starts = [sum(counts[:c]) for c in range(len(counts))]
    num_chunks = len(counts)
    classes: dict[tuple[Any, ...], int] = {}
    signatures, links_list, links_keys, chunk_ranges, stage_class = [], [], [], [], []
    for stage, signature in enumerate(stage_signatures(setup)):
        links = group_links(setup, stage, cache)
        links_key = tuple(cache.links_id(links[axis]) for axis in GROUP_AXES)
        index = classes.setdefault((signature, links_key), len(classes))
        if index == len(signatures):
            signatures.append(signature)
            links_list.append(links)
            links_keys.append(links_key)
            chunk_ranges.append(tuple(
                (range(starts[chunk], starts[chunk] + counts[chunk]), chunk == 0, chunk == num_chunks - 1)
                for chunk in range(stage, num_chunks, plan.pp)
            ))
        stage_class.append(index)
    memory_kinds, memory_class = stage_memory_classes(setup.model, plan)
    return StageLayout(
        signatures=tuple(signatures),
        links=tuple(links_list),
        links_keys=tuple(links_keys),
        chunk_ranges=tuple(chunk_ranges),
        stage_class=tuple(stage_class),
        memory_kinds=memory_kinds,
        memory_class=memory_class,
    )


def _chunks_of_class(
    setup: TrainingSetup, layout: StageLayout, index: int, chunk_context: int, cache: PricingCache
) -> tuple[ChunkTimes, tuple[tuple[float, float], ...]]:
    """(chunks with their sums, per-chunk (FLOPs, recompute FLOPs)) of stage class ``index``."""
    signature, links, links_key = layout.signatures[index], layout.links[index], layout.links_keys[index]
    # layers priced once per (chunk context, links); chunks once per (that, layer mix, ends)
    layer_cache: dict[bool, LayerCost] = cache.memo("layers", (chunk_context, links_key), dict)
    costs = [
        cache.memo(
            "chunk",
            (chunk_context, links_key, chunk_signature),
            lambda: chunk_cost(setup, layers=layers, first=first, last=last, links=links, layer_cache=layer_cache, cache=cache),
        )
        for (layers, first, last), chunk_signature in zip(layout.chunk_ranges[index], signature)
    ]
    return chunk_times(tuple(c.work for c in costs)), tuple((c.flops, c.recompute_flops) for c in costs)


def _data_parallel_work(
    setup: TrainingSetup, params: float, links: Mapping[str, GroupLinks], cache: PricingCache
) -> DataParallelTimes:
    """Gradient buckets left to overlap the backward, parameter gathers and optimizer seconds (incl.
    the buckets when they do not overlap) of a stage holding ``params`` parameters per rank."""
    grad_sync = _grad_sync(setup, params, links, cache)
    optimizer_s = _optimizer_time_s(setup, params, links, cache) + (
        0.0 if setup.dp_comm_overlap else sum(map(_DURATION, grad_sync))
    )
    return data_parallel_times(
        grad_sync if setup.dp_comm_overlap else (), _param_gather(setup, params, links, cache), optimizer_s
    )


def _stage_class_work(
    setup: TrainingSetup,
    layout: StageLayout,
    index: int,
    chunk_context: int,
    dp_context: int,
    cache: PricingCache,
) -> StageClassWork:
    """Stage class ``index``: its chunks (memoized per chunk context, links and signature) and its
    data-parallel work (memoized per data-parallel context, links and parameter count)."""
    signature, links, links_key = layout.signatures[index], layout.links[index], layout.links_keys[index]
    chunk, chunk_flops = cache.memo(
        "stage_chunks",
        (chunk_context, links_key, signature),
        lambda: _chunks_of_class(setup, layout, index, chunk_context, cache),
    )
    params = cache.memo(
        "parameters",
        (cache.model_id(setup.model), setup.plan.tp, setup.plan.ep, setup.plan.pp > 1, signature),
        lambda: _signature_parameters(setup, signature),
    )
    data_parallel = cache.memo(
        "data_parallel", (dp_context, links_key, params), lambda: _data_parallel_work(setup, params, links, cache)
    )
    return StageClassWork(chunk, data_parallel, chunk_flops)


@dataclass(frozen=True, slots=True, kw_only=True)
class IterationClasses:
    """``build_iteration``'s result with every distinct stage priced once: ``classes[stage_class[s]]``
    is stage s's work. The analytic fidelity reads this directly; the DES expands it to stages."""

    layout: StageLayout
    classes: tuple[StageClassWork, ...]
    schedule: str
    num_microbatches: int
    virtual_stages: int
    p2p_bandwidth_Bps: tuple[float, ...]
    p2p_latency_s: tuple[float, ...]
    overlap_slowdown: float
    hardware_flops_per_replica: float
    recompute_flops_per_replica: float


def build_iteration_classes(setup: TrainingSetup, cache: PricingCache | None = None) -> IterationClasses:
    """Price each stage class's chunks, gradient buckets and optimizer step once (see ``build_iteration``)."""
    cache = cache if cache is not None else PricingCache()
    plan = setup.plan
    chunk_context, _ = pricing_keys(setup, cache)
    dp_context = _dp_context(setup, cache)
    layout = stage_layout(setup, cache)
    classes = tuple(
        _stage_class_work(setup, layout, index, chunk_context, dp_context, cache) for index in range(len(layout.signatures))
    )
    # per-micro-batch FLOPs summed stage by stage, chunk by chunk (the order of the per-stage sum)
    flops = recompute_flops = 0.0
    for index in layout.stage_class:
        for chunk_flop, chunk_recompute_flop in classes[index].chunk_flops:
            flops += chunk_flop
            recompute_flops += chunk_recompute_flop
    bandwidth, latency = cache.memo(
        "p2p_links", (cache.cluster_id(setup.cluster), plan.tp * plan.cp * plan.dp, plan.pp),
        lambda: p2p_links(setup, cache),
    )
    m = setup.num_microbatches
    ranks_per_stage = plan.tp * plan.cp
    return IterationClasses(
        layout=layout,
        classes=classes,
        schedule=plan.schedule,
        num_microbatches=m,
        virtual_stages=plan.virtual_stages,
        p2p_bandwidth_Bps=bandwidth,
        p2p_latency_s=latency,
        overlap_slowdown=setup.overlap_slowdown,
        hardware_flops_per_replica=flops * m * ranks_per_stage,
        recompute_flops_per_replica=recompute_flops * m * ranks_per_stage,
    )


def build_iteration(setup: TrainingSetup, cache: PricingCache | None = None) -> IterationWork:
    """Price every stage's chunks, gradient buckets and optimizer step.

    ``cache`` (a search passes one for all its evaluations) memoizes exact intermediate results;
    without it a fresh one still prices each stage class (same chunks, links) once.
    """
    cache = cache if cache is not None else PricingCache()
    plan, model = setup.plan, setup.model
    priced = build_iteration_classes(setup, cache)
    _, setup_context = pricing_keys(setup, cache)
    capacity = setup.cluster.gpu.hbm_capacity_bytes
    flash = setup.attention_kernel == "flash"
    memory = cache.memo(
        "memory",
        (setup_context, capacity, flash),
        lambda: memory_per_stage(model, plan, setup.job, capacity_bytes=capacity, flash_attention=flash),
    )
    stages = []
    for stage, index in enumerate(priced.layout.stage_class):
        work, breakdown = priced.classes[index], memory[stage]
        stages.append(
            StageWork(
                stage=stage,
                chunks=work.chunk.chunks,
                grad_sync=work.data_parallel.grad_sync,
                param_gather=work.data_parallel.param_gather,
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
