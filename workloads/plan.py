"""Parallel training plans and training jobs (hardware-agnostic, validated on construction)."""

from __future__ import annotations

from dataclasses import dataclass

from workloads.errors import InvalidPlanError
from workloads.graph import CROSS_ENTROPY_BYTES

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "zb-v", "v-half", "v-min", "bfs", "hanayo")
SCHEDULE_FILE_PREFIX = "file:"  # schedule = "file:PATH": a schedule program from a JSON file
ONE_CHUNK_SCHEDULES = ("gpipe", "1f1b", "zb-h1", "zb-h2")
V_SCHEDULES = ("zb-v", "v-half", "v-min")  # two chunks per stage in a V
RECOMPUTE = ("none", "selective", "full")
OFFLOAD = ("none", "optimizer", "optimizer+params", "nvme")
CP_COMM = ("ring", "all_gather", "ulysses", "hybrid")
CP_COMM_SPELLINGS = {"all-gather": "all_gather"}  # INTERFACE.md writes the K/V all-gather hyphenated
TRAINING_PRECISIONS = ("bf16", "fp16", "fp8")
TP_GATHERED_INPUTS = ("regather", "save")
MOE_PROB_SCALINGS = ("hidden", "activation")
GRAD_REDUCE_DTYPES = ("fp32", "bf16", "fp16")
# what ``recompute = "selective"`` keeps (the stack's selective_recompute): Megatron's attention-core
# recomputation (Korthikanti et al. 2022) or PyTorch per-op selective checkpointing as torchtitan
# applies it (workloads.checkpointing)
SELECTIVE_RECOMPUTE = ("attention_core", "per_op")


@dataclass(frozen=True, slots=True, kw_only=True)
class ParallelPlan:
    """Degrees along each device-mesh axis and the framework features used.

    World size = tp * pp * cp * dp; expert parallelism ``ep`` splits the experts over ranks of the
    data-parallel (x context-parallel) group, as Megatron-Core does, so it must divide dp * cp.
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    # expert tensor parallelism (Megatron-Core --expert-tensor-parallel-size, MoE Parallel Folding,
    # arXiv 2504.14960): the MoE layers split their ranks etp x ep x expert-dp = tp x cp x dp, apart
    # from the attention's tp x cp x dp; 0 = tp (the experts split like the attention, ep over dp x cp)
    etp: int = 0
    sequence_parallel: bool = False
    zero: int = 0  # 0 | 1 (distributed optimizer) | 2 | 3 (FSDP full shard)
    hsdp: bool = False  # with zero=3: shard over a group of the dp ranks, replicate across the groups
    hsdp_shard: int = 0  # with hsdp: ranks of the dp x cp group one shard spans (0: those inside one node)
    schedule: str = "1f1b"
    virtual_stages: int = 1  # model chunks per GPU: "interleaved" / "bfs" any, V shapes 2, "hanayo" 2 per wave
    recompute: str = "none"  # of the layers not counted in ``recompute_layers``
    # layers of each stage fully recomputed (Megatron --recompute-method block --recompute-num-layers),
    # one entry per stage; empty = none. The stage's other layers follow ``recompute``.
    recompute_layers: tuple[int, ...] = ()
    layers_per_stage: tuple[int, ...] = ()  # uneven split; empty = as even as possible
    tp_comm_overlap: bool = False
    # MoE expert-parallel all-to-alls hidden behind another micro-batch's compute: Megatron-Core's
    # combined 1F1B (--overlap-moe-expert-parallel-comm), the forward of one micro-batch co-scheduled
    # layer by layer with the backward of another (sim.training.costs.ep_overlapped_layer)
    ep_comm_overlap: bool = False
    offload: str = "none"
    activation_offload: float = 0.0  # fraction of pending micro-batches' activations kept in host memory
    vocab_parallel: bool = False  # embedding, LM head and loss split over all pipeline stages (Yeung et al. 2024)
    cp_heads: int = 1  # cp_comm = "hybrid": head-parallel degree inside the cp group (LoongTrain 2D attention)
    cp_comm: str = "ring"  # context parallel: K/V passed around a ring (overlapped) or all-gathered (Llama 3)

    def __post_init__(self) -> None:
        if self.cp_comm in CP_COMM_SPELLINGS:
            object.__setattr__(self, "cp_comm", CP_COMM_SPELLINGS[self.cp_comm])
        for axis in ("tp", "pp", "dp", "cp", "ep", "virtual_stages"):
            value = getattr(self, axis)
            if not isinstance(value, int) or value < 1:
                raise InvalidPlanError(f"parallel.{axis} = {value!r} must be a positive integer")
        if self.zero not in (0, 1, 2, 3):
            raise InvalidPlanError(f"parallel.zero = {self.zero!r} must be 0, 1, 2 or 3")
        if self.schedule not in SCHEDULES and not self.schedule.startswith(SCHEDULE_FILE_PREFIX):
            raise InvalidPlanError(
                f"parallel.schedule = '{self.schedule}' must be one of {', '.join(SCHEDULES)} or 'file:PATH'"
            )
        for name, value, allowed in (
            ("recompute", self.recompute, RECOMPUTE),
            ("offload", self.offload, OFFLOAD),
            ("cp_comm", self.cp_comm, CP_COMM),
        ):
            if value not in allowed:
                raise InvalidPlanError(f"parallel.{name} = '{value}' must be one of {', '.join(allowed)}")
        if self.virtual_stages > 1 and self.schedule in ONE_CHUNK_SCHEDULES:
            raise InvalidPlanError(
                f"parallel.virtual_stages = {self.virtual_stages} needs schedule 'interleaved' (or bfs, hanayo, "
                f"a V shape), not '{self.schedule}'"
            )
        if self.schedule in V_SCHEDULES and self.virtual_stages != 2:
            raise InvalidPlanError(f"schedule '{self.schedule}' runs 2 chunks per stage (a V), not {self.virtual_stages}")
        if self.schedule == "hanayo" and self.virtual_stages % 2:
            raise InvalidPlanError(f"schedule 'hanayo' runs 2 chunks per stage per wave, not {self.virtual_stages}")
        if self.recompute_layers:
            if len(self.recompute_layers) != self.pp:
                raise InvalidPlanError(
                    f"parallel.recompute_layers has {len(self.recompute_layers)} entries; needs pp = {self.pp} (one per stage)"
                )
            if any(not isinstance(r, int) or isinstance(r, bool) or r < 0 for r in self.recompute_layers):
                raise InvalidPlanError(
                    f"parallel.recompute_layers = {list(self.recompute_layers)} must be integers >= 0"
                )
            if self.recompute == "full" and any(self.recompute_layers):
                raise InvalidPlanError(
                    "parallel.recompute_layers needs recompute = 'none' or 'selective' for the other layers, "
                    "not 'full' (which already recomputes every layer)"
                )
        if not (isinstance(self.activation_offload, (int, float)) and 0.0 <= self.activation_offload <= 1.0):
            raise InvalidPlanError(f"parallel.activation_offload = {self.activation_offload!r} must be a number in 0..1")
        if not isinstance(self.cp_heads, int) or isinstance(self.cp_heads, bool) or self.cp_heads < 1:
            raise InvalidPlanError(f"parallel.cp_heads = {self.cp_heads!r} must be a positive integer")
        if self.cp_comm == "hybrid" and self.cp % self.cp_heads:
            raise InvalidPlanError(f"parallel.cp_heads = {self.cp_heads} must divide cp = {self.cp} (cp_comm = 'hybrid')")
        if self.cp_comm != "hybrid" and self.cp_heads != 1:
            raise InvalidPlanError(f"parallel.cp_heads = {self.cp_heads} needs cp_comm = 'hybrid', not '{self.cp_comm}'")
        if self.hsdp and self.zero != 3:
            raise InvalidPlanError(f"parallel.hsdp = true needs zero = 3, not {self.zero}")
        if self.hsdp and self.hsdp_shard and (self.dp * self.cp) % self.hsdp_shard:
            raise InvalidPlanError(
                f"parallel.hsdp = {self.hsdp_shard} (the shard group size) must divide dp * cp = {self.dp * self.cp}")
        if not isinstance(self.etp, int) or isinstance(self.etp, bool) or self.etp < 0:
            raise InvalidPlanError(f"parallel.etp = {self.etp!r} must be a positive integer (or 0: as tp)")
        if self.etp in (0, self.tp):
            if (self.dp * self.cp) % self.ep:
                raise InvalidPlanError(f"parallel.ep = {self.ep} must divide dp * cp = {self.dp * self.cp} "
                                       f"(or fold the experts over tp too: parallel.etp)")
        else:
            ranks = self.tp * self.cp * self.dp
            if ranks % (self.ep * self.etp):
                raise InvalidPlanError(f"parallel.ep x etp = {self.ep} x {self.etp} must divide tp * cp * dp = {ranks}")
            if self.tp > 1 and not self.sequence_parallel:
                raise InvalidPlanError(f"parallel.etp = {self.etp} with tp = {self.tp} needs sequence_parallel = true "
                                       "(each tp rank routes its own sequence shard)")

    @property
    def expert_tp(self) -> int:
        """The MoE layers' tensor-parallel degree (``etp``, or tp where it is 0)."""
        return self.etp or self.tp

    @property
    def expert_dp(self) -> int:
        """Ranks of a stage holding the same experts: tp x cp x dp / (ep x expert_tp)."""
        return self.tp * self.cp * self.dp // (self.ep * self.expert_tp)

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.cp * self.dp


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingJob:
    """One training iteration's shape."""

    seq_len: int
    global_batch: int  # sequences per iteration
    micro_batch: int
    precision: str = "bf16"  # "bf16" | "fp16" | "fp8" (fp8 GEMMs, bf16 elsewhere)
    optimizer: str = "adam"
    # dtype of the main-gradient buffer and its data-parallel reduction (the stack's grad_reduce_dtype)
    grad_reduce_dtype: str = "fp32"
    # fp8 primary weights (precision fp8 only): matmul weights kept in fp8, no 16-bit copy
    # (Transformer Engine fp8_model_init; Megatron --fp8-param-gather)
    fp8_params: bool = False
    # the recipe's dropout probability (hidden and attention dropout, as GPT-3-style Megatron / NeMo
    # recipes set both; 0 = none, as Llama-style recipes): only whether it is > 0 changes the cost
    dropout: float = 0.0
    # what ``parallel.recompute = "selective"`` means (the stack's selective_recompute): "attention_core"
    # | "per_op" (see SELECTIVE_RECOMPUTE)
    selective_recompute: str = "attention_core"
    # how the stack runs a layer's elementwise chains and lays out its attention's operands (the stack
    # settings ``elementwise`` and ``attention_layout``, workloads.eager): they decide what autograd
    # saves (an eager RMSNorm keeps its fp32 input, torch SDPA the K and V repeated to the query heads)
    elementwise: str = "fused"
    attention_layout: str = "native"
    # the LM-head loss's implementation (the stack setting ``cross_entropy``): what it moves and what it
    # holds per logit (workloads.graph.CROSS_ENTROPY_BYTES, sim.training.activations.CROSS_ENTROPY_MEMORY)
    cross_entropy: str = "unfused"
    # what a column-parallel linear keeps of its sequence-parallel gathered input for its weight gradient
    # (the stack setting ``tp_gathered_input``): "regather" (Megatron and Transformer Engine keep the
    # sequence shard and gather it again in backward) | "save" (torch's DTensor TP: the matmul saves the
    # gathered input, nothing is gathered again)
    tp_gathered_input: str = "regather"
    # where an MoE layer multiplies by its router probabilities (the stack setting ``moe_prob_scaling``),
    # which decides what it keeps per routed token: "hidden" (the probabilities scale an h-wide tensor,
    # the expert output in the combine or the routed input before the experts, kept for their gradient
    # beside the first expert matmul's input) | "activation" (inside the expert activation, Megatron-
    # Core's weighted SwiGLU: only the probabilities are kept); sim.training.activations
    moe_prob_scaling: str = "hidden"

    def __post_init__(self) -> None:
        if self.selective_recompute not in SELECTIVE_RECOMPUTE:
            raise InvalidPlanError(
                f"training.selective_recompute = {self.selective_recompute!r} must be one of {', '.join(SELECTIVE_RECOMPUTE)}"
            )
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) or not 0.0 <= self.dropout < 1.0:
            raise InvalidPlanError(f"training.dropout = {self.dropout!r} must be a number in [0, 1)")
        for name in ("seq_len", "global_batch", "micro_batch"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise InvalidPlanError(f"training.{name} = {value!r} must be a positive integer")
        for name, allowed in (("precision", TRAINING_PRECISIONS), ("grad_reduce_dtype", GRAD_REDUCE_DTYPES),
                              ("tp_gathered_input", TP_GATHERED_INPUTS), ("cross_entropy", tuple(CROSS_ENTROPY_BYTES)),
                              ("moe_prob_scaling", MOE_PROB_SCALINGS)):
            value = getattr(self, name)
            if value not in allowed:
                raise InvalidPlanError(f"training.{name} = {value!r} must be one of {', '.join(allowed)}")
        if self.fp8_params and self.precision != "fp8":
            raise InvalidPlanError(f"training.fp8_params needs precision 'fp8', not '{self.precision}'")
        if self.optimizer not in ("adam", "sgd"):
            raise InvalidPlanError(f"training.optimizer = '{self.optimizer}' must be 'adam' or 'sgd'")

    def num_microbatches(self, dp: int) -> int:
        """Micro-batches per pipeline per iteration, m = global_batch / (dp * micro_batch)."""
        if self.global_batch % (dp * self.micro_batch):
            raise InvalidPlanError(
                f"training.global_batch {self.global_batch} must be divisible by dp {dp} x micro_batch {self.micro_batch}"
            )
        return self.global_batch // (dp * self.micro_batch)


def stage_layer_counts(
    num_layers: int, plan: ParallelPlan, placement: tuple[int, ...] | None = None
) -> tuple[int, ...]:
    """Transformer layers per model chunk, in pipeline order (pp * virtual_stages chunks).

    ``placement``: the stage of every chunk (default: chunk c on stage c % pp, the interleaved
    placement). Uses ``plan.layers_per_stage`` when given (one entry per stage, or one per chunk),
    else splits as evenly as possible with the larger chunks first.
    """
    chunks = plan.pp * plan.virtual_stages
    if plan.layers_per_stage:
        counts = tuple(plan.layers_per_stage)
        if len(counts) == plan.pp and plan.virtual_stages > 1:
            # one entry per stage: spread each stage's layers over its chunks (chunk c on stage c % pp)
            per_chunk = [0] * chunks
            for stage, layers in enumerate(counts):
                base, extra = divmod(layers, plan.virtual_stages)
                mine = [c for c in range(chunks) if placement[c] == stage] if placement else [
                    v * plan.pp + stage for v in range(plan.virtual_stages)
                ]
                for v, c in enumerate(mine):
                    per_chunk[c] = base + (1 if v < extra else 0)
            counts = tuple(per_chunk)
        if len(counts) != chunks:
            raise InvalidPlanError(
                f"parallel.layers_per_stage has {len(counts)} entries; needs pp = {plan.pp} (one per stage) "
                f"or pp x virtual_stages = {chunks} (one per chunk)"
            )
        if sum(counts) != num_layers or min(counts) < 0:
            raise InvalidPlanError(
                f"parallel.layers_per_stage {list(plan.layers_per_stage)} must be >= 0 and sum to the model's {num_layers} layers"
            )
        return counts
    if num_layers < chunks:
        raise InvalidPlanError(f"model has {num_layers} layers, fewer than pp x virtual_stages = {chunks} chunks")
    base, extra = divmod(num_layers, chunks)
    return (base + 1,) * extra + (base,) * (chunks - extra)  # the first ``extra`` chunks get one more


def chunk_recompute_counts(
    num_layers: int, plan: ParallelPlan, placement: tuple[int, ...] | None = None
) -> tuple[int, ...]:
    """Fully recomputed layers of every model chunk (pp * virtual_stages chunks, in pipeline order):
    stage s's ``recompute_layers[s]`` spread over its chunks one layer at a time, chunk by chunk, never
    more than a chunk holds; each chunk recomputes its first layers (Megatron's block method).
    Raises InvalidPlanError when a stage would recompute more layers than it holds. ``placement``:
    the stage of every chunk (default c % pp), as ``stage_layer_counts``."""
    counts = stage_layer_counts(num_layers, plan, placement)
    if not plan.recompute_layers:
        return (0,) * len(counts)
    out = [0] * len(counts)
    for stage, wanted in enumerate(plan.recompute_layers):
        chunks = [c for c in range(len(counts)) if (placement[c] if placement else c % plan.pp) == stage]
        held = sum(counts[c] for c in chunks)
        if wanted > held:
            raise InvalidPlanError(
                f"parallel.recompute_layers[{stage}] = {wanted} exceeds the {held} layers of stage {stage}"
            )
        while wanted:
            for c in chunks:
                if wanted and out[c] < counts[c]:
                    out[c] += 1
                    wanted -= 1
    return tuple(out)
