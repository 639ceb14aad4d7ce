"""Stored activations of a transformer layer per micro-batch, and how many micro-batches a pipeline
stage holds at once (Korthikanti et al. 2022, arXiv 2205.05198, Table 2, generalised per tensor to
GQA, SwiGLU, MoE, FlashAttention, sequence and context parallelism and recomputation)."""

from __future__ import annotations

from typing import NamedTuple

from sim.training.schedules import plan_occupancy
from workloads.checkpointing import per_op_checkpoint
from workloads.eager import RMSNORM_SAVED_BYTES
from workloads.graph import Sharding, layer_forward_ops
from workloads.model import ModelSpec
from workloads.plan import ParallelPlan, TrainingJob

ACTIVATION_BYTES = 2.0  # 16-bit stored activations (Korthikanti 2022 §4: fp16 activations)
DROPOUT_MASK_BYTES = 1.0  # one byte per mask element (Korthikanti 2022 §4.1)
SOFTMAX_LSE_BYTES = 4.0  # FlashAttention saves an fp32 log-sum-exp per query and head for backward
TOKEN_ID_BYTES = 8.0  # int64 token ids: Megatron theoretical_memory_usage.py "8 * s * b * p"
LOGITS_BYTES = 4.0  # fp32 LM-head inputs: Megatron theoretical_memory_usage.py 4*s*b*h*(1 + V/h)
# Bytes per local logit the loss holds, by implementation (the stack setting ``cross_entropy``):
# (kept for its backward per micro-batch in flight, at its peak: one micro-batch's, while every layer's
# activations are still held). "unfused", Megatron's vocab-parallel cross-entropy
# (megatron/core/tensor_parallel/cross_entropy.py at core_r0.8.0): the fp32 copy of the 16-bit logits
# becomes the softmax in place (-=, exp(out=), div_: 4 kept) beside the 16-bit logits the caller holds
# (2); backward turns it into the gradient in place and casts it to 16 bits (4 + 2). "native", its
# torch.compile'd fusion, the same buffers. "te", Transformer Engine's Triton kernel writes the
# gradient over the 16-bit logits in forward (2). "torch", F.cross_entropy on fp32 logits
# (torchtitan's pred.float(), Composer under bf16 autocast): _log_softmax keeps its fp32 output (4);
# forward holds the 16-bit logits, their fp32 copy and that output (2 + 4 + 4); backward
# nll_loss_backward's dense fp32 gradient, the kept output and _log_softmax_backward_data's fp32
# result are live at once (4 + 4 + 4). "torch_16bit", the same in the logits' 16 bits (2 kept; 2 + 2 + 2).
# "xentropy", flash-attention's kernel: it keeps the 16-bit logits and writes their gradient beside
# them in backward (2 kept; 2 + 2).
CROSS_ENTROPY_MEMORY = {
    "unfused": (4.0, 4.0 + 2.0),
    "native": (4.0, 4.0 + 2.0),
    "te": (2.0, 2.0),
    "torch": (4.0, 4.0 + 4.0 + 4.0),
    "torch_16bit": (2.0, 2.0 + 2.0 + 2.0),
    "xentropy": (2.0, 2.0 + 2.0),
}
FP8_SAVED_INPUT_BYTES = 1.0  # a Linear input saved for backward as its fp8 cast (fp8 training)
ROUTER_PROB_BYTES = 4.0  # fp32 router softmax per token and expert (Megatron-Core router computes in fp32)


class LayerActivations(NamedTuple):
    """Stored activation bytes of one layer, one micro-batch, one rank (``layer_activation_parts``)."""

    full_bytes: float  # stored with no recompute
    core_bytes: float  # the attention-core part of it (scores, softmax, dropout; or FlashAttention's LSE)
    input_bytes: float  # the layer input (all a fully recomputed layer keeps)
    selective_bytes: float  # stored under recompute = "selective" as ``job.selective_recompute`` defines it


def layer_activation_parts(
    model: ModelSpec, plan: ParallelPlan, job: TrainingJob, *, moe: bool, flash_attention: bool, dropout: bool
) -> LayerActivations:
    """Stored bytes of one layer (no recompute, attention core, layer input, selective), one
    micro-batch, one rank.

    Notation: s local sequence (seq_len / cp), b micro-batch, h hidden, t tp. Korthikanti 2022 Table 2
    for a GPT layer: s b h (10 + 24/t + 5 a s/(h t)); with sequence parallel the 10 s b h of
    replicated tensors (norm inputs, QKV and fc1 inputs, dropout masks) is also divided by t.
    """
    t = plan.tp
    s = job.seq_len / plan.cp
    b = job.micro_batch
    h = model.hidden
    tokens = s * b
    a = ACTIVATION_BYTES
    # fp8 training (Transformer Engine) saves each Linear's input for its weight gradient as the fp8
    # cast it made (TE Linear / LayerNormLinear / LayerNormMLP save the fp8 input, not the 16-bit one)
    g = FP8_SAVED_INPUT_BYTES if job.precision == "fp8" else a
    mask = DROPOUT_MASK_BYTES if dropout else 0.0
    # kv heads are replicated when tp exceeds them (Megatron GQA), so each rank holds at least one
    kv_heads_rank = max(model.kv_heads / t, 1.0)

    # replicated across TP unless sequence parallel (the "10" of Korthikanti's TP formula)
    norms = 1 if model.parallel_block else 2
    # inputs of the layer norms; an eager RMSNorm keeps its fp32 input and its 16-bit output instead
    eager_norm = job.elementwise == "eager" and model.norm == "rmsnorm"
    replicated = norms * (RMSNORM_SAVED_BYTES if eager_norm else a) * tokens * h
    replicated += 2 * mask * tokens * h  # dropout masks after attention and after the MLP
    # the QKV-projection input and the fc1 / router input (parallel blocks share the QKV input): with
    # sequence parallelism the shard (Megatron re-gathers it for the weight gradient) or, where the
    # stack's matmul saves the gathered tensor (tp_gathered_input "save", torch DTensor TP), all of it
    gathered = (1 if model.parallel_block else 2) * g * tokens * h

    # split across TP ranks (the "24" of Korthikanti's TP formula for a 4h GeLU MLP)
    if model.is_mla:
        qk_head = model.qk_nope_head_dim + model.qk_rope_head_dim
        latents = a * tokens * (2 * model.kv_lora_rank + model.qk_rope_head_dim)  # down output + its norm output
        if model.q_lora_rank:
            latents += 2 * a * tokens * model.q_lora_rank
        replicated += latents  # MLA down-projections are duplicated across TP ranks in Megatron-Core
        q_width = model.heads * qk_head / t
        k_width = q_width
        v_width = model.heads * model.v_head_dim / t
        out_width = v_width
    else:
        q_width = model.heads * model.head_dim / t
        k_width = v_width = kv_heads_rank * model.head_dim
        if job.attention_layout == "torch_sdpa":  # SDPA keeps K and V repeated to the query heads
            k_width = v_width = max(k_width, q_width)
        out_width = q_width
    split = a * tokens * (q_width + k_width + v_width) + g * tokens * out_width  # Q, K, V; out-proj input

    heads_rank = model.heads / t
    if flash_attention:
        core = SOFTMAX_LSE_BYTES * heads_rank * tokens  # scores never stored; only the fp32 log-sum-exp
    else:
        # softmax output (2) + dropout mask (1) + dropout output (2) = Korthikanti's 5 a s^2 b / t;
        # a query shard attends to all s_full keys under context parallelism
        per_element = a + (mask + a if dropout else 0.0)
        core = per_element * heads_rank * tokens * job.seq_len

    def mlp_width_bytes(width: float) -> float:
        # GeLU/ReLU: activation input and output (2 + 2 bytes per element); SwiGLU: gate, up and their
        # product; the activation output is the fc2 input (fp8 under fp8 training)
        return ((2 if model.gated_mlp else 1) * a + g) * width

    if moe:
        k = model.experts_per_token
        # routed tokens on this rank's experts (balanced): its expert TP group's sequence shards, the
        # whole sequence where the experts split like the attention (et = t); hidden-sized ones whole,
        # intermediates split by expert TP: the first expert matmul's input (as its fp8 cast under fp8)
        # and the activation's; where the probabilities scale an h-wide tensor (the expert output in
        # the combine, or the routed input) autograd keeps it too, where they scale the activation
        # (weighted SwiGLU) only the fp32 probabilities
        et = plan.expert_tp
        routed = k * tokens * (et / t if plan.sequence_parallel else 1.0)
        kept_for_probs = a * h if job.moe_prob_scaling == "hidden" else ROUTER_PROB_BYTES
        split += routed * (g * h + kept_for_probs + mlp_width_bytes(model.expert_ffn_hidden / et))
        split += model.shared_experts * tokens * mlp_width_bytes(model.expert_ffn_hidden / t)
        replicated += ROUTER_PROB_BYTES * tokens * model.experts
    else:
        split += tokens * mlp_width_bytes(model.ffn_hidden / t)

    if plan.sequence_parallel:
        replicated /= t
        if job.tp_gathered_input == "regather":
            gathered /= t
    layer_input = a * tokens * h / (t if plan.sequence_parallel else 1)
    full = replicated + gathered + split + core
    if job.selective_recompute == "per_op":
        selective = layer_input + per_op_saved_bytes(model, plan, job, moe=moe, flash_attention=flash_attention)
    else:
        selective = full - core
    return LayerActivations(full, core, layer_input, selective)


def per_op_saved_bytes(model: ModelSpec, plan: ParallelPlan, job: TrainingJob, *, moe: bool, flash_attention: bool) -> float:
    """Bytes per-op selective checkpointing keeps of one layer besides its input: the outputs of the
    saved ops (``workloads.checkpointing.per_op_checkpoint``) of the layer's forward op graph, one
    micro-batch on one rank, in 16-bit activations (fp8 runs are rejected by ``validate_plan``).
    Output sizes depend on the query tokens only, so the graph is built with whole causal
    sequences (context parallelism is rejected too)."""
    tokens = job.micro_batch * job.seq_len // plan.cp
    forward = layer_forward_ops(
        model, tokens=tokens, sequences=((job.seq_len // plan.cp, job.seq_len // plan.cp),) * job.micro_batch,
        sharding=Sharding(tp=plan.tp, sequence_parallel=plan.sequence_parallel, cp=plan.cp, ep=plan.ep,
                          etp=plan.expert_tp, cp_comm=plan.cp_comm, cp_heads=plan.cp_heads),
        moe=moe, bytes_per_element=ACTIVATION_BYTES, fused_attention=flash_attention,
    )
    return per_op_checkpoint(forward, model=model, tp=plan.tp).saved_bytes


def activation_bytes_per_layer(
    model: ModelSpec,
    plan: ParallelPlan,
    job: TrainingJob,
    *,
    flash_attention: bool = True,
    dropout: bool = True,
    moe_layer: bool | None = None,
) -> float:
    """Stored activation bytes of one transformer layer for one micro-batch on one rank.

    ``recompute``: none stores everything; selective drops the attention core (scores, softmax,
    dropout, or FlashAttention's log-sum-exp), or under ``job.selective_recompute = "per_op"`` keeps
    the layer input and the saved ops' outputs; full keeps only the layer input (2 s b h, / t with
    sequence parallel). ``dropout`` keeps Korthikanti's/Megatron's 1-byte masks (default, as their
    accounting); pass False for dropout-free recipes. ``moe_layer`` None = an MoE layer for MoE models.
    """
    moe = model.is_moe if moe_layer is None else moe_layer
    parts = layer_activation_parts(model, plan, job, moe=moe, flash_attention=flash_attention, dropout=dropout)
    return stored_activation_bytes(parts, plan.recompute)


def stored_activation_bytes(parts: LayerActivations, recompute: str) -> float:
    """Bytes a layer keeps under ``recompute`` from its ``layer_activation_parts``: none stores
    everything, selective what the stack's selective recomputation keeps, full only the layer input."""
    if recompute == "full":
        return parts.input_bytes
    if recompute == "selective":
        return parts.selective_bytes
    return parts.full_bytes


def recompute_working_bytes(parts: LayerActivations, recompute: str, selective_recompute: str) -> float:
    """Bytes one layer re-materialises during its backward under ``recompute``: the attention core
    (selective, attention_core), or what no recompute would store beyond what the layer keeps
    (per-op selective and full; Korthikanti's no-recompute tensors stand in for the recomputed ones)."""
    if recompute == "none":
        return 0.0
    if recompute == "selective" and selective_recompute == "attention_core":
        return parts.core_bytes
    return max(0.0, parts.full_bytes - stored_activation_bytes(parts, recompute))


def inflight_microbatches(plan: ParallelPlan, num_microbatches: int, stage: int) -> float:
    """Micro-batches whose activations a stage holds at its peak, in units of the whole stage's layers:
    the peak (micro-batch, chunk) activations held when the schedule's program runs
    (``sim.training.schedules.program_occupancy``), divided by the chunks per stage.

    Counted this way gpipe holds all m; 1f1b and zb-h1 min(pp - stage, m) (Narayanan et al. 2021;
    Qi et al. 2023 ZB-H1 keeps 1F1B's peak); interleaved with v chunks Megatron's warm-up of
    (pp - stage - 1) * 2 + (v - 1) * pp chunk-forwards plus one, capped at m * v, divided by v (on
    stage 0 pp * (1 + (pp - 1)/(pp v)), Narayanan et al. 2021's interleave penalty).

    Megatron-Core's combined 1F1B (``ep_comm_overlap`` with ep > 1) runs each forward beside the
    backward of the micro-batch before it, so one more forward is done before that backward frees its
    activations: interleaved, the one extra warm-up chunk-forward its schedule adds (1 / v of a stage;
    get_pp_rank_microbatches), without a pipeline a second micro-batch; capped at m.
    """
    if not 0 <= stage < plan.pp:
        raise ValueError(f"stage {stage} out of range 0..{plan.pp - 1} for pp = {plan.pp}")
    if num_microbatches < 1:
        raise ValueError(f"num_microbatches = {num_microbatches} must be >= 1")
    inflight = plan_occupancy(plan, num_microbatches).inflight_stages(stage)
    if plan.ep_comm_overlap and plan.ep > 1:
        inflight = min(float(num_microbatches), inflight + (1.0 / plan.virtual_stages if plan.pp > 1 else 1.0))
    return inflight


# ---- parameters ----------------------------------------------------------------------------------
