"""Data-parallel work of a pipeline stage: its parameters per rank, the gradient buckets it reduces,
the ZeRO-3 / FSDP parameter gathers and the optimizer step (with CPU and NVMe offload)."""

from __future__ import annotations

from typing import Mapping, NamedTuple

from hardware.collectives import Collective, GroupLinks, collective_time_s
from hardware.specs import Tier
from hardware.transfer import transfer_time_s
from sim import costmodel
from sim.training.config import TrainingSetup
from sim.training.pricing_cache import PricingCache
from sim.training.work import CommWork
from workloads.graph import Op
from workloads.precision import bytes_per_element
from sim.training.schedules import chunk_ends, plan_layer_counts, plan_placement
from workloads.plan import chunk_recompute_counts

# Enum members looked up once (attribute access on an Enum class is slow in a search loop)
_ALL_REDUCE, _REDUCE_SCATTER = Collective.ALL_REDUCE, Collective.REDUCE_SCATTER
_COLLECTIVE_NAMES = {kind: kind.value for kind in Collective}

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
# Adam as one elementwise kernel per operation (``optimizer_kernels = "per_op"``): Composer's
# DecoupledAdamW.adamw (composer/optim/decoupled_weight_decay.py, as llm-foundry's decoupled_adamw
# runs it) and torch's for-loop AdamW run, per fp32 tensor: param.mul_ (read 4, write 4),
# exp_avg.mul_ (8), .add_(grad) (12), exp_avg_sq.mul_ (8), .addcmul_(grad, grad) (12), sqrt into a
# new tensor (8), divide by sqrt(bias correction) (8), .add_(eps) (8), param.addcdiv_(exp_avg,
# denom) (16): 88 bytes where the fused multi-tensor kernel moves 28.
PER_OP_ADAM_BYTES_PER_PARAMETER = 8.0 + 8.0 + 12.0 + 8.0 + 12.0 + 8.0 + 8.0 + 8.0 + 16.0
# torch.nn.utils.clip_grad_norm_ and FSDP's clip_grad_norm_ multiply every gradient by the clamped
# coefficient whether or not it clips (read 4, write 4); Megatron scales only when it clips
CLIP_SCALE_BYTES_PER_PARAMETER = 8.0
OPTIMIZER_KERNELS = ("fused", "per_op")
# Megatron-Core's DDP (``grad_buffer_passes = "megatron_ddp"``) works on the rank's whole gradient
# buffer every iteration, not on the optimizer's shard (the distributed optimizer shards only the
# optimizer states): train_step calls zero_grad_buffer() (grad_data.zero_(): write every element),
# and each bucket's start_grad_sync, before its data-parallel collective, takes
# grad_data.norm(p=2) when check_for_nan_in_grad (Megatron-LM --no-check-for-nan-in-loss-and-grad
# is the opt-out: read every element) and runs grad_data *= gradient_scaling_factor (1 / dp unless
# average_in_collective, whose default is False: read and write); megatron/core/distributed/
# param_and_grad_buffer.py and distributed_data_parallel.py, core_r0.8.0. Passes per element of the
# buffer, in its dtype (``grad_reduce_dtype``); its zeroing replaces the shard's ZERO_GRAD term.
MEGATRON_DDP_GRAD_BUFFER_PASSES = 1.0 + 1.0 + 2.0
GRAD_BUFFER_PASSES = ("shard", "megatron_ddp")


def optimizer_bytes_per_parameter(optimizer: str, precision: str, kernels: str = "fused") -> float:
    """HBM traffic of one optimizer step per parameter of the rank's shard (see the constants);
    ``kernels`` "per_op" runs Adam one elementwise kernel per operation (SGD's update is one pass either way)."""
    if kernels not in OPTIMIZER_KERNELS:
        raise ValueError(f"optimizer kernels {kernels!r}; allowed: {', '.join(OPTIMIZER_KERNELS)}")
    per_op = kernels == "per_op"
    if optimizer == "adam":
        update = PER_OP_ADAM_BYTES_PER_PARAMETER if per_op else ADAM_BYTES_PER_PARAMETER
    else:
        update = SGD_BYTES_PER_PARAMETER
    extra = MASTER_TO_MODEL_BYTES_PER_PARAMETER + GRAD_NORM_BYTES_PER_PARAMETER + ZERO_GRAD_BYTES_PER_PARAMETER
    if per_op:
        extra += CLIP_SCALE_BYTES_PER_PARAMETER
    if precision == "fp16":
        extra += FP16_UNSCALE_BYTES_PER_PARAMETER
    return update + extra


# (dense layers, layers, holds embedding, holds LM head, layers fully recomputed, positions of the
# layers an fp8 run keeps in bf16)
ChunkSignature = tuple[int, int, bool, bool, int, tuple[int, ...]]


def stage_signatures(setup: TrainingSetup) -> tuple[tuple[ChunkSignature, ...], ...]:
    """Every stage's chunks as signatures, in model order. A chunk's price and parameters depend on its
    layers only through how many are dense and how many MoE (dense layers come first) and on whether
    it holds the embedding / LM head, and on how many of its first layers it recomputes in full."""
    model, plan = setup.model, setup.plan
    counts = plan_layer_counts(model.layers, plan)
    place = plan_placement(plan)
    recomputed = chunk_recompute_counts(model.layers, plan, place)
    ends = chunk_ends(plan)
    dense_layers = model.dense_layers if model.is_moe else model.layers
    last_chunk = len(counts) - 1
    signatures: list[list[ChunkSignature]] = [[] for _ in range(plan.pp)]
    start = 0
    for chunk, count in enumerate(counts):
        dense = min(max(dense_layers - start, 0), count)
        bf16 = tuple(i for i in range(count) if setup.bf16_layer(start + i))
        signatures[place[chunk]].append((dense, count, *ends[chunk], recomputed[chunk], bf16))
        start += count
    return tuple(tuple(stage) for stage in signatures)


def _layer_parameter_split(setup: TrainingSetup, moe: bool) -> tuple[float, float]:
    """(dense, expert) parameters per rank of one dense or MoE layer: tp shards the dense part
    (attention, norms, router, shared experts, a dense layer's MLP), expert tp x ep the routed
    experts (0 in a dense layer)."""
    model, plan = setup.model, setup.plan
    if moe:
        experts = model.experts * model.mlp_parameters(model.expert_ffn_hidden)
        moe_dense = model.layer_parameters(moe=True) - experts
        return moe_dense / plan.tp, experts / (plan.expert_tp * plan.ep)
    return model.layer_parameters(moe=False) / plan.tp, 0.0


def _layer_parameters_per_rank(setup: TrainingSetup, moe: bool) -> float:
    """Parameters per rank of one dense or MoE layer (tp shards it, ep the experts too)."""
    return sum(_layer_parameter_split(setup, moe))


def _table_parameters_per_rank(setup: TrainingSetup) -> float:
    """Parameters per rank of the embedding table (or of an untied LM head)."""
    model, plan = setup.model, setup.plan
    split = plan.pp if plan.vocab_parallel else 1
    return model.vocab * model.hidden / (plan.tp * split)


def _chunk_parameters(setup: TrainingSetup, signature: tuple[ChunkSignature, ...]) -> list[tuple[float, list[float]]]:
    """Per chunk of ``signature``: the parameters per rank of its root (the embedding / LM-head tables
    ``signature_parameters`` gives the stage, on the chunk that uses them) and of each of its layers,
    in model order."""
    model = setup.model
    table = _table_parameters_per_rank(setup)
    stage_first = any(chunk[2] for chunk in signature)
    per_layer: dict[bool, float] = {}  # a dense / MoE layer's, computed once
    out = []
    for dense, count, first, last, *_ in signature:
        root = (table if first else 0.0) + (table if last and (not model.tied_embeddings or not stage_first) else 0.0)
        layers = []
        for index in range(count):
            moe = model.is_moe and index >= dense
            if moe not in per_layer:
                per_layer[moe] = _layer_parameters_per_rank(setup, moe)
            layers.append(per_layer[moe])
        out.append((root, layers))
    return out


def signature_parameters(setup: TrainingSetup, signature: tuple[ChunkSignature, ...]) -> float:
    """``stage_parameters_per_rank`` of the stage whose chunks are ``signature`` (layer by layer in
    model order, so the float sum is the one of every stage with this signature)."""
    model = setup.model
    per_layer: dict[bool, float] = {}  # parameters per rank of a dense / MoE layer, computed once
    params = 0.0
    for dense, count, *_ in signature:
        for index in range(count):
            moe = model.is_moe and index >= dense
            if moe not in per_layer:
                per_layer[moe] = _layer_parameters_per_rank(setup, moe)
            params += per_layer[moe]
    table = _table_parameters_per_rank(setup)
    first, last = any(chunk[2] for chunk in signature), any(chunk[3] for chunk in signature)
    if first:
        params += table
    # a tied LM head is a second copy on another stage when pp > 1 (as Megatron keeps it), one
    # table when both ends share the stage (pp = 1, a V, or a vocabulary shard on every stage)
    if last and (not model.tied_embeddings or not first):
        params += table
    return params


def _chunk_expert_parameters(setup: TrainingSetup, chunk: ChunkSignature) -> float:
    """Routed-expert parameters per rank of one chunk (its MoE layers', model order); 0 for a dense model."""
    dense, count = chunk[0], chunk[1]
    if not setup.model.is_moe or count <= dense:
        return 0.0
    return (count - dense) * _layer_parameter_split(setup, True)[1]


def signature_expert_parameters(setup: TrainingSetup, signature: tuple[ChunkSignature, ...]) -> float:
    """The routed-expert part of ``signature_parameters``: the parameters per rank of the stage's
    MoE layers' experts (divided by expert tp x ep), which Megatron-Core keeps in a gradient buffer of
    their own, reduced and sharded over the expert data-parallel group ("edp",
    ``plan.expert_dp`` ranks; megatron/core/distributed/distributed_data_parallel.py
    ``DistributedDataParallel.__init__``: ``expert_parallel_buffers`` over
    ``parallel_state.get_data_modulo_expert_parallel_group()``, core_r0.8.0). 0 for a dense model;
    the rest of ``signature_parameters`` (attention, norms, router, shared experts, dense layers,
    embedding and LM head) is the dense part, data-parallel over "dp"."""
    return sum(_chunk_expert_parameters(setup, chunk) for chunk in signature)


def signature_parameter_split(setup: TrainingSetup, signature: tuple[ChunkSignature, ...]) -> tuple[float, float]:
    """(all, expert) parameters per rank of the stage whose chunks are ``signature``:
    ``signature_parameters`` and its routed-expert part ``signature_expert_parameters`` (the dense
    part is their difference; for a dense model exactly the total)."""
    return signature_parameters(setup, signature), signature_expert_parameters(setup, signature)


def data_parallel_groups(
    setup: TrainingSetup, links: Mapping[str, GroupLinks], *, expert: bool
) -> tuple[GroupLinks, GroupLinks | None]:
    """(the group a part of the parameters is sharded and reduce-scattered over, the group its shards
    are replicated and all-reduced over under HSDP, else None) for the dense parameters ("dp", or
    HSDP's "dp_shard" / "dp_replicate") or the routed experts ("edp", or "edp_shard" / "edp_replicate").

    The experts are data-parallel over their own expert data-parallel group at every ZeRO stage:
    ZeRO 0/1/2 as Megatron-Core's DDP and distributed optimizer run them
    (``signature_expert_parameters``); ZeRO-3 / FSDP as the FSDP implementations with expert
    parallelism shard them: torchtitan ``fully_shard``s each MoE block's routed experts over the
    ``dp_shard_mod_ep`` mesh (dp_shard x cp / ep ranks, x tp with etp = 1: torchtitan/distributed/
    parallel_dims.py ``ParallelDims._build_mesh_with_ep``, August 2025), the rest of the block over
    dp_shard x cp (torchtitan/experiments/llama4/infra/parallelize.py ``apply_fsdp``, July 2025; now
    torchtitan/distributed/fsdp.py ``apply_fsdp_to_decoder``: a per-parameter mesh, the experts on
    ``edp_mesh["efsdp"]`` = dp_shard x cp x tp / ep), and Megatron-Core's custom FSDP keeps the expert
    parameters in buffers over the expert data-parallel group
    (megatron/core/distributed/custom_fsdp/fully_sharded_data_parallel.py
    ``FullyShardedDataParallel._init_fsdp_param_and_grad_buffer``: ``ParamAndGradBuffer(...,
    expert_data_parallel_group=...)``). Under HSDP torchtitan replicates them over dp_replicate
    (``memory.expert_hsdp_shard``)."""
    prefix = "edp" if expert else "dp"
    if setup.plan.hsdp:
        return links[f"{prefix}_shard"], links[f"{prefix}_replicate"]
    return links[prefix], None


def stage_parameters_per_rank(setup: TrainingSetup, stage: int) -> float:
    """Parameters one rank of ``stage`` holds before any ZeRO sharding: its layers (all its virtual
    chunks) divided by tp (experts also by ep), plus the embedding on stage 0 and the LM head on the
    last stage (a tied head is a second copy there when pp > 1, as Megatron keeps it)."""
    return signature_parameters(setup, stage_signatures(setup)[stage])


def closing_gradient_parameters(setup: TrainingSetup, signature: tuple[ChunkSignature, ...]) -> float:
    """Parameters per rank of the stage whose gradients are complete only when its backward ends: the
    input embedding's (the embedding's backward is the model's last op), 0 on stages without it.

    Megatron's DDP fills its buckets in reverse parameter order, closing one once it holds
    ``bucket_size`` parameters, so the embedding table and the leftover of the first layer form the
    last bucket, which starts its reduction only after the embedding's backward
    (megatron/core/distributed/param_and_grad_buffer.py ``for param in params[::-1]``,
    register_grad_ready, core_r0.8.0); a tied table is one parameter, complete at the same point.
    FSDP with one unit per layer (``fsdp_unit = "layer"``) reduce-scatters the root unit, the
    embedding with the LM head it holds on the same chunk, in the root's post-backward, after every
    layer's (torch FSDP2 ``fully_shard(model)`` over the per-block units)."""
    for (root, _), chunk in zip(_chunk_parameters(setup, signature), signature):
        if chunk[2]:
            return root if setup.plan.zero == 3 and setup.fsdp_unit == "layer" else _table_parameters_per_rank(setup)
    return 0.0


def flat_gradient_prepare_bytes(setup: TrainingSetup, shard: int) -> float:
    """HBM bytes per gradient element that torch FSDP (``main_grad_accumulation = "flat_param"``)
    moves on its post-backward stream around each unit's reduce-scatter, every micro-batch
    (torch/distributed/fsdp/_runtime_utils.py ``_post_backward_hook`` / ``_reduce_grad``): a cast of
    the unsharded gradient to the reduction dtype when it differs from the compute dtype (read 2,
    write 4), the in-place division by the predivide factor (``_div_if_needed(padded_unsharded_grad,
    gradient_predivide_factor)``, > 1 from two ranks on: read and write), then on the 1/shard
    shard the post-divide (read and write) and the cast back to the fp32 parameter dtype
    (``_cast_grad_to_param_dtype``, read and write 4). 0 for the other stacks or one rank."""
    if setup.main_grad_accumulation != "flat_param" or shard <= 1:
        return 0.0
    reduce_bytes = setup.grad_reduce_bytes
    compute_bytes = bytes_per_element("bf16" if setup.job.precision == "fp8" else setup.job.precision)
    cast = compute_bytes + reduce_bytes if reduce_bytes != compute_bytes else 0.0
    to_param = reduce_bytes + 4.0 if reduce_bytes != 4.0 else 0.0
    return cast + 2.0 * reduce_bytes + (2.0 * reduce_bytes + to_param) / shard


def grad_sync_work(
    setup: TrainingSetup, stage: int, links: Mapping[str, GroupLinks], cache: PricingCache | None = None
) -> tuple[CommWork, ...]:
    """Data-parallel gradient buckets of one stage (empty when dp == 1 and the experts have no
    data-parallel peers).

    ZeRO 0 all-reduces gradients; ZeRO 1/2/3 reduce-scatter them (the matching parameter
    all-gather of ZeRO 1/2 runs after the optimizer, see ``optimizer_time_s``); HSDP reduce-scatters
    inside the node and all-reduces the 1/shard result across nodes. Gradients travel in
    ``setup.grad_reduce_dtype`` (the stack's rule: fp32 for bf16/fp8 training as Megatron's main grads,
    16-bit for fp16; bf16 with --grad-reduce-in-bf16). All full buckets have one size, so they are priced once.
    Without HSDP an MoE stage's routed experts have buckets of their own over the expert
    data-parallel group (``grad_sync_for_parameters``).
    """
    signature = stage_signatures(setup)[stage]
    params, expert = signature_parameter_split(setup, signature)
    return grad_sync_for_parameters(setup, params, links, cache, closing_gradient_parameters(setup, signature),
                                    expert=expert)


def _bucket_counts(params: float, closing: float, bucket: int) -> tuple[int, float]:
    """(full buckets, leftover parameters before the ``closing`` ones) of a buffer of ``params``.
    Subtracting the integer bucket from a float parameter count below 2**53 is exact, so one
    subtraction of k buckets equals k successive ones."""
    full = 0
    remaining = params - closing
    if remaining < 2.0**53:
        full = max(int(remaining // bucket), 0)
        remaining -= full * bucket
    while remaining >= bucket:
        full += 1
        remaining -= bucket
    return full, remaining


def grad_sync_for_parameters(
    setup: TrainingSetup, params: float, links: Mapping[str, GroupLinks], cache: PricingCache | None,
    closing: float = 0.0, expert: float = 0.0,
) -> tuple[CommWork, ...]:
    """The gradient buckets of a stage holding ``params`` parameters per rank in backward order: full
    buckets, then the last, the leftover with the ``closing`` parameters whose gradients the backward
    completes last (``closing_gradient_parameters``); the last is ready when the backward ends.

    ``expert``: the routed-expert parameters among ``params`` (``signature_expert_parameters``).
    They form a buffer of their own, as Megatron-Core's DDP keeps them
    (megatron/core/distributed/distributed_data_parallel.py ``DistributedDataParallel.__init__``:
    ``expert_parallel_buffers`` reduced over ``parallel_state.get_data_modulo_expert_parallel_group()``,
    core_r0.8.0, with the dense buffers' ``bucket_size``): buckets of the same size over the experts'
    groups (``data_parallel_groups``; none when they hold one rank), the dense rest over the dense
    groups, all on the one data-parallel stream (``CommWork`` axis "dp"). The two lists merge in the
    order their buckets fill during the backward: by the fraction of the backward (parameters so far
    / the buffer's) at which each becomes full, dense first on ties, each buffer's leftover at the
    end of the backward, the dense closing bucket (with the embedding) last. ZeRO-3 / FSDP
    reduce-scatters the same way; HSDP reduce-scatters each part over its shard group and all-reduces
    the shard over its replicate group."""
    plan = setup.plan
    cache = cache if cache is not None else PricingCache()
    collective = cache.collective_s
    dense_group = data_parallel_groups(setup, links, expert=False)
    expert_groups = data_parallel_groups(setup, links, expert=True) if expert > 0.0 else None
    if expert_groups is not None:
        params -= expert  # the dense buffer
    dense_buckets = links["dp"].size > 1
    expert_buckets = expert_groups is not None and links["edp"].size > 1
    if not dense_buckets and not expert_buckets:
        return ()
    grad_bytes = setup.grad_reduce_bytes
    bucket = max(BUCKET_PARAMETERS, 1_000_000 * plan.dp)
    kind = _ALL_REDUCE if plan.zero == 0 else _REDUCE_SCATTER
    kind_name = _COLLECTIVE_NAMES[kind]

    def buckets_over(params: float, closing: float, groups: tuple[GroupLinks, GroupLinks | None]) -> tuple[CommWork, ...]:
        """Full buckets, then the leftover with the closing parameters, of one buffer over ``groups``."""
        shard_group, replicate_group = groups
        prepare = flat_gradient_prepare_bytes(setup, shard_group.size)

        def seconds(message: float) -> float:
            before = 0.0
            if prepare:
                elements = message / grad_bytes
                op = Op(name="fsdp_grad_predivide", kind="memory", bytes_moved=elements * prepare)
                before = costmodel.op_time_s(op, setup.cluster.gpu, precision=setup.job.precision, links=links)
            if replicate_group is None:
                return before + collective(kind, message, shard_group)
            return before + collective(_REDUCE_SCATTER, message, shard_group) + collective(
                _ALL_REDUCE, message / shard_group.size, replicate_group
            )

        full, remaining = _bucket_counts(params, closing, bucket)
        message = bucket * grad_bytes
        out = (CommWork(axis="dp", kind=kind_name, message_bytes=message, duration_s=seconds(message)),) * full
        if remaining + closing > 0:
            message = (remaining + closing) * grad_bytes
            out += (CommWork(axis="dp", kind=kind_name, message_bytes=message, duration_s=seconds(message)),)
        return out

    dense = buckets_over(params, closing, dense_group) if dense_buckets else ()
    if not expert_buckets:
        return dense
    experts = buckets_over(expert, 0.0, expert_groups)
    if not dense:
        return experts
    return _merge_buckets(dense, params, closing, experts, expert, bucket)


def _merge_buckets(
    dense: tuple[CommWork, ...], dense_params: float, closing: float, experts: tuple[CommWork, ...],
    expert_params: float, bucket: int,
) -> tuple[CommWork, ...]:
    """The dense and expert buckets in the order they fill: full bucket i of a buffer of P parameters
    at i x bucket / P of the backward, a buffer's leftover at its end (1); dense first on ties; the
    dense leftover last where it holds the closing parameters (the embedding's, complete last)."""
    tail: tuple[CommWork, ...] = ()
    if closing > 0.0:
        dense, tail = dense[:-1], dense[-1:]

    def fraction(index: int, count: int, params: float) -> float:
        return 1.0 if index == count - 1 and (index + 1) * bucket > params else (index + 1) * bucket / params

    merged: list[CommWork] = []
    d = e = 0
    while d < len(dense) and e < len(experts):
        if fraction(d, len(dense), dense_params) <= fraction(e, len(experts), expert_params):
            merged.append(dense[d])
            d += 1
        else:
            merged.append(experts[e])
            e += 1
    merged.extend(dense[d:])
    merged.extend(experts[e:])
    return tuple(merged) + tail


class ParamGathers(NamedTuple):
    """A stage's parameter all-gathers, one per local chunk: ZeRO-3 / FSDP's (before every F and B),
    or ZeRO-1/2's paced by the first forward (``first_forward_only``); empty otherwise."""

    gathers: tuple[CommWork, ...]  # per chunk: the whole gather (its bytes, the sum of its units' seconds)
    first_unit_s: tuple[float, ...]  # per chunk: seconds from the gather's start to its first unit's end
    tail_share: tuple[float, ...]  # per chunk: share of an F's or B's compute after its last unit (0: one unit)
    # True: each chunk is gathered once per iteration, before its first forward only (ZeRO-1/2's
    # updated parameters after the optimizer; ``param_gather_pacing = "bucket"``)
    first_forward_only: bool = False
    # per chunk, the gathers before a B where they differ from the F's (``fsdp_kept_after_forward``:
    # units kept gathered from their forward to their backward); empty: the same as the F's
    backward: tuple[CommWork, ...] = ()
    backward_first_unit_s: tuple[float, ...] = ()
    backward_tail_share: tuple[float, ...] = ()


NO_GATHERS = ParamGathers((), (), ())
FSDP_UNITS = ("layer", "chunk")
# FSDP units a stack keeps gathered from their forward to their backward (``fsdp_unit = "layer"``):
# "none"; "root", the root unit with the embedding, final norm and LM head (torch FSDP1's
# _post_forward_reshard frees no root parameters, FSDP2 sets the root's reshard_after_forward to
# False); "root_last_layer", and the model's last transformer layer (torchtitan's
# reshard_after_forward = False for its last block)
FSDP_KEPT_AFTER_FORWARD = ("none", "root", "root_last_layer")
PARAM_GATHER_PACINGS = ("bucket", "free")


def paces_param_gather(setup: TrainingSetup) -> bool:
    """True when the ZeRO-1/2 parameter all-gather after the optimizer overlaps the next forward
    bucket by bucket (``param_gather_pacing = "bucket"`` with ``dp_comm_overlap``, dp > 1)."""
    if setup.param_gather_pacing not in PARAM_GATHER_PACINGS:
        raise ValueError(f"param_gather_pacing {setup.param_gather_pacing!r}; allowed: {', '.join(PARAM_GATHER_PACINGS)}")
    plan = setup.plan
    return (plan.zero in (1, 2) and plan.dp > 1 and setup.dp_comm_overlap
            and setup.param_gather_pacing == "bucket")


def bucket_paced_gathers(
    setup: TrainingSetup, links: Mapping[str, GroupLinks], cache: PricingCache | None,
    signature: tuple[ChunkSignature, ...],
) -> ParamGathers:
    """ZeRO-1/2 with the distributed optimizer's overlapped parameter all-gather, Megatron-Core r0.8
    (megatron/core/optimizer/distrib_optimizer.py at core_r0.8.0: ``zero_grad`` dispatches the
    all-gather of the first bucket only; each bucket's forward pre-hook (``_make_forward_pre_hook``,
    ``_finish_param_sync_helper``) waits for that bucket's all-gather and only then dispatches the
    next bucket's, "we can't pre-launch all-gathers for all buckets at once" under
    CUDA_DEVICE_MAX_CONNECTIONS=1; the handles run in forward order, model chunk by model chunk).

    One gather per local chunk, before that chunk's first forward of the iteration only, on the
    data-parallel stream; its units are the chunk's buckets (the gradient buckets' size, max(40M,
    1M x dp) parameters, 16-bit parameters), priced each at its own size: the full buckets and the
    remainder, which holds the chunk's first layers and, on the first chunk, the embedding table
    (the buffer fills its buckets in reverse parameter order, and the all-gathers run from the last
    bucket, ``closing_gradient_parameters``), so it is the first unit. The
    forward starts once the first unit is in and its last 1 / buckets of compute waits for the
    whole gather (``pipeline_des``'s rule): with n buckets of all-gather time a and forward compute
    f per bucket it ends at max(a + n f, n a + f), where the paced chain ends at a + n max(a, f):
    the same when f >= a, at most one bucket's all-gather (a - f) early when a > f.

    An MoE chunk's routed experts sit in the expert buffer, sharded over the expert data-parallel
    group (``data_parallel_groups``; megatron/core/distributed/distributed_data_parallel.py
    ``expert_parallel_buffers``, core_r0.8.0): their buckets (the same size) are gathered over "edp"
    (nothing when one rank holds them), their seconds added to the chunk's gather and their units to
    its count; the first unit stays the dense buffer's (the embedding's bucket)."""
    plan = setup.plan
    collective = cache.collective_s if cache is not None else collective_time_s
    group = links["dp"]
    bucket = max(BUCKET_PARAMETERS, 1_000_000 * plan.dp)
    gathers, first_unit, tails = [], [], []
    table = _table_parameters_per_rank(setup)
    expert_group = links["edp"] if setup.model.is_moe else None  # ZeRO 1/2: no HSDP
    for (root, layers), chunk in zip(_chunk_parameters(setup, signature), signature):
        params = root
        for layer in layers:
            params += layer
        expert = _chunk_expert_parameters(setup, chunk) if expert_group is not None else 0.0
        expert_s, expert_units = 0.0, 0
        if expert > 0.0:
            params -= expert  # the dense buffer's part; the experts' gathered over "edp" (or not at all)
            if expert_group.size > 1:
                expert_full, expert_left = _bucket_counts(expert, 0.0, bucket)
                if expert_full:
                    expert_s += expert_full * collective(Collective.ALL_GATHER, bucket * 2.0, expert_group)
                if expert_left > 0.0:
                    expert_s += collective(Collective.ALL_GATHER, expert_left * 2.0, expert_group)
                expert_units = expert_full + (1 if expert_left > 0.0 else 0)
            else:
                expert = 0.0  # one rank holds these experts: nothing to gather
        closing = table if chunk[2] else 0.0  # the embedding closes the last bucket (its first unit)
        full = int((params - closing) // bucket)
        remainder = params - full * bucket
        full_s = collective(Collective.ALL_GATHER, bucket * 2.0, group) if full else 0.0
        remainder_s = collective(Collective.ALL_GATHER, remainder * 2.0, group) if remainder > 0.0 else 0.0
        units = full + (1 if remainder > 0.0 else 0) + expert_units
        seconds = full * full_s + remainder_s + expert_s
        gathers.append(CommWork(axis="dp", kind=Collective.ALL_GATHER.value, message_bytes=(params + expert) * 2.0,
                                duration_s=seconds))
        first_unit.append(remainder_s if remainder > 0.0 else full_s)
        tails.append(1.0 / units if units > 1 else 0.0)
    return ParamGathers(tuple(gathers), tuple(first_unit), tuple(tails), first_forward_only=True)


def param_gather_work(
    setup: TrainingSetup, stage: int, links: Mapping[str, GroupLinks], cache: PricingCache | None = None
) -> ParamGathers:
    """The parameter gathers of ``stage`` (``param_gather_for_parameters``)."""
    signature = stage_signatures(setup)[stage]
    params, expert = signature_parameter_split(setup, signature)
    return param_gather_for_parameters(setup, params, links, cache, signature, expert=expert)


def param_gather_for_parameters(
    setup: TrainingSetup, params: float, links: Mapping[str, GroupLinks], cache: PricingCache | None,
    signature: tuple[ChunkSignature, ...], expert: float = 0.0,
) -> ParamGathers:
    """The gathers of a stage holding ``params`` parameters per rank in the chunks ``signature``
    (``expert`` of them routed experts, ``signature_expert_parameters``).

    ``fsdp_unit = "chunk"``: one collective of the chunk's parameters (the stage's split evenly over
    its chunks), waited on whole before the chunk's F or B. ``"layer"`` (torch FSDP with per-block
    auto-wrap, FSDP2 ``fully_shard`` per transformer block, Megatron-Core's FSDP): one all-gather per
    unit, the root unit (the chunk's embedding and LM head, which the root ``fully_shard`` /
    FSDP wrapper holds) first, then each layer in model order, each priced at its own size (an
    all-gather of one layer runs below the bus bandwidth of the whole chunk's: 2.5-12 % longer in
    total on the torchtitan A12 rows); the chunk's F or B starts once the first unit is gathered and
    its last ``tail_share`` = 1 / layers (the last layer's, with the embedding and LM head spread
    over the layers) waits for the last unit (``pipeline_des``). Units the stack keeps gathered from
    their forward to their backward (``fsdp_kept_after_forward``) are left out of the gather before
    the B (``ParamGathers.backward``), which runs the layers in backward order.

    An MoE model's routed experts are sharded over their own group (``data_parallel_groups``:
    torchtitan's ``fully_shard`` of the experts over ``dp_shard_mod_ep`` / ``efsdp``, Megatron-Core
    custom FSDP's expert buffers; under HSDP its shard group): each unit gathers its dense part over
    the dense shard group and its expert part over the experts' (nothing over a group of one rank),
    both on the one data-parallel stream, so its seconds are the sum of the two all-gathers and its
    bytes those gathered. A "chunk" unit splits the stage's experts evenly over its chunks as its
    parameters."""
    plan = setup.plan
    group = data_parallel_groups(setup, links, expert=False)[0]
    if paces_param_gather(setup):
        return bucket_paced_gathers(setup, links, cache, signature)
    if plan.zero != 3:
        return NO_GATHERS
    expert_group = data_parallel_groups(setup, links, expert=True)[0] if setup.model.is_moe else None
    if group.size <= 1 and (expert_group is None or expert_group.size <= 1):
        return NO_GATHERS
    collective = cache.collective_s if cache is not None else collective_time_s
    if setup.fsdp_unit not in FSDP_UNITS:
        raise ValueError(f"fsdp_unit {setup.fsdp_unit!r}; allowed: {', '.join(FSDP_UNITS)}")
    gather_dense = group.size > 1
    gather_expert = expert_group is not None and expert_group.size > 1
    unit_cache: dict[tuple[float, float], tuple[float, float]] = {}  # (bytes, seconds) by (dense, expert) parameters

    def unit(dense: float, experts: float) -> tuple[float, float]:
        """(gathered bytes, seconds) of one unit of ``dense`` parameters over the data-parallel group
        and ``experts`` over the expert one (16-bit parameters; nothing over a group of one rank)."""
        key = (dense, experts)
        if key not in unit_cache:
            nbytes = seconds = 0.0
            if gather_dense and dense > 0.0:
                nbytes += dense * 2.0
                seconds += collective(Collective.ALL_GATHER, dense * 2.0, group)
            if gather_expert and experts > 0.0:
                nbytes += experts * 2.0
                seconds += collective(Collective.ALL_GATHER, experts * 2.0, expert_group)
            unit_cache[key] = (nbytes, seconds)
        return unit_cache[key]

    stage_experts = expert if expert_group is not None else 0.0
    if setup.fsdp_unit == "chunk":
        chunks = plan.virtual_stages
        per_chunk, seconds = unit((params - stage_experts) / chunks, stage_experts / chunks)
        gather = CommWork(axis="dp", kind=Collective.ALL_GATHER.value, message_bytes=per_chunk, duration_s=seconds)
        return ParamGathers((gather,) * chunks, (seconds,) * chunks, (0.0,) * chunks)
    kept = setup.fsdp_kept_after_forward
    if kept not in FSDP_KEPT_AFTER_FORWARD:
        raise ValueError(f"fsdp_kept_after_forward {kept!r}; allowed: {', '.join(FSDP_KEPT_AFTER_FORWARD)}")
    # a layer's (dense, expert) parameters: the experts apart where they have a group of their own
    layer_parts = {moe: _layer_parameter_split(setup, moe) if expert_group is not None
                   else (_layer_parameters_per_rank(setup, moe), 0.0) for moe in (False, True)}

    def gathered(root: float, layers: list[tuple[float, float]]) -> tuple[CommWork, float, float]:
        """One gather of a root unit of ``root`` (dense) parameters (if any) then of ``layers``: the
        whole, its first unit's seconds and the share of the op's compute waiting for its last unit."""
        units = [unit(root, 0.0)] if root > 0.0 and gather_dense else []
        units.extend(unit(dense, experts) for dense, experts in layers)
        nbytes = seconds = 0.0
        for unit_bytes, unit_s in units:
            nbytes += unit_bytes
            seconds += unit_s
        whole = CommWork(axis="dp", kind=Collective.ALL_GATHER.value, message_bytes=nbytes, duration_s=seconds)
        return whole, units[0][1] if units else 0.0, 1.0 / len(layers) if len(units) > 1 and layers else 0.0

    forward, backward = [], []
    for (root, _), chunk in zip(_chunk_parameters(setup, signature), signature):
        dense_layers, count = chunk[0], chunk[1]
        layers = [layer_parts[setup.model.is_moe and index >= dense_layers] for index in range(count)]
        forward.append(gathered(root, layers))
        if kept != "none":
            # before the B: the layers not kept since its F, the last first (the root unit is kept)
            last_kept = kept == "root_last_layer" and chunk[3] and layers
            backward.append(gathered(0.0, layers[::-1][1:] if last_kept else layers[::-1]))
    gathers = ParamGathers(*(tuple(column) for column in zip(*forward))) if forward else NO_GATHERS
    if not backward:
        return gathers
    whole, first, tail = (tuple(column) for column in zip(*backward))
    return gathers._replace(backward=whole, backward_first_unit_s=first, backward_tail_share=tail)


def grad_buffer_bytes(setup: TrainingSetup, params: float, shard: float) -> float:
    """HBM bytes of the per-iteration passes over the rank's gradient buffer beyond the optimizer's
    (``grad_buffer_passes``): 0 for "shard"; for "megatron_ddp" MEGATRON_DDP_GRAD_BUFFER_PASSES x the
    buffer's bytes, the whole buffer (``params``) under ZeRO <= 1, the shard where gradients are sharded."""
    if setup.grad_buffer_passes not in GRAD_BUFFER_PASSES:
        raise ValueError(f"grad_buffer_passes {setup.grad_buffer_passes!r}; allowed: {', '.join(GRAD_BUFFER_PASSES)}")
    if setup.grad_buffer_passes == "shard":
        return 0.0
    buffer = params if setup.plan.zero <= 1 else shard
    return MEGATRON_DDP_GRAD_BUFFER_PASSES * setup.grad_reduce_bytes * buffer


def optimizer_time_s(
    setup: TrainingSetup, stage: int, links: Mapping[str, GroupLinks], cache: PricingCache | None = None
) -> float:
    """The optimizer step of one rank, with the traffic it implies.

    On the GPU it is memory-bound over the rank's optimizer shard (ZeRO >= 1 shards it dp ways).
    ZeRO 1/2 then all-gather the updated 16-bit parameters: here, after the optimizer, without
    dp_comm_overlap; with it, free (hidden under the next forward) unless the stack paces it bucket
    by bucket in the first forward (``param_gather_pacing = "bucket"``: ``bucket_paced_gathers``). Offloaded optimizers run CPU Adam over
    host DRAM bandwidth and move gradients down and parameters up over PCIe (ZeRO-Offload); NVMe
    offload also reads and writes the optimizer states from NVMe (ZeRO-Infinity).
    """
    params, expert = signature_parameter_split(setup, stage_signatures(setup)[stage])
    return optimizer_time_for_parameters_s(setup, params, links, cache, expert=expert)


def optimizer_time_for_parameters_s(
    setup: TrainingSetup, params: float, links: Mapping[str, GroupLinks], cache: PricingCache | None,
    expert: float = 0.0,
) -> float:
    """``optimizer_time_s`` of a stage holding ``params`` parameters per rank, ``expert`` of them
    routed experts (``signature_expert_parameters``). Under ZeRO 1/2/3 the distributed optimizer
    (ZeRO-3: FSDP's sharded parameters) shards the dense parameters over their group and the experts
    over theirs (``data_parallel_groups``; megatron/core/optimizer/__init__.py
    ``get_megatron_optimizer``: the expert-parallel parameter groups get a DistributedOptimizer over
    ``parallel_state.get_data_modulo_expert_parallel_group()``, core_r0.8.0), so the shard is
    dense / dp x cp + expert / expert_dp (under HSDP over the two shard groups) and the ZeRO-1/2
    parameter all-gather after the step gathers each part over its group (ZeRO-3 gathers before
    each use: ``param_gather_for_parameters``)."""
    plan, gpu, node = setup.plan, setup.cluster.gpu, setup.cluster.node
    sharded_over = data_parallel_groups(setup, links, expert=False)[0].size
    split = expert > 0.0
    dense = params - expert
    expert_group = data_parallel_groups(setup, links, expert=True)[0] if split else None
    if plan.zero < 1:
        shard = params
    elif split:
        shard = dense / sharded_over + expert / expert_group.size
    else:
        shard = params / sharded_over
    per_param = optimizer_bytes_per_parameter(setup.job.optimizer, setup.job.precision, setup.optimizer_kernels)
    buffer_bytes = grad_buffer_bytes(setup, params, shard)
    if buffer_bytes:
        per_param -= ZERO_GRAD_BYTES_PER_PARAMETER  # the buffer's passes zero it (grad_buffer_bytes)
    if plan.offload == "none":
        seconds = costmodel.op_time_s(Op(name="optimizer", kind="memory", bytes_moved=shard * per_param), gpu, precision=setup.job.precision, links=links)
    else:
        # CPU Adam of every GPU on the host shares its DRAM bandwidth: the GPUs actually there
        # (fewer than the node's slots when the whole job is smaller than a node)
        sharing = min(node.gpus_per_node, setup.cluster.num_gpus)
        dram_share_Bps = node.cpu_dram_bandwidth_Bps / sharing
        seconds = shard * per_param / dram_share_Bps
        seconds += transfer_time_s(shard * 2.0, Tier.CPU, Tier.HBM, node, gpu)  # updated 16-bit parameters up
        if plan.offload == "nvme":
            state_bytes = shard * 12.0  # fp32 master, m and v: read from and written back to NVMe
            seconds += transfer_time_s(state_bytes, Tier.NVME, Tier.CPU, node, gpu) + transfer_time_s(state_bytes, Tier.CPU, Tier.NVME, node, gpu)
    if buffer_bytes:  # on the GPU whether or not the optimizer is offloaded
        seconds += costmodel.op_time_s(Op(name="grad_buffer", kind="memory", bytes_moved=buffer_bytes), gpu,
                                       precision=setup.job.precision, links=links)
    if plan.zero in (1, 2) and not setup.dp_comm_overlap:
        collective = cache.collective_s if cache is not None else collective_time_s
        if links["dp"].size > 1:
            seconds += collective(Collective.ALL_GATHER, dense * 2.0, links["dp"])
        if expert_group is not None and expert_group.size > 1:
            seconds += collective(Collective.ALL_GATHER, expert * 2.0, expert_group)
    return seconds
