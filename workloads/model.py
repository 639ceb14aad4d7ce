"""``ModelSpec``: a transformer architecture and the quantities derived from it.

One dataclass covers dense MHA/GQA/MQA models, SwiGLU/GeLU/ReLU/squared-ReLU MLPs, mixture-of-experts
(routed top-k experts, shared experts, leading dense layers), multi-head latent attention (MLA,
DeepSeek) and sliding-window attention, plus the small structural variants that change parameter
counts (per-projection biases, parallel blocks, an embedding norm, OPT's position offset).
Variants are catalog rows, not subclasses.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from workloads.errors import ModelCatalogError

ACTIVATIONS = ("gelu", "swiglu", "relu2", "relu")
NORMS = ("layernorm", "rmsnorm")
POSITIONS = ("learned", "rope", "alibi")
# Bounds on inline architectures (docs/configuration.md): the largest published models have ~10^2
# layers and widths ~10^5; past these the per-layer loops and op graphs stop being tractable.
MAX_LAYERS = 100_000
MAX_DIMENSION = 100_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer. Counts are ints; ``head_dim`` defaults to hidden / heads."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int  # == heads for MHA, 1 for MQA
    ffn_hidden: int  # width of the dense MLP (intermediate size)
    vocab: int
    max_seq_len: int
    activation: str = "gelu"  # "gelu" | "swiglu" | "relu2" | "relu"
    norm: str = "layernorm"  # "layernorm" (weight + bias) | "rmsnorm" (weight)
    position: str = "rope"  # "learned" adds max_seq_len x hidden parameters
    bias: bool = False  # biases on QKV, output and MLP projections
    # Finer bias switches for models that bias only some projections. ``None`` follows ``bias``.
    attention_bias: bool | None = None  # biases on Q, K, V and the output projection
    mlp_bias: bool | None = None  # biases on the MLP (and expert) projections (GPT-J: MLP only)
    qkv_bias: bool = False  # biases on Q, K, V only, output unbiased (Qwen2/2.5)
    lm_head_bias: bool = False  # a bias on the output head (GPT-J: vocab extra parameters)
    tied_embeddings: bool = False
    parallel_block: bool = False  # attention and MLP read the same input (GPT-J, Falcon)
    norms_per_layer: int = 0  # 0 = 1 for a parallel block, else 2 (Falcon-40B/180B: 2 in parallel)
    embedding_norm: bool = False  # a norm right after the token embedding (BLOOM word_embeddings_layernorm)
    position_offset: int = 0  # extra rows of the learned position table (OPT reserves 2)
    rotary_dim: int | None = None  # rotary width per head when partial (GPT-J 64 of 256); None = whole head
    head_dim: int = 0  # 0 = hidden // heads
    sliding_window: int | None = None  # attention span in tokens, None = full causal
    # mixture of experts (experts == 0: dense)
    experts: int = 0
    experts_per_token: int = 0
    expert_ffn_hidden: int = 0
    shared_experts: int = 0
    dense_layers: int = 0  # leading layers with a dense MLP in an MoE model (DeepSeek-V3: 3)
    # multi-head latent attention (kv_lora_rank > 0 enables MLA)
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    published_parameters: float | None = None  # as announced by the authors, for the catalog test
    # Rounding step of the announced figure when it is coarse (Narayanan Table 1 prints "1.7" B, so
    # 0.1e9): the catalog test accepts half a step when that is wider than its 1 % tolerance.
    published_parameters_rounding: float | None = None
    source: str = ""
    notes: str = ""

    def __post_init__(self) -> None:
        if self.head_dim == 0 and not self.is_mla and self.heads > 0:
            if self.hidden % self.heads:
                raise ModelCatalogError(
                    f"model {self.name}: hidden {self.hidden} must be divisible by heads {self.heads} "
                    "(or give head_dim explicitly)"
                )
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        if self.attention_bias is None:
            object.__setattr__(self, "attention_bias", self.bias)
        if self.mlp_bias is None:
            object.__setattr__(self, "mlp_bias", self.bias)
        if self.norms_per_layer == 0:
            object.__setattr__(self, "norms_per_layer", 1 if self.parallel_block else 2)
        self.validate()

    # ---- structure ---------------------------------------------------------------------------
    def validate(self) -> None:
        """Raise ModelCatalogError naming the first broken structural rule."""
        where = f"model {self.name}"
        for field_name in ("layers", "hidden", "heads", "kv_heads", "vocab", "max_seq_len"):
            if getattr(self, field_name) <= 0:
                raise ModelCatalogError(f"{where}: {field_name} = {getattr(self, field_name)} must be > 0")
        if self.layers > MAX_LAYERS:
            raise ModelCatalogError(f"{where}: layers = {self.layers} is past the limit {MAX_LAYERS:,}")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or value is None:
                continue
            if isinstance(value, int) and value < 0:
                raise ModelCatalogError(f"{where}: {f.name} = {value} must be >= 0")
            if isinstance(value, float) and not (math.isfinite(value) and value > 0):
                raise ModelCatalogError(f"{where}: {f.name} = {value} must be a finite number > 0")
            if isinstance(value, int) and value > MAX_DIMENSION:
                raise ModelCatalogError(f"{where}: {f.name} = {value} is past the limit {MAX_DIMENSION:,}")
        if self.activation not in ACTIVATIONS:
            raise ModelCatalogError(f"{where}: activation '{self.activation}' not in {ACTIVATIONS}")
        if self.norm not in NORMS:
            raise ModelCatalogError(f"{where}: norm '{self.norm}' not in {NORMS}")
        if self.position not in POSITIONS:
            raise ModelCatalogError(f"{where}: position '{self.position}' not in {POSITIONS}")
        if self.heads % self.kv_heads:
            raise ModelCatalogError(f"{where}: heads {self.heads} must be divisible by kv_heads {self.kv_heads}")
        if self.is_moe:
            if not 0 < self.experts_per_token <= self.experts:
                raise ModelCatalogError(
                    f"{where}: experts_per_token {self.experts_per_token} must be in 1..experts ({self.experts})"
                )
            if self.expert_ffn_hidden <= 0:
                raise ModelCatalogError(f"{where}: expert_ffn_hidden must be > 0 for an MoE model")
            if not 0 <= self.dense_layers < self.layers:
                raise ModelCatalogError(f"{where}: dense_layers {self.dense_layers} must be in 0..layers-1")
        elif self.ffn_hidden <= 0:
            raise ModelCatalogError(f"{where}: ffn_hidden must be > 0 for a dense model")
        if self.is_mla and (self.qk_rope_head_dim <= 0 or self.qk_nope_head_dim <= 0 or self.v_head_dim <= 0):
            raise ModelCatalogError(f"{where}: MLA needs qk_nope_head_dim, qk_rope_head_dim and v_head_dim > 0")
        if self.sliding_window is not None and self.sliding_window <= 0:
            raise ModelCatalogError(f"{where}: sliding_window {self.sliding_window} must be > 0")
        if self.norms_per_layer not in (1, 2):
            raise ModelCatalogError(f"{where}: norms_per_layer {self.norms_per_layer} must be 1 or 2 (0 = derive)")
        if self.position_offset < 0 or (self.position_offset and self.position != "learned"):
            raise ModelCatalogError(
                f"{where}: position_offset {self.position_offset} must be >= 0 and needs position = 'learned'"
            )
        if self.rotary_dim is not None:
            if self.position != "rope":
                raise ModelCatalogError(f"{where}: rotary_dim needs position = 'rope', not '{self.position}'")
            if not 0 < self.rotary_dim <= self.head_dim:
                raise ModelCatalogError(
                    f"{where}: rotary_dim {self.rotary_dim} must be in 1..head_dim ({self.head_dim})"
                )
        if self.is_mla and (self.attention_bias or self.qkv_bias):
            raise ModelCatalogError(f"{where}: attention biases are not modelled for MLA (attention_bias/qkv_bias)")

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.is_moe else 0

    @property
    def gated_mlp(self) -> bool:
        return self.activation == "swiglu"

    # ---- parameters ------------------------------------------------------------------------------
    def attention_weight_parameters(self) -> int:
        """Projection weights of one attention block (matmul operands only)."""
        h = self.hidden
        if self.is_mla:
            qk_head = self.qk_nope_head_dim + self.qk_rope_head_dim
            if self.q_lora_rank:
                q = h * self.q_lora_rank + self.q_lora_rank * self.heads * qk_head
            else:
                q = h * self.heads * qk_head
            kv_down = h * (self.kv_lora_rank + self.qk_rope_head_dim)
            kv_up = self.kv_lora_rank * self.heads * (self.qk_nope_head_dim + self.v_head_dim)
            out = self.heads * self.v_head_dim * h
            return q + kv_down + kv_up + out
        q_width = self.heads * self.head_dim
        kv_width = self.kv_heads * self.head_dim
        return h * (q_width + 2 * kv_width) + q_width * h

    def attention_parameters(self) -> int:
        """Weights, biases and (MLA) latent norms of one attention block; no layer norms."""
        weights = self.attention_weight_parameters()
        if self.is_mla:
            # RMSNorm on the query and KV latents (DeepSeek-V3 q_a_layernorm, kv_a_layernorm)
            return weights + (self.q_lora_rank if self.q_lora_rank else 0) + self.kv_lora_rank
        qkv_width = (self.heads + 2 * self.kv_heads) * self.head_dim
        if self.attention_bias:
            biases = qkv_width + self.hidden
        elif self.qkv_bias:
            biases = qkv_width
        else:
            biases = 0
        return weights + biases

    def mlp_weight_parameters(self, ffn_hidden: int) -> int:
        """Weights of one MLP of width ``ffn_hidden`` (3 matrices when gated)."""
        return (3 if self.gated_mlp else 2) * self.hidden * ffn_hidden

    def mlp_parameters(self, ffn_hidden: int) -> int:
        """Weights (and biases) of one MLP of width ``ffn_hidden``."""
        matrices = 3 if self.gated_mlp else 2
        biases = ((matrices - 1) * ffn_hidden + self.hidden) if self.mlp_bias else 0
        return self.mlp_weight_parameters(ffn_hidden) + biases

    def norm_parameters(self) -> int:
        """One normalization layer."""
        return 2 * self.hidden if self.norm == "layernorm" else self.hidden

    def moe_block_parameters(self, active: bool) -> int:
        """Router, routed experts (all, or the top-k when ``active``) and shared experts of one MoE layer."""
        routed = self.experts_per_token if active else self.experts
        router = self.hidden * self.experts
        return router + (routed + self.shared_experts) * self.mlp_parameters(self.expert_ffn_hidden)

    def layer_parameters(self, moe: bool, active: bool = False) -> int:
        """One transformer layer: attention, MLP (dense or MoE) and its norms."""
        mlp = self.moe_block_parameters(active) if moe else self.mlp_parameters(self.ffn_hidden)
        return self.attention_parameters() + mlp + self.norms_per_layer * self.norm_parameters()

    def embedding_parameters(self) -> int:
        """Input embedding (+ its norm), learned positions, output head (if untied) and the final norm."""
        table = self.vocab * self.hidden
        positions = (self.max_seq_len + self.position_offset) * self.hidden if self.position == "learned" else 0
        head = (0 if self.tied_embeddings else table) + (self.vocab if self.lm_head_bias else 0)
        embedding_norm = self.norm_parameters() if self.embedding_norm else 0
        return table + embedding_norm + positions + head + self.norm_parameters()

    def _total(self, active: bool) -> int:
        dense = self.layers - self.moe_layers
        return (
            dense * self.layer_parameters(moe=False)
            + self.moe_layers * self.layer_parameters(moe=True, active=active)
            + self.embedding_parameters()
        )

    def total_parameters(self) -> int:
        """Every parameter, all experts counted."""
        return self._total(active=False)

    def active_parameters(self) -> int:
        """Parameters one token touches: top-k routed plus shared experts (== total for dense).

        The input embedding table counts in full, as in the dense total (DeepSeek-V3's 37B does too;
        its weights README's 36.6B leaves out the 0.9B input embedding).
        """
        return self._total(active=True)

    # ---- FLOPs and KV cache --------------------------------------------------------------------------
    def matmul_parameters_per_token(self) -> int:
        """Weights multiplied per token in the forward pass: active projections, routers and the LM head.

        Biases, norms and position tables are excluded (they are not matmuls); the LM head counts
        even when tied.
        """
        attention = self.attention_weight_parameters()
        dense_mlp = self.mlp_weight_parameters(self.ffn_hidden)
        moe_mlp = self.hidden * self.experts + (
            self.experts_per_token + self.shared_experts
        ) * self.mlp_weight_parameters(self.expert_ffn_hidden)
        dense = self.layers - self.moe_layers
        per_layer = dense * (attention + dense_mlp) + self.moe_layers * (attention + moe_mlp)
        return per_layer + self.vocab * self.hidden

    def attention_span(self, context_len: int) -> int:
        """Keys one query attends to at ``context_len``, capped by the sliding window."""
        return min(context_len, self.sliding_window) if self.sliding_window else context_len

    def attention_flops_per_token(self, context_len: int) -> float:
        """Score and value matmul FLOPs for one query token against ``context_len`` keys (all layers)."""
        if self.is_mla:
            qk, v = self.qk_nope_head_dim + self.qk_rope_head_dim, self.v_head_dim
        else:
            qk = v = self.head_dim
        return 2.0 * self.layers * self.heads * (qk + v) * self.attention_span(context_len)

    def forward_flops_per_token(self, context_len: int) -> float:
        """Forward FLOPs of one token that attends to ``context_len`` keys.

        With ``context_len = s`` for every token this is Narayanan et al. 2021's count
        (24 L h^2 + 4 s L h + 2 h V per token for GPT), which does not halve causal attention.
        """
        return 2.0 * self.matmul_parameters_per_token() + self.attention_flops_per_token(context_len)

    def kv_cache_elements_per_token(self) -> int:
        """Cached elements per token over all layers: K and V per KV head, or MLA's latent + rope key."""
        if self.is_mla:
            return self.layers * (self.kv_lora_rank + self.qk_rope_head_dim)
        return 2 * self.layers * self.kv_heads * self.head_dim

    def kv_cache_bytes_per_token(self, bytes_per_element: float) -> float:
        """KV-cache bytes per token at ``bytes_per_element`` (see ``workloads.precision``)."""
        return self.kv_cache_elements_per_token() * bytes_per_element
