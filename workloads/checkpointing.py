"""Per-op selective activation checkpointing (PyTorch SAC) as torchtitan applies it to a transformer
block: which forward ops' outputs a layer keeps for its backward and which forward ops the backward
re-runs. Hardware-agnostic: bytes and ops, never seconds.

The policy, torchtitan ``torchtitan/parallelisms/parallelize_llama.py`` at commit 9dec370 (lines
214-223 and 251-276; ``activation_checkpoint.mode = "selective"``, ``selective_ac_option = "op"``,
the default of ``train_configs/llama3_8b.toml``)::

    _save_list = {torch.ops.aten.mm.default,
                  torch.ops.aten._scaled_dot_product_efficient_attention.default,
                  torch.ops.aten._scaled_dot_product_flash_attention.default,
                  torch.ops._c10d_functional.reduce_scatter_tensor.default,
                  torch.ops.aten.abs.default, torch.ops.aten.max.default}
    ...
    if func == torch.ops.aten.mm.default:
        meta[mm_count_key] += 1
    # Saves output of all compute ops, except every second mm
    to_save = func in _save_list and not (
        func == torch.ops.aten.mm.default and meta[mm_count_key] % 2 == 0)
    return CheckpointPolicy.MUST_SAVE if to_save else CheckpointPolicy.PREFER_RECOMPUTE

``meta`` is a fresh ``defaultdict(int)`` per checkpointed call (``selective_checkpointing_context_fn``),
so the count restarts at every transformer block: its 1st, 3rd, 5th ... ``aten.mm`` are saved, the
2nd, 4th ... recomputed. Everything else (norms, RoPE, SwiGLU, residual adds, copies, all-gathers,
all-reduces, ``aten.bmm``) is recomputed. The block is wrapped with ``ptd_checkpoint_wrapper``
(non-reentrant checkpointing), so its input stays alive as the checkpoint's argument, and the
recomputation stops once the last tensor autograd saved is back (pytorch/pytorch
``torch/utils/checkpoint.py``: ``_checkpoint_without_reentrant_generator(..., early_stop=True)``,
"non-reentrant checkpoint stops recomputation as soon as it has computed all needed Tensors"): ops
after the block's last matmul, which save nothing for backward (the residual add), are not re-run.
The saved outputs are held from the forward to the backward (``_CachingTorchDispatchMode`` stores
every output of a MUST_SAVE op; ``_CachedTorchDispatchMode`` pops them during recomputation).

Not modelled: which SDPA backend ran. The save list of 9dec370 names the flash and memory-efficient
kernels only; a run on ``aten._scaled_dot_product_cudnn_attention`` would recompute the attention too
(pytorch/torchtitan issue #2091 and PR #2095, 2025-12, added every SDPA backend to the list). llmsim
prices torchtitan's attention as the fused flash kernel and keeps its output.

The matmuls are torchtitan's Llama modules (``torchtitan/models/llama/model.py`` at 9dec370,
line 189 ``xq, xk, xv = self.wq(x), self.wk(x), self.wv(x)``, line 214 ``self.wo(output)``, line 253
``self.w2(F.silu(self.w1(x)) * self.w3(x))``): seven ``aten.mm`` per block in the order wq, wk, wv,
wo, w1, w3, w2, so wq, wv, w1 and w2 are saved and wk, wo, w3 recomputed. llmsim's op graph fuses
wq/wk/wv into ``qkv_proj`` and w1/w3 into ``mlp_up`` (same FLOPs); ``torch_matmuls`` splits them back.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from workloads.graph import Op
from workloads.model import ModelSpec

# fp32 log-sum-exp per query and head that the flash / efficient SDPA kernels return beside the output
# (aten._scaled_dot_product_flash_attention's ``logsumexp``); the kernels' other outputs (philox seed
# and offset, empty cumulative lengths and debug mask) are a few bytes and not counted
SDPA_LSE_BYTES = 4.0


@dataclass(frozen=True, slots=True, kw_only=True)
class PerOpCheckpoint:
    """What per-op selective checkpointing does to one layer (see the module docstring)."""

    saved: tuple[tuple[str, float], ...]  # (matmul or op name, bytes of the outputs kept), forward order
    recompute: tuple[Op, ...]  # forward ops (single matmuls of a fused GEMM op) re-run in backward, in order

    @property
    def saved_bytes(self) -> float:
        """Bytes of every saved output (the block input, kept by the checkpoint, is not included)."""
        return sum(nbytes for _, nbytes in self.saved)


def torch_matmuls(op: Op, model: ModelSpec, tp: int) -> tuple[Op, ...]:
    """The ``aten.mm`` calls torchtitan's Llama block makes for weight GEMM ``op`` of
    ``workloads.graph.layer_forward_ops`` on a rank of ``tp``, in call order: ``qkv_proj`` is wq,
    wk, wv (separate ``nn.Linear``s; heads and KV heads split over tp as the graph splits them);
    a gated ``mlp_up`` is w1 then w3; any other weight GEMM is one matmul."""
    if op.name == "qkv_proj" and not model.is_mla:
        heads, kv_heads = -(-model.heads // tp), -(-model.kv_heads // tp)
        q = op.n * heads // (heads + 2 * kv_heads)
        kv = (op.n - q) // 2
        return (replace(op, name="qkv_proj_wq", n=q), replace(op, name="qkv_proj_wk", n=kv),
                replace(op, name="qkv_proj_wv", n=kv))
    if op.name == "mlp_up" and model.gated_mlp:
        half = op.n // 2
        return replace(op, name="mlp_up_w1", n=half), replace(op, name="mlp_up_w3", n=op.n - half)
    return (op,)


def output_bytes(op: Op, tp: int) -> float:
    """Bytes of the outputs a saved op keeps: a matmul's m x n product, the SDPA output and its
    log-sum-exp, a tensor-parallel reduce-scatter's 1/tp shard of its input."""
    if op.kind == "gemm":
        return float(op.m * op.n * op.batch) * op.bytes_per_element
    if op.kind == "attention":
        queries = sum(q for q, _ in op.sequences)
        return queries * op.heads * (op.v_head_dim * op.bytes_per_element + SDPA_LSE_BYTES)
    if op.kind == "collective" and op.collective == "reduce_scatter" and op.axis == "tp":
        return op.message_bytes / tp
    raise ValueError(f"op '{op.name}' ({op.kind}) is not in the per-op save list")


def _saved_kind(op: Op) -> bool:
    """Whether a non-matmul op is in ``_save_list``: the fused SDPA kernel and a functional
    reduce-scatter (over the tensor-parallel group, the one reduce-scatter inside a block)."""
    if op.kind == "attention":
        return True
    return op.kind == "collective" and op.collective == "reduce_scatter" and op.axis == "tp"


def per_op_checkpoint(forward: Sequence[Op], *, model: ModelSpec, tp: int) -> PerOpCheckpoint:
    """Apply torchtitan's per-op policy to one layer's forward ops (``layer_forward_ops``, after any
    stack rewrites): saved outputs and recomputed ops. A weight GEMM counts as its ``torch_matmuls``;
    a GEMM of two activations (unfused attention's scores and values) is ``aten.bmm``, not counted and
    recomputed. Recomputation ends at the layer's last matmul (early stop)."""
    saved: list[tuple[str, float]] = []
    rerun: list[Op] = []
    count = 0
    last_matmul = -1  # index in ``rerun`` after the last matmul call (re-run or replayed from the cache)
    for op in forward:
        if op.kind == "gemm" and op.weight:
            for mm in torch_matmuls(op, model, tp):
                count += 1
                if count % 2:
                    saved.append((mm.name, output_bytes(mm, tp)))
                else:
                    rerun.append(mm)
                last_matmul = len(rerun)
        elif _saved_kind(op):
            saved.append((op.name, output_bytes(op, tp)))
        else:
            rerun.append(op)
    return PerOpCheckpoint(saved=tuple(saved), recompute=tuple(rerun[: max(last_matmul, 0)]))
