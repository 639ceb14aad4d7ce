"""Training memory per pipeline stage: model states, stored activations, buffers and offload tiers.

Pure functions of (ModelSpec, ParallelPlan, TrainingJob); the analytic estimator, the SimPy executor
and the plan search all call them, so they cannot disagree about what fits.

Conventions (each cited where it is used below):
* Mixed precision as Megatron-LM: 16-bit weights, fp32 main gradients, fp32 master weights and Adam
  m, v -> 2 + 4 + 12 = 18 bytes/parameter at ZeRO 0; the distributed optimizer (ZeRO 1) gives
  6 + 12/d. ZeRO 2 also shards gradients; ZeRO 3 (FSDP) shards weights too.
* fp8 training keeps the bf16 weights and adds an fp8 copy of every transformer-layer matmul weight
  and its transpose (1 + 1 bytes/parameter; Transformer Engine caches both layouts for the forward
  and the data-gradient GEMMs on Hopper). With fp8 primary weights (``job.fp8_params``: TE
  fp8_model_init, Megatron --fp8-param-gather) the matmul weights are the fp8 tensor and its
  transpose only, with no 16-bit copy. Activations stay 16-bit (conservative: TE may store fp8
  casts of some GEMM inputs).
* The main gradients live in the data-parallel gradient buffer (Megatron-Core DDP: fp32 when
  grad_reduce_in_fp32, else the parameter dtype; gradient_accumulation_fusion makes main_grad a view
  of it), so a bf16 reduction keeps 2 bytes/parameter. 16-bit fp16 gradients still count 4: the fp16
  optimizer copies them into fp32 main gradients (Megatron Float16OptimizerWithFloat16Params).
* Data-parallel sharding runs over dp x cp (Megatron shards the distributed optimizer over the
  data-parallel group with context parallel); expert parameters over the expert data-parallel group,
  tp x cp x dp / (ep x etp). Experts split over the plan's etp (expert tensor parallelism; tp unless
  the plan folds the experts over other ranks, Megatron-Core's --expert-tensor-parallel-size).
* Stored activations per layer and in-flight micro-batches come from ``sim.training.activations``
  (Korthikanti et al. 2022, arXiv 2205.05198, Table 2, generalised per tensor).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from hardware.units import MB, MiB, GB
from sim.training.activations import (
    ACTIVATION_BYTES,
    CROSS_ENTROPY_MEMORY,
    DROPOUT_MASK_BYTES,
    LOGITS_BYTES,
    TOKEN_ID_BYTES,
    inflight_microbatches,
    layer_activation_parts,
    recompute_working_bytes,
    stored_activation_bytes,
)
from workloads.model import ModelSpec
from sim.training.schedules import plan_layer_counts, plan_occupancy, plan_placement, stage_ends
from workloads.plan import ParallelPlan, TrainingJob

# ---- byte sizes and fixed reserves: the one place for memory constants --------------------------
WEIGHT_BYTES = 2.0  # bf16/fp16 model weights
FP8_WEIGHT_CACHE_BYTES = 2.0  # fp8 weight + fp8 transpose per matmul parameter (see module docstring)
MAIN_GRAD_BYTES = 4.0  # fp32 main gradients (Megatron accumulate_allreduce_grads_in_fp32, formulas.md 4.3)
BF16_MAIN_GRAD_BYTES = 2.0  # bf16 gradient buffer (Megatron-Core grad_reduce_in_fp32 = False, NeMo grad_sync_dtype bf16)
ADAM_STATE_BYTES = 12.0  # fp32 master weight + m + v (ZeRO arXiv 1910.02054 §3.1; formulas.md 4.3)
SGD_STATE_BYTES = 4.0  # fp32 master weight only: plain SGD keeps no m, v
# NCCL communicator buffers: aiconfigurator system YAMLs reserve 342-392 MB for TP 2-8 (formulas.md,
# Serving/Memory); we take the upper end for any multi-GPU job.
NCCL_BUFFER_BYTES = 392 * MB
# cuBLASLt workspace: 32 MiB, the cuBLAS API reference's recommendation for Hopper that PyTorch adopted
# (pytorch/pytorch PR #120925); larger than the 4 MiB recommended before Hopper, so an upper bound.
CUBLAS_WORKSPACE_BYTES = 32 * MiB
# CUDA context, library handles and caching-allocator slack: aiconfigurator's fixed 3.5 GB "other"
# reserve per GPU (formulas.md, Serving/Memory). Sourced from serving; applied to training as is.
RUNTIME_RESERVE_BYTES = 3.5 * GB

DEFAULT_GPUS_PER_NODE = 8  # DGX/HGX nodes; HSDP shards inside a node of this many GPUs


def main_grad_bytes(job: TrainingJob) -> float:
    """Bytes per parameter of the main gradients (see the module docstring)."""
    return BF16_MAIN_GRAD_BYTES if job.grad_reduce_dtype == "bf16" else MAIN_GRAD_BYTES


def weight_bytes_per_rank(job: TrainingJob, params: float, matmul: float) -> float:
    """16-bit weights of ``params`` parameters, ``matmul`` of them matmul weights, with fp8's caches:
    an fp8 copy and its transpose beside the 16-bit weight, or (fp8 primary weights) instead of it."""
    if job.precision != "fp8":
        return WEIGHT_BYTES * params
    if job.fp8_params:
        return WEIGHT_BYTES * (params - matmul) + FP8_WEIGHT_CACHE_BYTES * matmul
    return WEIGHT_BYTES * params + FP8_WEIGHT_CACHE_BYTES * matmul


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryBreakdown:
    """Peak bytes on one GPU of pipeline stage ``stage`` (any rank of its tp x cp x dp group, by symmetry)."""

    stage: int
    weights_bytes: float  # weights (16-bit, + fp8 caches) resident on the GPU, after ZeRO-3 sharding
    gradients_bytes: float  # fp32 main gradients on the GPU
    optimizer_bytes: float  # master weights and optimizer moments on the GPU
    activations_bytes: float  # peak stored activations (schedule-dependent in-flight micro-batches)
    other_bytes: float  # NCCL buffers, cuBLAS workspace, runtime reserve, logits/loss, recompute and
    # ZeRO-3/offload gathered-layer working buffers
    capacity_bytes: float  # HBM of the GPU
    cpu_offload_bytes: float  # model-state bytes moved to CPU DRAM by offload
    nvme_offload_bytes: float  # model-state bytes moved to NVMe by offload

    @property
    def model_state_bytes(self) -> float:
        """Weights + gradients + optimizer states on the GPU."""
        return self.weights_bytes + self.gradients_bytes + self.optimizer_bytes

    @property
    def total_bytes(self) -> float:
        """Everything on the GPU at the peak."""
        return self.model_state_bytes + self.activations_bytes + self.other_bytes

    @property
    def fits_in_memory(self) -> bool:
        return self.total_bytes <= self.capacity_bytes

    @property
    def shortfall_bytes(self) -> float:
        """Bytes over capacity; 0.0 when it fits."""
        return max(0.0, self.total_bytes - self.capacity_bytes)


# ---- activations ---------------------------------------------------------------------------------
def _attention_parameters_per_rank(model: ModelSpec, t: int) -> float:
    """Attention projections on one TP rank; K/V projections replicate when kv_heads < tp."""
    total = model.attention_parameters()
    if model.is_mla or model.kv_heads >= t:
        return total / t
    kv = 2 * model.hidden * model.kv_heads * model.head_dim + (2 * model.kv_heads * model.head_dim if model.bias else 0)
    return (total - kv) / t + kv / model.kv_heads  # one KV head per rank


@dataclass(frozen=True, slots=True)
class _LayerParams:
    dense: float  # per rank, sharded by data parallel over dp x cp
    expert: float  # per rank, sharded over the expert data-parallel group (ParallelPlan.expert_dp)
    matmul: float  # matmul weights per rank (for fp8 caches)


def _layer_params(model: ModelSpec, plan: ParallelPlan, moe: bool) -> _LayerParams:
    t = plan.tp
    attention = _attention_parameters_per_rank(model, t)
    norms = (1 if model.parallel_block else 2) * model.norm_parameters()  # replicated over TP
    if moe:
        router = model.hidden * model.experts  # replicated over TP (Megatron-Core router)
        shared = model.shared_experts * model.mlp_parameters(model.expert_ffn_hidden) / t
        routed = model.experts * model.mlp_parameters(model.expert_ffn_hidden) / (plan.ep * plan.expert_tp)
        return _LayerParams(dense=attention + norms + router + shared, expert=routed, matmul=attention + shared + routed)
    mlp = model.mlp_parameters(model.ffn_hidden) / t
    return _LayerParams(dense=attention + norms + mlp, expert=0.0, matmul=attention + mlp)


def stage_recompute_counts(model: ModelSpec, plan: ParallelPlan) -> tuple[int, ...]:
    """Fully recomputed layers of every stage (``parallel.recompute_layers``; 0 when not given)."""
    return plan.recompute_layers or (0,) * plan.pp


def stage_layer_kinds(model: ModelSpec, plan: ParallelPlan) -> tuple[tuple[int, int], ...]:
    """(dense, MoE) transformer layers of every stage; chunk c runs on stage ``plan_placement(plan)[c]``
    (c % pp for looping schedules), and the first
    ``model.dense_layers`` layers of an MoE model are dense."""
    counts = plan_layer_counts(model.layers, plan)
    place = plan_placement(plan)
    dense = [0] * plan.pp
    moe = [0] * plan.pp
    start = 0
    for chunk, count in enumerate(counts):
        stage = place[chunk]
        in_moe = max(0, start + count - max(start, model.dense_layers)) if model.is_moe else 0
        moe[stage] += in_moe
        dense[stage] += count - in_moe
        start += count
    return tuple(zip(dense, moe))


def shard_degrees(plan: ParallelPlan, gpus_per_node: int) -> tuple[int, int]:
    """(dense, expert) data-parallel shard degrees for ZeRO.

    Megatron rank order puts tp fastest, then cp x dp, so a node of ``gpus_per_node`` GPUs holds
    gpus_per_node // tp ranks of the dp x cp group; HSDP shards over those, or over the plan's
    ``hsdp_shard`` consecutive ones (the gcd keeps it a divisor). The experts shard over the ranks of
    their expert data-parallel group inside one dense shard group (``expert_hsdp_shard``).
    """
    dense = plan.dp * plan.cp
    if plan.hsdp:
        shard = math.gcd(dense, plan.hsdp_shard or max(1, gpus_per_node // plan.tp))
        return shard, expert_hsdp_shard(plan, shard)
    return dense, plan.expert_dp


def expert_hsdp_shard(plan: ParallelPlan, dense_shard: int) -> int:
    """Ranks an expert is sharded over under HSDP: those of its expert data-parallel group (every
    expert tp x ep-th rank of the stage) inside one dense shard group (``dense_shard`` ranks of the
    dp x cp group, tp x dense_shard consecutive ranks), replicated over the rest: torchtitan's HSDP
    with expert parallelism carves ep out of the shard dimension and ``fully_shard``s the experts over
    what is left of it, ``dp_shard_mod_ep`` = dp_shard x cp / ep, replicating them over dp_replicate
    (torchtitan/distributed/parallel_dims.py ``ParallelDims._build_mesh_with_ep``). One rank where the
    expert group's stride does not fit in the shard span."""
    span, stride = plan.tp * dense_shard, plan.expert_tp * plan.ep
    if span % stride:
        return 1
    return math.gcd(span // stride, plan.expert_dp)


# ---- the stage breakdown -------------------------------------------------------------------------
class StageMemoryClass(NamedTuple):
    """Everything of a ``MemoryBreakdown`` that is the same on every stage with the same layers and
    pipeline ends: only the in-flight micro-batches (a function of the stage index) scale the
    stored activations. ``memory_per_stage`` computes one per distinct (dense, MoE, first, last).
    (A NamedTuple of floats: a search keeps many, and the garbage collector stops tracking them.)"""

    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    other_bytes: float
    cpu_offload_bytes: float
    nvme_offload_bytes: float
    stored_bytes_per_microbatch: float  # transformer-layer activations of one in-flight micro-batch
    first_stage_tokens: float  # s b / cp on the first stage (token ids and embedding mask), else 0
    first_stage_bytes_per_token: float  # token id + embedding dropout mask bytes per token
    offload_fraction: float = 0.0  # parallel.activation_offload

    def activations_bytes(self, inflight: float) -> float:
        """Stored activations with ``inflight`` micro-batches in flight; with activation offload a
        fraction ``offload_fraction`` of every pending micro-batch's activations but the one in use
        sits in host memory (PipeOffload, Wan et al. 2025, arXiv 2503.01328)."""
        if self.offload_fraction:
            inflight = min(inflight, 1.0) + max(inflight - 1.0, 0.0) * (1.0 - self.offload_fraction)
        activations = inflight * self.stored_bytes_per_microbatch
        if self.first_stage_tokens:
            activations += inflight * self.first_stage_tokens * self.first_stage_bytes_per_token
        return activations

    def total_bytes(self, inflight: float) -> float:
        """``MemoryBreakdown.total_bytes`` of ``breakdown(inflight=inflight)``, same float operations,
        without building the breakdown."""
        model_state = self.weights_bytes + self.gradients_bytes + self.optimizer_bytes
        return model_state + self.activations_bytes(inflight) + self.other_bytes

    def breakdown(self, *, stage: int, inflight: float, capacity_bytes: float) -> MemoryBreakdown:
        """The stage's breakdown with ``inflight`` micro-batches' activations stored."""
        activations = self.activations_bytes(inflight)
        return MemoryBreakdown(
            stage=stage,
            weights_bytes=self.weights_bytes,
            gradients_bytes=self.gradients_bytes,
            optimizer_bytes=self.optimizer_bytes,
            activations_bytes=activations,
            other_bytes=self.other_bytes,
            capacity_bytes=float(capacity_bytes),
            cpu_offload_bytes=self.cpu_offload_bytes,
            nvme_offload_bytes=self.nvme_offload_bytes,
        )


class StageMemoryTerms(NamedTuple):
    """The ZeRO-, offload- and data-parallel-independent terms of a stage memory class."""

    dense: float  # parameters per rank replicated over the data-parallel group before ZeRO
    expert: float  # expert parameters per rank (sharded over dp x cp / ep)
    matmul: float  # matmul weights per rank (fp8 caches)
    largest_layer: float  # parameters of the largest layer (gathered in full under ZeRO-3 / offload)
    stored_bytes_per_microbatch: float
    first_stage_tokens: float
    first_stage_bytes_per_token: float
    recompute_working_bytes: float
    logits_bytes: float


def stage_memory_terms(
    model: ModelSpec,
    plan: ParallelPlan,
    job: TrainingJob,
    *,
    dense_layers: int,
    moe_layers: int,
    first: bool,
    last: bool,
    recomputed_layers: int = 0,
    flash_attention: bool = True,
    dropout: bool = True,
) -> StageMemoryTerms:
    """Parameters, stored activations per micro-batch and working sets of a stage class, before
    data-parallel sharding, ZeRO and offload (see ``stage_memory_class``). ``recomputed_layers`` of
    the stage's layers (dense ones first, as they come first in the model) keep only their input
    (``parallel.recompute_layers``); the others follow ``plan.recompute``."""
    t = plan.tp

    # parameters on this rank: its layers, the input embedding on the first stage, the LM head on the
    # last (a tied embedding is kept on both ends when pp > 1, as Megatron does)
    dense = expert = matmul = largest_layer = 0.0
    for count, moe in ((dense_layers, False), (moe_layers, True)):
        if count:
            p = _layer_params(model, plan, moe)
            dense, expert, matmul = dense + count * p.dense, expert + count * p.expert, matmul + count * p.matmul
            largest_layer = max(largest_layer, p.dense + p.expert)
    split = plan.pp if plan.vocab_parallel else 1  # vocabulary parallelism: a 1/pp shard on every stage
    table = model.vocab * model.hidden / (t * split)  # vocab-parallel embedding / LM head
    if first:
        dense += table + (model.max_seq_len * model.hidden if model.position == "learned" else 0)
        largest_layer = max(largest_layer, table)
    if last:
        dense += model.norm_parameters()
        if not model.tied_embeddings or not first:  # a tied head on another stage is a second copy
            dense += table
            largest_layer = max(largest_layer, table)

    # activations: stored per layer x micro-batches in flight (Korthikanti 2022 Eq. 5-6, Narayanan
    # 2021); the in-flight count is applied per stage by StageMemoryClass.breakdown
    per_kind = {
        moe: layer_activation_parts(model, plan, job, moe=moe, flash_attention=flash_attention, dropout=dropout)
        for moe, count in ((False, dense_layers), (True, moe_layers))
        if count
    }

    recomputed_dense = min(recomputed_layers, dense_layers)
    recomputed = {False: recomputed_dense, True: recomputed_layers - recomputed_dense}
    stored_per_microbatch = sum(
        ((moe_layers if moe else dense_layers) - recomputed[moe]) * stored_activation_bytes(parts, plan.recompute)
        + recomputed[moe] * parts.input_bytes
        for moe, parts in per_kind.items()
    )
    tokens = job.seq_len / plan.cp * job.micro_batch
    sp = t if plan.sequence_parallel else 1
    first_bytes_per_token = 0.0
    if first:
        # Megatron theoretical_memory_usage.py: token ids (8 s b) and the embedding dropout mask (s b h)
        mask = DROPOUT_MASK_BYTES if dropout else 0.0
        first_bytes_per_token = TOKEN_ID_BYTES + mask * model.hidden / sp

    # recompute working set: the part of one layer re-materialised during its backward
    recompute_working = 0.0
    if per_kind and plan.recompute != "none":
        parts = per_kind[moe_layers > 0]
        recompute_working = recompute_working_bytes(parts, plan.recompute, job.selective_recompute)
    if recomputed_layers:  # a fully recomputed layer re-materialises all it did not keep
        parts = per_kind[recomputed[True] > 0]
        recompute_working = max(recompute_working, parts.full_bytes - parts.input_bytes)

    # LM-head inputs and logits on the last stage: 4 s b h / t (Megatron theoretical_memory_usage.py's
    # 4 s b h (1 + V/h) / t, its logits term replaced by the loss's own, CROSS_ENTROPY_MEMORY; under
    # sequence parallelism a stack that saves its gathered inputs, tp_gathered_input "save", keeps the
    # LM head's gathered 16-bit input whole) for as many micro-batches as the schedule program keeps in
    # flight on the last chunk (every micro-batch under gpipe and bfs, one under the 1F1B family), plus
    # one micro-batch's loss at its peak
    logits = 0.0
    if last:
        live = plan_occupancy(plan, job.num_microbatches(plan.dp)).last_chunk_inflight
        kept, peak = CROSS_ENTROPY_MEMORY[job.cross_entropy]
        local_logits = tokens * model.vocab / (split * t)
        saved_whole = plan.sequence_parallel and t > 1 and job.tp_gathered_input == "save"
        head_input = ACTIVATION_BYTES * tokens * model.hidden if saved_whole else LOGITS_BYTES * tokens * model.hidden / t
        logits = live * (head_input + kept * local_logits) + (peak - kept) * local_logits
    return StageMemoryTerms(
        dense, expert, matmul, largest_layer, stored_per_microbatch, tokens if first else 0.0, first_bytes_per_token,
        recompute_working, logits,
    )


def stage_memory_class(
    model: ModelSpec,
    plan: ParallelPlan,
    job: TrainingJob,
    *,
    dense_layers: int,
    moe_layers: int,
    first: bool,
    last: bool,
    recomputed_layers: int = 0,
    flash_attention: bool = True,
    dropout: bool = True,
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE,
    terms: StageMemoryTerms | None = None,
) -> StageMemoryClass:
    """The stage-index-free part of ``stage_memory`` for a stage holding ``dense_layers`` dense and
    ``moe_layers`` MoE layers, the embedding when ``first`` and the LM head when ``last``.
    ``terms``: this stage's ``stage_memory_terms`` when the caller has them (a search memoizes them)."""
    if terms is None:
        terms = stage_memory_terms(
            model, plan, job, dense_layers=dense_layers, moe_layers=moe_layers, first=first, last=last,
            recomputed_layers=recomputed_layers, flash_attention=flash_attention, dropout=dropout,
        )
    dense, expert, matmul, largest_layer = terms.dense, terms.expert, terms.matmul, terms.largest_layer
    job.num_microbatches(plan.dp)  # raises InvalidPlanError when global_batch does not divide

    # model-state bytes per rank before sharding
    weight_bytes = weight_bytes_per_rank(job, dense + expert, matmul)
    state_per_param = ADAM_STATE_BYTES if job.optimizer == "adam" else SGD_STATE_BYTES
    dense_shard, expert_shard = shard_degrees(plan, gpus_per_node)

    params = dense + expert
    # fraction of this rank's parameters it keeps when sharded over the data-parallel groups
    shard_fraction = (dense / dense_shard + expert / expert_shard) / params if params else 1.0
    weights = weight_bytes * (shard_fraction if plan.zero == 3 else 1.0)
    grad_bytes = main_grad_bytes(job)
    gradients = grad_bytes * params * (shard_fraction if plan.zero >= 2 else 1.0)
    optimizer = state_per_param * params * (shard_fraction if plan.zero >= 1 else 1.0)

    # one layer gathered in full (weights + its unsharded gradient) while it runs: ZeRO-3 / parameter
    # offload (DeepSpeed estimate_zero3_model_states_mem_needs: 4 x largest layer params in fp16)
    gathered_layer = (WEIGHT_BYTES + grad_bytes) * largest_layer
    working_buffer = gathered_layer if plan.zero == 3 else 0.0

    # offload (ZeRO-Offload arXiv 2101.06840: optimizer states and fp32 gradients on the CPU;
    # ZeRO-Infinity arXiv 2104.07857: parameters and optimizer states on NVMe)
    cpu = nvme = 0.0
    if plan.offload == "optimizer":
        cpu, gradients, optimizer = gradients + optimizer, 0.0, 0.0
    elif plan.offload == "optimizer+params":
        cpu, weights, gradients, optimizer = weights + gradients + optimizer, 0.0, 0.0, 0.0
        working_buffer = gathered_layer
    elif plan.offload == "nvme":
        # gradients are staged in CPU DRAM for the optimizer step that swaps states in from NVMe
        cpu, nvme, weights, gradients, optimizer = gradients, weights + optimizer, 0.0, 0.0, 0.0
        working_buffer = gathered_layer

    reserves = CUBLAS_WORKSPACE_BYTES + RUNTIME_RESERVE_BYTES + (NCCL_BUFFER_BYTES if plan.world_size > 1 else 0.0)
    return StageMemoryClass(
        weights_bytes=weights,
        gradients_bytes=gradients,
        optimizer_bytes=optimizer,
        other_bytes=reserves + terms.logits_bytes + terms.recompute_working_bytes + working_buffer,
        cpu_offload_bytes=cpu,
        nvme_offload_bytes=nvme,
        stored_bytes_per_microbatch=terms.stored_bytes_per_microbatch,
        first_stage_tokens=terms.first_stage_tokens,
        first_stage_bytes_per_token=terms.first_stage_bytes_per_token,
        offload_fraction=plan.activation_offload,
    )


def _check_memory_inputs(capacity_bytes: float, gpus_per_node: int) -> None:
    if not capacity_bytes > 0:
        raise ValueError(f"capacity_bytes = {capacity_bytes!r} must be > 0")
    if gpus_per_node < 1:
        raise ValueError(f"gpus_per_node = {gpus_per_node!r} must be >= 1")


def stage_memory(
    model: ModelSpec,
    plan: ParallelPlan,
    job: TrainingJob,
    *,
    capacity_bytes: float,
    stage: int,
    flash_attention: bool = True,
    dropout: bool = True,
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE,
) -> MemoryBreakdown:
    """Peak memory of one GPU of pipeline stage ``stage``; see the module docstring for conventions.

    ``gpus_per_node`` only matters for HSDP (sharding group = the dp x cp ranks inside one node).
    Raises InvalidPlanError when global_batch is not divisible by dp x micro_batch.
    """
    _check_memory_inputs(capacity_bytes, gpus_per_node)
    if not 0 <= stage < plan.pp:
        raise ValueError(f"stage {stage} out of range 0..{plan.pp - 1} for pp = {plan.pp}")
    dense_layers, moe_layers = stage_layer_kinds(model, plan)[stage]
    first, last = stage_ends(plan)[stage]
    kind = stage_memory_class(
        model, plan, job, dense_layers=dense_layers, moe_layers=moe_layers, first=first,
        last=last, recomputed_layers=stage_recompute_counts(model, plan)[stage],
        flash_attention=flash_attention, dropout=dropout, gpus_per_node=gpus_per_node,
    )
    inflight = inflight_microbatches(plan, job.num_microbatches(plan.dp), stage)
    return kind.breakdown(stage=stage, inflight=inflight, capacity_bytes=capacity_bytes)


MemoryKind = tuple[int, int, bool, bool, int]  # (dense layers, MoE layers, first, last, recomputed layers)


def stage_memory_classes(model: ModelSpec, plan: ParallelPlan) -> tuple[tuple[MemoryKind, ...], tuple[int, ...]]:
    """(distinct (dense layers, MoE layers, first, last, recomputed layers) in order of first
    appearance, class index of every stage): stages of one class differ in memory only through their
    in-flight micro-batches."""
    keys: dict[MemoryKind, int] = {}
    stage_class = []
    ends = stage_ends(plan)
    recomputed = stage_recompute_counts(model, plan)
    for stage, (dense, moe) in enumerate(stage_layer_kinds(model, plan)):
        key = (dense, moe, *ends[stage], recomputed[stage])
        stage_class.append(keys.setdefault(key, len(keys)))
    return tuple(keys), tuple(stage_class)


def memory_per_stage(
    model: ModelSpec,
    plan: ParallelPlan,
    job: TrainingJob,
    *,
    capacity_bytes: float,
    flash_attention: bool = True,
    dropout: bool = True,
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE,
) -> tuple[MemoryBreakdown, ...]:
    """``stage_memory`` for every pipeline stage, in order (each distinct stage class computed once)."""
    _check_memory_inputs(capacity_bytes, gpus_per_node)
    keys, stage_class = stage_memory_classes(model, plan)
    kinds = [
        stage_memory_class(
            model, plan, job, dense_layers=dense, moe_layers=moe, first=first, last=last,
            recomputed_layers=recomputed, flash_attention=flash_attention, dropout=dropout, gpus_per_node=gpus_per_node,
        )
        for dense, moe, first, last, recomputed in keys
    ]
    m = job.num_microbatches(plan.dp)
    return tuple(
        kinds[k].breakdown(stage=stage, inflight=inflight_microbatches(plan, m, stage), capacity_bytes=capacity_bytes)
        for stage, k in enumerate(stage_class)
    )


def peak_stage_memory(
    kinds: tuple[StageMemoryClass, ...],
    stage_class: tuple[int, ...],
    plan: ParallelPlan,
    num_microbatches: int,
    *,
    capacity_bytes: float,
    first_stages: tuple[int, ...] | None = None,
) -> MemoryBreakdown:
    """The breakdown of the first stage reaching the largest total over ``memory_per_stage``: what a
    plan search reads (largest total; with one capacity for all stages it fits iff this stage fits,
    and its shortfall is the largest, since x - capacity is monotone in x). In-flight micro-batches
    never grow with the stage index (``inflight_microbatches``), so within a class its first stage
    holds the most: it compares the totals of each class's first stage (``first_stages``, when the
    caller has them: ``stage_class.index(k)`` for every class k) and builds only the winner's breakdown."""
    if first_stages is None:
        first_stages = tuple(stage_class.index(k) for k in range(len(kinds)))
    best_stage = best_kind = -1
    best_total = -math.inf
    for k, stage in enumerate(first_stages):  # stage order, so ">" keeps the first stage reaching the max
        total = kinds[k].total_bytes(inflight_microbatches(plan, num_microbatches, stage))
        if total > best_total:
            best_stage, best_kind, best_total = stage, k, total
    inflight = inflight_microbatches(plan, num_microbatches, best_stage)
    return kinds[best_kind].breakdown(stage=best_stage, inflight=inflight, capacity_bytes=capacity_bytes)
