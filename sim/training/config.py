"""``[training]`` and ``[parallel]``: parse, fill defaults, and reject invalid plans with the rule
and the values."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

from hardware.collectives import GroupLinks, num_channels
from hardware import units
from hardware.topology import Cluster
from sim.config import reject_unknown_keys, resolve_cluster, resolve_model, section, supported_precision
from sim.errors import ConfigError
from sim.notices import warn
from sim.stacks import resolve_settings
from sim.training.hetero import StageGroup, place_stages, resolve_groups, stage_groups_for
from sim.training.goodput import CheckpointSpec, FailureSpec, parse_checkpoint, parse_failures
from sim.training.schedules import FILE_PREFIX, SCHEDULES, V_SHAPES, chunks_per_stage, plan_placement, program_profile
from workloads.errors import InvalidPlanError
from workloads.model import ModelSpec
from workloads.plan import ParallelPlan, TrainingJob, chunk_recompute_counts, stage_layer_counts

TRAINING_KEYS = (
    "seq_len", "global_batch", "micro_batch", "precision", "optimizer", "framework", "attention_kernel",
    "grad_reduce_dtype", "main_grad_accumulation", "optimizer_kernels", "grad_buffer_passes", "linear_bias", "fp8_recipe", "fp8_params", "fp8_bf16_edge_layers",
    "fp8_backward_accumulation", "cross_entropy", "qkv_split", "attention_layout", "fp8_cast_fusion", "fp8_scale_update", "checkpoint",
    "host_forward_op_us", "host_backward_op_us", "selective_recompute", "fsdp_unit",
    "param_gather_pacing", "elementwise", "compile", "fp8_all_gather", "fsdp_kept_after_forward", "tp_gathered_input",
    "moe_expert_gemm", "moe_prob_scaling", "moe_dispatcher", "failures", "dropout",
)
PARALLEL_KEYS = (
    "tp",
    "pp",
    "cp",
    "ep",
    "etp",
    "dp",
    "sequence_parallel",
    "zero",
    "hsdp",
    "schedule",
    "virtual_stages",
    "recompute",
    "recompute_layers",
    "layers_per_stage",
    "tp_comm_overlap",
    "tp_overlap_method",
    "ep_comm_overlap",
    "dp_comm_overlap",
    "pipeline_p2p",
    "offload",
    "cp_comm",
    "vocab_parallel",
    "activation_offload",
    "cp_heads",
    "expert_load_imbalance",
    "overlap_slowdown",
    "stage_groups",
)
ATTENTION_KERNELS = ("flash", "flash2", "flash1", "cudnn", "unfused")
# bytes per gradient element of the data-parallel reduction (and of the main-grad buffer it reduces)
GRAD_REDUCE_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0}

# SMs a communication kernel occupies while it overlaps compute: NCCL runs one thread block per
# channel, its blocks never share an SM with compute kernels, and on a DGX with 8 NICs it uses 16 SMs
# (NCCL maintainer, NVIDIA/nccl#689). Overlapped compute loses that share of the GPU (Calculon models
# the same effect as `processor_usage`); calibratable per run with [parallel] overlap_slowdown.
COMMUNICATION_SMS = 16


def default_overlap_slowdown(sm_count: int) -> float:
    """Compute slowdown (>= 1) while a communication kernel holds COMMUNICATION_SMS of ``sm_count`` SMs."""
    return sm_count / (sm_count - min(COMMUNICATION_SMS, sm_count // 2))


# SMs a point-to-point send/recv kernel holds (one peer each way, as ring attention's K/V passes):
# NCCL sizes P2P channels apart from the ring/tree collectives, and on a node with NICs a send/recv
# needs a fraction of the SMs an all-reduce does (NCCL maintainer, NVIDIA/nccl#1598); measured
# send/recv and all-to-all kernels run on 2-8 SMs where all-gather / reduce-scatter take 32 (same
# thread). The top of that range, and never more than the run's collectives hold.
P2P_COMMUNICATION_SMS = 8


def dp_overlap_slowdown(links: GroupLinks, sm_count: int) -> float:
    """Compute slowdown (>= 1) while a data-parallel collective on ``links`` overlaps compute: NCCL
    runs one thread block per channel and never shares those SMs with compute kernels (NCCL
    maintainer, NVIDIA/nccl#689). Inside one node the collective runs on NCCL's ring channels
    (``hardware.collectives.num_channels``: two per NVLink up to MAXCHANNELS, 24 on DGX A100 as
    nccl-tests#100's HGX A100 log shows, 32 on H100/H200); a group across nodes on COMMUNICATION_SMS
    (16 on a DGX with 8 NICs, NVIDIA/nccl#689; the 3-node H100 log of NVIDIA/nccl#1453 builds 16 channels)."""
    held = num_channels(links) if links.num_nodes <= 1 else COMMUNICATION_SMS
    return sm_count / (sm_count - min(held, sm_count // 2))


def p2p_overlap_slowdown(overlap_slowdown: float, sm_count: int) -> float:
    """Compute slowdown while a send/recv kernel overlaps it: the SMs the run's collectives hold
    (``overlap_slowdown`` = SMs / (SMs - held)), capped at P2P_COMMUNICATION_SMS."""
    held = min(sm_count * (1.0 - 1.0 / overlap_slowdown), P2P_COMMUNICATION_SMS)
    return sm_count / (sm_count - held)


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingSetup:
    """Everything a training run needs, resolved and validated."""

    model: ModelSpec
    cluster: Cluster
    job: TrainingJob
    plan: ParallelPlan
    # "flash" (FlashAttention-2 / cuDNN fused) | "flash2" (the flash-attn 2 library kernel: the FA2
    # rate, no calibration rows) | "flash1" (a FlashAttention-1-class fused kernel, e.g. the 2022
    # Triton kernel) | "cudnn" (cuDNN fused attention, Transformer Engine's choice on Hopper: its
    # measured rate relative to FA2 there, hardware.cost.attention_cudnn_rate) | "unfused" (scores
    # materialised)
    attention_kernel: str
    dp_comm_overlap: bool  # gradient reduce overlapped with backward (Megatron --overlap-grad-reduce)
    expert_load_imbalance: float  # busiest expert's tokens / mean
    overlap_slowdown: float  # >= 1
    # the slowdown while the data-parallel stream overlaps compute; None: from the data-parallel
    # group's NCCL channels (``dp_overlap_slowdown``); a set ``[parallel] overlap_slowdown`` sets both
    data_parallel_overlap_slowdown: float | None = None
    framework: str = "megatron-core"  # the software-stack profile (sim/stacks/training/)
    # weight-gradient accumulation into the main-grad buffer: "fused" (in the GEMM epilogue),
    # "unfused" (a separate add kernel per micro-batch) or "none" (autograd writes .grad)
    main_grad_accumulation: str = "fused"
    # the optimizer step's kernels: "fused" (one multi-tensor-apply pass over the states, Apex /
    # Transformer Engine FusedAdam, torch fused AdamW) | "per_op" (one elementwise kernel per
    # operation of the update, torch's for-loop AdamW / Composer DecoupledAdamW; gradient clipping
    # always scales the gradients); see sim.training.data_parallel.optimizer_bytes_per_parameter
    optimizer_kernels: str = "fused"
    # per-iteration passes over the gradients besides the optimizer's: "shard" (the optimizer zeroes
    # its shard's gradients) | "megatron_ddp" (Megatron-Core's DDP zeroes, pre-scales and NaN-checks
    # the rank's whole gradient buffer); see sim.training.data_parallel.grad_buffer_bytes
    grad_buffer_passes: str = "shard"
    # ZeRO-3 / FSDP parameter gathers: "layer" (one unit per transformer layer plus a root unit with
    # the embedding and LM head, prefetched, a chunk's F or B starting once its first unit is
    # gathered) | "chunk" (one gather of the chunk, waited on whole); see
    # sim.training.data_parallel.param_gather_for_parameters
    fsdp_unit: str = "layer"
    # FSDP units kept gathered from their forward to their backward (fsdp_unit "layer"): "none" |
    # "root" (torch FSDP's root unit: embedding, final norm, LM head) | "root_last_layer" (and the
    # model's last layer, torchtitan); see sim.training.data_parallel.FSDP_KEPT_AFTER_FORWARD
    fsdp_kept_after_forward: str = "none"
    # ZeRO-1/2 parameter all-gather after the optimizer with dp_comm_overlap: "free" (hidden under the
    # next forward) | "bucket" (Megatron-Core's distributed optimizer: bucket by bucket in each
    # chunk's first forward, each bucket's all-gather dispatched once the previous one is waited on);
    # see sim.training.data_parallel.bucket_paced_gathers
    param_gather_pacing: str = "free"
    # the fused QKV projection's split into Q, K, V (fused attention): "none" | "concat" (views; backward
    # concatenates the three gradients) | "concat_copy_v" (and Transformer Engine copies V after RoPE);
    # see sim.training.costs.qkv_split_ops
    qkv_split: str = "none"
    # how an MoE layer runs its experts' matmuls: "grouped" (one grouped kernel over the local experts:
    # priced as one batched GEMM) | "per_expert" (a GEMM kernel per expert, each at its own shape:
    # Transformer Engine's GroupedLinear on Hopper, multi_stream_cublas_gemm); see sim.training.costs
    moe_expert_gemm: str = "grouped"
    # how an MoE layer moves its tokens to the experts: "alltoall" (an NCCL all-to-all of the permuted
    # copies: one per chosen expert) | "flex" (Megatron-Core's flex dispatcher on DeepEP / HybridEP: each
    # token once per node and per rank it reaches); see hardware.collectives.token_dispatch_traffic_bytes
    moe_dispatcher: str = "alltoall"
    # how tp_comm_overlap runs: "userbuffers" (Transformer Engine's comm-GEMM overlap: ring-exchange
    # all-gathers, pipelined and bulk reduce-scatters on SMs of their own) | "symmetric_memory"
    # (PyTorch's micro-pipelined async TP: all-gather and reduce-scatter matmuls in tp chunks with
    # copy-engine transfers, then a reduction kernel); see sim.training.costs._paired_tp_overlap
    tp_overlap_method: str = "userbuffers"
    # pipeline sends: "overlapped" (on their own stream beside compute, Megatron-Core) | "blocking"
    # (Megatron-LM 2021-22: the stage waits for its exchange, and the receiver all-gathers a
    # scatter/gather slice over TP on its compute stream); see sim.training.costs.blocking_p2p_s
    pipeline_p2p: str = "overlapped"
    # biased linear layers: "fused" (bias add and bias gradient in the GEMM epilogues, Transformer
    # Engine / cuBLASLt) | "unfused" (Megatron-LM 2021-22: a separate add after the QKV matmul and
    # a column-sum kernel over each biased linear's output gradient) | "skip_bias_add" (Megatron-Core:
    # the QKV bias in the GEMM epilogue, the other biases added by the next elementwise kernel and
    # their gradients column sums); see sim.training.costs.unfused_bias_add_ops
    linear_bias: str = "fused"
    # fp8 scaling (precision "fp8" only): "delayed" (amax inside the cast kernels, casts fused into
    # norms and activations) | "current" (an amax pass before every cast, no fused casts)
    fp8_recipe: str = "delayed"
    # fp8 casts Transformer Engine fuses into the kernel that produces a GEMM input (precision fp8):
    # "norm_activation" (TE LayerNormLinear and LayerNormMLP: the norm and the MLP activation write
    # fp8), "norm" (Megatron-Core's MLP: TELayerNormColumnParallelLinear fuses the norm's cast, the
    # activation is Megatron's own kernel and TERowParallelLinear casts its input), "none" (every
    # cast a kernel of its own), "compiled" (torchao float8 under torch.compile: the Inductor kernels
    # producing the inputs take the amax, the casts stay kernels); see sim.training.costs.fp8_passes
    fp8_cast_fusion: str = "norm_activation"
    # sequence-parallel all-gathers of an fp8 run moving fp8 (torchao's float8 tensor parallelism);
    # see sim.training.costs.fp8_all_gather_ops
    fp8_all_gather: bool = False
    # delayed scaling's amax-history / scale update: "per_module" (each fp8 module, each pass: TE of
    # 2023) | "fused" (once per fp8_autocast, not priced); see sim.training.costs.fp8_scale_update_ops
    fp8_scale_update: str = "fused"
    # accumulation of the fp8 dgrad and wgrad GEMMs (precision "fp8" only): "split" (partial sums
    # promoted to fp32, Transformer Engine's _2X_ACC_DGRAD/_2X_ACC_WGRAD, torchao's grad_input and
    # grad_weight without use_fast_accum) | "fast"; forward GEMMs use fast accumulation in both
    fp8_backward_accumulation: str = "split"
    # transformer layers at each end of the model an fp8 run keeps in bf16 (Megatron-Core
    # first_last_layers_bf16 with num_layers_at_start/end_in_bf16)
    fp8_bf16_edge_layers: int = 0
    # host dispatch per op (eager PyTorch: Python module code, the ATen dispatcher, the launch), seconds
    # the host spends issuing one forward op / one backward op; the GPU cannot start an op before it
    # is issued (0: the host always runs ahead, as with CUDA graphs); see sim.training.costs._host_dispatch
    host_forward_op_s: float = 0.0
    host_backward_op_s: float = 0.0
    checkpoint: CheckpointSpec | None = None  # [training.checkpoint]
    failures: FailureSpec | None = None  # [training.failures]
    # heterogeneous clusters ([cluster] groups, sim.training.hetero): the groups and the group of
    # every pipeline stage; empty on a homogeneous cluster. ``cluster`` is then the whole job's
    # GPU count on stage 0's group's GPU and node (every stage is priced on its own group's).
    groups: tuple[StageGroup, ...] = ()
    stage_group: tuple[int, ...] = ()

    def bf16_layer(self, layer: int) -> bool:
        """Whether global transformer ``layer`` runs its GEMMs in bf16 during fp8 training (the
        ``fp8_bf16_edge_layers`` first and last layers)."""
        edges = self.fp8_bf16_edge_layers
        return self.job.precision == "fp8" and edges > 0 and (layer < edges or layer >= self.model.layers - edges)

    @property
    def attention_layout(self) -> str:
        """Layout copies around the fused attention kernel: "native" (the kernel reads Q, K, V and
        writes its output in the framework's layout) | "flash_bshd" (Transformer Engine's flash-attn
        backend on [s, b, h, d] tensors, TE 0.8 to 1.x: copies to and from [b, s, h, d]; see
        sim.training.costs.flash_layout_ops) | "torch_sdpa" (PyTorch SDPA on transposed views: GQA's
        repeated K and V, the output's copy; see workloads.eager.sdpa_layout_ops)."""
        return self.job.attention_layout

    @property
    def elementwise(self) -> str:
        """Elementwise chains (norms, RoPE, gated activation, residual adds): "fused" (one kernel per
        chain: fused CUDA / Triton kernels, torch.compile) | "eager" (PyTorch eager: one ATen kernel
        per op) | "eager_fused_norm" (eager, the norms one fused kernel); see workloads.eager."""
        return self.job.elementwise

    @property
    def cross_entropy(self) -> str:
        """The LM-head loss: "unfused" (Megatron's vocab-parallel cross-entropy), "native" (Megatron-Core
        cross_entropy_loss_fusion, torch.compile'd), "te" (Transformer Engine's Triton kernel), "torch"
        / "torch_16bit" (PyTorch's F.cross_entropy on fp32 / 16-bit logits), "xentropy" (flash-attention's
        xentropy kernel on the 16-bit logits, llm-foundry's fused_crossentropy); bytes per logit moved in
        workloads.graph.CROSS_ENTROPY_BYTES, held in sim.training.activations.CROSS_ENTROPY_MEMORY."""
        return self.job.cross_entropy

    @property
    def tp_gathered_input(self) -> str:
        """What a column-parallel linear keeps of its sequence-parallel gathered input: "regather"
        (Megatron, Transformer Engine: the shard, gathered again in backward) | "save" (torch DTensor
        TP: the gathered input the matmul saves); see workloads.plan.TrainingJob."""
        return self.job.tp_gathered_input

    @property
    def moe_prob_scaling(self) -> str:
        """Where an MoE layer multiplies by its router probabilities: "hidden" (an h-wide tensor, the
        routed input or the expert output, kept for the probabilities' gradient) | "activation" (inside
        the expert activation, Megatron-Core's weighted SwiGLU); see workloads.plan.TrainingJob."""
        return self.job.moe_prob_scaling

    @property
    def fused_attention(self) -> bool:
        """Whether attention runs as one fused kernel (no scores in memory)."""
        return self.attention_kernel != "unfused"

    @property
    def grad_reduce_dtype(self) -> str:
        """dtype of the data-parallel gradient reduction and the main-grad buffer: "fp32" | "bf16" | "fp16"."""
        return self.job.grad_reduce_dtype

    @property
    def grad_reduce_bytes(self) -> float:
        return GRAD_REDUCE_BYTES[self.grad_reduce_dtype]

    @property
    def num_microbatches(self) -> int:
        return self.job.num_microbatches(self.plan.dp)


def _int(table: Mapping[str, Any], key: str, where: str, default: int | None = None) -> int:
    value = table.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(f"[{where}] {key} = {value!r} must be an integer")
    return value


def _bool(table: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
    value = table.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(f"[{where}] {key} = {value!r} must be true or false")
    return value


def _hsdp(parallel: Mapping[str, Any]) -> tuple[bool, int]:
    """``[parallel] hsdp`` as (hsdp, shard group size; 0: the ranks inside a node): true, false, 0 (no
    HSDP) or the size of the shard group (ranks of the dp x cp group; INTERFACE.md)."""
    value = parallel.get("hsdp", False)
    if isinstance(value, bool):
        return value, 0
    if not isinstance(value, int) or value < 0:
        raise ConfigError(f"[parallel] hsdp = {value!r} must be true, false or a shard group size (an integer >= 0)")
    return value > 0, value


def _fraction(table: Mapping[str, Any], key: str, where: str) -> float:
    value = table.get(key, 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ConfigError(f"[{where}] {key} = {value!r} must be a number in 0..1")
    return float(value)


def _float(table: Mapping[str, Any], key: str, where: str, default: float, minimum: float, maximum: float) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not minimum <= value <= maximum:
        raise ConfigError(f"[{where}] {key} = {value!r} must be a finite number in [{minimum:g}, {maximum:g}]")
    return float(value)


# Sizes past these are refused with the limit named (docs/configuration.md): no real run needs more,
# and beyond them the arrays and loops of a run stop fitting in memory and time.
MAX_GLOBAL_BATCH = 2**24
MAX_SEQ_LEN = 10_000_000
# Both fidelities execute the schedule program pass by pass (micro-batch x stage x chunk); past this
# many that takes minutes (zb-h1, 8 stages: 2,048 micro-batches 7 s, 65,536 micro-batches 320 s and
# 7 GB on a loaded 2-core machine). The largest published runs use ~33,000 (GPT 1T: 512 x 64).
MAX_SCHEDULE_PASSES = 2**17


def parse_schedule(parallel: Mapping[str, Any], base_dir: Path | None) -> tuple[str, int]:
    """(schedule, chunks per stage) of a ``[parallel]`` table: a ``file:PATH`` schedule resolved
    against ``base_dir`` (the config file's folder), ``virtual_stages`` turned into chunks per stage
    (V shapes 2; hanayo 2 per wave, ``virtual_stages`` = waves; a file what its program holds)."""
    schedule = parallel.get("schedule", "1f1b")
    if not isinstance(schedule, str):
        raise ConfigError(f"[parallel] schedule = {schedule!r} must be a string")
    virtual = _int(parallel, "virtual_stages", "parallel", 1)
    if virtual < 1:
        raise InvalidPlanError(f"parallel.virtual_stages = {virtual} must be >= 1")
    if schedule.startswith(FILE_PREFIX):
        path = Path(schedule[len(FILE_PREFIX):])
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        if not path.is_file():
            raise ConfigError(f"[parallel] schedule = {schedule!r}: no such file {path}")
        schedule = FILE_PREFIX + str(path.resolve())
    elif schedule in V_SHAPES and virtual not in (1, 2):
        raise InvalidPlanError(f"parallel.virtual_stages = {virtual}: schedule '{schedule}' always runs 2 chunks per stage")
    elif schedule not in SCHEDULES:
        return schedule, virtual  # ParallelPlan names the rule
    return schedule, chunks_per_stage(schedule, virtual)


def parse_training(config: Mapping[str, Any], base_dir: Path | None = None) -> TrainingSetup:
    """Resolve model, cluster, job and plan; raise ConfigError / InvalidPlanError naming the rule.
    ``base_dir``: the config file's folder (a ``file:`` schedule resolves against it)."""
    training = section(config, "training")
    # [training]'s own keys first: an inline model's max_seq_len defaults to seq_len, so a missing or
    # misspelled seq_len would otherwise surface as "[model]: missing key 'max_seq_len'"
    reject_unknown_keys(training, "training", TRAINING_KEYS)
    for key in ("seq_len", "global_batch"):
        if key not in training:
            raise ConfigError(f"[training] needs '{key}'")
    seq_len = training.get("seq_len")
    model = resolve_model(config, default_max_seq_len=seq_len if isinstance(seq_len, int) and not isinstance(seq_len, bool) else None)
    parallel = section(config, "parallel", required=False)
    checkpoint, failures = parse_checkpoint(training.get("checkpoint")), parse_failures(training.get("failures"))
    if failures is not None and checkpoint is None:
        raise ConfigError("[training.failures] needs [training.checkpoint] (interval_s, storage_Bps_per_node): without checkpoints a failure loses the whole run")
    reject_unknown_keys(parallel, "parallel", PARALLEL_KEYS)
    for key, limit in (("seq_len", MAX_SEQ_LEN), ("global_batch", MAX_GLOBAL_BATCH), ("micro_batch", MAX_GLOBAL_BATCH)):
        value = training.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > limit:
            raise ConfigError(f"[training] {key} = {value} is past the limit {limit:,}")
    job = TrainingJob(
        seq_len=_int(training, "seq_len", "training"),
        global_batch=_int(training, "global_batch", "training"),
        micro_batch=_int(training, "micro_batch", "training", 1),
        precision=str(training.get("precision", "bf16")),
        optimizer=str(training.get("optimizer", "adam")),
        dropout=training.get("dropout", 0.0),
    )
    stack, settings = resolve_settings("training", config)
    attention_kernel = settings["attention_kernel"]
    grad_reduce = settings["grad_reduce_dtype"]
    if grad_reduce == "auto":
        # Megatron's rule: fp16 training reduces 16-bit gradients, bf16 (and fp8) needs fp32
        grad_reduce = "fp16" if job.precision == "fp16" else "fp32"
    elif grad_reduce == "16bit":
        # the run's 16-bit dtype whatever the precision (Composer FSDP mixed_precision PURE)
        grad_reduce = "fp16" if job.precision == "fp16" else "bf16"
    elif grad_reduce == "bf16" and job.precision == "fp16":
        given = "grad_reduce_dtype = 'bf16'" if "grad_reduce_dtype" in training else (
            f"framework = {stack.name!r} (its grad_reduce_dtype is 'bf16'; set [training] grad_reduce_dtype)")
        raise ConfigError(f"[training] {given} with precision 'fp16'; allowed grad_reduce_dtype with fp16: auto, fp32, 16bit")

    tp = _int(parallel, "tp", "parallel", 1)
    pp = _int(parallel, "pp", "parallel", 1)
    cp = _int(parallel, "cp", "parallel", 1)
    for name, value in (("tp", tp), ("pp", pp), ("cp", cp)):
        if value < 1:
            raise InvalidPlanError(f"parallel.{name} = {value} must be >= 1")
    cluster_table = section(config, "cluster")
    group_clusters: tuple[Cluster, ...] = ()
    if "groups" in cluster_table:
        group_clusters, total_gpus = resolve_groups(cluster_table)
        cluster_table["num_gpus"] = total_gpus
    elif "stage_groups" in parallel:
        raise ConfigError(f"[parallel] stage_groups = {parallel['stage_groups']!r} needs [cluster] groups (a heterogeneous cluster)")
    dp_value = parallel.get("dp", "auto")
    if dp_value == "auto":
        num_gpus = cluster_table.get("num_gpus")
        if not isinstance(num_gpus, int) or isinstance(num_gpus, bool) or num_gpus <= 0:
            raise ConfigError(f"[cluster] num_gpus = {num_gpus!r} must be a positive integer")
        if num_gpus % (tp * pp * cp):
            raise InvalidPlanError(
                f"parallel.dp = 'auto' needs num_gpus {num_gpus} divisible by tp x pp x cp = {tp * pp * cp}"
            )
        dp = num_gpus // (tp * pp * cp)
    elif isinstance(dp_value, int) and not isinstance(dp_value, bool):
        dp = dp_value
    else:
        raise ConfigError(f"[parallel] dp = {dp_value!r} must be a positive integer or 'auto'")
    stage_group: tuple[int, ...] = ()
    if group_clusters:
        stage_group = place_stages(group_clusters, parallel.get("stage_groups"), pp=pp, tp=tp, ranks_per_stage=tp * cp * dp)
        first = group_clusters[stage_group[0]]
        cluster = Cluster(gpu=first.gpu, node=first.node, network=first.network, num_gpus=sum(c.num_gpus for c in group_clusters))
    else:
        cluster = resolve_cluster(config, default_num_gpus=tp * pp * cp * dp)
    precision = job.precision
    for gpu in [c.gpu for c in group_clusters] or [cluster.gpu]:  # every group's GPU must have it
        precision = supported_precision(precision, gpu, "training.precision", given="precision" in training)
    # fp8 primary weights apply to fp8 runs; a stack that keeps them (its profile) runs bf16 without
    if training.get("fp8_params") and precision != "fp8":
        warn(f"[training] fp8_params = true does not apply to precision '{precision}' (fp8 only); ignored")
    job = replace(job, precision=precision, grad_reduce_dtype=grad_reduce,
                  fp8_params=settings["fp8_params"] and precision == "fp8",
                  selective_recompute=settings["selective_recompute"],
                  elementwise=_elementwise(training, settings["elementwise"]), attention_layout=settings["attention_layout"],
                  cross_entropy=settings["cross_entropy"], tp_gathered_input=settings["tp_gathered_input"],
                  moe_prob_scaling=settings["moe_prob_scaling"])

    layers = parallel.get("layers_per_stage", [])
    if not isinstance(layers, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in layers):
        raise ConfigError(f"[parallel] layers_per_stage = {layers!r} must be a list of integers")
    schedule, chunks = parse_schedule(parallel, base_dir)
    hsdp, hsdp_shard = _hsdp(parallel)
    plan = ParallelPlan(
        recompute_layers=_recompute_layers(parallel, pp),
        tp=tp,
        pp=pp,
        dp=dp,
        cp=cp,
        ep=_int(parallel, "ep", "parallel", 1),
        etp=_int(parallel, "etp", "parallel", 0),
        sequence_parallel=_bool(parallel, "sequence_parallel", "parallel", False),
        zero=_int(parallel, "zero", "parallel", 0),
        hsdp=hsdp,
        hsdp_shard=hsdp_shard,
        schedule=schedule,
        virtual_stages=chunks,
        recompute=str(parallel.get("recompute", "none")),
        layers_per_stage=tuple(layers),
        # the stack's default applies where it can (sequence parallel, tp > 1); with tp = 1 there is
        # nothing to overlap and the flag is accepted
        tp_comm_overlap=_bool(parallel, "tp_comm_overlap", "parallel", False) if "tp_comm_overlap" in parallel
        else settings["tp_comm_overlap"] and tp > 1 and _bool(parallel, "sequence_parallel", "parallel", False),
        ep_comm_overlap=_bool(parallel, "ep_comm_overlap", "parallel", False),
        offload=str(parallel.get("offload", "none")),
        vocab_parallel=_bool(parallel, "vocab_parallel", "parallel", False),
        activation_offload=_fraction(parallel, "activation_offload", "parallel"),
        cp_comm=str(parallel.get("cp_comm", "ring")),
        cp_heads=_int(parallel, "cp_heads", "parallel", 1),
    )
    validate_plan(model, cluster, job, plan)
    overlap_slowdowns = [
        _float(parallel, "overlap_slowdown", "parallel", default_overlap_slowdown(c.gpu.sm_count), 1.0, 100.0)
        for c in group_clusters
    ]
    if job.seq_len > model.max_seq_len and model.position != "learned":
        warn(f"training.seq_len {job.seq_len} is past the {model.max_seq_len}-token context model {model.name} was "
             f"trained with ({model.position} positions extrapolate, but quality is not modelled); the speed is simulated as given")
    overlap_slowdown = _float(
        parallel, "overlap_slowdown", "parallel", default_overlap_slowdown(cluster.gpu.sm_count), 1.0, 100.0
    )
    return TrainingSetup(
        model=model,
        cluster=cluster,
        job=job,
        plan=plan,
        attention_kernel=attention_kernel,
        dp_comm_overlap=settings["dp_comm_overlap"],
        expert_load_imbalance=_float(parallel, "expert_load_imbalance", "parallel", 1.0, 1.0, 1000.0),
        overlap_slowdown=overlap_slowdown,
        data_parallel_overlap_slowdown=overlap_slowdown if "overlap_slowdown" in parallel else None,
        framework=stack.name,
        main_grad_accumulation=settings["main_grad_accumulation"],
        optimizer_kernels=settings["optimizer_kernels"],
        grad_buffer_passes=settings["grad_buffer_passes"],
        fsdp_unit=settings["fsdp_unit"],
        fsdp_kept_after_forward=settings["fsdp_kept_after_forward"],
        param_gather_pacing=settings["param_gather_pacing"],
        qkv_split=settings["qkv_split"],
        moe_expert_gemm=settings["moe_expert_gemm"],
        moe_dispatcher=settings["moe_dispatcher"],
        pipeline_p2p=settings["pipeline_p2p"],
        tp_overlap_method=settings["tp_overlap_method"],
        linear_bias=settings["linear_bias"],
        fp8_recipe=settings["fp8_recipe"],
        fp8_cast_fusion=_fp8_cast_fusion(training, settings["fp8_cast_fusion"]),
        fp8_all_gather=settings["fp8_all_gather"],
        fp8_scale_update=settings["fp8_scale_update"],
        fp8_backward_accumulation=settings["fp8_backward_accumulation"],
        fp8_bf16_edge_layers=_edge_layers(settings["fp8_bf16_edge_layers"], model),
        host_forward_op_s=settings["host_forward_op_us"] * units.us,
        host_backward_op_s=settings["host_backward_op_us"] * units.us,
        checkpoint=checkpoint,
        failures=failures,
        groups=stage_groups_for(group_clusters, overlap_slowdowns),
        stage_group=stage_group,
    )


def _elementwise(training: Mapping[str, Any], setting: str) -> str:
    """The elementwise setting under ``[training] compile``: torch.compile fuses each elementwise chain
    between matmuls (Inductor), so a compiled run is "fused" unless the config asks otherwise."""
    compiled = _bool(training, "compile", "training", False)
    if not compiled:
        return setting
    if training.get("elementwise", "fused") != "fused":
        raise ConfigError(f"[training] compile = true with elementwise = {training['elementwise']!r}; "
                          "torch.compile fuses the elementwise chains: leave elementwise out or set it to 'fused'")
    return "fused"


def _fp8_cast_fusion(training: Mapping[str, Any], setting: str) -> str:
    """The fp8_cast_fusion setting under ``[training] compile``: a stack that casts every fp8 GEMM input
    in a kernel of its own ("none": torchao float8) has Inductor fuse each cast's amax into the
    kernel producing its input ("compiled"), unless the config names fp8_cast_fusion itself."""
    if setting == "none" and "fp8_cast_fusion" not in training and _bool(training, "compile", "training", False):
        return "compiled"
    return setting


def _edge_layers(value: float, model: ModelSpec) -> int:
    """``fp8_bf16_edge_layers``: a whole number of layers, at most half the model at each end."""
    if value != int(value) or not 0 <= value <= model.layers // 2:
        raise ConfigError(f"[training] fp8_bf16_edge_layers = {value:g} must be an integer in 0..{model.layers // 2} "
                          f"(half the {model.layers} layers of model {model.name})")
    return int(value)


def _recompute_layers(parallel: Mapping[str, Any], pp: int) -> tuple[int, ...]:
    """``[parallel] recompute_layers``: an int for every stage or a list with one entry per stage."""
    value = parallel.get("recompute_layers", 0)
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ConfigError(f"[parallel] recompute_layers = {value} must be >= 0")
        return (value,) * pp if value else ()
    if isinstance(value, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in value):
        if len(value) != pp:
            raise ConfigError(f"[parallel] recompute_layers = {value} has {len(value)} entries; needs pp = {pp} (one per stage)")
        return tuple(value) if any(value) else ()
    raise ConfigError(f"[parallel] recompute_layers = {value!r} must be an integer or a list of integers (one per stage)")


def check_selective_recompute(model: ModelSpec, job: TrainingJob, plan: ParallelPlan) -> None:
    """Per-op selective checkpointing (``selective_recompute = "per_op"``) is modelled for what
    torchtitan's policy was written for: dense, non-MLA blocks, 16-bit matmuls, no context
    parallelism. Outside that the saved tensors are not sourced, so the plan is refused with the
    allowed value named (``attention_core``, or another ``recompute``)."""
    if plan.recompute != "selective" or job.selective_recompute != "per_op":
        return
    reason = None
    if job.precision == "fp8":
        # torchao float8 matmuls are aten._scaled_mm, not in the save list, and its amax ops
        # (aten.abs, aten.max) are: what such a layer keeps is not modelled
        reason = "precision 'fp8' (torchao float8's saved tensors under per-op checkpointing are not modelled)"
    elif model.is_moe:
        reason = f"mixture-of-experts model {model.name} (its grouped expert GEMMs are not aten.mm)"
    elif model.is_mla:
        reason = f"multi-head latent attention model {model.name} (torchtitan's policy is counted on Llama's wq, wk, wv)"
    elif plan.cp > 1:
        reason = f"cp = {plan.cp} (the ring attention's saved tensors are not modelled)"
    if reason is not None:
        raise InvalidPlanError(
            f"training.selective_recompute = 'per_op' with recompute = 'selective' is not modelled for {reason}; "
            "allowed: selective_recompute = 'attention_core', or recompute = 'none' | 'full'"
        )


def validate_plan(
    model: ModelSpec, cluster: Cluster, job: TrainingJob, plan: ParallelPlan, *, check_program: bool = True
) -> None:
    """The divisibility rules Megatron-LM enforces, each reported with its values; last, that the
    schedule's program is valid (``program_profile`` raises). ``check_program=False`` leaves that
    last rule to a caller that checks many plans' programs together (the plan search)."""
    if plan.world_size != cluster.num_gpus:
        raise InvalidPlanError(
            f"tp x pp x cp x dp = {plan.tp} x {plan.pp} x {plan.cp} x {plan.dp} = {plan.world_size} "
            f"must equal cluster.num_gpus {cluster.num_gpus}"
        )
    if model.heads % plan.tp:
        raise InvalidPlanError(f"parallel.tp {plan.tp} must divide the {model.heads} attention heads of model {model.name}")
    if not model.is_mla and model.kv_heads % plan.tp:
        raise InvalidPlanError(f"parallel.tp {plan.tp} must divide the {model.kv_heads} kv_heads of model {model.name}")
    widths = []
    if not model.is_moe or model.dense_layers:
        widths.append(("FFN width", model.ffn_hidden))
    if model.is_moe:
        widths.append(("expert FFN width", model.expert_ffn_hidden))
    for label, width in widths:
        if width % plan.tp:
            raise InvalidPlanError(f"parallel.tp {plan.tp} must divide the {label} {width} of model {model.name}")
    chunks = plan.pp * plan.virtual_stages
    if chunks > MAX_SCHEDULE_PASSES:  # checked before the placement, which walks every chunk
        raise InvalidPlanError(
            f"parallel.pp {plan.pp} x virtual_stages {plan.virtual_stages} = {chunks:,} model chunks, past the limit of "
            f"{MAX_SCHEDULE_PASSES:,} scheduled passes (one per chunk per micro-batch); model {model.name} has "
            f"{model.layers} layers"
        )
    place = plan_placement(plan)
    stage_layer_counts(model.layers, plan, place)
    if plan.recompute_layers:  # without any, chunk_recompute_counts only repeats stage_layer_counts
        chunk_recompute_counts(model.layers, plan, place)
    if plan.ep > 1:
        if not model.is_moe:
            raise InvalidPlanError(f"parallel.ep = {plan.ep} needs a mixture-of-experts model; model {model.name} is dense")
        if model.experts % plan.ep:
            raise InvalidPlanError(f"parallel.ep {plan.ep} must divide the {model.experts} experts of model {model.name}")
    if plan.etp not in (0, plan.tp):
        if not model.is_moe:
            raise InvalidPlanError(f"parallel.etp = {plan.etp} needs a mixture-of-experts model; model {model.name} is dense")
        if model.expert_ffn_hidden % plan.etp:
            raise InvalidPlanError(f"parallel.etp = {plan.etp} must divide the expert width {model.expert_ffn_hidden} "
                                   f"of model {model.name}")
    heads_split = plan.cp if plan.cp_comm == "ulysses" else plan.cp_heads if plan.cp_comm == "hybrid" else 1
    if heads_split > 1:
        for label, count in (("attention heads", model.heads), ("kv_heads", model.heads if model.is_mla else model.kv_heads)):
            if count % (plan.tp * heads_split):
                what = "cp" if plan.cp_comm == "ulysses" else "cp_heads"
                raise InvalidPlanError(
                    f"parallel.cp_comm = '{plan.cp_comm}' splits heads over tp x {what} = {plan.tp * heads_split}, "
                    f"which must divide the {count} {label} of model {model.name}"
                )
    if plan.cp > 1 and job.seq_len % (2 * plan.cp):
        raise InvalidPlanError(
            f"training.seq_len {job.seq_len} must be divisible by 2 x cp = {2 * plan.cp} (load-balanced causal context parallel)"
        )
    num_microbatches = job.num_microbatches(plan.dp)  # raises when dp x micro_batch does not divide the batch
    if plan.schedule == "interleaved" and num_microbatches % plan.pp:
        raise InvalidPlanError(
            f"schedule 'interleaved' needs the {num_microbatches} micro-batches to be a multiple of pp {plan.pp}"
        )
    passes = num_microbatches * plan.pp * plan.virtual_stages
    if passes > MAX_SCHEDULE_PASSES:
        raise InvalidPlanError(
            f"{num_microbatches:,} micro-batches x pp {plan.pp} x {plan.virtual_stages} chunks = {passes:,} scheduled "
            f"passes, past the limit of {MAX_SCHEDULE_PASSES:,} (checking and executing the schedule takes minutes "
            "beyond it); use fewer micro-batches: a larger training.micro_batch or a smaller training.global_batch"
        )
    if plan.tp_comm_overlap and plan.tp > 1 and not plan.sequence_parallel:
        raise InvalidPlanError("parallel.tp_comm_overlap = true needs sequence_parallel = true (as Megatron-Core)")
    if plan.ep_comm_overlap:
        # Megatron-Core's TransformerConfig checks for --overlap-moe-expert-parallel-comm
        if plan.pp > 1 and plan.schedule != "interleaved":
            raise InvalidPlanError(
                f"parallel.ep_comm_overlap = true with pp {plan.pp} needs schedule 'interleaved': Megatron-Core "
                "co-schedules forward and backward only there"
            )
        if plan.recompute == "full" or plan.recompute_layers:
            raise InvalidPlanError("parallel.ep_comm_overlap = true needs recompute other than 'full' and no recompute_layers")
    if job.seq_len > model.max_seq_len and model.position == "learned":
        raise InvalidPlanError(
            f"training.seq_len {job.seq_len} exceeds the {model.max_seq_len} learned positions of model {model.name}"
        )
    check_selective_recompute(model, job, plan)
    if check_program:
        program_profile(plan.schedule, plan.pp, num_microbatches, plan.virtual_stages)  # valid (checked once)
