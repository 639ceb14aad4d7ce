"""Price one micro-batch of training work per pipeline chunk: process groups on the topology,
layer op graphs for F, B and W, and their seconds with the communication left exposed.

Ranks follow Megatron-LM's default order (tp fastest, then cp, then dp, then pp), so a tensor-
parallel group sits inside a node and data-parallel peers are tp x cp ranks apart. By symmetry one
rank per pipeline stage is priced: every data-parallel replica and every tp/cp peer does the same.
The data-parallel work lives in ``sim.training.data_parallel`` and the assembly of a whole
iteration in ``sim.training.iteration``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping

from hardware.collectives import TOKEN_DISPATCH, Collective, GroupLinks, collective_time_s
from hardware.topology import Cluster, spanning_links
from sim import costmodel
from sim.training.config import TrainingSetup, p2p_overlap_slowdown
from sim.training.hetero import stage_rank, stage_setup
from sim.training.activations import layer_activation_parts, stored_activation_bytes
from sim.training.memory import shard_degrees
from sim.training.pricing_cache import PricingCache
from sim.training.work import ChunkWork, chain_host_bound, host_bound_pass_s
from workloads.checkpointing import per_op_checkpoint, torch_matmuls
from workloads.eager import eager_elementwise_ops, sdpa_layout_ops
from workloads.plan import ParallelPlan
from workloads.model import ModelSpec
from workloads.graph import EP_TOKEN_EXCHANGES, EXPERT_GEMMS, Op, Sharding, backward_ops, embedding_ops, layer_forward_ops, lm_head_ops
from workloads.precision import bytes_per_element

@dataclass(frozen=True, slots=True, kw_only=True)
class Ranks:
    """Rank numbers of stage ``stage``'s process groups (Megatron order tp, cp, dp, pp)."""

    tp: tuple[int, ...]
    cp: tuple[int, ...]
    dp: tuple[int, ...]  # the data-parallel x context-parallel group ZeRO shards and reduces over
    ep: tuple[int, ...]
    dp_shard: tuple[int, ...]  # HSDP: the shard group, part of the dp group (== dp without HSDP)
    dp_replicate: tuple[int, ...]  # HSDP: one rank per shard group (a single rank without HSDP)
    edp: tuple[int, ...]  # the expert data-parallel group: the ranks holding the same experts
    edp_shard: tuple[int, ...]  # HSDP: the experts' shard group, part of edp (== edp without HSDP)
    edp_replicate: tuple[int, ...]  # HSDP: one rank per expert shard group


def rank_of(setup: TrainingSetup, *, tp: int = 0, cp: int = 0, dp: int = 0, pp: int = 0) -> int:
    plan = setup.plan
    return tp + plan.tp * (cp + plan.cp * (dp + plan.dp * pp))


def stage_ranks(setup: TrainingSetup, stage: int) -> Ranks:
    plan = setup.plan
    # expert group: expert TP fastest, then EP (Megatron-Core's expert rank order etp-ep-dp inside a
    # stage): every expert_tp-th rank; with etp = tp, consecutive ranks of the (cp x dp) space
    base = rank_of(setup, pp=stage)
    ep_ranks = [base + j * plan.expert_tp for j in range(plan.ep)]
    dp_cp = tuple(rank_of(setup, cp=j % plan.cp, dp=j // plan.cp, pp=stage) for j in range(plan.cp * plan.dp))
    shard, expert_shard = shard_degrees(plan, setup.cluster.node.gpus_per_node)
    edp = tuple(base + j * plan.expert_tp * plan.ep for j in range(plan.expert_dp))
    return Ranks(
        tp=tuple(rank_of(setup, tp=t, pp=stage) for t in range(plan.tp)),
        cp=tuple(rank_of(setup, cp=c, pp=stage) for c in range(plan.cp)),
        dp=dp_cp,
        ep=tuple(ep_ranks),
        dp_shard=dp_cp[:shard],
        dp_replicate=dp_cp[::shard],
        edp=edp,
        edp_shard=edp[:expert_shard],
        edp_replicate=edp[::expert_shard],
    )


GROUP_AXES = ("tp", "cp", "dp", "ep", "edp", "dp_shard", "dp_replicate", "edp_shard", "edp_replicate", "pp", "cp_heads",
              "cp_ring")


def stage_groups(setup: TrainingSetup, stage: int) -> dict[str, tuple[int, int, int]]:
    """``stage_ranks`` as arithmetic progressions (first rank, stride, count) per axis: in Megatron
    order every group of a stage is evenly spaced (tp by 1; cp and dp x cp by tp, ep by the expert tp; the HSDP
    replicate group by tp x shard), which lets a search cache the links without listing ranks.

    "edp" is the expert data-parallel group, the ``plan.expert_dp`` ranks holding the same experts,
    which reduce and shard the expert parameters' gradients (Megatron-Core's expert data-parallel
    group, ``parallel_state.get_data_modulo_expert_parallel_group``, core_r0.8.0; rank order
    etp-ep-dp inside a stage): every (expert tp x ep)-th rank."""
    plan = setup.plan
    base = rank_of(setup, pp=stage)
    dp_cp = plan.cp * plan.dp
    shard, expert_shard = shard_degrees(plan, setup.cluster.node.gpus_per_node)
    expert_stride = plan.expert_tp * plan.ep
    return {
        "tp": (base, 1, plan.tp),
        "cp": (base, plan.tp, plan.cp),
        "dp": (base, plan.tp, dp_cp),
        "ep": (base, plan.expert_tp, plan.ep),
        "edp": (base, expert_stride, plan.expert_dp),
        "dp_shard": (base, plan.tp, min(shard, dp_cp)),
        "dp_replicate": (base, plan.tp * shard, -(-dp_cp // shard)),
        # HSDP: the experts' shard group inside a dense shard group, and one rank of each across them
        "edp_shard": (base, expert_stride, expert_shard),
        "edp_replicate": (base, expert_stride * expert_shard, plan.expert_dp // expert_shard),
        "pp": (base - stage * plan.tp * dp_cp, plan.tp * dp_cp, plan.pp),  # the stage's rank across stages
        # hybrid context parallelism: the head all-to-all over cp_heads neighbouring cp ranks, the
        # K/V ring over the cp / cp_heads groups (ring alone: the whole cp group)
        "cp_heads": (base, plan.tp, plan.cp_heads if plan.cp_comm == "hybrid" else 1),
        "cp_ring": (base, plan.tp * (plan.cp_heads if plan.cp_comm == "hybrid" else 1),
                    plan.cp // (plan.cp_heads if plan.cp_comm == "hybrid" else 1)),
    }


def group_links(setup: TrainingSetup, stage: int, cache: PricingCache | None = None) -> dict[str, GroupLinks]:
    """The links each process group of ``stage`` sees (see ``stage_groups``)."""
    cache = cache if cache is not None else PricingCache()
    if setup.groups:  # a heterogeneous cluster: the stage's groups inside its own group's cluster
        sub, local = stage_setup(setup, stage)
        groups = stage_groups(sub, local)
        start, stride, _ = groups.pop("pp")
        links = {axis: cache.group_links(sub.cluster, *spec) for axis, spec in groups.items()}
        links["pp"] = pipeline_group_links(setup, start, cache)
        return links
    cluster = setup.cluster
    return {axis: cache.group_links(cluster, *spec) for axis, spec in stage_groups(setup, stage).items()}


def pipeline_group_links(setup: TrainingSetup, offset: int, cache: PricingCache) -> GroupLinks:
    """The links of the pipeline group (rank ``offset`` of every stage) of a heterogeneous cluster:
    it spans the groups the stages are placed on (``hardware.topology.spanning_links``)."""
    def compute() -> GroupLinks:
        parts: dict[int, tuple[Cluster, list[int]]] = {}
        for stage in range(setup.plan.pp):
            cluster, rank = stage_rank(setup, stage, offset)
            parts.setdefault(id(cluster), (cluster, []))[1].append(rank)
        return spanning_links(list(parts.values()))

    key = (tuple(cache.cluster_id(g.cluster) for g in setup.groups), setup.stage_group, setup.plan.tp * setup.plan.cp * setup.plan.dp, offset)
    return cache.memo("pipeline_group_links", key, compute)


def _sharding(setup: TrainingSetup) -> Sharding:
    plan = setup.plan
    return Sharding(
        tp=plan.tp,
        sequence_parallel=plan.sequence_parallel,
        cp=plan.cp,
        ep=plan.ep,
        etp=plan.expert_tp,
        expert_load_imbalance=setup.expert_load_imbalance,
        cp_comm=plan.cp_comm,
        cp_heads=plan.cp_heads,
    )


def cp_heads_split(plan: ParallelPlan) -> int:
    """The factor context parallelism splits attention heads by: cp under Ulysses, cp_heads under
    hybrid, 1 under ring / all-gather (they split the sequence only)."""
    return plan.cp if plan.cp_comm == "ulysses" else plan.cp_heads if plan.cp_comm == "hybrid" else 1


def attention_sequences(setup: TrainingSetup) -> tuple[tuple[tuple[int, int], ...], bool]:
    """(query, key) pairs of one rank's micro-batch and whether the kernel masks causally.

    Context parallel with load balancing gives each rank two sequence chunks whose queries see on
    average half the sequence: priced as s/cp queries against s/2 keys, unmasked (exact in FLOPs).
    Ulysses attends the whole sequence with heads / cp; hybrid s cp_heads / cp queries (its ring).
    A sliding window w < s caps each query's keys: priced as s queries against the mean key count.
    """
    s, b, cp = setup.job.seq_len, setup.job.micro_batch, setup.plan.cp
    window = setup.model.sliding_window
    # Ulysses attends over the whole sequence (heads split instead); hybrid over cp / cp_heads shards
    heads_split = cp_heads_split(setup.plan)
    if cp > 1 and heads_split == cp:  # the rank's cp shard regathered: b whole sequences
        return attention_sequences_full(s, b, window)
    if cp > 1:
        queries = s * heads_split // cp
        keys = s // 2 if window is None or window >= s else _window_mean_keys(s, window)
        return tuple([(queries, keys)] * b), False
    return attention_sequences_full(s, b, window)


def _window_mean_keys(s: int, window: int) -> int:
    """Keys a query of a sequence of s tokens sees on average under a sliding window w < s: the first
    w queries see 1..w keys, the rest w each."""
    return round((window * (window + 1) / 2 + (s - window) * window) / s)


def attention_sequences_full(s: int, b: int, window: int | None) -> tuple[tuple[tuple[int, int], ...], bool]:
    """(query, key) pairs of b whole sequences of length s (causal, or a sliding window: s queries
    against the mean key count, unmasked, as many queries as keys or more)."""
    if window is not None and window < s:
        return tuple([(s, _window_mean_keys(s, window))] * b), False
    return tuple([(s, s)] * b), True


def layer_passes(
    setup: TrainingSetup, moe: bool, full_recompute: bool = False, bf16: bool = False
) -> tuple[list[Op], list[Op], list[Op]]:
    """(F, B, W) ops of one layer for one micro-batch; B starts with the recomputed forward ops
    (all of them when ``full_recompute``, one of the ``recompute_layers``; else per ``plan.recompute``).
    ``bf16``: a layer an fp8 run keeps in bf16 (``TrainingSetup.bf16_layer``): 16-bit GEMMs, no fp8 casts."""
    job, plan = setup.job, setup.plan
    if bf16 and job.precision == "fp8":
        job = replace(job, precision="bf16", fp8_params=False)
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
        fused_attention=setup.fused_attention,
    )
    if setup.attention_kernel in ("flash1", "flash2", "cudnn"):  # hardware.cost.ATTENTION_KERNELS
        forward = [replace(op, kernel=setup.attention_kernel) if op.kind == "attention" else op for op in forward]
    if setup.moe_expert_gemm == "per_expert":  # one GEMM kernel per local expert, each at its own shape
        forward = [replace(op, kernels=op.batch) if op.name in EXPERT_GEMMS else op for op in forward]
    if setup.moe_dispatcher == "flex":
        forward = flex_dispatch_ops(setup.model, forward)
    if setup.elementwise != "fused":
        forward = eager_elementwise_ops(forward, setup.model, fused_norm=setup.elementwise == "eager_fused_norm")
    if job.dropout > 0.0:
        forward = with_dropout(setup, forward)
    if setup.attention_kernel == "unfused":
        forward = megatron_attention_layout_ops(forward)
    else:
        forward = qkv_split_ops(setup, forward)
        if setup.attention_layout == "flash_bshd":
            forward = flash_layout_ops(setup, forward)
        elif setup.attention_layout == "torch_sdpa":
            forward = sdpa_layout_ops(forward)
    if setup.linear_bias == "unfused":
        forward = unfused_bias_add_ops(setup, forward)
    if job.precision == "fp8" and setup.fp8_all_gather:
        forward = fp8_all_gather_ops(forward, moe=moe)
    if plan.recompute == "full" or full_recompute:
        recompute = forward
    elif plan.recompute == "selective" and job.selective_recompute == "per_op":
        # PyTorch per-op selective checkpointing (torchtitan): every op outside its save list and
        # every second matmul, up to the layer's last matmul (workloads.checkpointing)
        recompute = list(per_op_checkpoint(forward, model=setup.model, tp=plan.tp).recompute)
    elif plan.recompute == "selective":
        recompute = [op for op in forward if op.kind == "attention" or op.name.startswith("attention_")
                     and op.kind != "collective"]
    else:
        recompute = []
    # a split into views runs no forward kernel (nor a recomputed one); its backward concatenation
    # is in b_ops
    views = [op for op in forward if op.name == QKV_SPLIT_OP and op.bytes_moved == 0.0]
    b_ops, w_ops = backward_ops(forward, recompute=[op for op in recompute if op not in views],
                                regather=setup.tp_gathered_input == "regather")
    forward = [op for op in forward if op not in views]
    if setup.linear_bias in ("unfused", "skip_bias_add"):
        w_ops = w_ops + unfused_bias_gradient_ops(setup, forward)
    if job.precision == "fp8":
        forward, b_ops, w_ops = fp8_passes(setup, forward, b_ops, w_ops, moe=moe)
    elif setup.job.precision == "fp8":  # a bf16 layer of an fp8 run: its GEMMs at the 16-bit peak
        forward, b_ops, w_ops = ([replace(op, precision="bf16") if op.kind == "gemm" else op for op in ops]
                                 for ops in (forward, b_ops, w_ops))
    return forward, b_ops, accumulate_main_grads(setup, w_ops)


# Sequence-parallel all-gathers in fp8 (``fp8_all_gather``, precision "fp8"): torchao's
# Float8ColwiseParallel and PrepareFloat8ModuleInput cast a column-parallel linear's input to fp8
# before gathering it, and Float8RowwiseParallel's output, NoopFwToFloat8BwDynamic, casts its
# gradient to fp8 before the backward all-gather (torchao/float8/float8_tensor_parallel.py, "all-gather
# in float8", tensorwise scaling): one byte per element each way, where the reduce-scatters (a
# row-parallel output, a column-parallel input gradient) stay 16-bit.
FP8_ALL_GATHERS = ("attention_all_gather", "mlp_all_gather")
FP8_BACKWARD_ALL_GATHERS = ("attention_reduce_scatter", "mlp_reduce_scatter")


def fp8_all_gather_ops(forward: list[Op], *, moe: bool) -> list[Op]:
    """``forward`` with its sequence-parallel all-gathers moving fp8 (see above): the input gathers
    at one byte per element (their reduce-scatter gradients at the 16-bit bytes) and the output
    reduce-scatters' backward gathers of the output gradient at one byte. An MoE layer's MLP
    gathers stay 16-bit (its router is not a float8 linear)."""
    out = []
    for op in forward:
        if op.kind == "collective" and not (moe and op.name.startswith("mlp_")):
            a = op.message_bytes
            if op.name in FP8_ALL_GATHERS:
                op = replace(op, message_bytes=a / 2.0, backward_bytes_moved=a)
            elif op.name in FP8_BACKWARD_ALL_GATHERS:
                op = replace(op, backward_bytes_moved=a / 2.0)
        out.append(op)
    return out


# Dropout (``[training] dropout`` > 0). Hidden dropout runs inside the bias-dropout-add after
# attention and after the MLP (Megatron-Core megatron/core/fusions/fused_bias_dropout.py,
# bias_dropout_add_fused_train, jit-fused; Megatron-LM 2021 the same): the fused forward kernel also
# writes the 1-byte mask it draws, and its backward (a separate kernel: the residual gradient passes
# through, the branch's gradient is grad x mask / (1 - p)) reads the 16-bit gradient and the mask and
# writes the 16-bit gradient. Bytes per element of the (sequence-parallel shard of the) hidden state.
HIDDEN_DROPOUT_FORWARD_BYTES = 1.0
HIDDEN_DROPOUT_BACKWARD_EXTRA_BYTES = 1.0  # + 2 x the activation bytes (read and write the gradient)
# The two residual adds of a layer, where the two dropout sites sit (workloads.graph.layer_forward_ops)
HIDDEN_DROPOUT_SITES = ("residual_norm", "residual")
# Attention dropout inside the fused attention kernel (Philox mask drawn in forward, redrawn in
# backward). On Hopper, Transformer Engine's cuDNN fused attention in Megatron-Core's sbhd layout pays
# +0.020 ms for attention_dropout 0.1 in one DotProductAttention forward + backward (0.594 -> 0.614 ms,
# H200 sm90, TE 2.15, bf16, 4 sequences x 1,024 tokens, 16 heads, head dim 128, median of 50 after 20
# warm-up; NVIDIA/TransformerEngine#3312). Those wall times are not kernel times: this model prices the
# shape's cuDNN kernels (causal, TE's default attn_mask_type; H200, its 4 x 16 grid at 0.79 of the
# benchmarks' rate, hardware.calibration attention_grid_occupancy) at 0.0510 ms forward + 0.1667 ms
# backward = 0.2177 ms, 37 % of the 0.594 ms (the rest is TE's host path and launches), so 0.594 / 0.614
# as a kernel rate dilutes the dropout 2.7x. Read as kernel time, the +0.020 ms gives the kernel's rate
# with dropout 0.2177 / (0.2177 + 0.020) = 0.916 (test_training_dropout recomputes it from the model;
# 0.896 over the 0.1716 ms the full-grid rate had priced).
# Cross-checks, none at this kernel and GPU: FlashAttention-1 on A100 at head dim 64 and compute-bound
# sizes runs forward + backward at 470.51 ms without and 583.45 ms with dropout 0.1 (seq 16k, batch 16,
# 8 heads; Dao et al. 2022, arXiv 2205.14135, Appendix E.6 Tables 17 and 20), a rate of 0.806 with
# half the matmul work per score element that head dim 128 does; FA4 on GB200 keeps 75-85 % forward
# and 60-70 % backward of its no-dropout rate (Dao-AILab/flash-attention#2597). The rate applies to
# every fused kernel family (no Hopper FlashAttention-2 measurement with and without dropout is cited).
# The materialised-scores path already counts its dropout bytes
# (workloads.graph UNFUSED_SOFTMAX_BYTES_PER_SCORE).
ATTENTION_DROPOUT_KERNEL_MS = 0.2177  # this model's cuDNN kernel price of TE#3312's shape on H200 at the boost clock
ATTENTION_DROPOUT_EXTRA_MS = 0.614 - 0.594  # TE#3312, H200 sbhd, dropout 0.1 vs 0.0
ATTENTION_DROPOUT_RATE = ATTENTION_DROPOUT_KERNEL_MS / (ATTENTION_DROPOUT_KERNEL_MS + ATTENTION_DROPOUT_EXTRA_MS)


def with_dropout(setup: TrainingSetup, forward: list[Op]) -> list[Op]:
    """A layer's forward ops with the recipe's dropout (see the constants above): the mask bytes on the
    two residual adds (their backward also multiplies the gradient by the mask) and the fused
    attention kernel at its rate with dropout."""
    job, plan = setup.job, setup.plan
    tokens = job.micro_batch * job.seq_len // plan.cp
    if plan.sequence_parallel and plan.tp > 1:
        tokens //= plan.tp
    elements = tokens * setup.model.hidden
    a = bytes_per_element("bf16" if job.precision == "fp8" else job.precision)
    out: list[Op] = []
    for op in forward:
        if op.kind == "memory" and op.name in HIDDEN_DROPOUT_SITES:
            backward = 2.0 * op.bytes_moved if op.backward_bytes_moved is None else op.backward_bytes_moved
            op = replace(
                op, bytes_moved=op.bytes_moved + HIDDEN_DROPOUT_FORWARD_BYTES * elements,
                backward_bytes_moved=backward + (2.0 * a + HIDDEN_DROPOUT_BACKWARD_EXTRA_BYTES) * elements,
            )
        elif op.kind == "attention":
            op = replace(op, kernel_rate=op.kernel_rate * ATTENTION_DROPOUT_RATE)
        out.append(op)
    return out


# The split of the fused QKV projection's output into Q, K and V (``qkv_split``), for fused
# attention (the materialised-scores path prices its own split, ``megatron_attention_layout_ops``).
# "concat": Q, K and V are views of the QKV output (Megatron-Core SelfAttention
# get_query_key_value_tensors: SplitAlongDim, TE's _SplitAlongDim, or torch.split; Composer MPT
# qkv.chunk(3)), so no forward kernel, but backward assembles the QKV output gradient from the
# attention kernel's and RoPE's separate dQ, dK, dV with torch.cat (TE _SplitAlongDim.backward
# concatenates unless the gradients already are consecutive views of one buffer; autograd's split
# backward is a cat): read the three gradients and write the QKV output gradient, 2 x its m n
# elements. "concat_copy_v": as "concat", and Transformer Engine's attention copies V into a tensor
# of its own in forward when RoPE has replaced Q and K by new contiguous tensors: V keeps the fused
# output's strides, get_qkv_layout finds no layout for the three strides and makes them contiguous
# (transformer_engine/pytorch/attention get_qkv_layout: "force q,k,v to be contiguous"), reading and
# writing V. "none": no split (separate Q, K, V projections, or a kernel that reads the packed QKV
# and writes its gradient packed).
QKV_SPLIT_OP = "qkv_split"


def flex_dispatch_ops(model: ModelSpec, forward: list[Op]) -> list[Op]:
    """``forward`` with an MoE layer's expert-parallel dispatch and combine run by Megatron-Core's flex
    dispatcher (``moe_dispatcher = "flex"``: DeepEP's normal kernels or NVIDIA's HybridEP) instead of
    an all-to-all of the permuted copies: each carries the rank's distinct tokens (the all-to-all's
    message over ``experts_per_token``) and sends each once to every node and rank it reaches
    (``hardware.collectives.token_dispatch_traffic_bytes``); the combine mirrors it. The permutations
    around them stay as the all-to-all dispatcher runs them."""
    k = model.experts_per_token
    return [
        replace(op, collective=TOKEN_DISPATCH, message_bytes=op.message_bytes / k, routed_experts=model.experts, experts_per_token=k)
        if op.kind == "collective" and op.name in EP_TOKEN_EXCHANGES else op
        for op in forward
    ]


def qkv_split_ops(setup: TrainingSetup, forward: list[Op]) -> list[Op]:
    """``forward`` with the QKV split of ``setup.qkv_split`` (see the comment above) after the QKV
    projection; its backward is the gradients' concatenation."""
    if setup.qkv_split == "none":
        return forward
    index = next((i for i, op in enumerate(forward) if op.kind == "gemm" and op.name == "qkv_proj"), None)
    if index is None:  # no fused QKV projection (MLA's separate projections)
        return forward
    qkv = forward[index]
    elements = qkv.m * qkv.n * qkv.batch
    a = qkv.bytes_per_element
    rope = index + 1 < len(forward) and forward[index + 1].name == "rope"
    copy = 0.0
    if setup.qkv_split == "concat_copy_v" and rope:
        # V's share of the QKV output (kv_heads of heads + 2 kv_heads head-dim columns per rank); a
        # Ulysses all-to-all regroups it (s x heads / cp instead of s / cp x heads), the same count
        model = setup.model
        kv_heads = -(-model.kv_heads // setup.plan.tp)
        copy = 2.0 * qkv.m * kv_heads * model.head_dim * qkv.batch * a
    # placed after the projection, so that its backward follows RoPE's (the V copy, inside the
    # attention call in forward, is priced here: the pass is serial either way)
    split = Op(name=QKV_SPLIT_OP, kind="memory", bytes_moved=copy, backward_bytes_moved=2.0 * elements * a)
    return forward[:index + 1] + [split] + forward[index + 1:]


# Transformer Engine's flash-attn backend on [s, b, h, d] tensors (``attention_layout =
# "flash_bshd"``): flash-attn takes [b s, h, d], so TE's FlashAttention.forward
# (transformer_engine/pytorch/attention.py at 7d576ed25, NeMo 24.07's TE_TAG; the same code at
# 09ba8427, MLPerf v3.1's TE_REVISION, and in transformer_engine/pytorch/transformer.py at
# release_v0.8, MLPerf v3.0's) converts on both sides of the kernel when qkv_format is "sbhd"
# (Megatron-Core 338af514 TEDotProductAttention's default without apply_rope_fusion; TE's own
# MultiheadAttention passes sbhd, the only format TE 0.8 has):
# - input: Q, K and V interleaved in the QKV output (layout sbh3d: no RoPE) are made contiguous in
#   [b, s] order by tex.fa_prepare_fwd (head dim 128, s b >= 512) or else by
#   ``x.transpose(0, 1).contiguous()`` each, a copy either way (read and write 2 x the QKV output's
#   elements); Q and K that RoPE rewrote and V that get_qkv_layout copied (``qkv_split``
#   "concat_copy_v") are contiguous [s, b, h, d], and the transpose copies them only when b > 1
#   (with b = 1 the transposed tensor is already contiguous). The backward needs no copy of its own:
#   fa_prepare_bwd writes the packed QKV gradient, the transposes' gradients are views, and either
#   way the split's concatenation (``qkv_split``) is the pass that assembles it. Priced as the QKV
#   split's forward.
# - input, ``qkv_split = "none"``: Transformer Engine's own TransformerLayer (NeMo 1.17 / 1.20 legacy
#   GPT: fuse_qkv_params, qkv_weight_interleaved) splits the QKV output into interleaved views whose
#   split backward is a no-op when the three gradients are consecutive views of one buffer (TE 0.8
#   transformer.py _SplitLastDim.backward, 09ba8427 attention.py _SplitAlongDim.backward: noop_ok), so
#   no concatenation stands in for the copy back: the same FlashAttention code (TE 0.8
#   transformer.py FlashAttention.forward at release_v0.8, 09ba8427 attention.py lines 945-955)
#   copies Q, K, V into [b, s] order with fa_prepare_fwd (read [s, b, np, 3 hn], write
#   [3, b, s, np, hn]: 2 x the QKV output's elements), and _PrepareQKVForFA.backward's fa_prepare_bwd
#   reads dQ, dK, dV and writes the packed [s, b, np, 3 hn] gradient (2 x its elements again), whose
#   split into views is a no-op for the split backward above (on the transpose path the gradients
#   are strided views and that split backward concatenates them: the same bytes). Priced as an op of
#   its own before the attention kernel (``ATTENTION_INPUT_LAYOUT_OP``), both directions; its RoPE
#   rule is the one above (no stack runs RoPE through TransformerLayer here, and TE 09ba8427's
#   _get_qkv_layout rejects a rotated Q, K beside a strided V).
# - output: ``output.view(b, s, -1).transpose(0, 1).contiguous()`` (09ba8427 attention.py line
#   1024, release_v0.8 transformer.py line 384) copies it back to [s, b] order when b > 1 (read and
#   write its elements), and in backward autograd's reshape of the transposed gradient to
#   [b s, h, d] (the view's backward; b and s cannot merge) copies it again. With b = 1 the
#   transposed [s, 1, h d] is already contiguous (PyTorch ignores a size-1 dimension's stride) and
#   its gradient reshapes as a view: no copy either way.
ATTENTION_OUTPUT_LAYOUT_OP = "attention_output_layout"
ATTENTION_INPUT_LAYOUT_OP = "attention_input_layout"


def flash_layout_ops(setup: TrainingSetup, forward: list[Op]) -> list[Op]:
    """``forward`` with the [s, b] <-> [b, s] copies of ``attention_layout = "flash_bshd"`` (see the
    comment above): the input copy added to the QKV split's forward bytes (or, with no split op,
    ``qkv_split = "none"``, an op of its own before the attention kernel that copies in both
    directions), the output copy (b > 1) an op after the attention kernel."""
    b = setup.job.micro_batch
    split = next((i for i, op in enumerate(forward) if op.name == QKV_SPLIT_OP), None)
    qkv = next((op for op in forward if op.kind == "gemm" and op.name == "qkv_proj"), None)
    rope = any(op.name == "rope" for op in forward)
    out = list(forward)
    if qkv is not None and (b > 1 or not rope):
        copy = 2.0 * qkv.m * qkv.n * qkv.batch * qkv.bytes_per_element
        if split is not None:
            out[split] = replace(out[split], bytes_moved=out[split].bytes_moved + copy)
        elif (attention := next((i for i, op in enumerate(out) if op.kind == "attention"), None)) is not None:
            out.insert(attention, Op(name=ATTENTION_INPUT_LAYOUT_OP, kind="memory", bytes_moved=copy,
                                     backward_bytes_moved=copy))
    if b > 1:
        for index in range(len(out) - 1, -1, -1):
            op = out[index]
            if op.kind == "attention":
                queries = sum(q for q, _ in op.sequences)
                elements = queries * op.heads * (op.v_head_dim or op.head_dim)
                copy = 2.0 * elements * op.bytes_per_element  # the kernel's 16-bit output, read and written
                copy_op = Op(name=ATTENTION_OUTPUT_LAYOUT_OP, kind="memory", bytes_moved=copy,
                             backward_bytes_moved=copy)
                out.insert(index + 1, copy_op)
                break
    return out


def megatron_attention_layout_ops(forward: list[Op]) -> list[Op]:
    """The layout copies of Megatron-LM 2021-22's materialised-scores core attention
    (megatron/model/transformer.py ParallelAttention.forward at 50a4b5fa02): the [b np, sq, hn]
    context of the value bmm becomes [sq, b, np hn] by ``context_layer.permute(2, 0, 1, 3).contiguous()``,
    a copy (read + write the context, after the last ``attention_values`` GEMM); Q, K and V are views
    of the QKV output (``split_tensor_along_last_dim``), so in backward the split's gradient is
    assembled by a concatenation (read the three gradients, write the QKV output gradient: 2 x the
    QKV GEMM's m n), priced as this op's backward. (The permute's own backward and the views' are
    strided views the bmm gradients consume directly: no copy.)"""
    values = [index for index, op in enumerate(forward) if op.kind == "gemm" and op.name.startswith("attention_values")]
    if not values:
        return forward
    context = sum(forward[i].m * forward[i].n * forward[i].batch for i in values)
    a = forward[values[-1]].bytes_per_element
    qkv = next((op for op in forward if op.kind == "gemm" and op.name == "qkv_proj"), None)
    split = qkv.m * qkv.n * qkv.batch * qkv.bytes_per_element if qkv is not None else 0.0
    copy = Op(name="attention_context_copy", kind="memory", bytes_moved=2.0 * context * a, backward_bytes_moved=2.0 * split)
    return forward[: values[-1] + 1] + [copy] + forward[values[-1] + 1:]


# Biased projections of a layer whose bias Megatron-LM 2021-22 adds in a kernel of its own (the QKV
# ColumnParallelLinear: matmul, then the bias add), and those whose bias is folded into the next
# elementwise kernel (bias_dropout_add after out_proj / mlp_down, bias_gelu after mlp_up); every one
# of them reduces its bias gradient with a separate column sum over the output gradient.
# ``linear_bias = "skip_bias_add"``, Megatron-Core with Transformer Engine linears (NeMo 24.x):
# linear_qkv is built with skip_bias_add=False, so TE adds its bias in the GEMM epilogue and reduces
# its gradient inside the fp8 cast-transpose (fused); linear_proj, linear_fc1 and linear_fc2 are
# built with skip_bias_add=True (megatron/core/transformer/attention.py, mlp.py at 338af514), so TE
# returns their bias unapplied (TE Linear return_bias: apply_bias False, no dbias in its backward),
# bias_gelu_impl / bias_dropout_add add it, and autograd reduces the broadcast bias's gradient:
# GeLUFunction.backward returns the [s, b, 4h/tp] input gradient for the bias too
# (megatron/core/fusions/fused_bias_gelu.py at 338af514), summed to the bias's shape. These three
# column sums are ``unfused_bias_gradient_ops``; no separate add.
BIAS_ADD_GEMMS = ("qkv_proj",)
BIASED_ATTENTION_GEMMS = ("qkv_proj", "out_proj")
BIASED_MLP_GEMMS = ("mlp_up", "mlp_down")
ROW_PARALLEL_GEMMS = ("out_proj", "mlp_down")  # their bias acts on the all-reduced (or SP-scattered) output


def _biased(setup: TrainingSetup, name: str) -> bool:
    model = setup.model
    if name == "qkv_proj" and (model.attention_bias or model.qkv_bias):
        return True
    return bool(model.attention_bias and name in BIASED_ATTENTION_GEMMS or model.mlp_bias and name in BIASED_MLP_GEMMS)


def _bias_rows(setup: TrainingSetup, op: Op) -> int:
    """Rows the bias of ``op`` is applied to: the GEMM's tokens, a row-parallel projection's
    sequence-parallel shard (its bias follows the reduce-scatter)."""
    plan = setup.plan
    if op.name in ROW_PARALLEL_GEMMS and plan.sequence_parallel and plan.tp > 1:
        return op.m // plan.tp
    return op.m


def unfused_bias_add_ops(setup: TrainingSetup, forward: list[Op]) -> list[Op]:
    """``linear_bias = "unfused"``: after each GEMM of ``BIAS_ADD_GEMMS`` with a bias, an add kernel
    reads and writes its output (2 x m n elements); its backward is the bias-gradient column sum,
    which reads the output gradient once (m n)."""
    out: list[Op] = []
    for op in forward:
        out.append(op)
        if op.kind == "gemm" and op.name in BIAS_ADD_GEMMS and _biased(setup, op.name):
            elements = op.m * op.n * op.batch
            out.append(Op(name=f"{op.name}_bias_add", kind="memory", bytes_moved=2.0 * elements * op.bytes_per_element,
                          backward_bytes_moved=elements * op.bytes_per_element))
    return out


def unfused_bias_gradient_ops(setup: TrainingSetup, forward: list[Op]) -> list[Op]:
    """``linear_bias = "unfused"`` or ``"skip_bias_add"``: the bias-gradient column sums of the biased projections whose bias
    rides in the following elementwise kernel (out_proj, mlp_up, mlp_down): one read of the output
    gradient each (rows x n elements; the 1-D result is negligible), as weight-gradient work."""
    ops = []
    for op in forward:
        if op.kind == "gemm" and op.weight and op.name not in BIAS_ADD_GEMMS and _biased(setup, op.name):
            elements = _bias_rows(setup, op) * op.n * op.batch
            ops.append(Op(name=f"{op.name}_bias_grad", kind="memory", bytes_moved=elements * op.bytes_per_element))
    return ops


# Ops whose output feeds a GEMM and into which the stack fuses the fp8 cast of that output, by
# ``fp8_cast_fusion``: (producers of forward GEMM inputs, forward ops whose backward produces a GEMM's
# output gradient). Under delayed scaling the producer writes fp8 (1 byte instead of 16 bits); under
# current scaling it takes the amax while writing its 16-bit output (see below). "norm_activation",
# TE's LayerNormLinear and LayerNormMLP (the norm kernel layernorm_fwd_fp8, the activation fp8_gelu; in
# backward fp8_cast_transpose_bgrad_dgelu_fused emits the fp8 gradient of fc1;
# transformer_engine/pytorch/module/layernorm_mlp.py at 09ba8427); "norm", Megatron-Core's MLP
# (megatron/core/transformer/mlp.py at core_r0.8.0: linear_fc1 is TELayerNormColumnParallelLinear,
# the activation Megatron's jit-fused bias_gelu / bias_swiglu in 16 bits, linear_fc2
# TERowParallelLinear, which casts its input with fp8_cast_transpose_fused, and fc1's backward casts
# the activation's 16-bit gradient the same way); "none", every cast a kernel; "compiled", torchao
# float8 under torch.compile: Inductor fuses the amax reduction of a cast into the kernel it generates
# for the producer when both are in the compiled graph (pytorch/pytorch#111122, test/inductor/
# test_fp8.py test_layernorm_fp8_quant: a norm and the amax of its output in one kernel; torchao's own
# roofline prices the amax of a linear's input and output gradient at no traffic when fused with the
# previous op, torchao/testing/training/roofline_utils.py get_tensor_memory_traffic_ovhd_s
# fuse_with_prev), and the cast, which needs the whole tensor's amax, stays a kernel of its own. The
# producers are the Inductor kernels of a compiled TransformerBlock (torchtitan compiles each block):
# the norms, the activation and the copy of the attention output to [b, s, h] forward; in backward
# the activation's, RoPE's and the second norm's (with the residual gradient sum), not the block
# output's gradient, which the next block's graph produces, nor the attention kernels'.
_NORMS = ("input_norm", "residual_norm")
_ACTIVATIONS = ("mlp_activation", "experts_activation", "shared_activation")
FP8_FUSED_PRODUCERS = {
    "norm_activation": (_NORMS + _ACTIVATIONS, _ACTIVATIONS),
    "norm": (_NORMS, ()),
    "none": ((), ()),
    "compiled": (_NORMS + _ACTIVATIONS + ("attention_output_copy",), _ACTIVATIONS + ("rope", "residual_norm")),
}
# GEMMs Transformer Engine / Megatron-Core keep in 16 bits during fp8 training: the MoE router
# (a plain linear layer) and the materialised attention score / value products.
FP8_BF16_GEMMS = ("router", "attention_scores", "attention_values")
# Bytes per element of a separate cast-transpose kernel: read 16 bits, write fp8 and fp8^T; current
# scaling adds an amax pass (read 16 bits) before the cast.
FP8_CAST_BYTES = 2.0 + 1.0
FP8_CAST_TRANSPOSE_BYTES = FP8_CAST_BYTES + 1.0
FP8_AMAX_BYTES = 2.0
# A producer that writes fp8 itself writes no transposed copy: the weight-gradient GEMM's operand
# is made in backward by tex.fp8_transpose of the saved fp8 tensor (read 1, write 1 byte per element;
# TE 1.x LayerNormLinear backward ln_out_total_t, LayerNormMLP backward gelu_out_t at 7d576ed25).
FP8_TRANSPOSE_BYTES = 1.0 + 1.0
# Current scaling (Transformer Engine 2.x Float8CurrentScalingQuantizer): a fusing norm or activation
# computes the amax while it writes its 16-bit output, then the output is cast and transposed (read 2,
# write 1 + 1; transformer_engine/pytorch/csrc/extensions/normalization.cpp FUSED_NORM_AMAX_FP8 at
# v2.9, activation.cpp FUSED_ACTIVATION_AMAX_FP8 at d0067d0d); any other producer's output gets an
# amax pass and a cast-transpose.
# A GEMM input that reaches its GEMM through a sequence-parallel all-gather in fp8 (``fp8_all_gather``)
# is cast on the sequence shard before the gather, one layout only (read 16 bits, write fp8: 1/tp of
# the GEMM's rows, with its amax pass under current scaling), and the transposed copy the weight
# gradient needs is made from the gathered fp8 tensor (FP8_TRANSPOSE_BYTES over all rows): Transformer
# Engine's grad_output_preprocess ("FP8 case with gather: unfused bgrad, cast, transpose for efficient
# gather", module/base.py at 7d576ed25; TE 2.x distributed.py _all_gather_fp8 quantizes the shard,
# then makes the transpose of the gathered tensor), torchao's Float8ColwiseParallel /
# Float8RowwiseParallel (the cast before the gather; torch._scaled_mm takes its second operand
# column-major, so the weight-gradient GEMM transposes the gathered fp8 input and output gradient,
# torchao/float8/float8_ops.py).


# Delayed scaling's bookkeeping (``fp8_scale_update = "per_module"``): Transformer Engine up to the
# 2023 releases updates every fp8 module's amax history and scale in the module itself, each forward
# (prepare_forward) and each backward (prepare_backward): copy_amax_from_global_buffer writes the
# reduced amax into the history, then the jit-fused _fused_amax_and_scale_update runs torch.max over
# the history, torch.roll and fill_ of it, and the scale and inverse-scale updates
# (transformer_engine/pytorch/fp8.py and module/base.py at 09ba8427, the MLPerf v3.1 TE; module.py
# at release_v0.8 the same): FP8_SCALE_UPDATE_KERNELS small kernels per module per pass, each priced
# as a memory kernel (launch + fill) over the history, 1,024 entries of 3 fp32 amaxes (the recipes'
# amax history 1024). TE's LayerNormMLP keeps one fp8_meta for fc1 and fc2. From TE 1.x the update
# runs once per fp8_autocast for all modules (fused_amax_and_scale_update_after_reduction at
# 7d576ed25, NeMo 24.07's TE): "fused", not priced (a few kernels per autocast).
FP8_SCALE_UPDATE_KERNELS = 5
FP8_SCALE_UPDATE_BYTES = 2.0 * 1024 * 3 * 4.0


def fp8_weight_gemms(forward: list[Op]) -> list[Op]:
    """The GEMMs of a forward pass that Transformer Engine runs in fp8 with a weight (no precision of
    their own: the run's fp8); what its scale updates, weight casts and amax reductions count."""
    return [op for op in forward if op.kind == "gemm" and op.weight and not op.precision]


def fp8_scale_update_ops(setup: TrainingSetup, forward: list[Op], pass_name: str) -> list[Op]:
    """The per-module amax-history and scale update kernels of one pass (see the constants above)."""
    if setup.fp8_scale_update != "per_module" or setup.fp8_recipe == "current":
        return []
    modules = [op.name for op in fp8_weight_gemms(forward)]
    if setup.fp8_cast_fusion == "norm_activation" and {"mlp_up", "mlp_down"} <= set(modules):
        modules.remove("mlp_down")  # LayerNormMLP: one module, one fp8_meta
    return [Op(name=f"{name}_fp8_scale_update_{pass_name}{index}", kind="memory", bytes_moved=FP8_SCALE_UPDATE_BYTES)
            for name in modules for index in range(FP8_SCALE_UPDATE_KERNELS)]


def _before_module_gemms(updates: list[Op], ops: list[Op], suffix: str) -> list[Op]:
    """``ops`` with each module's scale-update kernels (``fp8_scale_update_ops``, named after the
    module's GEMM) placed where the module runs them, at its entry (prepare_forward /
    prepare_backward): just before its GEMM (``suffix`` "_dgrad" in backward), or before its fp8
    cast when it has one. The GPU seconds do not depend on the order; the host's dispatch does."""
    if not updates:
        return ops
    by_module: dict[str, list[Op]] = {}
    for op in updates:
        by_module.setdefault(op.name.split("_fp8_scale_update_")[0], []).append(op)
    out: list[Op] = []
    for op in ops:
        name = op.name.removesuffix("_fp8_cast").removesuffix(suffix) if op.kind in ("gemm", "memory") else ""
        if (op.kind == "gemm" or op.name.endswith("_fp8_cast")) and name in by_module:
            out.extend(by_module.pop(name))
        out.append(op)
    return [op for module in by_module.values() for op in module] + out  # any module not found: at the front


def fp8_passes(
    setup: TrainingSetup, forward: list[Op], b_ops: list[Op], w_ops: list[Op], *, moe: bool
) -> tuple[list[Op], list[Op], list[Op]]:
    """fp8 training (Transformer Engine): each layer GEMM's 16-bit input is cast to fp8 (with the
    transposed copy wgrad needs) and so is its output gradient before dgrad/wgrad. Under delayed
    scaling the cast is fused into the producing norm/activation kernel where the stack fuses it
    (``fp8_cast_fusion``), which then pays the fp8 transpose in backward; otherwise it is a separate
    kernel. Current scaling adds an amax pass to every cast but a fusing producer's, which takes the
    amax itself. An input gathered in fp8 under sequence parallelism is cast on its shard and
    transposed after the gather (see the constants above). Router and attention products stay
    16-bit (``FP8_BF16_GEMMS``); the LM head does too (``end_ops`` builds it with 16-bit weights).
    With ``fp8_backward_accumulation = "split"`` the fp8 dgrad and wgrad GEMMs run with the split
    accumulator (``hardware.cost.gemm_time_s``: the fp8 MAMF rate, without the fast-accumulation
    speedup)."""
    current = setup.fp8_recipe == "current"
    forward_producers, backward_producers = FP8_FUSED_PRODUCERS[setup.fp8_cast_fusion]

    def fusing_producer(producer: str, gradient: bool) -> bool:
        """The producer writes the fp8 copy (delayed scaling) or takes the amax (current scaling)."""
        name = producer.removeprefix("recompute_")
        if gradient and name.endswith("_backward"):
            return name.removesuffix("_backward") in backward_producers
        return name in forward_producers

    def fp8_gather(op: Op) -> bool:
        """``op`` is a sequence-parallel all-gather of a GEMM input moving fp8 (``fp8_all_gather_ops``):
        a forward input gather (or its recompute) or a row-parallel output gradient's backward gather."""
        name = op.name.removeprefix("recompute_")
        if not setup.fp8_all_gather or (moe and name.startswith("mlp_")):
            return False
        if name.endswith("_backward"):
            return name.removesuffix("_backward") in FP8_BACKWARD_ALL_GATHERS
        return name in FP8_ALL_GATHERS

    def stays_16bit(op: Op) -> bool:
        return op.name.split("_")[0] == "router" or op.name.startswith(FP8_BF16_GEMMS)

    def keep_16bit(ops: list[Op]) -> list[Op]:
        return [replace(op, precision="bf16") if op.kind == "gemm" and stays_16bit(op) else op for op in ops]

    def with_casts(ops: list[Op], gradient: bool) -> tuple[list[Op], list[Op]]:
        """``ops`` with their cast kernels, and the fp8 transposes of the GEMM inputs whose transposed
        copy is made from an fp8 tensor (a fusing producer's, or one gathered in fp8) for wgrad."""
        out: list[Op] = []
        transposes: list[Op] = []
        producer = ""
        gathered = False
        for op in ops:
            if op.kind == "gemm" and op.weight and not stays_16bit(op) and not op.name.endswith("_wgrad"):
                # the GEMM's 16-bit input is m x k: X in forward; dY (m x forward n) for a dgrad, whose
                # producer is the op just before it in backward order (collectives skipped)
                elements = op.m * op.k * op.batch
                fused = fusing_producer(producer, gradient)
                amax = 0.0 if fused or not current else FP8_AMAX_BYTES
                writes_fp8 = fused and not current
                if not writes_fp8:  # a cast kernel: on the shard, one layout, before an fp8 gather
                    cast_bytes = ((FP8_CAST_BYTES + amax) * elements / setup.plan.tp if gathered
                                  else (FP8_CAST_TRANSPOSE_BYTES + amax) * elements)
                    out.append(Op(name=f"{op.name}_fp8_cast", kind="memory", bytes_moved=cast_bytes,
                                  backward_bytes_moved=0.0, recompute=op.recompute))
                # a fused producer's output gradient is written with its transpose (TE's
                # fp8_cast_transpose_bgrad_dgelu_fused); recomputed GEMMs reuse the forward's count
                if (gathered or (writes_fp8 and not gradient)) and not op.recompute:
                    transposes.append(Op(name=f"{op.name}_fp8_transpose", kind="memory",
                                         bytes_moved=FP8_TRANSPOSE_BYTES * elements))
            out.append(op)
            if op.kind == "collective":
                gathered = gathered or fp8_gather(op)
            else:
                producer, gathered = op.name, False
        return out, transposes

    def accumulate(ops: list[Op]) -> list[Op]:
        # the dgrad and wgrad GEMMs of the fp8 layers promote their partial sums to fp32 where the
        # stack runs them with the split accumulator; recomputed forward GEMMs keep fast accumulation
        if setup.fp8_backward_accumulation != "split":
            return ops
        return [replace(op, split_accumulator=True)
                if op.kind == "gemm" and not op.precision and op.name.endswith(("_dgrad", "_wgrad")) else op
                for op in ops]

    forward, forward_transposes = with_casts(keep_16bit(forward), gradient=False)
    b_ops, gradient_transposes = with_casts(keep_16bit(b_ops), gradient=True)
    b_ops = accumulate(b_ops)
    # the fp8 transposes, before the weight gradients that use them
    w_ops = forward_transposes + gradient_transposes + w_ops
    b_ops = _before_module_gemms(fp8_scale_update_ops(setup, forward, "b"), b_ops, "_dgrad")
    forward = _before_module_gemms(fp8_scale_update_ops(setup, forward, "f"), forward, "")
    return forward, b_ops, accumulate(keep_16bit(w_ops))


def accumulate_main_grads(setup: TrainingSetup, w_ops: list[Op]) -> list[Op]:
    """W ops with the stack's main-grad accumulation. "unfused" (Megatron-LM 2021's grad hook,
    ``main_grad.add_(grad)``): after each weight-gradient GEMM an add kernel reads the 16-bit gradient
    the GEMM wrote and reads and writes the main-grad element (``grad_reduce_dtype``), every
    micro-batch. "fused" (Megatron-Core gradient_accumulation_fusion / TE fuse_wgrad_accumulation):
    the GEMM epilogue reads and writes the fp32 C instead, hidden under the compute-bound main loop
    of a weight-gradient GEMM, so no separate kernel. "none": autograd writes ``.grad`` directly.
    "flat_param" (torch FSDP's FlatParameter, FSDP1): the weights are views that ``torch.split`` cut
    from the unit's flat parameter (flat_param.py ``_get_unflat_views``), so split's backward copies
    each weight gradient the GEMM wrote into the unit's flat gradient, every micro-batch: one read and
    one write of the gradient in the GEMM's output dtype."""
    if setup.main_grad_accumulation not in ("unfused", "flat_param"):
        return w_ops
    out: list[Op] = []
    flat = setup.main_grad_accumulation == "flat_param"
    per_element = 0.0 if flat else 2.0 * setup.grad_reduce_bytes
    for op in w_ops:
        out.append(op)
        if op.kind == "gemm":
            elements = op.m * op.n * op.batch
            grad_bytes = bytes_per_element("bf16" if setup.job.precision == "fp8" else setup.job.precision)
            written = 2.0 * grad_bytes if flat else op.bytes_per_element
            out.append(Op(name=f"{op.name}_{'flat_grad_copy' if flat else 'accumulate'}", kind="memory",
                          bytes_moved=elements * (written + per_element)))
    return out


# fp8 weight casts (Transformer Engine modules holding 16-bit weights, ``fp8_params = false``): a
# Linear casts its weight to fp8 and writes the transposed fp8 copy its dgrad GEMM reads
# (fp8_cast_transpose_fused: read 2, write 1 + 1 bytes per element) in the first micro-batch of a
# step only, and reuses both cached copies in the others: Megatron-Core's schedules call
# set_is_first_microbatch on the first micro-batch of each model chunk and TELinear passes
# is_first_microbatch to TE, which recasts only then (megatron/core/pipeline_parallel/schedules.py,
# megatron/core/transformer/custom_layers/transformer_engine.py at 338af514, NeMo 24.07's MCORE_TAG);
# NeMo 1.x's legacy ParallelTransformer counts micro-batches to the same end (microbatch_count in
# nemo/collections/nlp/modules/common/megatron/transformer.py at v1.20.0). Fp8 primary weights are
# written in fp8 by the optimizer step instead (not priced here).
FP8_WEIGHT_CAST_BYTES = 2.0 + 1.0 + 1.0


def fp8_weight_cast_s(setup: TrainingSetup, signature: tuple[tuple, ...], links: Mapping[str, GroupLinks]) -> float:
    """Seconds per step one rank of the stage whose chunks are ``signature``
    (``sim.training.data_parallel.stage_signatures``) spends casting its fp8 layers' GEMM weights
    (see ``FP8_WEIGHT_CAST_BYTES``): zero unless fp8 with 16-bit weights."""
    if setup.job.precision != "fp8" or setup.job.fp8_params:
        return 0.0
    per_layer: dict[bool, float] = {}  # weight elements per rank of a dense / MoE fp8 layer
    elements = 0.0
    for dense, count, _first, _last, _recomputed, bf16 in signature:
        for index in range(count):
            if index in bf16:
                continue
            moe = setup.model.is_moe and index >= dense
            if moe not in per_layer:
                per_layer[moe] = float(sum(op.k * op.n * op.batch for op in fp8_weight_gemms(layer_passes(setup, moe)[0])))
            elements += per_layer[moe]
    if elements <= 0.0:
        return 0.0
    cast = Op(name="fp8_weight_cast", kind="memory", bytes_moved=elements * FP8_WEIGHT_CAST_BYTES)
    return costmodel.op_time_s(cast, setup.cluster.gpu, precision=setup.job.precision, links=links)


@dataclass(frozen=True, slots=True, kw_only=True)
class PassCost:
    """Seconds of one pass: compute, communication per axis, and the part that stays exposed."""

    compute_s: float
    exposed_comm_s: dict[str, float]
    flops: float
    recompute_flops: float
    # host dispatch (``host_forward_op_us`` / ``host_backward_op_us``): the host's seconds to issue the
    # pass's ops, and the seconds the GPU waits for it when the pass starts with the host and the
    # GPU together (``work.host_bound_pass_s`` minus the GPU seconds); zero without host dispatch
    host_s: float = 0.0
    host_stall_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.compute_s + sum(self.exposed_comm_s.values())


# Transformer Engine's default userbuffer overlap methods (initialize_ub in
# transformer_engine/pytorch/module/base.py, as Megatron-Core --tp-comm-overlap configures them):
# the all-gathers of the QKV / fc1 inputs (forward) and of the proj / fc2 output gradients (backward)
# use "ring_exchange" (tp chunks of the tokens, each chunk's GEMM runs while the next chunk arrives);
# the reduce-scatters of the proj / fc2 outputs use "pipeline" (the GEMM in TP_PIPELINE_SPLITS chunks,
# each chunk's reduce-scatter behind the next chunk's GEMM); the reduce-scatters of the QKV / fc1
# input gradients use "bulk" (the whole collective beside the weight-gradient GEMM, unsplit).
# The same defaults place the traffic: "ring_exchange" moves its chunks with the copy engines
# (use_ce = True, num_sm = 1), so its GEMM keeps every SM; "pipeline" and "bulk" run their
# communication kernels on num_sm = 16 SMs with set_sm_margin = True, so the GEMM they overlap is
# launched on the SMs left (sm_count - 16) for its whole length, not only while traffic flows. The
# model prices that GEMM ``overlap_slowdown`` times slower (COMMUNICATION_SMS = 16 = TE's num_sm).
TP_PIPELINE_SPLITS = 4
# sequence parallel: backward all-gathers a TP GEMM's sharded input again for its weight gradient
# (workloads.graph.backward_ops), launched before the input-gradient GEMM and overlapping it: async
# NCCL in Megatron-LM (LinearWithGradAccumulationAndAsyncCommunication.backward) and in Transformer
# Engine without userbuffers, TE's "bulk" qkv_dgrad / fc1_dgrad overlap with them
REGATHER_SUFFIX = "_regather"
TP_OVERLAPPED_COLLECTIVES = ("attention_", "mlp_")  # the layer's TP collectives (not the embedding / LM head)


def _chunked_gemm_s(op: Op, splits: int, gpu, precision: str, links: Mapping[str, GroupLinks]) -> float:  # type: ignore[no-untyped-def]
    """``op`` run as ``splits`` GEMMs of m / splits rows each (Transformer Engine's overlap chunks)."""
    if splits <= 1 or op.m < splits:
        return costmodel.op_time_s(op, gpu, precision=precision, links=links)
    chunk = replace(op, m=op.m // splits)
    return splits * costmodel.op_time_s(chunk, gpu, precision=precision, links=links)


def _paired_tp_overlap(
    setup: TrainingSetup, ops: list[Op], links: Mapping[str, GroupLinks], collective_time
) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """Transformer Engine's comm-GEMM overlap, GEMM by GEMM (the methods above; the loops of
    CommOverlapP2PBase::split_overlap_ag and CommOverlapBase::split_overlap_rs in
    transformer_engine/common/comm_gemm_overlap/comm_gemm_overlap.cpp): an all-gather hides behind
    the GEMM that consumes it, the first tp-1 of its tp chunk GEMMs covering the tp-1 transfers (the
    local chunk's GEMM starts at once); a pipelined reduce-scatter hides behind the GEMM that
    produces it, chunk i's reduce-scatter beside chunk i+1's GEMM, the last chunk's exposed; a bulk
    overlap hides the collective unsplit beside the whole GEMM. Each GEMM's time hides at most its
    own collectives. Collectives without such a
    GEMM (all-reduces, the embedding's and LM head's) stay exposed. The paired GEMM itself runs as
    the overlap runs it: a ring exchange's as tp GEMMs of m/tp rows, a pipeline's as
    TP_PIPELINE_SPLITS GEMMs of m/splits rows on the SMs the communication kernel leaves, a bulk
    overlap's whole on those SMs. ``tp_overlap_method = "symmetric_memory"`` (PyTorch's async TP,
    torch.ops.symm_mem): all-gathers as the ring exchange; every reduce-scatter, forward and backward,
    behind the GEMM that produces it in tp chunks of m/tp rows with copy-engine transfers (the local
    chunk last, so all tp-1 transfers can hide), then a reduction kernel of its own over the tp
    partials; the sequence-parallel re-gathers are async all-gathers (``_async_regathers_hidden_s``).
    Returns (TP seconds hidden, extra GEMM and reduction seconds)."""
    tp = setup.plan.tp
    gpu, precision = setup.cluster.gpu, setup.job.precision
    symmetric = setup.tp_overlap_method == "symmetric_memory"
    hidden = extra = 0.0
    gemm_left: dict[int | tuple[str, int], float] = {}  # GEMM -> its time not yet used to hide traffic
    for index, op in enumerate(ops):
        if op.kind != "collective" or op.axis != "tp" or op.collective not in ("all_gather", "reduce_scatter"):
            continue
        if not op.name.removeprefix("recompute_").startswith(TP_OVERLAPPED_COLLECTIVES):
            continue
        backward = op.name.endswith("_backward")
        if op.name.endswith(REGATHER_SUFFIX):
            if symmetric:
                continue  # an async all-gather beside the input-gradient GEMM (_async_regathers_hidden_s)
            step, splits, sm_margin = 1, 1, True  # bulk beside the input-gradient GEMM
        elif op.collective == "all_gather":
            step, splits, sm_margin = 1, tp, False  # ring exchange on the copy engines
        elif symmetric:
            step, splits, sm_margin = -1, tp, False  # the producing GEMM in tp chunks, copy-engine transfers
        else:
            step, splits, sm_margin = -1, (1 if backward else TP_PIPELINE_SPLITS), True  # bulk / pipeline
        j = index + step
        while 0 <= j < len(ops) and ops[j].kind != "gemm":
            if ops[j].kind == "collective" and ops[j].axis == "tp":
                j = -1  # another TP collective in between: nothing to pair
                break
            j += step
        if not 0 <= j < len(ops):
            continue
        gemm = ops[j]
        key: int | tuple[str, int] = j
        if symmetric and backward and op.collective == "reduce_scatter" and len(
                torch_matmuls(replace(gemm, name=gemm.name.removesuffix("_dgrad")), setup.model, tp)) > 1:
            # the input gradient of separate linears on one input (wq, wk, wv; w1, w3) is a sum of their
            # matmuls, which Inductor's micro_pipeline_tp pass does not match (it fuses a reduce-scatter
            # whose input is one matmul): an NCCL reduce-scatter, exposed
            continue
        if symmetric and op.collective == "reduce_scatter":
            # fused_matmul_reduce_scatter sums the tp stacked partials of the GEMM's output in a kernel of
            # its own after the last chunk: it reads the m x n output once and writes its 1/tp shard
            reduction = Op(name=f"{op.name}_reduction", kind="memory",
                           bytes_moved=gemm.bytes_per_element * gemm.m * gemm.n * gemm.batch * (1.0 + 1.0 / tp))
            extra += costmodel.op_time_s(reduction, gpu, precision=precision, links=links)
        elif backward and op.collective == "reduce_scatter" and gemm.name.endswith("_dgrad"):
            # TE's qkv_wgrad / fc1_wgrad bulk overlap: the input gradient's reduce-scatter runs beside
            # the weight-gradient GEMM of the same linear (dW = X^T dY: m, n, k = dgrad's n, k, m),
            # while the re-gather of its input (REGATHER_SUFFIX) runs beside the dgrad GEMM
            gemm, key = replace(gemm, name=gemm.name.removesuffix("_dgrad") + "_wgrad", m=gemm.n, n=gemm.k, k=gemm.m), ("w", j)
        if key not in gemm_left:
            whole = costmodel.op_time_s(gemm, gpu, precision=precision, links=links)
            overlapped = _chunked_gemm_s(gemm, splits, gpu, precision, links)
            if sm_margin:
                overlapped *= setup.overlap_slowdown
            gemm_left[key] = overlapped
            extra += overlapped - whole
        seconds = costmodel.op_time_s(op, gpu, precision=precision, links=links, collective_time=collective_time)
        if (op.collective == "all_gather" or symmetric) and splits > 1:
            # split_overlap_ag: chunk i's GEMM (the local chunk first) runs while chunk i+1 arrives, so
            # the tp-1 transfers hide behind the first tp-1 chunk GEMMs; symmetric memory's matmul-reduce-
            # scatter sends chunk i's partial while chunk i+1's GEMM runs, the local chunk's GEMM last
            covered = min(seconds, gemm_left[key] * (splits - 1) / splits)
        elif splits > 1:
            # split_overlap_rs: chunk i's reduce-scatter runs beside chunk i+1's GEMM; the last is exposed
            covered = min(seconds * (splits - 1) / splits, gemm_left[key] * (splits - 1) / splits)
        else:
            covered = min(seconds, gemm_left[key])  # bulk: beside the whole GEMM
        gemm_left[key] -= covered
        hidden += covered
    return hidden, extra


def _async_regathers_hidden_s(
    setup: TrainingSetup, ops: list[Op], links: Mapping[str, GroupLinks], collective_time, *, paired: bool
) -> float:  # type: ignore[no-untyped-def]
    """Seconds of the sequence-parallel re-gathers (``REGATHER_SUFFIX``) that the userbuffer overlap
    does not take (all of them without it, the LM head's with it) hidden behind the input-gradient
    GEMM after each, as an async NCCL all-gather runs; the excess stays exposed."""
    gpu, precision = setup.cluster.gpu, setup.job.precision
    hidden = 0.0
    for index, op in enumerate(ops):
        if op.kind != "collective" or not op.name.endswith(REGATHER_SUFFIX):
            continue
        if paired and op.name.removeprefix("recompute_").startswith(TP_OVERLAPPED_COLLECTIVES):
            continue  # a userbuffer bulk overlap (_paired_tp_overlap)
        j = index + 1
        while j < len(ops) and ops[j].kind != "gemm":
            j += 1
        if j == len(ops):
            continue
        seconds = costmodel.op_time_s(op, gpu, precision=precision, links=links, collective_time=collective_time)
        hidden += min(seconds, costmodel.op_time_s(ops[j], gpu, precision=precision, links=links))
    return hidden


def _reported_axis(op: Op) -> str:
    """The parallel axis a collective's time is reported and overlapped under: Ulysses heads and
    ring exchanges both as context parallel."""
    return "cp" if op.axis in ("cp_heads", "cp_ring") else op.axis


def price_pass(
    setup: TrainingSetup, ops: list[Op], links: Mapping[str, GroupLinks], cache: PricingCache | None = None,
    host_op_s: float = 0.0, host_recompute_op_s: float = 0.0,
) -> PassCost:
    """Compute plus the communication left on the critical path.

    TP collectives block the compute stream unless ``tp_comm_overlap`` (then each all-gather /
    reduce-scatter hides, but for 1/tp, behind its paired GEMM, see ``_paired_tp_overlap``; overlapped
    compute runs slower by ``overlap_slowdown``); the context-parallel
    K/V ring overlaps the attention kernel (the all-gather variant blocks); expert all-to-alls block.
    """
    gpu, precision = setup.cluster.gpu, setup.job.precision
    collective_time = cache.collective_s if cache is not None else collective_time_s
    compute = gemm = attention = flops = recompute_flops = cp_ring = 0.0
    comm: dict[str, float] = {}
    host = host_op_s > 0.0 or host_recompute_op_s > 0.0
    op_seconds: list[float] = []
    for op in ops:
        seconds = costmodel.op_time_s(op, gpu, precision=precision, links=links, collective_time=collective_time)
        if host:
            op_seconds.append(seconds)
        if op.kind == "collective":
            axis = _reported_axis(op)
            comm[axis] = comm.get(axis, 0.0) + seconds
            if axis == "cp" and op.collective == "send_recv":
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
    # the ring's K/V passes are send/recv kernels, which hold fewer SMs than collectives
    ring_slowdown = p2p_overlap_slowdown(setup.overlap_slowdown, gpu.sm_count) - 1.0 if cp_ring else slowdown
    exposed: dict[str, float] = {}
    tp_paired = setup.plan.tp_comm_overlap and setup.plan.tp > 1 and "tp" in comm
    hidden_tp, overlapped_gemm_s = _paired_tp_overlap(setup, ops, links, collective_time) if tp_paired else (0.0, 0.0)
    compute += overlapped_gemm_s  # the paired GEMMs' chunks and SM margins (their slowdown while hiding TP)
    regathered = _async_regathers_hidden_s(setup, ops, links, collective_time,
                                           paired=tp_paired and setup.tp_overlap_method == "userbuffers")
    compute += regathered * slowdown  # NCCL's SMs while the async gathers run beside their GEMM
    for axis, seconds in comm.items():
        if axis == "tp" and tp_paired:
            hidden = hidden_tp + regathered
        elif axis == "tp":
            hidden = regathered
        elif axis == "cp":
            hidden = min(cp_ring, attention)  # ring passes overlap attention; an all-gather blocks
        else:
            hidden = 0.0
        if axis != "tp":
            compute += hidden * (ring_slowdown if axis == "cp" else slowdown)
        exposed[axis] = seconds - hidden
    if not host:
        return PassCost(compute_s=compute, exposed_comm_s=exposed, flops=flops, recompute_flops=recompute_flops)
    host_s, stall_s = _host_dispatch(ops, op_seconds, comm, exposed, host_op_s, host_recompute_op_s)
    return PassCost(compute_s=compute, exposed_comm_s=exposed, flops=flops, recompute_flops=recompute_flops,
                    host_s=host_s, host_stall_s=stall_s)


def _host_dispatch(
    ops: list[Op], op_seconds: list[float], comm: Mapping[str, float], exposed: Mapping[str, float],
    host_op_s: float, host_recompute_op_s: float,
) -> tuple[float, float]:
    """(host seconds, GPU wait) of one pass whose ops the host issues in order, each after
    ``host_op_s`` of dispatch (``host_recompute_op_s`` for a recomputed forward op, which re-runs
    forward module code): ``work.host_bound_pass_s`` over the ops' stream seconds, a collective
    counting the exposed share of its axis (the part that holds the compute stream)."""
    gpu_s = []
    for op, seconds in zip(ops, op_seconds):
        if op.kind == "collective":
            axis = _reported_axis(op)
            total = comm.get(axis, 0.0)
            seconds = seconds * exposed.get(axis, 0.0) / total if total > 0.0 else 0.0
        gpu_s.append(seconds)
    issue = [(host_recompute_op_s if op.recompute else host_op_s) * (op.kernels if op.kind == "memory" else 1) for op in ops]
    span = host_bound_pass_s(gpu_s, issue)
    return sum(issue), max(0.0, span - sum(gpu_s))


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
    forward_s, backward_s = setup.host_forward_op_s, setup.host_backward_op_s
    cost = LayerCost(
        forward=price_pass(setup, f_ops, links, cache, forward_s, forward_s),
        backward_input=price_pass(setup, b_ops, links, cache, backward_s, forward_s),
        backward_weight=price_pass(setup, w_ops, links, cache, backward_s, forward_s),
        recompute_s=price_pass(setup, recompute, links, cache).total_s if recompute else 0.0,
    )
    return ep_overlapped_layer(setup, cost) if setup.plan.ep_comm_overlap else cost


def ep_overlap_unpaired_share(setup: TrainingSetup) -> float:
    """Share of a stage's forwards (and of its backwards) that Megatron-Core's combined 1F1B
    (``parallel.ep_comm_overlap``) runs alone, with no pass of another micro-batch beside it: the
    warm-up forwards and cool-down backwards. Without a pipeline, the first forward and the last
    backward of m micro-batches; interleaved, each stage's (pp - rank - 1) x 2 + (v - 1) x pp warm-up
    forwards plus the one extra the combined schedule adds (megatron/core/pipeline_parallel/
    schedules.py get_pp_rank_microbatches), pp x v on average over the stages, of its m x v: pp / m."""
    return min(1.0, setup.plan.pp / setup.num_microbatches)


def ep_overlapped_layer(setup: TrainingSetup, cost: LayerCost) -> LayerCost:
    """``cost`` with its expert-parallel all-to-alls hidden as Megatron-Core's combined 1F1B runs
    them (``parallel.ep_comm_overlap``, --overlap-moe-expert-parallel-comm; combined_1f1b.py): a
    layer's forward for one micro-batch runs beside the same layer's backward for another, their
    communication on a stream of its own, so the forward's dispatch and combine hide behind the
    backward's compute (input and weight gradients) and the backward's behind the forward's compute.
    The compute they overlap runs ``overlap_slowdown`` slower meanwhile (the communication kernels'
    SMs). The warm-up forwards and cool-down backwards run alone (``ep_overlap_unpaired_share``)
    and keep their all-to-alls exposed; each pass carries the mean over its micro-batches."""
    forward, backward, weight = cost.forward, cost.backward_input, cost.backward_weight
    alone = ep_overlap_unpaired_share(setup)
    cost_of_hiding = setup.overlap_slowdown - 1.0

    def overlapped(pass_cost: PassCost, partner_compute_s: float) -> PassCost:
        exposed = pass_cost.exposed_comm_s.get("ep", 0.0)
        hidden = (1.0 - alone) * min(exposed, partner_compute_s)
        if hidden <= 0.0:
            return pass_cost
        return replace(pass_cost, exposed_comm_s={**pass_cost.exposed_comm_s, "ep": exposed - hidden + hidden * cost_of_hiding})

    return replace(cost, forward=overlapped(forward, backward.compute_s + weight.compute_s),
                   backward_input=overlapped(backward, forward.compute_s))


def end_ops(setup: TrainingSetup, *, first: bool, last: bool) -> list[tuple[list[Op], list[Op], list[Op]]]:
    """F, B, W ops of the embedding (first chunk) and LM head + loss (last chunk); with
    ``vocab_parallel`` every stage runs a 1/pp vocabulary shard of both (``chunk_ends``)."""
    model, job, plan = setup.model, setup.job, setup.plan
    tokens = job.micro_batch * job.seq_len // plan.cp
    act = bytes_per_element("bf16" if job.precision == "fp8" else job.precision)
    sharding = _sharding(setup)
    split = plan.pp if plan.vocab_parallel else 1
    ends = []
    if first:
        ends.append(embedding_ops(model, tokens=tokens, sharding=sharding, bytes_per_element=act, vocab_split=split))
    if last:
        ends.append(lm_head_ops(model, tokens=tokens, sharding=sharding, bytes_per_element=act, vocab_split=split,
                                cross_entropy=setup.cross_entropy))
    out = []
    for forward in ends:
        if job.precision == "fp8":
            # Megatron's output layer is not a Transformer Engine fp8 module: the LM head runs 16-bit
            forward = [replace(op, precision="bf16") if op.kind == "gemm" else op for op in forward]
        b_ops, w_ops = backward_ops(forward, regather=setup.tp_gathered_input == "regather")
        out.append((forward, b_ops, accumulate_main_grads(setup, w_ops)))
    return out


def activation_offload_stall_s(setup: TrainingSetup, offloaded_bytes: float, chunk_s: float) -> float:
    """Stall per micro-batch of a chunk that offloads ``offloaded_bytes`` of its activations to host
    memory after F and reloads them before B (PipeOffload, Wan et al. 2025, arXiv 2503.01328): the
    copies run on the copy engines during the stage's other work, one each way per micro-batch and
    ``chunk_s`` of compute per micro-batch to hide them, over the GPU's share of its PCIe switch's
    uplink (every pipeline stage offloads at once: the node's ``gpus_per_pcie_switch`` GPUs share it);
    whatever does not fit stalls the backward."""
    node = setup.cluster.node
    share = min(node.gpus_per_pcie_switch, node.gpus_per_node)
    seconds = max(offloaded_bytes / (node.host_to_device_Bps / share), offloaded_bytes / (node.device_to_host_Bps / share))
    return max(0.0, seconds - chunk_s)


def blocking_p2p_s(
    setup: TrainingSetup, links: Mapping[str, GroupLinks], send_bytes: float, *, first: bool, last: bool,
    cache: PricingCache | None = None,
) -> tuple[float, float]:
    """Seconds a chunk's F and B (per micro-batch) spend in blocking pipeline p2p
    (``pipeline_p2p = "blocking"``, Megatron-LM 2021-22 ``p2p_communication._communicate``): the
    stage issues its sends and receives with ``batch_isend_irecv``, waits on them and calls
    ``torch.cuda.synchronize()``, so the transfer of the chunk's output (F) and of its input gradient
    (B) holds the stage's compute stream instead of overlapping its next op; with the scatter/gather
    optimisation (tp > 1 without sequence parallelism) the receiver then rebuilds the whole tensor
    from the tp slices with an all-gather over the TP group (``gather_split_1d_tensor``) before the
    op that consumes it. The model-order first chunk receives no activations and sends no input
    gradient; the last sends no activations and receives no gradient. The hop is priced over the
    pipeline group's links (its slowest link when the group spans nodes). Zero when p2p overlaps."""
    if setup.pipeline_p2p != "blocking" or links["pp"].size <= 1 or send_bytes <= 0:
        return 0.0, 0.0
    collective = cache.collective_s if cache is not None else collective_time_s
    plan = setup.plan
    transfer = collective(Collective.SEND_RECV, send_bytes, links["pp"])
    gather = 0.0
    if plan.tp > 1 and not plan.sequence_parallel:
        gather = collective(Collective.ALL_GATHER, send_bytes * plan.tp, links["tp"])
    forward = (0.0 if last else transfer) + (0.0 if first else gather)
    backward = (0.0 if first else transfer) + (0.0 if last else gather)
    return forward, backward


def blocking_p2p_axes(setup: TrainingSetup) -> tuple[str, ...]:
    """The process-group axes whose links ``blocking_p2p_s`` reads for ``setup``'s chunks."""
    return ("pp", "tp") if setup.pipeline_p2p == "blocking" else ()


# Delayed scaling's amax reduction in Transformer Engine 1.x (``fp8_scale_update = "fused"``): at the
# exit of each fp8_autocast (Megatron-Core enters one per TransformerBlock forward, i.e. per model chunk
# and micro-batch) FP8GlobalStateManager.reduce_and_update_fp8_tensors all-reduces (MAX) the
# concatenated amaxes of the chunk's fp8 modules over the autocast's fp8_group with async_op=False, and
# once more in backward, in the backward of the first module (reduce_and_update_bwd_fp8_tensors)
# (transformer_engine/pytorch/fp8.py reduce_tensor_across_group_op_max, module/linear.py at 7d576ed25,
# NeMo 24.07's TE_TAG). Megatron-Core's fp8_group is every rank of the pipeline stage, tp x dp x cp
# (parallel_state.get_amax_reduction_group(with_context_parallel=True), transformer_block.py at
# 338af514). The compute stream waits for each all-reduce, so its latency is exposed: priced as an
# all-reduce of the amaxes (fp32; per fp8 GEMM 3 forward tensors, input / weight / output, and 2
# backward, grad output / grad input: TE's fp8_meta scaling_fwd / scaling_bwd) over the stage's data-
# parallel group, whose nodes the stage's tp ranks share (the tp group when dp x cp = 1). The 2023 TE
# of ``fp8_scale_update = "per_module"`` (MLPerf v3.0 / v3.1) reduced asynchronously inside the TP
# group only (their config_common.sh NVTE_DP_AMAX_REDUCE_INTERVAL=0, NVTE_ASYNC_AMAX_REDUCTION=1): not
# priced. Current scaling keeps no amax history: not priced.
FP8_AMAX_TENSORS_PER_GEMM = (3, 2)  # (forward, backward) amaxes per fp8 GEMM


def fp8_amax_reduction_axes(setup: TrainingSetup) -> tuple[str, ...]:
    """The process-group axes whose links ``fp8_amax_reduction_s`` reads for ``setup``'s chunks."""
    applies = (setup.job.precision == "fp8" and setup.fp8_recipe == "delayed" and setup.fp8_scale_update == "fused")
    return ("dp", "tp") if applies else ()


def fp8_amax_reduction_s(
    setup: TrainingSetup, links: Mapping[str, GroupLinks], fp8_gemms: int, cache: PricingCache | None = None
) -> tuple[float, float]:
    """Seconds per micro-batch a chunk of ``fp8_gemms`` fp8 GEMMs waits in its forward and its
    backward for the blocking amax all-reduces (see ``FP8_AMAX_TENSORS_PER_GEMM``); zero where the
    stack has none or the stage is one rank."""
    if not fp8_amax_reduction_axes(setup) or fp8_gemms <= 0:
        return 0.0, 0.0
    group = links["dp"] if links["dp"].size > 1 else links["tp"]
    if group.size <= 1:
        return 0.0, 0.0
    collective = cache.collective_s if cache is not None else collective_time_s
    forward, backward = (collective(Collective.ALL_REDUCE, 4.0 * tensors * fp8_gemms, group)
                         for tensors in FP8_AMAX_TENSORS_PER_GEMM)
    return forward, backward


def chunk_link_axes(setup: TrainingSetup) -> tuple[str, ...]:
    """Axes whose links ``chunk_cost`` reads besides its layers' collectives."""
    return tuple(dict.fromkeys(blocking_p2p_axes(setup) + fp8_amax_reduction_axes(setup)))


def fp8_gemms_per_layer(setup: TrainingSetup, moe: bool) -> int:
    """fp8 GEMMs with a weight in one transformer layer (``layer_passes``' forward; grouped expert
    GEMMs count once per local expert)."""
    return sum(op.batch for op in fp8_weight_gemms(layer_passes(setup, moe)[0]))


# what a chunk's layer is priced as: (MoE, fully recomputed, kept in bf16) for a transformer layer,
# "embedding" / "lm_head" for the pipeline ends
LayerKind = "tuple[bool, bool, bool] | str"


def chunk_layer_kinds(setup: TrainingSetup, *, layers: range, first: bool, last: bool, recomputed: int = 0) -> list[LayerKind]:
    """The kinds ``chunk_cost`` prices for a chunk, in its order: each layer, then the ends it holds."""
    model = setup.model
    kinds: list[LayerKind] = [
        (model.is_moe and layer >= model.dense_layers, index < recomputed, setup.bf16_layer(layer))
        for index, layer in enumerate(layers)
    ]
    if first:
        kinds.append("embedding")
    if last:
        kinds.append("lm_head")
    return kinds


def layer_kind_ops(setup: TrainingSetup, kind: LayerKind) -> tuple[list[Op], list[Op], list[Op]]:
    """(F, B, W) ops of one ``chunk_layer_kinds`` entry."""
    if isinstance(kind, str):
        (ops,) = end_ops(setup, first=kind == "embedding", last=kind == "lm_head")
        return ops
    return layer_passes(setup, *kind)


def collective_axes(ops: tuple[list[Op], ...]) -> frozenset[str]:
    """The process-group axes whose links ``price_layer`` reads for ``ops`` (``costmodel.op_time_s``
    reads a group's links only for a collective on its axis): its price is a function of those links."""
    return frozenset(op.axis for passes in ops for op in passes if op.kind == "collective")


def host_dispatch_stalls(costs: list[LayerCost], layers: int, *, first: bool) -> tuple[float, float, float]:
    """Seconds per micro-batch the GPU waits for the host in a chunk's F, B and W (``costs``: the
    chunk's layers in model order, then its embedding when ``first``, then its LM head): each pass
    chains its layers' (GPU, host, span) triples in the order it runs them (``work.chain_host_bound``:
    forward from the embedding to the LM head, backward the other way), starting with the host and
    the GPU together; the wait is the chained span minus the GPU seconds. Over L identical layers
    that is the first layer's own wait plus (L - 1) x max(0, host - GPU seconds of a layer)."""
    ends = costs[layers:]
    order = ([ends[0]] if first and ends else []) + costs[:layers] + (ends[1:] if first else ends)
    stalls = []
    for name in ("forward", "backward_input", "backward_weight"):
        chained = None
        for cost in (order if name == "forward" else reversed(order)):
            p = getattr(cost, name)
            gpu = p.total_s
            triple = (gpu, p.host_s, gpu + p.host_stall_s)
            chained = triple if chained is None else chain_host_bound(chained, triple)
        stalls.append(0.0 if chained is None else max(0.0, chained[2] - chained[0]))
    return stalls[0], stalls[1], stalls[2]


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
    layer_cache: dict[tuple[bool, bool, bool] | str, LayerCost],
    cache: PricingCache | None = None,
    recomputed: int = 0,
    layer_costs: list[LayerCost] | None = None,
) -> ChunkCost:
    """F, B and W of one micro-batch through a chunk holding ``layers`` (global layer indices), the
    first ``recomputed`` of them fully recomputed (``parallel.recompute_layers``). ``layer_costs``:
    the caller's prices of ``chunk_layer_kinds`` in order (else priced here through ``layer_cache``)."""
    model, job, plan = setup.model, setup.job, setup.plan
    if layer_costs is None:
        layer_costs = []
        for kind in chunk_layer_kinds(setup, layers=layers, first=first, last=last, recomputed=recomputed):
            if kind not in layer_cache:  # each kind priced once per layer cache
                layer_cache[kind] = price_layer(setup, layer_kind_ops(setup, kind), links, cache)
            layer_costs.append(layer_cache[kind])
    costs = list(layer_costs)
    # a chunk repeats a few layer kinds: each distinct LayerCost's passes and their totals
    # (``PassCost.total_s``) read once; every sum below still adds layer by layer, in layer order
    passes_of: dict[int, tuple[tuple[PassCost, PassCost, PassCost], tuple[float, float, float]]] = {}
    for cost in costs:
        if id(cost) not in passes_of:
            three = (cost.forward, cost.backward_input, cost.backward_weight)
            passes_of[id(cost)] = (three, (three[0].total_s, three[1].total_s, three[2].total_s))
    exposed: dict[str, float] = {}
    flops = recompute_flops = 0.0
    for cost in costs:
        for pass_cost in passes_of[id(cost)][0]:
            for axis, seconds in pass_cost.exposed_comm_s.items():  # _add, inline
                exposed[axis] = exposed.get(axis, 0.0) + seconds
            flops += pass_cost.flops
            recompute_flops += pass_cost.recompute_flops
    # Vocabulary parallelism's pipeline-group collectives run on their own stream beside the chunk's
    # transformer layers (Yeung et al. 2024, arXiv 2411.05288, Sec. 4: the output-layer all-reduces
    # are overlapped with the layers' computation): per pass, they hide behind the layers' compute,
    # which runs slower by ``overlap_slowdown`` meanwhile; the rest stays exposed
    hidden_pp = [0.0, 0.0, 0.0]
    if plan.vocab_parallel and (first or last):
        slowdown = setup.overlap_slowdown - 1.0
        layer_costs = costs[: len(layers)]
        for k, name in enumerate(("forward", "backward_input", "backward_weight")):
            comm = sum(getattr(c, name).exposed_comm_s.get("pp", 0.0) for c in costs[len(layers):])
            room = sum(getattr(c, name).compute_s for c in layer_costs)
            hidden = min(comm, room)
            hidden_pp[k] = hidden - hidden * slowdown
            exposed["pp"] = exposed.get("pp", 0.0) - hidden
    tokens = job.micro_batch * job.seq_len // plan.cp
    send = tokens * model.hidden * bytes_per_element("bf16" if job.precision == "fp8" else job.precision)
    if plan.tp > 1:
        # Megatron's scatter/gather optimisation (Narayanan et al. 2021 Sec. 4.1): each TP rank sends
        # its 1/tp slice between stages and the receiver all-gathers it over NVLink
        send /= plan.tp
    f_p2p, b_p2p = blocking_p2p_s(setup, links, send, first=first, last=last, cache=cache)
    if f_p2p or b_p2p:
        exposed["pp"] = exposed.get("pp", 0.0) + f_p2p + b_p2p
    f_amax = b_amax = 0.0
    if fp8_amax_reduction_axes(setup):
        gemms = {moe: fp8_gemms_per_layer(setup, moe) for moe in {model.is_moe and layer >= model.dense_layers for layer in layers}}
        fp8_gemms = sum(gemms[model.is_moe and layer >= model.dense_layers] for layer in layers if not setup.bf16_layer(layer))
        f_amax, b_amax = fp8_amax_reduction_s(setup, links, fp8_gemms, cache)
        if f_amax or b_amax:
            exposed["dp"] = exposed.get("dp", 0.0) + f_amax + b_amax
    parts = layer_activation_parts(
        model, plan, job, moe=model.is_moe, flash_attention=setup.fused_attention, dropout=True
    )
    per_layer_activation = stored_activation_bytes(parts, plan.recompute)
    activation_bytes = (len(layers) - recomputed) * per_layer_activation + recomputed * parts.input_bytes
    totals = [passes_of[id(c)][1] for c in costs]
    passes = [sum(t[0] for t in totals) - hidden_pp[0] + f_p2p + f_amax,
              sum(t[1] for t in totals) - hidden_pp[1] + b_p2p + b_amax,
              sum(t[2] for t in totals) - hidden_pp[2]]
    if setup.host_forward_op_s > 0.0 or setup.host_backward_op_s > 0.0:
        for k, stall in enumerate(host_dispatch_stalls(costs, len(layers), first=first)):
            passes[k] += stall
    if plan.activation_offload:
        passes[1] += activation_offload_stall_s(setup, plan.activation_offload * activation_bytes, sum(passes))
    work = ChunkWork(
        forward_s=passes[0],
        backward_input_s=passes[1],
        backward_weight_s=passes[2],
        exposed_comm_s=exposed,
        recompute_s=sum(c.recompute_s for c in costs),
        activation_bytes=activation_bytes,
        send_bytes=send,
        layers=len(layers),
    )
    return ChunkCost(work=work, flops=flops, recompute_flops=recompute_flops)
