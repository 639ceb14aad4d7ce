"""Elementwise code run op by op (PyTorch eager) instead of as fused kernels, and the layout copies
around PyTorch's scaled_dot_product_attention: rewrites of a layer's forward ops
(``workloads.graph.layer_forward_ops``, whose memory ops are one fused kernel each). Bytes and
kernel counts, never seconds.

The numbers are counted op by op, ATen op by ATen op, on torchtitan's Llama code
(``torchtitan/models/llama/model.py`` and ``torchtitan/models/norms.py`` at 9dec370, 2024-12-26; the
same code at 1ea476e9f, April 2024) in 16-bit activations by ``benchmarks/eager_elementwise_bytes.py``
(``tests/workloads/test_eager.py`` re-counts them when torch is installed): a kernel is an ATen op
that is not a view, its bytes every tensor it reads plus every tensor it writes. Per element of the
module's natural tensor, forward and backward (autograd's ops for the output gradient):

========================  ===============  ================  ===================================
module                    forward          backward          per element of
========================  ===============  ================  ===================================
RMSNorm (eager)           36 B, 8 kernels  92 B, 16 kernels  the hidden state (6 B saved)
RoPE, one of Q, K         20 B, 3 kernels  20 B, 4 kernels   Q (or K): heads x head dim columns
SwiGLU ``silu(a) * b``    10 B, 2 kernels  18 B, 3 kernels   the FFN width
residual ``x + f(x)``     6 B, 1 kernel    6 B, 1 kernel     the hidden state
GQA ``repeat_kv``         2 + 2/r B, 1     2 + 2/r B, 1      the repeated K (or V); r = heads / kv_heads
attention output copy     4 B, 1 kernel    none              the attention output
========================  ===============  ================  ===================================

RMSNorm eager is ``x.float()`` (2 + 4 B), ``pow(2)`` (4 + 4), ``mean(-1)`` (4), ``+ eps`` and
``rsqrt`` (per row), ``x * rsqrt`` (4 + 4), ``type_as`` (4 + 2), ``* weight`` (2 + 2); its backward
runs autograd's formula for each (``pow``'s alone re-materialises ``x ** 1``, scales it and
multiplies the gradient: 28 B). A fused norm (one kernel: Transformer Engine, Apex, torchtitan's
``fused_rmsnorm`` Triton kernel, or torch.compile) reads the input and writes the output, 4 B, as
``layer_forward_ops`` prices it. RoPE is ``view_as_complex(x.float())`` (2 + 4 B), the complex
product with ``freqs_cis`` (4 + 4; the table is per token, shared by the heads) and ``type_as``
(4 + 2). A residual connection adds in forward and, in backward, sums the gradient of the skip path
with the branch's (autograd accumulates the two for the input used twice). torch's eager LayerNorm
and GeLU are one ATen kernel each (``native_layer_norm``, ``gelu``), as fused.

torch's SDPA takes [b, heads, s, d]; torchtitan transposes its [b, s, heads, d] views in and copies the
output back (``output.transpose(1, 2).contiguous()``), and repeats K and V to the query heads
(``repeat_kv``: ``expand`` then ``reshape``, a copy when heads > kv_heads; the backward sums the
repeats). The attention kernel then reads the repeated K and V. These copies run compiled or not
(``torch.compile`` cannot fuse them into the SDPA kernel, an extern call).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from workloads.graph import Op
from workloads.model import ModelSpec

# (bytes per element, kernels) of each eager module, forward and backward (the table above)
RMSNORM_FORWARD, RMSNORM_BACKWARD = (36.0, 8), (92.0, 16)
ROPE_FORWARD, ROPE_BACKWARD = (20.0, 3), (20.0, 4)  # per tensor rotated (Q and K: twice the kernels)
SWIGLU_FORWARD, SWIGLU_BACKWARD = (10.0, 2), (18.0, 3)
RESIDUAL_FORWARD, RESIDUAL_BACKWARD = (6.0, 1), (6.0, 1)
# A fused norm kernel (what ``layer_forward_ops`` prices per element at 16 bits): read and write
FUSED_NORM_FORWARD, FUSED_NORM_BACKWARD = (4.0, 1), (8.0, 1)
# what autograd keeps of an eager RMSNorm for its backward, per element: the fp32 input (pow and the
# product with rsqrt save it) and the 16-bit normalised output (the weight product saves it); a fused
# norm keeps its 16-bit input (and a per-row rstd)
RMSNORM_SAVED_BYTES = 6.0


def eager_elementwise_ops(forward: Sequence[Op], model: ModelSpec, *, fused_norm: bool) -> list[Op]:
    """``forward`` with its norms, RoPE, gated activation and residual adds run as PyTorch eager ops
    (the table above); ``fused_norm``: the norms stay one kernel each (torchtitan's ``fused_rmsnorm``).
    LayerNorm models keep their norm kernels (eager LayerNorm is one kernel); non-gated activations
    and the MoE experts' kernels are left as they are. 16-bit activations only."""
    eager_norm = model.norm == "rmsnorm" and not fused_norm
    norm_f, norm_b = (RMSNORM_FORWARD, RMSNORM_BACKWARD) if eager_norm else (FUSED_NORM_FORWARD, FUSED_NORM_BACKWARD)
    out = []
    for op in forward:
        if op.kind != "memory":
            out.append(op)
            continue
        if op.name == "input_norm" and eager_norm:
            elements = op.bytes_moved / 4.0  # 2 x a bytes per element at a = 2
            out.append(_eager(op, elements, norm_f, norm_b))
        elif op.name == "residual_norm":
            elements = op.bytes_moved / 8.0  # the fused add + norm: 4 x a per element
            out.append(_eager(op, elements, _plus(RESIDUAL_FORWARD, norm_f), _plus(RESIDUAL_BACKWARD, norm_b)))
        elif op.name == "residual":
            out.append(_eager(op, op.bytes_moved / 6.0, RESIDUAL_FORWARD, RESIDUAL_BACKWARD))
        elif op.name == "rope":
            # Q and K columns: the fused kernel reads and writes them (2 x a per element)
            elements = op.bytes_moved / 4.0
            out.append(_eager(op, elements, (ROPE_FORWARD[0], 2 * ROPE_FORWARD[1]),
                              (ROPE_BACKWARD[0], 2 * ROPE_BACKWARD[1])))
        elif op.name == "mlp_activation" and model.gated_mlp:
            elements = op.bytes_moved / 6.0  # gate, up and product: 3 x a per FFN element
            out.append(_eager(op, elements, SWIGLU_FORWARD, SWIGLU_BACKWARD))
        else:
            out.append(op)
    return out


def sdpa_layout_ops(forward: Sequence[Op]) -> list[Op]:
    """``forward`` with the copies around PyTorch SDPA (see the module docstring): GQA's repeated K
    and V before the first attention kernel (when it has fewer KV heads than query heads), the
    output's contiguous copy after the last (a context-parallel ring runs several kernels over the
    same queries)."""
    kernels = [i for i, op in enumerate(forward) if op.kind == "attention"]
    if not kernels:
        return list(forward)
    first = forward[kernels[0]]
    queries = max(sum(q for q, _ in forward[i].sequences) for i in kernels)
    a = first.bytes_per_element
    out = list(forward)
    out.insert(kernels[-1] + 1, Op(name="attention_output_copy", kind="memory",
                                   bytes_moved=2.0 * a * queries * first.heads * (first.v_head_dim or first.head_dim),
                                   backward_bytes_moved=0.0, backward_kernels=0))
    if first.kv_heads and first.kv_heads < first.heads:
        # K and V, each written at the query heads after a read at its own
        repeated = queries * first.heads * (first.head_dim + (first.v_head_dim or first.head_dim))
        nbytes = a * repeated * (1.0 + first.kv_heads / first.heads)
        for i in kernels:
            out[i] = replace(out[i], kv_heads=first.heads)  # the kernel reads the repeated K and V
        out.insert(kernels[0], Op(name="repeat_kv", kind="memory", bytes_moved=nbytes, backward_bytes_moved=nbytes,
                                  kernels=2, backward_kernels=2))
    return out


def _eager(op: Op, elements: float, forward: tuple[float, int], backward: tuple[float, int]) -> Op:
    return replace(op, bytes_moved=forward[0] * elements, kernels=forward[1],
                   backward_bytes_moved=backward[0] * elements, backward_kernels=backward[1])


def _plus(a: tuple[float, int], b: tuple[float, int]) -> tuple[float, int]:
    return a[0] + b[0], a[1] + b[1]
