"""Step time of one serving replica for a batch as it is: the layer op graph of
``workloads.graph`` (GEMMs on the step's total tokens, attention per request, TP collectives)
priced by ``sim.costmodel`` (the one op -> cost mapping), plus the LM head and sampling on the
sampled positions only, pipeline-stage transfers, and fixed CPU overheads per step and per request.

Exact caching: every op except attention depends on the step's token count alone, so their price is
cached per token count; attention is priced per step on the chunks' own (query, key) lengths.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from operator import attrgetter
from typing import Sequence

from hardware.cost import attention_keys_processed, launch_overhead_s, single_query_keys_processed
from hardware.topology import Cluster
from sim.costmodel import attention_totals_time_s, op_time_s, price_ops
from sim.serving.plan import Chunk, StepPlan
from workloads.graph import Op, Sharding, embedding_ops, layer_forward_ops, lm_head_ops
from workloads.model import ModelSpec
from workloads.precision import bytes_per_element

# Decode-attention kernels. "shared_kv": one thread block serves all query heads of a KV head (FlashAttention,
# FlashInfer, TensorRT-LLM XQA), so K/V stream from HBM once per KV head. "per_query_head": one thread block
# per query head (TensorRT-LLM's masked-MHA kernel: "the vanilla implementation that uses a single CUDA
# thread-block per head", TensorRT-LLM docs/source/advanced/gpt-attention.md, multi-block mode section), so
# with GQA each of the heads/kv_heads query heads of a group reads the group's K/V again; the re-reads hit in
# L2 (the group's blocks run together) and the kernel is bound by max(HBM bytes of the distinct K/V, L2 bytes of
# every query head's K/V / L2 bandwidth).
DECODE_ATTENTION_KERNELS = ("shared_kv", "per_query_head")
# Rules a serving stack names for its decode-attention kernel: a kernel above, or "xqa" (TensorRT-LLM's
# dispatch, ``xqa_decode_attention``).
DECODE_ATTENTION_RULES = (*DECODE_ATTENTION_KERNELS, "xqa")


def xqa_decode_attention(model: ModelSpec, tp: int) -> str:
    """TensorRT-LLM's choice of decode-attention kernel. Its XQA kernel (query heads of a KV group
    share the K/V loads) runs only for head size 128 with exactly 8 query heads per KV head and 1, 2, 4
    or 8 KV heads per rank, and no cyclic (sliding-window) KV cache (``DecoderXQARunner::shouldUse`` in
    NVIDIA/TensorRT-LLM cpp/tensorrt_llm/kernels/decoderMaskedMultiheadAttention/decoderXQARunner.h, the
    v0.9-era version); everything else runs the masked-MHA kernel, one thread block per query head."""
    kv_heads = max(1, model.kv_heads // tp)
    heads = model.heads // tp
    xqa = (model.head_dim == 128 and heads == 8 * kv_heads and kv_heads in (1, 2, 4, 8)
           and model.sliding_window is None)
    return "shared_kv" if xqa else "per_query_head"


def decode_attention_kernel(rule: str, model: ModelSpec, tp: int) -> str:
    """The kernel a stack's decode-attention ``rule`` picks for ``model`` on ``tp`` ranks."""
    if rule == "xqa":
        return xqa_decode_attention(model, tp)
    if rule not in DECODE_ATTENTION_KERNELS:
        raise ValueError(f"decode_attention = {rule!r}; allowed: {', '.join(DECODE_ATTENTION_RULES)}")
    return rule

# What happens to the vocab-parallel logits under tensor parallelism: "shard" (each rank samples its own
# vocabulary shard, nothing exchanged) or "all_gather" (TensorRT-LLM's LM head is a ColumnLinear with
# gather_output=True: the 16-bit logits of the sampled positions, vocabulary padded to a multiple of tp,
# are all-gathered onto every rank, and each rank's decoder samples the full vocabulary).
TP_LOGITS = ("shard", "all_gather")

# Per-call host cost of a stack's own all-reduce kernel: "collective" (what a framework pays per NCCL call,
# hardware.collectives.COLLECTIVE_LAUNCH_OVERHEAD_S) or "kernel" (one kernel launch, the GPU's launch
# overhead: TensorRT-LLM's AllReduce plugin enqueues its one-shot / two-shot kernel inside the engine's
# enqueue, with no host synchronisation).
CUSTOM_ALL_REDUCE_LAUNCHES = ("collective", "kernel")


def trtllm_all_reduce_workspace_bytes(ranks: int) -> float:
    """The largest all-reduce TensorRT-LLM's AllReduce plugin runs with its own kernel under
    AllReduceStrategy AUTO: its workspace, 16,000,000 B for up to 2 ranks and 8,000,000 B above
    (cpp/tensorrt_llm/common/customAllReduceUtils.h getMaxRequiredWorkspaceSize, the 0.9-0.14 versions);
    larger messages run NCCL (cpp/tensorrt_llm/plugins/ncclPlugin/allreducePlugin.cpp selectImplementation)."""
    return 16e6 if ranks <= 2 else 8e6
# CUDA-graph rules of serving stacks: how a decode-only step's batch is padded to the batch sizes the
# stack captured graphs at ("none": no padding). "vllm-v0": vLLM 0.5.x ModelRunner (vllm/worker/
# model_runner.py, v0.5.3): a decode-only step of at most 256 sequences (_BATCH_SIZES_TO_CAPTURE =
# [1, 2, 4] + [8 i for i in 1..32]) whose longest sequence is at most max_seq_len_to_capture (EngineArgs
# default 8192) replays the graph of _get_graph_batch_size(batch): 1, 2, 4, then the next multiple of 8;
# the padding slots run every layer's GEMMs and elementwise ops (input token 0, sequence length 1) and are
# dropped before the LM head (_prune_hidden_states); other steps run eagerly, unpadded.
CUDA_GRAPH_RULES = ("none", "vllm-v0")
VLLM_V0_GRAPH_MAX_BATCH = 256
VLLM_V0_GRAPH_MAX_SEQ_LEN = 8192
VLLM_V0_GRAPH_ALIGNMENT = 8


def cuda_graph_batch(rule: str, batch: int, longest_seq_tokens: int) -> int | None:
    """The batch size a decode-only step of ``batch`` sequences (the longest ``longest_seq_tokens``
    tokens with the new one) runs at under CUDA-graph ``rule``; None when it runs eagerly."""
    if rule == "none":
        return None
    if rule != "vllm-v0":
        raise ValueError(f"cuda_graph_padding = {rule!r}; allowed: {', '.join(CUDA_GRAPH_RULES)}")
    if batch > VLLM_V0_GRAPH_MAX_BATCH or longest_seq_tokens > VLLM_V0_GRAPH_MAX_SEQ_LEN:
        return None
    if batch <= 2:
        return batch
    if batch <= 4:
        return 4
    return -(-batch // VLLM_V0_GRAPH_ALIGNMENT) * VLLM_V0_GRAPH_ALIGNMENT


# Sampling reads the fp32 logits of each sampled position once for softmax/top-p and once for the
# draw (vLLM's sampler: logits.float(), softmax, then multinomial sampling): 2 passes x 4 bytes.
SAMPLER_PASSES = 2
LOGIT_BYTES = 4.0


def compute_precision(weight_precision: str, activation_precision: str) -> str:
    """Peak the GEMMs run at: fp8 weights use fp8 tensor cores (W8A8, as TensorRT-LLM/vLLM FP8);
    int8/int4 weight-only quantization dequantizes to the activation precision. No separate
    activation-quantization kernel is priced (shipped fp8 surfaces time the GEMM alone): TensorRT-LLM's
    FP8Linear quantizes with the checkpoint's static input scale (a pointwise quantize layer, no amax
    pass, which TensorRT can fuse into the kernel producing the input) and takes an fp8 input as it is
    (tensorrt_llm/quantization/layers.py FP8Linear.forward). vLLM's dynamic per-tensor quantization
    without its RMSNorm fusion is a kernel of its own, not modelled."""
    return "fp8" if weight_precision == "fp8" else activation_precision


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaShape:
    """What a replica runs: model, GPUs (the ``tp * ep * pp`` ranks from ``first_rank``), precisions.

    With ``ep > 1`` (MoE only) each pipeline stage is ``ep`` groups of ``tp`` GPUs: attention and the
    dense parts run tensor-parallel within a group, each group on its own share of the batch (data
    parallel across groups); the routed experts are split over the ``ep`` groups (``experts / ep`` per
    group, each expert's FFN split over the group's ``tp`` GPUs), and tokens reach their experts by an
    all-to-all dispatch and return by an all-to-all combine across the groups (ranks ``tp`` apart).
    """

    model: ModelSpec
    cluster: Cluster
    tp: int
    pp: int = 1
    ep: int = 1
    weight_precision: str = "bf16"
    kv_precision: str = "bf16"
    activation_precision: str = "bf16"
    first_rank: int = 0

    def __post_init__(self) -> None:
        if self.ep > 1:
            experts = self.model.experts if self.model.is_moe else 0
            if experts == 0 or experts % self.ep:
                raise ValueError(
                    f"ep = {self.ep} must divide the routed experts of {self.model.name} ({experts}); "
                    "expert parallelism needs an MoE model"
                )

    @property
    def num_gpus(self) -> int:
        return self.tp * self.ep * self.pp


class StepCostModel:
    """Seconds of one batch step on a replica (``step_time_s``), with the CPU overheads given."""

    def __init__(
        self,
        shape: ReplicaShape,
        *,
        step_overhead_s: float,
        request_overhead_s: float,
        draft: StepCostModel | None = None,
        draft_free_overhead: float = 0.0,
        decode_attention: str = "shared_kv",
        tp_all_reduce: str = "nccl",
        custom_all_reduce_max_bytes: float = 0.0,
        cuda_graph_padding: str = "none",
        api_server_token_overhead_s: float = 0.0,
        tp_logits: str = "shard",
        custom_all_reduce_launch: str = "collective",
    ) -> None:
        if decode_attention not in DECODE_ATTENTION_KERNELS:
            raise ValueError(f"decode_attention = {decode_attention!r}; allowed: {', '.join(DECODE_ATTENTION_KERNELS)}")
        cuda_graph_batch(cuda_graph_padding, 1, 1)  # validates the rule
        if tp_logits not in TP_LOGITS:
            raise ValueError(f"tp_logits = {tp_logits!r}; allowed: {', '.join(TP_LOGITS)}")
        self.tp_logits = tp_logits
        if custom_all_reduce_launch not in CUSTOM_ALL_REDUCE_LAUNCHES:
            raise ValueError(f"custom_all_reduce_launch = {custom_all_reduce_launch!r}; "
                             f"allowed: {', '.join(CUSTOM_ALL_REDUCE_LAUNCHES)}")
        self.decode_attention = decode_attention
        self.cuda_graph_padding = cuda_graph_padding
        # host time per token streamed through an API server that shares the engine's process (0: none,
        # or a server in its own process), paid serially like the other CPU overheads
        self.api_server_token_overhead_s = api_server_token_overhead_s
        self.shape = shape
        self.step_overhead_s = step_overhead_s
        self.request_overhead_s = request_overhead_s
        self.draft = draft
        self.draft_free_overhead = draft_free_overhead
        # speculative statistics of the steps priced by ``step_time_s`` (the engine's steps)
        self.speculative_steps = 0
        self.speculative_step_s = 0.0  # time of the steps that drafted
        self.draft_s = 0.0  # of which drafting (the draft model's passes, or draft-free heads' overhead)
        self._last_draft_s = 0.0
        model, cluster = shape.model, shape.cluster
        self._gpu = cluster.gpu
        self._precision = compute_precision(shape.weight_precision, shape.activation_precision)
        self._act_bpe = bytes_per_element(shape.activation_precision)
        self._w_bpe = bytes_per_element(shape.weight_precision)
        self._kv_bpe = bytes_per_element(shape.kv_precision)
        ranks = list(range(shape.first_rank, shape.first_rank + shape.tp))
        self._links = {"tp": cluster.group_links(ranks)}
        tp_calibration = self._links["tp"].calibration
        custom_max_bytes = custom_all_reduce_max_bytes
        if tp_all_reduce == "trtllm" and custom_max_bytes == 0:
            custom_max_bytes = trtllm_all_reduce_workspace_bytes(shape.tp)
        if tp_all_reduce != "nccl" and custom_all_reduce_launch == "kernel" and custom_max_bytes > 0:
            # the stack's own kernel, measured or not, is one kernel launch per call within its size limit
            self._links["tp"] = replace(self._links["tp"], kernel_all_reduce_max_bytes=custom_max_bytes,
                                        kernel_launch_s=launch_overhead_s(self._gpu))
        if tp_all_reduce != "nccl" and tp_calibration is not None:
            # the stack's own all-reduce kernel where the GPU's profile measured it, up to the stack's size
            # limit for it (``for_tp_all_reduce``; 0 for TensorRT-LLM: its plugin's workspace), each call
            # paying the host cost of how the stack launches it
            self._links["tp"] = replace(self._links["tp"], calibration=tp_calibration.for_tp_all_reduce(
                tp_all_reduce, custom_max_bytes))
        stage_gpus = shape.tp * shape.ep
        if shape.ep > 1:
            self._links["ep"] = cluster.group_links([shape.first_rank + i * shape.tp for i in range(shape.ep)])
        if shape.pp > 1:
            self._links["pp"] = cluster.group_links([shape.first_rank, shape.first_rank + stage_gpus])
        self._ep = shape.ep
        self._sharding = Sharding(tp=shape.tp, ep=shape.ep)
        self._dense_layers = model.layers - model.moe_layers
        self._moe_layers = model.moe_layers
        self._window = model.sliding_window
        self._token_cache: dict[int, float] = {}
        self._head_cache: dict[int, float] = {}
        # attention template: the layer's attention op with the rank's head counts
        probe = self._layer_ops(1, moe=False, sequences=((1, 1),))
        self._attention = replace(
            next(op for op in probe if op.kind == "attention"), sequences=(), bytes_per_element=self._kv_bpe
        )

    # ---- pieces ------------------------------------------------------------------------------------
    def _layer_ops(self, tokens: int, *, moe: bool, sequences: Sequence[tuple[int, int]] = ()) -> list[Op]:
        return layer_forward_ops(
            self.shape.model,
            tokens=tokens,
            sequences=sequences,
            sharding=self._sharding,
            moe=moe,
            bytes_per_element=self._act_bpe,
            weight_bytes_per_element=self._w_bpe,
        )

    def _price(self, ops: Sequence[Op]) -> float:
        return price_ops(ops, self._gpu, precision=self._precision, links=self._links).total_s

    def token_time_s(self, tokens: int) -> float:
        """Every op of the forward pass except attention and the LM head, for ``tokens`` tokens."""
        cached = self._token_cache.get(tokens)
        if cached is not None:
            return cached
        full_tokens = tokens
        tokens = -(-tokens // self._ep)  # the busiest expert-parallel group's share of the batch
        seconds = 0.0
        if self._dense_layers:
            seconds += self._dense_layers * self._price(self._layer_ops(tokens, moe=False))
        if self._moe_layers:
            seconds += self._moe_layers * self._price(self._layer_ops(tokens, moe=True))
        model = self.shape.model
        seconds += self._price(embedding_ops(model, tokens=tokens, sharding=self._sharding, bytes_per_element=self._act_bpe))
        if self.shape.pp > 1:
            message = tokens * model.hidden * self._act_bpe
            hop = Op(name="pp_send", kind="collective", collective="send_recv", axis="pp", message_bytes=message)
            seconds += (self.shape.pp - 1) * op_time_s(hop, self._gpu, precision=self._precision, links=self._links)
        self._token_cache[full_tokens] = seconds
        return seconds

    def pipeline_hop_s(self, tokens: int) -> float:
        """One activation transfer between adjacent pipeline stages for a step of ``tokens`` tokens
        (the hop ``token_time_s`` counts ``pp - 1`` times; 0 without pipeline parallelism)."""
        if self.shape.pp <= 1:
            return 0.0
        share = -(-tokens // self._ep)
        hop = Op(name="pp_send", kind="collective", collective="send_recv", axis="pp",
                 message_bytes=share * self.shape.model.hidden * self._act_bpe)
        return op_time_s(hop, self._gpu, precision=self._precision, links=self._links)

    def head_time_s(self, sampled: int) -> float:
        """LM head (vocab-parallel, no loss) and the sampler for ``sampled`` positions; with
        ``tp_logits = "all_gather"`` and tp > 1 the logits are all-gathered first and every rank's
        sampler reads the full (padded) vocabulary."""
        cached = self._head_cache.get(sampled)
        if cached is not None:
            return cached
        full_sampled = sampled
        sampled = -(-sampled // self._ep)  # each expert-parallel group samples its own requests
        model = self.shape.model
        ops = lm_head_ops(
            model, tokens=sampled, sharding=self._sharding, bytes_per_element=self._act_bpe,
            weight_bytes_per_element=self._w_bpe, loss=False,
        )
        tp = self.shape.tp
        vocab_shard = -(-model.vocab // tp)
        sampled_vocab = vocab_shard
        if self.tp_logits == "all_gather" and tp > 1:
            sampled_vocab = vocab_shard * tp  # the padded vocabulary, gathered onto every rank
            ops.append(Op(name="logits_all_gather", kind="collective", collective="all_gather", axis="tp",
                          message_bytes=sampled * sampled_vocab * self._act_bpe))
        ops.append(Op(name="sampler", kind="memory", bytes_moved=SAMPLER_PASSES * sampled * sampled_vocab * LOGIT_BYTES))
        seconds = self._price(ops)
        self._head_cache[full_sampled] = seconds
        return seconds

    def attention_time_s(self, sequences: Sequence[tuple[int, int]]) -> float:
        """All layers' attention for (query tokens, key tokens) per request, keys capped by a sliding window."""
        if not sequences:
            return 0.0
        if self._window is not None:
            w = self._window
            sequences = [(q, min(kv, q + w - 1)) for q, kv in sequences]
        if self._ep > 1:
            return max(self._group_attention_s(group) for group in _balance(sequences, self._ep))
        return self._group_attention_s(sequences)

    def _group_attention_s(self, sequences: Sequence[tuple[int, int]]) -> float:
        """All layers' attention of one tensor-parallel group over its ``sequences``."""
        if not sequences:
            return 0.0
        if self.decode_attention == "per_query_head":
            decodes = [s for s in sequences if s[0] == 1]
            if decodes:
                others = [s for s in sequences if s[0] != 1]
                return self.shape.model.layers * (self._per_query_head_decode_s(decodes) + self._attention_op_s(others))
        return self.shape.model.layers * self._attention_op_s(sequences)

    def _attention_op_s(self, sequences: Sequence[tuple[int, int]]) -> float:
        """One layer's fused attention kernel over ``sequences`` (0 for none)."""
        if not sequences:
            return 0.0
        t = self._attention
        op = Op(name=t.name, kind=t.kind, sequences=tuple(sequences), heads=t.heads, kv_heads=t.kv_heads,
                head_dim=t.head_dim, v_head_dim=t.v_head_dim, causal=t.causal, bytes_per_element=t.bytes_per_element)
        return op_time_s(op, self._gpu, precision=self._precision, links=self._links)

    def _per_query_head_decode_s(self, decodes: Sequence[tuple[int, int]]) -> float:
        """One layer's decode attention by a kernel with one thread block per query head."""
        return self._per_query_head_bound_s(self._attention_op_s(decodes), sum(kv for _, kv in decodes))

    def _per_query_head_bound_s(self, shared_kv_s: float, keys: int) -> float:
        """One layer's decode attention over ``keys`` keys by a kernel with one thread block per query
        head: the shared-KV kernel's time ``shared_kv_s`` (compute, distinct K/V bytes from HBM) or, if
        longer, every query head's K/V read through L2 at the GPU's measured L2 bandwidth (HBM
        bandwidth, a lower bound, when not measured)."""
        t = self._attention
        gpu = self._gpu
        l2_bytes = keys * t.heads * (t.head_dim + (t.v_head_dim or t.head_dim)) * t.bytes_per_element
        l2_Bps = gpu.l2_bandwidth_Bps or gpu.hbm_bandwidth_Bps * gpu.efficiency.memory
        return max(shared_kv_s, l2_bytes / l2_Bps + launch_overhead_s(gpu))

    def chunks_attention_time_s(self, chunks: Sequence[Chunk]) -> float:
        """``attention_time_s`` of the chunks' (query, key) pairs, priced from sums over the chunks:
        a step's thousands of single-query chunks (decodes) are summed in bulk and only the others
        (prompt chunks, verifications of drafts) one by one, with no list of pairs. The same float:
        every sum is of integers and half-integers, exact in floating point."""
        if self._window is not None or self._ep > 1:  # keys capped per sequence, or sequences balanced over groups
            return self.attention_time_s([(c.query_tokens, c.context_tokens + c.query_tokens) for c in chunks])
        if not chunks:
            return 0.0
        queries = list(map(_query_tokens, chunks))
        contexts = list(map(_context_tokens, chunks))
        singles = queries.count(1)
        others = [] if singles == len(queries) else [(q, c + q) for q, c in zip(queries, contexts) if q != 1]
        single_keys = sum(contexts) - sum(kv - q for q, kv in others) + singles
        causal = self._attention.causal
        single_processed = single_query_keys_processed(singles, single_keys, causal=causal)
        other_queries = sum(q for q, _ in others)
        other_keys = sum(kv for _, kv in others)
        other_processed = 0.0
        for q, kv in others:
            other_processed += attention_keys_processed(q, kv, causal=causal)
        layers = self.shape.model.layers
        if self.decode_attention == "per_query_head" and singles:
            decode_s = self._per_query_head_bound_s(
                self._attention_totals_s(singles, singles, single_keys, single_processed), single_keys)
            others_s = self._attention_totals_s(len(others), other_queries, other_keys, other_processed)
            return layers * (decode_s + others_s)
        return layers * self._attention_totals_s(len(queries), singles + other_queries, single_keys + other_keys,
                                                 single_processed + other_processed)

    def _attention_totals_s(self, sequences: int, query_tokens: int, key_tokens: int, keys_processed: float) -> float:
        """One layer's fused attention kernel over a batch given by its sums (0 for no sequences)."""
        return attention_totals_time_s(self._attention, self._gpu, precision=self._precision, num_sequences=sequences,
                                       query_tokens=query_tokens, key_tokens=key_tokens, keys_processed=keys_processed)

    def cost_sources(self, prompt_tokens: int, output_tokens: int) -> dict[str, float]:
        """Fractions of one request's op time served alone (prefill of ``prompt_tokens``, then
        ``output_tokens`` - 1 decode steps at the mean context) that came from a measured calibration
        profile, a transferred one or the roofline model (``sim.costmodel.op_cost_source``)."""
        from sim.costmodel import source_fractions, tally_cost_sources

        caches = self._token_cache, self._head_cache
        self._token_cache, self._head_cache = {}, {}  # price afresh so every op is counted
        try:
            with tally_cost_sources() as prefill:
                self.forward_time_s(prompt_tokens, [(prompt_tokens, prompt_tokens)], 1)
            decodes = max(0, output_tokens - 1)
            context = prompt_tokens + max(1, decodes // 2)
            with tally_cost_sources() as decode:
                self.forward_time_s(1, [(1, context)], 1)
        finally:
            self._token_cache, self._head_cache = caches
        return source_fractions({k: prefill[k] + decodes * decode[k] for k in prefill})

    def forward_time_s(self, tokens: int, sequences: Sequence[tuple[int, int]], sampled: int) -> float:
        """One forward pass of ``tokens`` tokens over ``sequences``, sampling ``sampled`` positions."""
        return self.token_time_s(tokens) + self.attention_time_s(sequences) + self.head_time_s(sampled)

    # ---- a step --------------------------------------------------------------------------------------
    def step_time_s(self, plan: StepPlan) -> float:
        """Seconds from the start of ``plan`` to its sampled tokens (GPU work plus CPU overheads)."""
        chunks = plan.chunks
        if not chunks:
            return self.step_overhead_s
        # positions whose logits are sampled: the last token of each chunk, all k+1 of a verification
        sampled = plan.num_decode_tokens + len(chunks) - plan.num_decode_chunks
        drafts = 0
        decode_contexts: list[int] = []
        if plan.num_decode_tokens > plan.num_decode_chunks:  # some decode verifies drafts
            drafts = max(c.query_tokens for c in chunks if c.is_decode) - 1
            decode_contexts = [c.context_tokens for c in chunks if c.is_decode]
        tokens = plan.num_tokens
        if self.cuda_graph_padding != "none" and plan.num_prefill_tokens == 0 and tokens == len(chunks):
            # a decode-only step of one token per sequence: replayed at the captured batch size
            longest = max(map(_context_tokens, chunks)) + 1
            tokens = cuda_graph_batch(self.cuda_graph_padding, tokens, longest) or tokens
        seconds = self._batch_time_s(tokens, self.chunks_attention_time_s(chunks), len(chunks), sampled,
                                     drafts=drafts, decode_contexts=decode_contexts)
        if self.api_server_token_overhead_s:
            seconds += self.api_server_token_overhead_s * streamed_tokens(plan)
        if drafts > 0:
            self.speculative_steps += 1
            self.speculative_step_s += seconds
            self.draft_s += self._last_draft_s
        return seconds

    def host_time_s(self, plan: StepPlan) -> float:
        """The CPU part of ``step_time_s(plan)``: per step, per scheduled sequence, and per token
        streamed through an in-process API server."""
        return (self.step_overhead_s + self.request_overhead_s * len(plan.chunks)
                + self.api_server_token_overhead_s * streamed_tokens(plan))

    def batch_time_s(
        self, tokens: int, sequences: Sequence[tuple[int, int]], sampled: int, *, drafts: int = 0,
        decode_contexts: Sequence[int] = (),
    ) -> float:
        """A step of ``len(sequences)`` requests, given as (query, key) pairs: forward pass, drafting
        of ``drafts`` tokens for the requests decoding at ``decode_contexts``, and CPU overheads."""
        return self._batch_time_s(tokens, self.attention_time_s(sequences), len(sequences), sampled,
                                  drafts=drafts, decode_contexts=decode_contexts)

    def _batch_time_s(
        self, tokens: int, attention_s: float, requests: int, sampled: int, *, drafts: int,
        decode_contexts: Sequence[int],
    ) -> float:
        """``batch_time_s`` with the attention of its ``requests`` sequences already priced."""
        seconds = self.token_time_s(tokens) + attention_s + self.head_time_s(sampled)
        self._last_draft_s = 0.0
        if drafts > 0:
            if self.draft is not None:
                decode = [(1, context + 1) for context in decode_contexts]
                self._last_draft_s = drafts * self.draft.forward_time_s(len(decode), decode, len(decode))
            else:
                self._last_draft_s = seconds * self.draft_free_overhead
            seconds += self._last_draft_s
        return seconds + self.step_overhead_s + self.request_overhead_s * requests


_query_tokens = attrgetter("query_tokens")
_context_tokens = attrgetter("context_tokens")


def streamed_tokens(plan: StepPlan) -> int:
    """Sequences of ``plan`` that emit a token this step, so that a streaming API server sends one
    chunk for each: every emitting decode, and every prefill chunk that completes its prompt (with the
    tokens already generated, for a recomputed request)."""
    return sum(1 for c in plan.chunks if c.emits and (
        c.is_decode or c.context_tokens + c.query_tokens >= c.request.prompt_tokens + c.request.generated))


def _balance(sequences: Sequence[tuple[int, int]], groups: int) -> list[list[tuple[int, int]]]:
    """Split requests over ``groups`` expert-parallel groups, largest attention work (q x kv) first,
    each to the least loaded group (the longest-processing-time rule a data-parallel balancer uses)."""
    parts: list[list[tuple[int, int]]] = [[] for _ in range(groups)]
    loads = [0] * groups
    for seq in sorted(sequences, key=lambda s: s[0] * s[1] + s[1], reverse=True):
        i = loads.index(min(loads))
        parts[i].append(seq)
        loads[i] += seq[0] * seq[1] + seq[1]
    return parts
