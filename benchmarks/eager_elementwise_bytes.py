"""Bytes and kernels of torchtitan's eager elementwise code, counted op by op with PyTorch (CPU is
enough: the count is of the ATen ops the code dispatches and the tensors each reads and writes, which
do not depend on the device). The numbers behind ``workloads.eager`` (``[training] elementwise =
"eager"``); ``tests/workloads/test_eager.py`` re-counts them when torch is installed.

What is counted, per module, in the order torchtitan's Llama (torchtitan/models/llama/model.py and
torchtitan/models/norms.py at 9dec370, 2024-12-26; the same code at 1ea476e9f, April 2024) runs it,
in bf16 activations as FSDP2's MixedPrecisionPolicy(param_dtype=bf16) gives them:

- ``rmsnorm``: RMSNorm.forward, ``(x.float() * rsqrt(x.float().pow(2).mean(-1) + eps)).type_as(x) * w``;
- ``rope``: apply_rotary_emb on Q and K, ``view_as_real(view_as_complex(x.float()) * freqs_cis)``
  then ``type_as``;
- ``swiglu``: ``silu(w1 x) * w3 x`` between the matmuls;
- ``repeat_kv``: GQA's ``x[:, :, :, None].expand(...).reshape(...)`` of K and V (a copy when
  heads > kv_heads);
- ``attention_output``: ``sdpa(...).transpose(1, 2).contiguous()``;
- ``residual``: ``x + branch(x)``, less the branch's own kernels: the add, and in backward the
  accumulation of the skip path's gradient with the branch's.

A kernel is an ATen op that is not a view and reads or writes a tensor; its bytes are the bytes of
every tensor it reads plus every tensor it writes (a broadcast operand read once). Forward and
backward (autograd's ops for the module's output gradient) apart; the saved bytes are what autograd
keeps for backward (distinct storages). Printed per element of the module's natural tensor: the
hidden state for rmsnorm and residual, Q + K for rope (heads + kv_heads head-dim columns), the FFN
width for swiglu, the repeated K + V for repeat_kv, the attention output for attention_output.

    PYTHONPATH=. python benchmarks/eager_elementwise_bytes.py
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

TOKENS, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN = 64, 4096, 32, 8, 128, 8192
BF16 = torch.bfloat16


class _Counter(TorchDispatchMode):
    """Kernels and bytes of the ATen ops dispatched while active."""

    def __init__(self) -> None:
        super().__init__()
        self.kernels, self.bytes = 0, 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if torch.Tag.view_copy in func.tags or func._schema.name in ("aten::detach", "aten::empty", "aten::empty_like",
                                                                     "aten::empty_strided", "aten::new_empty_strided",
                                                                     "aten::_local_scalar_dense", "aten::lift_fresh",
                                                                     "aten::_unsafe_view"):
            return out
        if any(a.alias_info is not None and not a.alias_info.is_write for a in func._schema.returns):
            return out  # a view: no kernel
        inputs = [t for t in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        outputs = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        if not outputs:
            return out
        self.kernels += 1
        self.bytes += sum(_read_bytes(t) for t in inputs) + sum(_read_bytes(t) for t in outputs)
        return out


def _read_bytes(t: torch.Tensor) -> int:
    """Bytes of the distinct elements a kernel touches in ``t`` (a broadcast view's storage once)."""
    return min(t.numel() * t.element_size(), t.untyped_storage().nbytes())


def _count(fn: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> dict[str, float]:
    """Forward kernels and bytes, backward kernels and bytes, and saved bytes of ``fn(*inputs)``."""
    leaves = [t.detach().requires_grad_(t.is_floating_point()) for t in inputs]
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with _Counter() as forward:
            y = fn(*leaves)
    grad = torch.randn_like(y)
    with _Counter() as backward:  # (autograd.grad: no accumulation into the leaves' .grad)
        torch.autograd.grad(y, [t for t in leaves if t.requires_grad], grad)
    return {"forward_kernels": forward.kernels, "forward_bytes": forward.bytes,
            "backward_kernels": backward.kernels, "backward_bytes": backward.bytes, "saved_bytes": sum(saved.values())}


def _rmsnorm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    f = x.float()
    return (f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + 1e-5)).type_as(x) * w


def _freqs(tokens: int, head_dim: int) -> torch.Tensor:
    angles = torch.outer(torch.arange(tokens).float(), 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim)))
    return torch.polar(torch.ones_like(angles), angles)


def _rope(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """One of Q, K rotated (apply_rotary_emb runs the same ops on each)."""
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * freqs.view(1, x.shape[1], 1, -1)).flatten(3).type_as(x)


def _swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.silu(gate) * up


def _repeat_kv(x: torch.Tensor) -> torch.Tensor:
    b, s, kv, d = x.shape
    return x[:, :, :, None, :].expand(b, s, kv, HEADS // KV_HEADS, d).reshape(b, s, HEADS, d)


def _attention_output(o: torch.Tensor) -> torch.Tensor:
    return o.transpose(1, 2).contiguous()


def _branch(x: torch.Tensor) -> torch.Tensor:
    return torch.neg(x)  # any one-kernel branch: its own kernels are subtracted (counts)


def _residual(x: torch.Tensor) -> torch.Tensor:
    """A residual connection ``x + branch(x)``: the add, and in backward the sum of the gradients of
    the skip path and of the branch, which autograd accumulates for ``x``."""
    return x + _branch(x)


def counts() -> dict[str, dict[str, float]]:
    """Per module, its kernels and its bytes per element of its natural tensor (see the docstring)."""
    torch.manual_seed(0)
    hidden = torch.randn(1, TOKENS, HIDDEN, dtype=BF16)
    cases = {
        "rmsnorm": (_rmsnorm, (hidden, torch.ones(HIDDEN, dtype=BF16)), TOKENS * HIDDEN),
        "rope": (_rope, (torch.randn(1, TOKENS, HEADS, HEAD_DIM, dtype=BF16), _freqs(TOKENS, HEAD_DIM)),
                 TOKENS * HEADS * HEAD_DIM),
        "swiglu": (_swiglu, (torch.randn(TOKENS, FFN, dtype=BF16), torch.randn(TOKENS, FFN, dtype=BF16)), TOKENS * FFN),
        "repeat_kv": (_repeat_kv, (torch.randn(1, TOKENS, KV_HEADS, HEAD_DIM, dtype=BF16),), TOKENS * HEADS * HEAD_DIM),
        "attention_output": (_attention_output, (torch.randn(1, HEADS, TOKENS, HEAD_DIM, dtype=BF16),),
                             TOKENS * HEADS * HEAD_DIM),
        "residual": (_residual, (hidden,), TOKENS * HIDDEN),
    }
    out = {}
    for name, (fn, inputs, elements) in cases.items():
        counted = _count(fn, *inputs)
        if fn is _residual:  # the connection alone: less the branch's own kernels
            counted = {k: v - _count(_branch, *inputs)[k] for k, v in counted.items()}
        out[name] = {k: (v / elements if "bytes" in k else v) for k, v in counted.items()}
    return out


def main() -> None:
    for name, values in counts().items():
        print(f"{name:<17}" + "  ".join(f"{k} {v:.3f}" if "bytes" in k else f"{k} {v}" for k, v in values.items()))


if __name__ == "__main__":
    main()
