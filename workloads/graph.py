"""Op graphs of one transformer layer (and the embedding / LM-head ends) under a sharding.

Hardware-agnostic: every op carries shapes, FLOPs-defining dimensions, bytes and message sizes,
never seconds (``sim.costmodel`` prices them). The forward graph of a layer is built for the tokens
one rank holds; the backward is derived op by op: a GEMM ``Y = X W`` (m x k times k x n) splits into
an input-gradient GEMM (B: dX = dY W^T, m x n times n x k) and a weight-gradient GEMM
(W: dW = X^T dY, k x m times m x n) as in the zero-bubble papers; attention, memory-bound ops and
collectives go to B.

Sharding follows Megatron-LM: column-parallel QKV / MLP-up and row-parallel output / MLP-down under
tensor parallelism (tp), each followed by an all-reduce, or with sequence parallelism by an
all-gather before and a reduce-scatter after; context parallelism (cp) splits the sequence and passes
K/V blocks around a ring; expert parallelism (ep) dispatches tokens with all-to-alls.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import networkx as nx

from workloads.model import ModelSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class Op:
    """One kernel (or one collective) on one rank.

    kind "gemm": ``batch`` independent (m x k) @ (k x n) products; ``weight_bytes_per_element``
    describes the k x n operand, ``bytes_per_element`` the activations.
    kind "attention": a fused attention kernel over ``sequences`` of (query tokens, key tokens).
    kind "memory": a memory-bound kernel moving ``bytes_moved``.
    kind "collective": ``collective`` over the ``axis`` group, of ``message_bytes``.
    """

    name: str
    kind: str
    m: int = 0
    n: int = 0
    k: int = 0
    batch: int = 1
    sequences: tuple[tuple[int, int], ...] = ()
    heads: int = 0
    kv_heads: int = 0
    head_dim: int = 0
    v_head_dim: int = 0
    causal: bool = True
    backward: bool = False  # attention: the backward kernel
    bytes_moved: float = 0.0
    # memory op: bytes of its backward (None: twice the forward); collective: the backward's message
    # (None: the forward's, as the conjugate collective)
    backward_bytes_moved: float | None = None
    collective: str = ""
    axis: str = ""
    message_bytes: float = 0.0
    bytes_per_element: float = 2.0
    weight_bytes_per_element: float = 2.0
    recompute: bool = False  # re-run of a forward op inside the backward pass
    weight: bool = True  # gemm: the k x n operand is a weight (its gradient is W work, else B work)
    precision: str = ""  # gemm: the tensor-core precision when it differs from the run's ("" = the run's)
    kernel_rate: float = 1.0  # attention: a further factor on the kernel's compute rate (dropout inside it)
    kernel: str = "flash"  # attention: the fused kernel family (hardware.cost.ATTENTION_KERNELS)
    split_accumulator: bool = False  # fp8 gemm: promotes partial sums to fp32 (no fast accumulation)
    # memory op: the kernels it launches (an eager chain of ops, workloads.eager) and those of its
    # backward (None: as many); each kernel pays a launch and, in eager stacks, a host dispatch.
    # gemm: the kernels its ``batch`` runs as, each over batch / kernels of the products at that
    # batch's own rate (an MoE layer's per-expert GEMMs); one host dispatch for all of them
    kernels: int = 1
    backward_kernels: int | None = None
    # collective "token_dispatch" (an MoE layer's node-deduplicating dispatch or combine,
    # ``hardware.collectives.token_dispatch_time_s``): ``message_bytes`` of distinct tokens, each routed
    # to ``experts_per_token`` of the model's ``routed_experts``
    routed_experts: int = 0
    experts_per_token: int = 0

    @property
    def gemm_flops(self) -> float:
        """Matmul FLOPs of a GEMM op (0 for other kinds; attention FLOPs come from hardware.cost)."""
        return 2.0 * self.m * self.n * self.k * self.batch if self.kind == "gemm" else 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Sharding:
    """How one rank's share of a layer is cut."""

    tp: int = 1
    sequence_parallel: bool = False
    cp: int = 1
    ep: int = 1
    etp: int = 0  # the experts' tensor-parallel degree (ParallelPlan.etp); 0 = tp
    expert_load_imbalance: float = 1.0  # busiest expert's tokens / mean (>= 1)
    cp_comm: str = "ring"  # "ring" (K/V blocks passed around, overlapping attention) | "all_gather" |
    # "ulysses" (all-to-all from sequence to head sharding around attention) | "hybrid" (both, 2D)
    cp_heads: int = 1  # "hybrid": head-parallel degree of the all-to-all; the ring runs over cp / cp_heads


def expected_active_experts(experts: int, top_k: int, routed_tokens: int) -> float:
    """Expected distinct experts hit when ``routed_tokens`` tokens each pick ``top_k`` of ``experts``
    uniformly: E (1 - (1 - k/E)^T)."""
    if routed_tokens <= 0:
        return 0.0
    return experts * (1.0 - (1.0 - top_k / experts) ** routed_tokens)


def _div(value: int, parts: int) -> int:
    """Shard size (ceil): a dimension smaller than the parallel degree is replicated, not zero."""
    return max(1, -(-value // parts))


def _ring_pass(axis: str, ring: int, kv_block: float) -> Op:
    """Ring attention's K/V passes: ring - 1 steps, each sending this rank's K and V block on to the
    next rank. The backward passes K and V around again and the dK, dV partial sums with them
    (ring-flash-attention's ring_flash_attn_backward: kv_comm and d_kv_comm; Transformer Engine's
    P2P context parallelism likewise): twice the forward's bytes."""
    message = (ring - 1) * kv_block
    return Op(name="cp_kv_ring", kind="collective", collective="send_recv", axis=axis, message_bytes=message,
              backward_bytes_moved=2.0 * message)


def _ring_blocks(sequences: Sequence[tuple[int, int]], ring: int) -> int | None:
    """The local query count q of load-balanced ring attention when ``sequences`` are its priced
    pairs (each q local queries against ring x q / 2 keys on average, ``attention_sequences``); None
    otherwise (a sliding window caps the keys: priced as one kernel)."""
    q = sequences[0][0] if sequences else 0
    if q < 2 or q % 2 or any(pair != (q, ring * q // 2) for pair in sequences):
        return None
    return q


def _ring_attention_ops(
    sequences: Sequence[tuple[int, int]], ring: int, *, heads: int, kv_heads: int, qk_dim: int, v_dim: int,
    bytes_per_element: float,
) -> list[Op]:
    """Ring attention as it runs: one attention kernel per ring step and an online-softmax merge after
    each remote step (Liu et al. 2023, Ring Attention; load-balanced zigzag as Megatron-Core / TE).
    The rank holds two sequence chunks of q / 2 tokens; step 0 attends its own K/V (causal, q x q);
    each of the ring - 1 remote steps attends q / 2 x q key pairs of work (the rank's queries against
    one remote chunk, or its later chunk against both), priced at the costlier form (all q queries,
    two q/2 x q/2 blocks): the step's ranks wait for the slowest. Each kernel reloads its queries and
    rewrites its output (the kernel model's per-query cost) and launches; each merge reads the block's
    output and updates the fp32 accumulator (zhuzilin/ring-flash-attention ``_update_out_and_lse``:
    block_out cast to fp32, out read and written; LSE read twice, written once). Same FLOPs as one
    kernel over q queries x s/2 keys."""
    q = _ring_blocks(sequences, ring)
    assert q is not None
    b = len(sequences)

    def kernel(name: str, pairs: tuple[tuple[int, int], ...], causal: bool) -> Op:
        return Op(name=name, kind="attention", sequences=pairs, heads=heads, kv_heads=kv_heads, head_dim=qk_dim,
                  v_head_dim=v_dim, causal=causal)

    merge_bytes = b * q * heads * (v_dim * (bytes_per_element + 4.0 + 4.0) + 3 * 4.0)
    ops = [kernel("attention", ((q, q),) * b, True)]
    half = ((q // 2, q // 2),) * (2 * b)
    for step in range(1, ring):
        ops.append(kernel(f"attention_ring_{step}", half, False))
        ops.append(Op(name=f"attention_ring_merge_{step}", kind="memory", bytes_moved=merge_bytes))
    return ops


def layer_forward_ops(
    model: ModelSpec,
    *,
    tokens: int,
    sequences: Sequence[tuple[int, int]],
    sharding: Sharding,
    moe: bool,
    bytes_per_element: float,
    weight_bytes_per_element: float | None = None,
    causal: bool = True,
    fused_attention: bool = True,
) -> list[Op]:
    """Forward ops of one layer on one rank, in execution order.

    ``tokens`` are the rank's tokens before any sequence-parallel split (b x s / cp in training,
    the step's total tokens in serving); ``sequences`` are the attention (query, key) pairs of those
    tokens. With a sliding window, callers pass key counts already capped (see ``ModelSpec.attention_span``).
    """
    h, tp = model.hidden, sharding.tp
    a = bytes_per_element
    w = a if weight_bytes_per_element is None else weight_bytes_per_element
    sp = sharding.sequence_parallel and tp > 1
    norm_tokens = _div(tokens, tp) if sp else tokens
    act = tokens * h * a  # one full activation tensor of the layer input

    def gemm(name: str, m: int, n: int, k: int, batch: int = 1) -> Op:
        return Op(name=name, kind="gemm", m=m, n=n, k=k, batch=batch, bytes_per_element=a, weight_bytes_per_element=w)

    def mem(name: str, nbytes: float, backward_nbytes: float | None = None) -> Op:
        return Op(name=name, kind="memory", bytes_moved=nbytes, backward_bytes_moved=backward_nbytes)

    def coll(name: str, collective: str, axis: str, nbytes: float) -> Op:
        return Op(name=name, kind="collective", collective=collective, axis=axis, message_bytes=nbytes)

    def enter_tp(name: str) -> list[Op]:
        return [coll(f"{name}_all_gather", "all_gather", "tp", act)] if sp else []

    def leave_tp(name: str) -> list[Op]:
        if tp == 1:
            return []
        if sp:
            return [coll(f"{name}_reduce_scatter", "reduce_scatter", "tp", act)]
        return [coll(f"{name}_all_reduce", "all_reduce", "tp", act)]

    ops: list[Op] = [mem("input_norm", 2 * norm_tokens * h * a)]
    ops += enter_tp("attention")
    heads = _div(model.heads, tp)
    kv_heads = _div(model.kv_heads, tp)
    if model.is_mla:
        qk_dim = model.qk_nope_head_dim + model.qk_rope_head_dim
        v_dim = model.v_head_dim
        if model.q_lora_rank:
            ops.append(gemm("q_down", tokens, model.q_lora_rank, h))
            ops.append(gemm("q_up", tokens, heads * qk_dim, model.q_lora_rank))
        else:
            ops.append(gemm("q_proj", tokens, heads * qk_dim, h))
        ops.append(gemm("kv_down", tokens, model.kv_lora_rank + model.qk_rope_head_dim, h))
        ops.append(gemm("kv_up", tokens, heads * (model.qk_nope_head_dim + v_dim), model.kv_lora_rank))
        kv_heads = heads  # MLA expands the latent into per-head K and V for training and prefill
    else:
        qk_dim = v_dim = model.head_dim
        ops.append(gemm("qkv_proj", tokens, (heads + 2 * kv_heads) * qk_dim, h))
    if model.position == "rope":
        ops.append(mem("rope", 2 * tokens * (heads + kv_heads) * qk_dim * a))
    head_split = 1  # attention heads split over context-parallel ranks (Ulysses / hybrid)
    if sharding.cp > 1 and sharding.cp_comm in ("ulysses", "hybrid"):
        # DeepSpeed-Ulysses (Jacobs et al. 2023, arXiv 2309.14509): an all-to-all turns the rank's
        # sequence shard of Q, K, V (all its heads) into the full sequence of heads / cp, and one more
        # after attention turns the output back; LoongTrain's 2D attention (Gu et al. 2024, arXiv
        # 2406.18485) runs it over cp_heads ranks and a K/V ring over the other cp / cp_heads
        head_split = sharding.cp if sharding.cp_comm == "ulysses" else sharding.cp_heads
        if head_split > 1:
            qkv = tokens * (heads * qk_dim + kv_heads * (qk_dim + v_dim)) * a
            axis = "cp" if sharding.cp_comm == "ulysses" else "cp_heads"
            ops.append(coll("cp_qkv_all_to_all", "all_to_all", axis, qkv))
        ring = sharding.cp // head_split
        if ring > 1:
            kv_block = tokens * head_split * _div(kv_heads, head_split) * (qk_dim + v_dim) * a
            ops.append(_ring_pass("cp_ring", ring, kv_block))
    elif sharding.cp > 1:
        kv_block = tokens * kv_heads * (qk_dim + v_dim) * a
        if sharding.cp_comm == "all_gather":
            # all-gather the full sequence's K and V before attention (Llama 3's context parallelism)
            ops.append(coll("cp_kv_all_gather", "all_gather", "cp", sharding.cp * kv_block))
        else:
            ops.append(_ring_pass("cp", sharding.cp, kv_block))
    ring_steps = sharding.cp // head_split if sharding.cp > 1 and sharding.cp_comm in ("ring", "hybrid") else 1
    if fused_attention and ring_steps > 1 and _ring_blocks(sequences, ring_steps) is not None:
        ops += _ring_attention_ops(
            sequences, ring_steps, heads=_div(heads, head_split), kv_heads=_div(kv_heads, head_split),
            qk_dim=qk_dim, v_dim=v_dim, bytes_per_element=a,
        )
    elif fused_attention:
        ops.append(
            Op(
                name="attention",
                kind="attention",
                sequences=tuple(sequences),
                heads=_div(heads, head_split),
                kv_heads=_div(kv_heads, head_split),
                head_dim=qk_dim,
                v_head_dim=v_dim,
                causal=causal,
            )
        )
    else:
        ops += unfused_attention_ops(
            sequences, heads=_div(heads, head_split), qk_dim=qk_dim, v_dim=v_dim, bytes_per_element=a
        )
    if head_split > 1:
        axis = "cp" if sharding.cp_comm == "ulysses" else "cp_heads"
        ops.append(coll("cp_out_all_to_all", "all_to_all", axis, tokens * heads * v_dim * a))
    ops.append(gemm("out_proj", tokens, h, heads * v_dim))
    ops += leave_tp("attention")
    # A residual add's backward sums the skip path's gradient with the branch's (read two, write one:
    # 3 x a per element), whether or not its forward was fused; the fused add + norm adds the norm's
    # backward (read the input and the gradient, write the input gradient, 4 x a with its partials)
    ops.append(mem("residual_norm", 4 * norm_tokens * h * a, 7 * norm_tokens * h * a))
    ops += enter_tp("mlp")
    gate = 2 if model.gated_mlp else 1
    if moe:
        ops += _moe_ops(model, tokens, sharding, gemm, mem, coll, a)
    else:
        f = _div(model.ffn_hidden, tp)
        ops.append(gemm("mlp_up", tokens, gate * f, h))
        ops.append(mem("mlp_activation", (gate + 1) * tokens * f * a))
        ops.append(gemm("mlp_down", tokens, h, f))
    ops += leave_tp("mlp")
    ops.append(mem("residual", 3 * norm_tokens * h * a, 3 * norm_tokens * h * a))
    return ops


# Bytes per attention-score element in Megatron's unfused path (fused scale-mask-softmax, then
# dropout): read scores and write probabilities (2 + 2 at 16 bits), dropout reads probabilities and
# writes the result (2 + 2) plus a 1-byte mask; Korthikanti et al. 2022 count the same tensors
# (2 + 2 + 1 = 5 bytes stored per element, the "5as/h" term).
UNFUSED_SOFTMAX_BYTES_PER_SCORE = 9.0
# Its backward: dropout's backward reads the gradient and the 1-byte mask and writes the gradient
# (2 + 1 + 2), then the fused softmax backward reads the gradient and the saved probabilities and
# writes the input gradient in place (2 + 2 + 2; Megatron-LM megatron/fused_kernels/
# scaled_upper_triang_masked_softmax_cuda.cu bwd_cuda, "backward pass is completely in-place", at
# commit 50a4b5fa02, 2021-04-08): 11 bytes per score, not twice the forward's 9.
UNFUSED_SOFTMAX_BACKWARD_BYTES_PER_SCORE = 11.0


def unfused_attention_ops(
    sequences: Sequence[tuple[int, int]], *, heads: int, qk_dim: int, v_dim: int, bytes_per_element: float
) -> list[Op]:
    """Attention with the score matrix materialised (pre-FlashAttention Megatron): batched QK^T,
    softmax + dropout over every score, batched AV. Sequences of equal shape batch together; the
    full (non-causal) score matrix is computed and masked, as those kernels did."""
    shapes: dict[tuple[int, int], int] = {}
    for q, kv in sequences:
        shapes[(q, kv)] = shapes.get((q, kv), 0) + 1
    ops: list[Op] = []
    for index, ((q, kv), count) in enumerate(sorted(shapes.items())):
        suffix = "" if len(shapes) == 1 else f"_{index}"
        batch = count * heads
        ops.append(Op(name=f"attention_scores{suffix}", kind="gemm", m=q, n=kv, k=qk_dim, batch=batch, weight=False, bytes_per_element=bytes_per_element, weight_bytes_per_element=bytes_per_element))
        scores = batch * q * kv
        ops.append(Op(name=f"attention_softmax{suffix}", kind="memory", bytes_moved=UNFUSED_SOFTMAX_BYTES_PER_SCORE * scores,
                      backward_bytes_moved=UNFUSED_SOFTMAX_BACKWARD_BYTES_PER_SCORE * scores))
        ops.append(Op(name=f"attention_values{suffix}", kind="gemm", m=q, n=v_dim, k=kv, batch=batch, weight=False, bytes_per_element=bytes_per_element, weight_bytes_per_element=bytes_per_element))
    return ops


# an MoE layer's expert matmuls: batches of one product per active local expert
EXPERT_GEMMS = ("experts_up", "experts_down")
# an MoE layer's expert-parallel token exchanges: the dispatch to the experts and the combine back
EP_TOKEN_EXCHANGES = ("ep_dispatch", "ep_combine")


def _moe_ops(model: ModelSpec, tokens: int, sharding: Sharding, gemm, mem, coll, a: float) -> list[Op]:  # type: ignore[no-untyped-def]
    """Router, token permutations, dispatch, expert GEMMs, combine and shared experts of one MoE layer."""
    h, tp, ep = model.hidden, sharding.tp, sharding.ep
    etp = sharding.etp or tp
    gate = 2 if model.gated_mlp else 1
    f = _div(model.expert_ffn_hidden, etp)
    k, experts = model.experts_per_token, model.experts
    # Under sequence parallelism each TP rank routes its s/tp tokens and the all-to-all exchanges only
    # that shard, an all-gather over the etp ranks that split each expert following it (Megatron-Core's
    # MoEAlltoAllTokenDispatcher: all-to-all over EP, then all-gather over expert TP); without SP every
    # TP rank routes and sends the full set (and etp = tp)
    sp = sharding.sequence_parallel and tp > 1
    shard = _div(tokens, tp) if sp else tokens
    ops = [gemm("router", shard, experts, h), mem("router_topk", shard * experts * 4.0)]
    exchanged = shard * k * h * a
    # token-expert pairs this rank's experts take from its EP group, gathered over expert TP
    routed = (shard * etp if sp else tokens) * k
    local_experts = experts // ep
    # tokens arriving at this rank's experts: all ep ranks' pairs spread over all experts
    arriving = routed * ep * local_experts / experts
    # The token permutations around the experts (Megatron-Core's MoEAlltoAllTokenDispatcher, core_r0.8.0
    # to 92c8482e): ``permute`` copies each token once per chosen expert into expert order before the
    # dispatch and ``unpermute`` sums an output's k copies back after the combine; arriving tokens come
    # grouped by source rank, and with several local experts ``sort_chunks_by_idxs`` regroups them by
    # expert after the dispatch and back before the combine. Each reads and writes the rows it moves;
    # a permutation's backward is the inverse permutation, the same bytes.
    regroup = 2 * arriving * h * a if local_experts > 1 and ep > 1 else 0.0
    ops.append(_permutation("moe_permute", 2 * exchanged))
    if ep > 1:
        ops.append(coll(EP_TOKEN_EXCHANGES[0], "all_to_all", "ep", exchanged))
    if regroup:
        ops.append(_permutation("moe_sort_chunks", regroup))
    active = expected_active_experts(local_experts, min(k, local_experts), routed // k * ep)
    active_experts = max(1, round(active))
    per_expert = max(1, round(arriving * sharding.expert_load_imbalance / active_experts))
    ops.append(gemm(EXPERT_GEMMS[0], per_expert, gate * f, h, batch=active_experts))
    ops.append(mem("experts_activation", (gate + 1) * per_expert * active_experts * f * a))
    ops.append(gemm(EXPERT_GEMMS[1], per_expert, h, f, batch=active_experts))
    if regroup:
        ops.append(_permutation("moe_unsort_chunks", regroup))
    if ep > 1:
        ops.append(coll(EP_TOKEN_EXCHANGES[1], "all_to_all", "ep", exchanged))
    ops.append(_permutation("moe_unpermute", exchanged + exchanged / k))
    if model.shared_experts:
        fs = model.shared_experts * f
        ops.append(gemm("shared_up", tokens, gate * fs, h))
        ops.append(mem("shared_activation", (gate + 1) * tokens * fs * a))
        ops.append(gemm("shared_down", tokens, h, fs))
    return ops


def _permutation(name: str, nbytes: float) -> Op:
    """A memory op that moves rows into another order; its backward moves them back (same bytes)."""
    return Op(name=name, kind="memory", bytes_moved=nbytes, backward_bytes_moved=nbytes)


# Backward of the embedding lookup, bytes per element of the local table: PyTorch's embedding backward
# (sparse=False, as Megatron's VocabParallelEmbedding uses it) writes a dense gradient of the whole
# table (zero-fill, then scatter-add the token gradients: 2 x 16 bits), and Megatron's DDP adds it to
# the fp32 main gradient (read the 16-bit gradient, read and write the fp32 one: 2 + 4 + 4).
EMBEDDING_BACKWARD_BYTES_PER_TABLE_ELEMENT = 2.0 + 2.0 + 2.0 + 4.0 + 4.0


def embedding_ops(
    model: ModelSpec, *, tokens: int, sharding: Sharding, bytes_per_element: float, vocab_split: int = 1
) -> list[Op]:
    """Input embedding lookup (vocab-parallel under tp: a masked lookup plus an all-reduce); its
    backward writes a dense gradient of the rank's vocab shard (see the constant above).
    ``vocab_split`` > 1: the table is also split over that many pipeline stages (vocabulary
    parallelism, Yeung et al. 2024, arXiv 2411.05288), each looks up its shard and an all-reduce
    over the pipeline group sums the partial embeddings."""
    table = _div(model.vocab, sharding.tp * vocab_split) * model.hidden
    ops = [
        Op(
            name="embedding",
            kind="memory",
            bytes_moved=2 * tokens * model.hidden * bytes_per_element,
            backward_bytes_moved=tokens * model.hidden * bytes_per_element + EMBEDDING_BACKWARD_BYTES_PER_TABLE_ELEMENT * table,
        )
    ]
    if sharding.tp > 1:
        collective = "reduce_scatter" if sharding.sequence_parallel else "all_reduce"
        ops.append(
            Op(
                name="embedding_" + collective,
                kind="collective",
                collective=collective,
                axis="tp",
                message_bytes=tokens * model.hidden * bytes_per_element,
            )
        )
    if vocab_split > 1:
        ops.append(
            Op(
                name="embedding_pp_all_reduce", kind="collective", collective="all_reduce", axis="pp",
                message_bytes=tokens * model.hidden * bytes_per_element,
            )
        )
    return ops


# Megatron-LM's vocab-parallel cross-entropy (megatron/core/tensor_parallel/cross_entropy.py) runs
# unfused on fp32 logits, bytes per local logit: the model casts the 16-bit logits to fp32 (read 2,
# write 4), then max (read 4), subtract the max (read 4, write 4), exp in place (4 + 4), sum (4) and
# divide by the sum, keeping the softmax for backward (4 + 4): 38 bytes. Backward multiplies the
# saved softmax (less the one-hot target) by the incoming gradient in place (4 + 4) and casts it to
# 16 bits for the LM-head GEMMs (read 4, write 2): 14 bytes.
CROSS_ENTROPY_FORWARD_BYTES = 6.0 + 4.0 + 8.0 + 8.0 + 4.0 + 8.0
CROSS_ENTROPY_BACKWARD_BYTES = 8.0 + 6.0
# Megatron-Core's fused cross-entropy (cross_entropy_loss_fusion, the "native" implementation:
# megatron/core/fusions/fused_cross_entropy.py at core_r0.8.0) runs the same steps as three
# torch.compile'd functions (megatron/core/jit.py: jit_fuser = torch.compile from torch 2.2), an
# all-reduce between each: the fp32 copy and its max in one kernel (read 2, write 4), subtract, exp
# and sum in one (read 4, write the exponentials back, 4), the division by the sum (4 + 4): 22
# bytes; backward the gradient update and the cast to 16 bits in one kernel (read 4, write the
# mutated fp32 softmax back, 4, and the 16-bit gradient, 2): 10 bytes.
CROSS_ENTROPY_NATIVE_FORWARD_BYTES = 6.0 + 8.0 + 8.0
CROSS_ENTROPY_NATIVE_BACKWARD_BYTES = 4.0 + 4.0 + 2.0
# Transformer Engine's Triton cross-entropy (transformer_engine/pytorch/triton/cross_entropy.py at
# v2.9, Megatron-Core cross_entropy_fusion_impl = "te"): online_softmax_kernel reads the 16-bit
# logits once for the running max and sum, cross_entropy_kernel reads them again and writes the
# gradient in place in their dtype (3 x 2 bytes); backward element_mul_kernel scales it by the
# per-token loss gradient in place (2 + 2; skipped only for a scalar 1.0 gradient, not Megatron's
# per-token loss).
CROSS_ENTROPY_TE_FORWARD_BYTES = 2.0 + 2.0 + 2.0
CROSS_ENTROPY_TE_BACKWARD_BYTES = 2.0 + 2.0
# PyTorch's torch.nn.functional.cross_entropy on fp32 logits (torchtitan's cross_entropy_loss on
# pred.float(); Composer / llm-foundry's CrossEntropyLoss under bf16 autocast, which runs it in fp32),
# ATen op by ATen op (the counter of benchmarks/eager_elementwise_bytes.py): the fp32 cast (read 2,
# write 4), _log_softmax (4 + 4), nll_loss_forward (a gather of one logit per token): 14 bytes;
# backward nll_loss_backward (a zero-filled gradient, 4, and one target per token),
# _log_softmax_backward_data (reads the gradient and the saved output, writes: 4 + 4 + 4) and the cast
# back to 16 bits (4 + 2): 22 bytes.
CROSS_ENTROPY_TORCH_FORWARD_BYTES = 6.0 + 8.0
CROSS_ENTROPY_TORCH_BACKWARD_BYTES = 4.0 + 12.0 + 6.0
# The same on the 16-bit logits themselves (torchtitan before its pred.float(), e.g. train.py at
# 6aafe3cdf / f38766edb, April 2024): _log_softmax in their dtype (2 + 2), then backward the zero-filled
# gradient (2) and _log_softmax_backward_data (2 + 2 + 2).
CROSS_ENTROPY_TORCH_16BIT_FORWARD_BYTES = 2.0 + 2.0
CROSS_ENTROPY_TORCH_16BIT_BACKWARD_BYTES = 2.0 + 6.0
# flash-attention's xentropy kernel on the 16-bit logits (flash_attn.losses.cross_entropy, csrc/xentropy
# of flash-attention v1.0.3: llm-foundry's default loss_fn "fused_crossentropy", llmfoundry/models/mpt/
# modeling_mpt.py at 061f2c7c): cunn_SoftMaxXEntropyForward reads each row twice (its max and sum,
# then the sum of exponentials: 2 + 2) and writes one loss and log-sum-exp per token;
# cunn_SoftMaxXEntropyBackward reads the logits and writes their gradient (2 + 2).
CROSS_ENTROPY_XENTROPY_FORWARD_BYTES = 2.0 + 2.0
CROSS_ENTROPY_XENTROPY_BACKWARD_BYTES = 2.0 + 2.0
# bytes per local logit (forward, backward) by implementation
CROSS_ENTROPY_BYTES = {
    "unfused": (CROSS_ENTROPY_FORWARD_BYTES, CROSS_ENTROPY_BACKWARD_BYTES),
    "native": (CROSS_ENTROPY_NATIVE_FORWARD_BYTES, CROSS_ENTROPY_NATIVE_BACKWARD_BYTES),
    "te": (CROSS_ENTROPY_TE_FORWARD_BYTES, CROSS_ENTROPY_TE_BACKWARD_BYTES),
    "torch": (CROSS_ENTROPY_TORCH_FORWARD_BYTES, CROSS_ENTROPY_TORCH_BACKWARD_BYTES),
    "torch_16bit": (CROSS_ENTROPY_TORCH_16BIT_FORWARD_BYTES, CROSS_ENTROPY_TORCH_16BIT_BACKWARD_BYTES),
    "xentropy": (CROSS_ENTROPY_XENTROPY_FORWARD_BYTES, CROSS_ENTROPY_XENTROPY_BACKWARD_BYTES),
}


def lm_head_ops(
    model: ModelSpec, *, tokens: int, sharding: Sharding, bytes_per_element: float, weight_bytes_per_element: float | None = None, loss: bool = True,
    vocab_split: int = 1, cross_entropy: str = "unfused",
) -> list[Op]:
    """Final norm, vocab-parallel LM head and (in training) the vocab-parallel cross-entropy
    (``cross_entropy``: its implementation, a key of ``CROSS_ENTROPY_BYTES``).
    ``vocab_split`` > 1: the vocabulary is also split over that many pipeline stages (Yeung et al.
    2024): the last transformer stage broadcasts the final hidden states to the pipeline group (its
    backward reduces their gradients back), each stage computes its shard of the logits and the
    softmax statistics are all-reduced over the pipeline group too."""
    a = bytes_per_element
    w = a if weight_bytes_per_element is None else weight_bytes_per_element
    tp = sharding.tp
    sp = sharding.sequence_parallel and tp > 1
    ops: list[Op] = []
    if vocab_split > 1:
        hidden_bytes = (_div(tokens, tp) if sp else tokens) * model.hidden * a
        ops.append(Op(name="lm_head_pp_broadcast", kind="collective", collective="broadcast", axis="pp", message_bytes=hidden_bytes))
    ops.append(Op(name="final_norm", kind="memory", bytes_moved=2 * (_div(tokens, tp) if sp else tokens) * model.hidden * a))
    if sp:
        ops.append(Op(name="lm_head_all_gather", kind="collective", collective="all_gather", axis="tp", message_bytes=tokens * model.hidden * a))
    vocab = _div(model.vocab, tp * vocab_split)
    ops.append(Op(name="lm_head", kind="gemm", m=tokens, n=vocab, k=model.hidden, bytes_per_element=a, weight_bytes_per_element=w))
    if loss:
        elements = tokens * vocab
        forward_bytes, backward_bytes = CROSS_ENTROPY_BYTES[cross_entropy]
        ops.append(
            Op(
                name="cross_entropy",
                kind="memory",
                bytes_moved=forward_bytes * elements,
                backward_bytes_moved=backward_bytes * elements,
            )
        )
        if tp > 1:
            # three fp32 all-reduces of one value per token: max, sum of exponentials, target logit
            ops.append(Op(name="cross_entropy_all_reduce", kind="collective", collective="all_reduce", axis="tp", message_bytes=3 * tokens * 4.0))
        if vocab_split > 1:
            ops.append(Op(name="cross_entropy_pp_all_reduce", kind="collective", collective="all_reduce", axis="pp", message_bytes=3 * tokens * 4.0))
    return ops


def backward_ops(forward: Sequence[Op], *, recompute: Sequence[Op] = (), regather: bool = True) -> tuple[list[Op], list[Op]]:
    """(B, W) ops of a forward op list, in backward order; ``recompute`` forward ops run first in B.
    ``regather``: a GEMM whose input was gathered over TP gathers it again for its weight gradient
    (the stack kept the sequence shard); False: the gathered input was saved (torch DTensor TP)."""
    b_ops: list[Op] = [replace(op, name=f"recompute_{op.name}", recompute=True) for op in recompute]
    w_ops: list[Op] = []
    for index in range(len(forward) - 1, -1, -1):
        op = forward[index]
        if op.kind == "gemm":
            before = forward[index - 1] if index > 0 else None
            if regather and op.weight and before is not None and before.kind == "collective" \
                    and before.collective == "all_gather" and before.axis == "tp":
                # sequence parallel keeps the GEMM's input sharded: the weight gradient needs it whole, so
                # backward gathers it again beside the input-gradient GEMM (Megatron
                # LinearWithGradAccumulationAndAsyncCommunication, TE LayerNormLinear backward)
                b_ops.append(replace(before, name=f"{before.name}_regather"))
            b_ops.append(replace(op, name=f"{op.name}_dgrad", m=op.m, n=op.k, k=op.n))
            # dW = X^T dY multiplies two activations; without a weight it is the other input's gradient
            grad = replace(op, name=f"{op.name}_wgrad", m=op.k, n=op.n, k=op.m, weight_bytes_per_element=op.bytes_per_element)
            (w_ops if op.weight else b_ops).append(grad)
        elif op.kind == "attention":
            b_ops.append(replace(op, name=f"{op.name}_backward", backward=True))
        elif op.kind == "memory":
            backward = 2 * op.bytes_moved if op.backward_bytes_moved is None else op.backward_bytes_moved
            kernels = op.kernels if op.backward_kernels is None else op.backward_kernels
            if kernels == 0:  # nothing runs (a copy whose gradient is a view of the output gradient)
                continue
            b_ops.append(replace(op, name=f"{op.name}_backward", bytes_moved=backward, backward_bytes_moved=None,
                                 kernels=kernels, backward_kernels=None))
        else:
            message = op.message_bytes if op.backward_bytes_moved is None else op.backward_bytes_moved
            b_ops.append(replace(op, name=f"{op.name}_backward", collective=_CONJUGATE[op.collective],
                                 message_bytes=message, backward_bytes_moved=None))
    return b_ops, w_ops


# The backward of a collective (Megatron's f/g conjugate pairs): all-gather <-> reduce-scatter,
# all-reduce stays all-reduce (input-gradient sum), all-to-all and ring passes repeat.
_CONJUGATE = {
    "all_gather": "reduce_scatter",
    "reduce_scatter": "all_gather",
    "all_reduce": "all_reduce",
    "all_to_all": "all_to_all",
    "token_dispatch": "token_dispatch",
    "send_recv": "send_recv",
    "broadcast": "reduce_scatter",
}


def op_graph(ops: Sequence[Op]) -> nx.DiGraph:
    """The ops as a dependency chain (networkx DiGraph, node = op name, attribute ``op``).

    Kernels of one layer run in order on one stream, so the graph is a path; it is the structure
    the trace and per-op CSV walk, and the place to add parallel branches.
    """
    graph = nx.DiGraph()
    previous: str | None = None
    for op in ops:
        if op.name in graph:
            raise ValueError(f"duplicate op name '{op.name}' in one graph")
        graph.add_node(op.name, op=op)
        if previous is not None:
            graph.add_edge(previous, op.name)
        previous = op.name
    return graph
