"""GPU check for the Megatron-Core H100 1.7B / 7.1B rows, predicted 13.3 and 8.9 % faster than
published (issue 11; the family's rows 0.3-13.3 %): times, at those rows' own per-GPU shapes, the kernel costs the model prices without
a measurement of its own, so one short GPU session can size them.

1. Attention dropout: causal attention forward and forward + backward with dropout 0.0 and 0.1 on
   PyTorch's cuDNN backend (what Transformer Engine runs on Hopper) and its FlashAttention backend
   where the build has them. The model takes dropout's rate from TransformerEngine#3312 (H200, 0.896
   of the kernel rate, ``sim.training.costs.ATTENTION_DROPOUT_RATE``).
2. Weight-gradient GEMMs that accumulate into fp32 main gradients (Megatron's
   gradient_accumulation_fusion): a bf16 GEMM alone, the same GEMM then an fp32 add into the main
   gradient (the unfused form), and, where this torch has ``torch.mm(..., out_dtype=)``, the GEMM
   writing fp32 itself. The model prices the fp32 C traffic inside the GEMM's roofline. Inputs are
   not rotated through L2: the ratios, not the absolute times, are what to read.
3. The layer's memory-bound kernels, which the model prices at one rate per GPU
   (``hardware.cost.memory_op_time_s``: on the H100 0.807 of BabelStream's 2.97 of 3.35 TB/s, the mean
   of four published timings of Megatron-Core's kernels, ``efficiency.memory_kernels``, spread 0.70-0.93):
   LayerNorm forward and forward + backward (torch's, and
   Transformer Engine's where installed), Megatron's bias + GeLU (tanh form) forward and backward and
   its bias + dropout + add forward and backward (p = 0.1), each under torch.compile as Megatron-Core's
   jit_fuser runs them from torch 2.2 (eager on the CPU run). Each row carries the bytes the kernel
   must move, the achieved bandwidth and the model's price of those bytes on ``--gpu``: the ratio
   measured / model is the correction a memory-kernel table would carry.

    PYTHONPATH=. python benchmarks/gpu_small_model_kernels.py --out small_model_kernels.csv
    PYTHONPATH=. python benchmarks/gpu_small_model_kernels.py --device cpu   # tiny shapes, host clock

Needs torch (the ``calibrate`` extra). Shapes come from the rows of validation/published/training.csv
through the suite's own configs, not from constants here. Prints the ratios and writes one CSV row
per timing with the device, driver and library versions.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from dataclasses import dataclass
from typing import Any, Callable

from validation.microbench.harness import environment
from validation.microbench.timing import PerfCounterTimer, measure
from validation.training_suite import published_rows, row_config

ROWS = ("mcore-h100-1.7b", "mcore-h100-7.1b")
DROPOUTS = (0.0, 0.1)


@dataclass(frozen=True)
class RowShapes:
    """Per-GPU shapes of one micro-batch of a training row."""

    row: str
    tokens: int
    heads: int  # attention heads on one GPU
    head_dim: int
    seq_len: int
    batch: int
    wgrads: tuple[tuple[str, int, int], ...]  # (name, weight rows, weight columns); K = tokens
    hidden: int = 0  # the norms' and residual adds' width
    ffn: int = 0  # the MLP activation's width on one GPU
    norm_tokens: int = 0  # the norms' and residual adds' tokens on one GPU (tokens / tp under sequence parallelism)


def row_shapes(name: str) -> RowShapes:
    """The shapes of ``name``'s layer on one GPU (its config as ``llmsim validate -v`` prints it)."""
    rows = {r["row"]: r for r in published_rows("training.csv")}
    config = row_config(rows[name])
    model, training, parallel = config["model"], config["training"], config["parallel"]
    tp, hidden, heads = parallel["tp"], model["hidden"], model["heads"]
    ffn = model.get("ffn_hidden", 4 * hidden)
    kv_heads = model.get("kv_heads", heads)
    head_dim = hidden // heads
    qkv = (heads + 2 * kv_heads) * head_dim
    wgrads = (("qkv", hidden, qkv // tp), ("out_proj", hidden // tp, hidden), ("mlp_up", hidden, ffn // tp),
              ("mlp_down", ffn // tp, hidden))
    batch, seq_len = training["micro_batch"], training["seq_len"]
    return RowShapes(row=name, tokens=batch * seq_len, heads=heads // tp, head_dim=head_dim, seq_len=seq_len,
                     batch=batch, wgrads=wgrads, hidden=hidden, ffn=ffn // tp,
                     norm_tokens=batch * seq_len // (tp if parallel.get("sequence_parallel") else 1))


def tiny(shapes: RowShapes) -> RowShapes:
    """The same layer shrunk for the CPU (every dimension / 16, at least 8)."""
    def small(n: int) -> int:
        return max(8, n // 16)
    return RowShapes(row=shapes.row + " (cpu, /16)", tokens=small(shapes.tokens), heads=max(1, shapes.heads // 8),
                     head_dim=small(shapes.head_dim), seq_len=small(shapes.seq_len), batch=1,
                     wgrads=tuple((n, small(r), small(c)) for n, r, c in shapes.wgrads),
                     hidden=small(shapes.hidden), ffn=small(shapes.ffn), norm_tokens=small(shapes.norm_tokens))


class _CudaTimer:
    def __init__(self, torch: Any) -> None:
        self.torch = torch

    def time_call(self, fn: Callable[[], object]) -> float:
        start, end = (self.torch.cuda.Event(enable_timing=True) for _ in range(2))
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e-3


def _median(timer: Any, call: Callable[[], object], warmup: int, repeats: int) -> float:
    return measure(lambda _: call, sets=1, timer=timer, warmup=warmup, repeats=repeats).median_s


def attention_rows(torch: Any, device: str, s: RowShapes, timer: Any, warmup: int, repeats: int) -> list[dict[str, Any]]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dtype = torch.bfloat16
    shape = (s.batch, s.heads, s.seq_len, s.head_dim)
    q, k, v = (torch.randn(*shape, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    grad = torch.randn(*shape, device=device, dtype=dtype)
    backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION} if device == "cuda" else {"math": SDPBackend.MATH}
    rows = []
    for backend, kernel in backends.items():
        for p in DROPOUTS:
            def forward() -> Any:
                with sdpa_kernel(kernel):
                    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)

            def forward_backward() -> None:
                q.grad = k.grad = v.grad = None
                forward().backward(grad)

            try:
                times = {"forward": _median(timer, forward, warmup, repeats),
                         "forward_backward": _median(timer, forward_backward, warmup, repeats)}
            except RuntimeError as exc:  # the backend does not take this case on this build or GPU
                print(f"  attention {backend} dropout {p}: not run ({str(exc).splitlines()[0]})", file=sys.stderr)
                continue
            for what, seconds in times.items():
                rows.append({"kernel": f"attention_{what}", "variant": f"{backend} dropout {p}", "row": s.row,
                             "shape": "x".join(map(str, shape)), "latency_s": seconds})
    return rows


def wgrad_rows(torch: Any, device: str, s: RowShapes, timer: Any, warmup: int, repeats: int) -> list[dict[str, Any]]:
    dtype = torch.bfloat16
    rows = []
    for name, out_rows, out_cols in s.wgrads:
        x = torch.randn(s.tokens, out_rows, device=device, dtype=dtype)  # the layer input
        dy = torch.randn(s.tokens, out_cols, device=device, dtype=dtype)  # the output gradient
        main_grad = torch.zeros(out_rows, out_cols, device=device, dtype=torch.float32)
        variants: dict[str, Callable[[], object]] = {
            "bf16 out": lambda: torch.mm(x.t(), dy),
            "bf16 out + fp32 add (unfused)": lambda: main_grad.add_(torch.mm(x.t(), dy)),
        }
        try:
            torch.mm(x[:8].t(), dy[:8], out_dtype=torch.float32)
            variants["fp32 out (out_dtype)"] = lambda: torch.mm(x.t(), dy, out_dtype=torch.float32)
        except (TypeError, RuntimeError):
            pass
        for variant, call in variants.items():
            rows.append({"kernel": f"wgrad_{name}", "variant": variant, "row": s.row,
                         "shape": f"{out_rows}x{out_cols}x{s.tokens}", "latency_s": _median(timer, call, warmup, repeats)})
    return rows


# bf16 bytes per element each memory-bound kernel must move (reads + writes), as the model counts them
LAYERNORM_FORWARD_BYTES = 2 + 2  # read x, write y
LAYERNORM_BACKWARD_BYTES = 2 + 2 + 2  # read x and dy, write dx (dgamma / dbeta are per-column partials)
BIAS_GELU_FORWARD_BYTES = 2 + 2  # read the GEMM output, write the activation
BIAS_GELU_BACKWARD_BYTES = 2 + 2 + 2  # read the gradient and the saved input, write the input gradient
DROPOUT_ADD_FORWARD_BYTES = 2 + 2 + 2 + 1  # read x and the residual, write the sum and the 1-byte mask
DROPOUT_ADD_BACKWARD_BYTES = 2 + 1 + 2  # read the gradient and the mask, write the gradient
DROPOUT = 0.1


def _bias_gelu(x: Any, bias: Any, torch: Any) -> Any:
    """GeLU's tanh form on x + bias (the form Megatron's fused bias_gelu computes)."""
    y = x + bias
    return y * 0.5 * (1.0 + torch.tanh(0.7978845608 * y * (1.0 + 0.044715 * y * y)))


def _bias_dropout_add(x: Any, bias: Any, residual: Any, torch: Any) -> Any:
    return residual + torch.nn.functional.dropout(x + bias, p=DROPOUT, training=True)


def memory_kernel_rows(torch: Any, device: str, s: RowShapes, timer: Any, warmup: int, repeats: int,
                       gpu_name: str) -> list[dict[str, Any]]:
    """The layer's memory-bound kernels at the row's shapes, each with its bytes, achieved TB/s and the
    model's price of those bytes on ``gpu_name`` (see the module docstring, item 3)."""
    from hardware.catalog import get_gpu
    from hardware.cost import memory_op_time_s

    gpu = get_gpu(gpu_name)
    dtype = torch.bfloat16
    compiled = device == "cuda"
    fuse = torch.compile if compiled else (lambda fn: fn)
    style = "torch.compile" if compiled else "eager"
    tokens, hidden, ffn = s.norm_tokens, s.hidden, s.ffn  # the MLP activation holds every token: s.tokens

    def tensor(*shape: int, grad: bool = False) -> Any:
        return torch.randn(*shape, device=device, dtype=dtype, requires_grad=grad)

    x, dy = tensor(tokens, hidden, grad=True), tensor(tokens, hidden)
    gamma, beta = tensor(hidden, grad=True), tensor(hidden, grad=True)
    act, act_grad, act_bias = tensor(s.tokens, ffn, grad=True), tensor(s.tokens, ffn), tensor(ffn, grad=True)
    residual, out_bias = tensor(tokens, hidden, grad=True), tensor(hidden, grad=True)
    gelu, dropout_add = fuse(_bias_gelu), fuse(_bias_dropout_add)

    def layernorm() -> Any:
        return torch.nn.functional.layer_norm(x, (hidden,), gamma, beta)

    def backward(forward: Callable[[], Any], grad: Any) -> Callable[[], None]:
        def run() -> None:
            forward().backward(grad)
        return run

    cases: list[tuple[str, str, Callable[[], object], float]] = [
        ("layernorm_forward", "torch", layernorm, LAYERNORM_FORWARD_BYTES * tokens * hidden),
        ("layernorm_forward_backward", "torch", backward(layernorm, dy),
         (LAYERNORM_FORWARD_BYTES + LAYERNORM_BACKWARD_BYTES) * tokens * hidden),
        ("bias_gelu_forward", style, lambda: gelu(act, act_bias, torch), BIAS_GELU_FORWARD_BYTES * s.tokens * ffn),
        ("bias_gelu_forward_backward", style, backward(lambda: gelu(act, act_bias, torch), act_grad),
         (BIAS_GELU_FORWARD_BYTES + BIAS_GELU_BACKWARD_BYTES) * s.tokens * ffn),
        ("bias_dropout_add_forward", style, lambda: dropout_add(x, out_bias, residual, torch),
         DROPOUT_ADD_FORWARD_BYTES * tokens * hidden),
        ("bias_dropout_add_forward_backward", style, backward(lambda: dropout_add(x, out_bias, residual, torch), dy),
         (DROPOUT_ADD_FORWARD_BYTES + DROPOUT_ADD_BACKWARD_BYTES) * tokens * hidden),
    ]
    try:
        import transformer_engine.pytorch as te

        te_norm = te.LayerNorm(hidden, params_dtype=dtype, device=device)
        cases += [
            ("layernorm_forward", "transformer_engine", lambda: te_norm(x), LAYERNORM_FORWARD_BYTES * tokens * hidden),
            ("layernorm_forward_backward", "transformer_engine", backward(lambda: te_norm(x), dy),
             (LAYERNORM_FORWARD_BYTES + LAYERNORM_BACKWARD_BYTES) * tokens * hidden),
        ]
    except Exception as exc:  # not installed, or no GPU build: the torch rows still run
        print(f"  transformer_engine LayerNorm: not run ({type(exc).__name__})", file=sys.stderr)
    rows = []
    for kernel, variant, call, nbytes in cases:
        seconds = _median(timer, call, warmup, repeats)
        # a forward + backward pair is two kernels (or more) in the model: price each half's bytes
        halves = (nbytes,) if not kernel.endswith("forward_backward") else _split_bytes(kernel, nbytes)
        model_s = sum(memory_op_time_s(gpu, part) for part in halves)
        shape = f"{s.tokens}x{ffn}" if "gelu" in kernel else f"{tokens}x{hidden}"
        rows.append({"kernel": kernel, "variant": variant, "row": s.row, "shape": shape,
                     "latency_s": seconds, "bytes": nbytes, "achieved_TBps": nbytes / seconds / 1e12,
                     "model_s": model_s, "model_gpu": gpu_name})
    return rows


def _split_bytes(kernel: str, nbytes: float) -> tuple[float, float]:
    """The forward and backward bytes of a forward + backward case (the ratio of their per-element counts)."""
    forward, backward_ = {"layernorm": (LAYERNORM_FORWARD_BYTES, LAYERNORM_BACKWARD_BYTES),
                          "bias_gelu": (BIAS_GELU_FORWARD_BYTES, BIAS_GELU_BACKWARD_BYTES),
                          "bias_dropout_add": (DROPOUT_ADD_FORWARD_BYTES, DROPOUT_ADD_BACKWARD_BYTES)}[
        kernel.removesuffix("_forward_backward")]
    return nbytes * forward / (forward + backward_), nbytes * backward_ / (forward + backward_)


def ratios(rows: list[dict[str, Any]]) -> list[str]:
    """The lines to read: dropout's rate per backend and the fp32 accumulation's cost per GEMM."""
    by = {(r["row"], r["kernel"], r["variant"]): r["latency_s"] for r in rows}
    lines = []
    for (row, kernel, variant), seconds in by.items():
        if kernel.startswith("attention") and variant.endswith("dropout 0.1"):
            base = by.get((row, kernel, variant.replace("dropout 0.1", "dropout 0.0")))
            if base:
                lines.append(f"{row} {kernel} {variant.split()[0]}: rate with dropout 0.1 = {base / seconds:.3f}")
        if kernel.startswith("wgrad") and variant != "bf16 out":
            base = by[(row, kernel, "bf16 out")]
            lines.append(f"{row} {kernel} {variant}: {seconds / base:.3f} x the bf16-out GEMM")
    for r in rows:
        if "model_s" in r:
            lines.append(f"{r['row']} {r['kernel']} {r['variant']}: {r['achieved_TBps']:.2f} TB/s, "
                         f"{r['latency_s'] / r['model_s']:.2f} x the model's price on {r['model_gpu']}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--out", help="CSV to write (default: print only)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--gpu", default="h100-sxm-80gb", help="catalog GPU whose model prices the memory-bound kernels")
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("error: this check needs torch (pip install -e '.[calibrate]')", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but torch sees no GPU; use --device cpu for the tiny-shape run", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    timer = _CudaTimer(torch) if args.device == "cuda" else PerfCounterTimer()
    env = environment(torch, args.device)
    env["source"] = "benchmarks/gpu_small_model_kernels.py"
    rows: list[dict[str, Any]] = []
    for name in ROWS:
        shapes = row_shapes(name) if args.device == "cuda" else tiny(row_shapes(name))
        rows += attention_rows(torch, args.device, shapes, timer, args.warmup, args.repeats)
        rows += wgrad_rows(torch, args.device, shapes, timer, args.warmup, args.repeats)
        rows += memory_kernel_rows(torch, args.device, shapes, timer, args.warmup, args.repeats, args.gpu)
    for row in rows:
        row.update(env)
        print(f"{row['row']:<28} {row['kernel']:<26} {row['variant']:<32} {row['shape']:<20} {row['latency_s'] * 1e6:10.1f} us")
    print("\n".join(ratios(rows)))
    if args.out:
        with open(args.out, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(key for row in rows for key in row)))
            writer.writeheader()
            writer.writerows(rows)
        print(f"wrote {len(rows)} rows to {args.out}")
    return 0 if all(math.isfinite(r["latency_s"]) and r["latency_s"] > 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
