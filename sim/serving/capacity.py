"""Memory of one serving replica (per GPU): weights, activation workspace, communication buffers and
the KV cache that fills what ``gpu_memory_utilization`` leaves; the KV capacity in blocks follows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hardware.units import MB
from sim.serving.stepcost import ReplicaShape
from workloads.model import ModelSpec
from workloads.precision import bytes_per_element

# NCCL buffers a TP group holds per GPU: 342-392 MB for TP 2-8 in aiconfigurator's system files
# (../shared/reference/formulas.md, Serving / Memory); the larger value is used for any TP > 1.
NCCL_BUFFER_BYTES = 392 * MB
# fp32 logits of the sampled positions (vLLM's sampler upcasts logits to float32).
LOGIT_BYTES = 4.0
# What a stack keeps per sequence slot for sampling (``decoder_buffers``): "logits", the fp32 logits
# of the sampled positions alone (vLLM); "trtllm", TensorRT-LLM 0.14's executor buffers, allocated for
# every one of its max_batch_size slots before it sizes the KV cache (TrtGptModelInflightBatching:
# createBuffers, then createDecoder, logged as "runtime buffers" and "decoder"), on every TP rank over
# the whole padded vocabulary V, with S the engine's max_seq_len and T its max_num_tokens:
# - runtime buffers (the batch manager, closed source in 0.14: its 2024 copies and the later open
#   decoderBuffers.cpp): the fp32 logits (4 V); cache indirection, once in the engine's and twice in the
#   decoder's buffers, the decoder's fp32 log-probs and each slot's output ids and log-probs, int32 or
#   fp32 per position (24 S); the step's int32 input ids (4 T);
# - decoder (cpp/tensorrt_llm/runtime/gptDecoderBatched.cpp GptDecoderBatched::setup, gptDecoder.cpp
#   and the sampling layers at v0.14.0, commit b0880169): ids, parent ids, log-probs and tiled
#   log-probs per position (16 S); the fp32 embedding bias, the decoding workspace's copy of the
#   logits, the penalty layer's int32 occurrence table and top-k's fp32 log-probs (16 V); top-k's
#   candidate ids and values, 1,024 x 8 of each (65,536 B), and ~240 B of per-slot scalars.
# Checked against TensorRT-LLM's logs: NVIDIA/TensorRT-LLM issue #1188 (Qwen2.5-0.5B, V 151,936,
# S 32,768, 2,048 slots: "2.66 GB" and "5.76 GB", GiB in its memory counters; the terms give 2.659 and
# 5.762) and docs/source/reference/memory.md (V 32,000, S 2,048, 256 slots: 43.29 and 180.30 MiB; the
# decoder of versions up to 0.13 held one more fp32 B x V buffer, its draft logits). Under pipeline
# parallelism they sit on the last stage; the plan below counts them on the GPU it models, the first.
DECODER_BUFFERS = ("logits", "trtllm")
TRTLLM_SLOT_BYTES_PER_VOCAB = 4.0 + 16.0
TRTLLM_SLOT_BYTES_PER_POSITION = 24.0 + 16.0
TRTLLM_SLOT_BYTES = 65_536.0 + 240.0
TRTLLM_STEP_BYTES_PER_TOKEN = 4.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaMemory:
    """Per-GPU bytes of a replica and the KV capacity they leave."""

    budget_bytes: float  # memory the engine may use: engine_memory_bytes x gpu_memory_utilization (vLLM) or all of it (TensorRT-LLM)
    weights_bytes: float
    workspace_bytes: float
    comm_bytes: float
    runtime_bytes: float  # what the process holds outside its own allocations (CUDA context, library handles)
    kv_bytes: float  # left for the KV cache (may be negative: does not fit)
    kv_bytes_per_token: float  # per GPU
    block_size: int
    num_blocks: int  # of the replica: ep groups each hold their own requests' KV

    @property
    def fits(self) -> bool:
        return self.num_blocks > 0

    @property
    def shortfall_bytes(self) -> float:
        """Bytes missing for even one KV block (0 when it fits)."""
        return max(0.0, self.block_size * self.kv_bytes_per_token - self.kv_bytes)

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size


def kv_bytes_per_token_per_gpu(shape: ReplicaShape) -> float:
    """KV bytes one token costs on one GPU: layers split by pp; KV heads split by tp (a head cannot
    be split: with more ranks than KV heads each rank keeps one); MLA's latent is replicated."""
    model = shape.model
    total = model.kv_cache_bytes_per_token(bytes_per_element(shape.kv_precision))
    layers_share = math.ceil(model.layers / shape.pp) / model.layers
    if model.is_mla:
        head_share = 1.0
    else:
        head_share = math.ceil(model.kv_heads / shape.tp) / model.kv_heads
    return total * layers_share * head_share


def routed_expert_parameters(model: ModelSpec) -> int:
    """Parameters of every routed expert of every MoE layer (what expert parallelism splits)."""
    if not model.is_moe:
        return 0
    return model.moe_layers * model.experts * model.mlp_parameters(model.expert_ffn_hidden)


def weights_bytes_per_gpu(shape: ReplicaShape) -> float:
    """Weights on one GPU: every parameter split over tp x pp (vocab-parallel embeddings included);
    with ep > 1 the routed experts are further split over the ep groups while the rest (attention,
    dense layers, router, shared experts, embeddings) is replicated in each group."""
    model = shape.model
    experts = routed_expert_parameters(model) if shape.ep > 1 else 0
    rest = model.total_parameters() - experts
    per_gpu = rest / (shape.tp * shape.pp) + experts / (shape.tp * shape.ep * shape.pp)
    return per_gpu * bytes_per_element(shape.weight_precision)


def workspace_bytes_per_gpu(
    shape: ReplicaShape, max_batched_tokens: int, max_num_seqs: int, gathered_logits: bool = False,
    decoder_buffers: str = "logits", max_seq_len: int = 0,
) -> float:
    """Peak activation memory of the largest step (vLLM profiles exactly this with a dummy batch of
    ``max_batched_tokens``): the layer input and residual (2 h), the QKV output, and the MLP
    intermediate (gate and up, then the activated product) of the rank, in activation precision,
    plus the sampling buffers of ``max_num_seqs`` sequences (``decoder_buffers``, see
    ``DECODER_BUFFERS``; "logits": their fp32 logits over the rank's vocab shard, over the whole
    padded vocabulary when the stack gathers the logits onto every rank, ``gathered_logits``;
    "trtllm" also needs ``max_seq_len``, the engine's longest sequence)."""
    if decoder_buffers not in DECODER_BUFFERS:
        raise ValueError(f"decoder_buffers = {decoder_buffers!r}; allowed: {', '.join(DECODER_BUFFERS)}")
    model = shape.model
    a = bytes_per_element(shape.activation_precision)
    tp = shape.tp
    head_dim = model.head_dim if not model.is_mla else model.qk_nope_head_dim + model.qk_rope_head_dim
    qkv = (math.ceil(model.heads / tp) + 2 * math.ceil(model.kv_heads / tp)) * head_dim
    ffn = model.expert_ffn_hidden * model.experts_per_token if model.is_moe else model.ffn_hidden
    gate = 2 if model.gated_mlp else 1
    mlp = (gate + 1) * math.ceil(ffn / tp)
    per_token = (2 * model.hidden + max(qkv, mlp)) * a
    # with ep groups each GPU holds its group's share of the step (see ReplicaShape)
    tokens = math.ceil(max_batched_tokens / shape.ep)
    seqs = math.ceil(max_num_seqs / shape.ep)
    if decoder_buffers == "trtllm":
        padded_vocab = math.ceil(model.vocab / tp) * tp
        return tokens * per_token + trtllm_slot_buffer_bytes(padded_vocab, max_seq_len, seqs, tokens)
    vocab = math.ceil(model.vocab / tp) * (tp if gathered_logits else 1)
    return tokens * per_token + seqs * vocab * LOGIT_BYTES


def trtllm_slot_buffer_bytes(padded_vocab: int, max_seq_len: int, max_batch_size: int, max_num_tokens: int) -> float:
    """TensorRT-LLM 0.14's runtime and decoder buffers (the two lines its executor logs) of an engine
    with these limits, on each rank (see ``DECODER_BUFFERS``)."""
    per_slot = TRTLLM_SLOT_BYTES_PER_VOCAB * padded_vocab + TRTLLM_SLOT_BYTES_PER_POSITION * max_seq_len + TRTLLM_SLOT_BYTES
    return max_batch_size * per_slot + TRTLLM_STEP_BYTES_PER_TOKEN * max_num_tokens


def replica_memory(
    shape: ReplicaShape, *, gpu_memory_utilization: float, block_size: int, max_batched_tokens: int, max_num_seqs: int,
    kv_cache_memory: str = "total_fraction", gathered_logits: bool = False, runtime_reserve_bytes: float = 0.0,
    decoder_buffers: str = "logits", max_seq_len: int = 0,
) -> ReplicaMemory:
    """The memory plan of one replica GPU (the most loaded one: the first pipeline stage), out of the
    device memory the CUDA runtime reports (``GpuSpec.engine_memory_bytes``).
    ``kv_cache_memory``: "total_fraction" (vLLM) budgets ``gpu_memory_utilization`` of the whole GPU
    and gives KV what weights, workspace and buffers leave of it; "free_fraction" (TensorRT-LLM's
    free_gpu_memory_fraction) gives KV that fraction of what they leave of the whole GPU.
    ``runtime_reserve_bytes``: device memory the process holds before it sizes its KV cache that none
    of its own allocations account for (CUDA context, cuBLAS handles and workspaces), as much of it
    as the stack's KV budget sees (see the stacks' ``runtime_reserve_MiB``). ``decoder_buffers`` and
    ``max_seq_len``: see ``workspace_bytes_per_gpu``."""
    # the device memory the engine sees: the CUDA runtime's total where the catalog gives it (79.11 GiB
    # on an H100 SXM 80GB), which both the vLLM and TensorRT-LLM budgets are fractions of
    capacity = shape.cluster.gpu.engine_memory_bytes
    weights = weights_bytes_per_gpu(shape)
    workspace = workspace_bytes_per_gpu(shape, max_batched_tokens, max_num_seqs, gathered_logits, decoder_buffers, max_seq_len)
    comm = NCCL_BUFFER_BYTES if shape.num_gpus > 1 else 0.0
    held = weights + workspace + comm + runtime_reserve_bytes
    if kv_cache_memory == "free_fraction":
        budget = capacity
        kv = (capacity - held) * gpu_memory_utilization
    else:
        budget = capacity * gpu_memory_utilization
        kv = budget - held
    per_token = kv_bytes_per_token_per_gpu(shape)
    blocks = shape.ep * max(0, int(kv // (block_size * per_token))) if kv > 0 else 0
    return ReplicaMemory(
        budget_bytes=budget, weights_bytes=weights, workspace_bytes=workspace, comm_bytes=comm,
        runtime_bytes=runtime_reserve_bytes, kv_bytes=kv,
        kv_bytes_per_token=per_token, block_size=block_size, num_blocks=blocks,
    )
