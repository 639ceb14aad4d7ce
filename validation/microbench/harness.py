"""The microbenchmark harness behind ``llmsim calibrate run`` (PyTorch, the ``calibrate`` extra).

Sweeps, each row one median of ``repeats`` timed calls after ``warmup`` (``timing.measure``), with
random inputs rotated through enough buffers to exceed twice the L2 cache, and the first result of
every op checked once against a reference:

- GEMM (``torch.matmul``) over LLM projection shapes in bf16 and fp16, fp8 (``torch._scaled_mm``)
  on GPUs with fp8 tensor cores (compute capability >= 8.9);
- attention (``scaled_dot_product_attention``): causal prefill without and with existing KV (the
  query block is the last positions of the keys), decode (one query token) across KV lengths,
  heads, KV heads and head dims;
- memory-bound kernels (elementwise scale, read + write) and device copies over sizes;
- pinned host<->device copies (GPU only);
- kernel-launch overhead (a one-element kernel back to back);
- NCCL all-reduce, all-gather, reduce-scatter and all-to-all over message sizes when more than one
  GPU is visible (one process per GPU, ``torch.distributed``).

On the GPU calls are timed with CUDA events; ``--device cpu`` runs the same sweeps with small shapes
and the host clock (what CI can run). torch is imported only inside ``run``.
"""

from __future__ import annotations

import datetime
import math
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

from validation.microbench.timing import PerfCounterTimer, measure, rotation_count

CPU_CACHE_BYTES = 32 * 2**20  # rotation target on the CPU device (a server last-level cache)


@dataclass(frozen=True, kw_only=True)
class Sweep:
    gemm: tuple[tuple[int, int, int], ...]
    prefill: tuple[tuple[int, int, int, int, int, int], ...]  # batch, seq, prefix, heads, kv_heads, head_dim
    decode: tuple[tuple[int, int, int, int, int], ...]  # batch, kv_len, heads, kv_heads, head_dim
    memory_bytes: tuple[int, ...]
    copy_bytes: tuple[int, ...]
    collective_bytes: tuple[int, ...]
    warmup: int
    repeats: int


def _llm_gemms(tokens: Iterable[int], hiddens: Iterable[int]) -> tuple[tuple[int, int, int], ...]:
    shapes = []
    for h in hiddens:
        for m in tokens:
            shapes += [(m, 3 * h, h), (m, h, h), (m, 4 * h, h), (m, h, 4 * h)]
    return tuple(dict.fromkeys(shapes))


def sweep_for(device: str, quick: bool) -> Sweep:
    """The shapes of one run: full or ``quick`` on a GPU (quick finishes in minutes on an H100-class
    part: ~250 timed configurations of at most a few ms), tiny on the CPU."""
    if device == "cpu":
        return Sweep(
            gemm=((16, 64, 64), (64, 128, 64), (128, 128, 128)),
            prefill=((1, 64, 0, 2, 2, 32), (1, 32, 32, 2, 1, 32)),
            decode=((2, 64, 2, 1, 32), (4, 128, 4, 2, 32)),
            memory_bytes=(2**16, 2**20), copy_bytes=(2**16,), collective_bytes=(2**16,),
            warmup=2, repeats=5,
        )
    if quick:
        return Sweep(
            gemm=_llm_gemms((1, 16, 128, 1024, 4096), (4096, 8192)),
            prefill=tuple((b, s, p, h, kv, 128) for b, s in ((1, 4096), (8, 1024)) for p in (0, 2048) for h, kv in ((32, 8), (64, 8))),
            decode=tuple((b, l, h, kv, 128) for b in (8, 64) for l in (1024, 8192) for h, kv in ((32, 8), (64, 8))),
            memory_bytes=tuple(2**e for e in range(16, 31, 2)), copy_bytes=tuple(2**e for e in range(16, 31, 3)),
            collective_bytes=tuple(2**e for e in range(10, 31, 2)), warmup=5, repeats=20,
        )
    return Sweep(
        gemm=_llm_gemms((1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384), (2048, 4096, 5120, 8192, 12288)),
        prefill=tuple((b, s, p, h, kv, d) for b, s in ((1, 8192), (1, 2048), (4, 2048), (16, 512)) for p in (0, 1024, 4096)
                      for h, kv in ((32, 32), (32, 8), (64, 8)) for d in (64, 128)),
        decode=tuple((b, l, h, kv, d) for b in (1, 8, 32, 128) for l in (256, 1024, 4096, 16384, 65536)
                     for h, kv in ((32, 32), (32, 8), (64, 8)) for d in (64, 128)),
        memory_bytes=tuple(2**e for e in range(12, 33)), copy_bytes=tuple(2**e for e in range(12, 31)),
        collective_bytes=tuple(2**e for e in range(8, 33)), warmup=10, repeats=50,
    )


class _CudaEventTimer:
    def __init__(self, torch: Any) -> None:
        self._torch = torch

    def time_call(self, fn: Callable[[], object]) -> float:
        start = self._torch.cuda.Event(enable_timing=True)
        end = self._torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e-3


def environment(torch: Any, device: str) -> dict[str, str]:
    """Provenance columns of every row of a run."""
    env = {"torch": torch.__version__, "date": datetime.date.today().isoformat(), "source": "llmsim calibrate run"}
    if device == "cuda":
        env["device"] = torch.cuda.get_device_name(0)
        env["cuda"] = str(torch.version.cuda)
        try:
            env["driver"] = ".".join(str(v) for v in divmod(torch._C._cuda_getDriverVersion(), 1000))
        except Exception:  # driver query is best effort; the CUDA runtime version is always recorded
            env["driver"] = ""
        env["library"] = "cublas+cudnn"
        env["library_version"] = f"cudnn {torch.backends.cudnn.version()}"
    else:
        import platform

        env["device"] = f"cpu {platform.processor() or platform.machine()}"
        env["library"] = "torch-cpu"
        env["library_version"] = torch.__version__
    return env


class _Bench:
    def __init__(self, torch: Any, device: str, sweep: Sweep, seed: int) -> None:
        self.torch = torch
        self.device = device
        self.sweep = sweep
        self.generator = torch.Generator(device="cpu").manual_seed(seed)
        if device == "cuda":
            self.timer: Any = _CudaEventTimer(torch)
            self.cache_bytes = float(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 * 2**20))
        else:
            self.timer = PerfCounterTimer()
            self.cache_bytes = CPU_CACHE_BYTES

    def randn(self, *shape: int, dtype: Any) -> Any:
        t = self.torch.randn(*shape, generator=self.generator, dtype=self.torch.float32)
        return t.to(device=self.device, dtype=dtype)

    def time(self, make_inputs: Callable[[], tuple], call: Callable[..., object], bytes_per_set: float) -> float:
        sets = rotation_count(bytes_per_set, self.cache_bytes, max_sets=8 if self.device == "cpu" else 64)
        inputs = [make_inputs() for _ in range(sets)]
        stats = measure(lambda i: (lambda: call(*inputs[i])), sets=sets, timer=self.timer,
                        warmup=self.sweep.warmup, repeats=self.sweep.repeats)
        return stats.median_s

    def precisions(self) -> list[tuple[str, Any]]:
        torch = self.torch
        if self.device == "cpu":
            return [("fp32", torch.float32), ("bf16", torch.bfloat16)]
        out = [("bf16", torch.bfloat16), ("fp16", torch.float16)]
        if torch.cuda.get_device_capability(0) >= (8, 9) and hasattr(torch, "float8_e4m3fn"):
            out.append(("fp8", torch.float8_e4m3fn))
        return out


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise RuntimeError(f"microbenchmark result check failed: {what}")


def _gemm_rows(b: _Bench) -> Iterator[dict[str, Any]]:
    torch = b.torch
    for name, dtype in b.precisions():
        checked = False
        for m, n, k in b.sweep.gemm:
            size = 1 if name == "fp8" else torch.tensor([], dtype=dtype).element_size()
            if name == "fp8":
                scale = torch.ones((), device=b.device)

                def make():
                    return (b.randn(m, k, dtype=torch.float16).to(dtype), b.randn(n, k, dtype=torch.float16).to(dtype).t())

                def call(x, w):
                    return torch._scaled_mm(x, w, scale_a=scale, scale_b=scale, out_dtype=torch.bfloat16)
            else:
                def make():
                    return (b.randn(m, k, dtype=dtype), b.randn(k, n, dtype=dtype))

                def call(x, w):
                    return torch.matmul(x, w)
            if not checked:
                x, w = make()
                reference = x.float() @ w.float()
                _check(torch.allclose(call(x, w).float(), reference, rtol=0.1, atol=0.1 * math.sqrt(k)), f"gemm {name} {m}x{n}x{k}")
                checked = True
            seconds = b.time(make, call, (m * k + k * n + m * n) * size)
            yield {"op": "gemm", "precision": name, "m": m, "n": n, "k": k, "batch": 1, "latency_s": seconds}


def _sdpa(torch: Any, q: Any, k: Any, v: Any, causal_lower_right: bool) -> Any:
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    if causal_lower_right:
        from torch.nn.attention.bias import causal_lower_right as lower_right

        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=lower_right(q.shape[2], k.shape[2]))
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=q.shape[2] > 1)


def _attention_rows(b: _Bench) -> Iterator[dict[str, Any]]:
    torch = b.torch
    name, dtype = ("bf16", torch.bfloat16)
    size = 2
    checked = False
    cases = [("attention_prefill", bt, s, p + s, h, kv, d) for bt, s, p, h, kv, d in b.sweep.prefill]
    cases += [("attention_decode", bt, 1, l, h, kv, d) for bt, l, h, kv, d in b.sweep.decode]
    for op, batch, q_len, kv_len, heads, kv_heads, head_dim in cases:
        lower_right = kv_len > q_len > 1

        def make():
            return (b.randn(batch, heads, q_len, head_dim, dtype=dtype), b.randn(batch, kv_heads, kv_len, head_dim, dtype=dtype),
                    b.randn(batch, kv_heads, kv_len, head_dim, dtype=dtype))

        def call(q, k, v):
            return _sdpa(torch, q, k, v, lower_right)
        if not checked:
            q, k, v = make()
            out = call(q, k, v).float()
            kk = k.float().repeat_interleave(heads // kv_heads, dim=1)
            vv = v.float().repeat_interleave(heads // kv_heads, dim=1)
            scores = q.float() @ kk.transpose(-1, -2) / math.sqrt(head_dim)
            mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=b.device).tril(diagonal=kv_len - q_len)
            reference = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ vv
            _check(torch.allclose(out, reference, atol=0.05, rtol=0.05), f"{op} {batch}x{q_len}x{kv_len}")
            checked = True
        bytes_per_set = (batch * heads * q_len * 2 + batch * kv_heads * kv_len * 2) * head_dim * size
        seconds = b.time(make, call, bytes_per_set)
        yield {"op": op, "precision": name, "kv_precision": name, "batch": batch, "seq_len": q_len, "kv_len": kv_len,
               "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "causal": True, "latency_s": seconds}


def _memory_rows(b: _Bench) -> Iterator[dict[str, Any]]:
    torch = b.torch
    checked = False
    for total in b.sweep.memory_bytes:
        elements = max(1, total // 8)  # fp32 read + write = 8 bytes per element

        def make():
            return (b.randn(elements, dtype=torch.float32), torch.empty(elements, device=b.device))

        def scale(x, out):
            return torch.mul(x, 2.0, out=out)
        if not checked:
            x, out = make()
            scale(x, out)
            _check(torch.equal(out, x * 2.0), "memory scale")
            checked = True
        yield {"op": "memory", "precision": "fp32", "bytes": elements * 8, "latency_s": b.time(make, scale, elements * 8)}
    for total in b.sweep.copy_bytes:
        elements = max(1, total // 8)

        def make():
            return (torch.empty(elements, device=b.device), b.randn(elements, dtype=torch.float32))

        def copy(dst, src):
            return dst.copy_(src)
        yield {"op": "device_copy", "precision": "fp32", "bytes": elements * 8, "latency_s": b.time(make, copy, elements * 8)}
    if b.device == "cuda":
        for total in b.sweep.copy_bytes:
            elements = max(1, total // 4)
            host = torch.empty(elements, pin_memory=True)
            device = torch.empty(elements, device="cuda")
            h2d = b.time(lambda: (device, host), lambda d, h: d.copy_(h, non_blocking=True), 0)
            d2h = b.time(lambda: (host, device), lambda h, d: h.copy_(d, non_blocking=True), 0)
            yield {"op": "host_to_device", "precision": "fp32", "bytes": elements * 4, "latency_s": h2d}
            yield {"op": "device_to_host", "precision": "fp32", "bytes": elements * 4, "latency_s": d2h}
    tiny = torch.zeros(1, device=b.device)
    launches = 100

    def burst(x):
        for _ in range(launches):
            x.add_(1.0)
    seconds = b.time(lambda: (tiny,), burst, 0) / launches
    yield {"op": "launch", "precision": "fp32", "latency_s": seconds}


def _collective_worker(rank: int, world: int, sizes: tuple[int, ...], warmup: int, repeats: int, port: int, queue: Any) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.cuda.set_device(rank)
    timer = _CudaEventTimer(torch)
    rows = []
    for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        for size in sizes:
            elements = max(world, size // 2) // world * world
            buf = torch.randn(elements, device="cuda", dtype=torch.float16)
            out = torch.empty_like(buf)
            shard = torch.empty(elements // world, device="cuda", dtype=torch.float16)
            calls = {
                "all_reduce": lambda: dist.all_reduce(buf),
                "all_gather": lambda: dist.all_gather_into_tensor(out, buf[: elements // world]),
                "reduce_scatter": lambda: dist.reduce_scatter_tensor(shard, buf),
                "all_to_all": lambda: dist.all_to_all_single(out, buf),
            }
            stats = measure(lambda i: calls[op], sets=1, timer=timer, warmup=warmup, repeats=repeats)
            median = torch.tensor([stats.median_s], device="cuda")
            dist.all_reduce(median, op=dist.ReduceOp.MAX)
            rows.append({"op": op, "precision": "fp16", "num_gpus": world, "message_bytes": elements * 2, "latency_s": float(median.item())})
    if rank == 0:
        queue.put(rows)
    dist.destroy_process_group()


def _collective_rows(b: _Bench) -> Iterator[dict[str, Any]]:
    torch = b.torch
    if b.device != "cuda" or torch.cuda.device_count() < 2:
        return
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    world = 2
    while world <= torch.cuda.device_count():
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        mp.spawn(_collective_worker, args=(world, b.sweep.collective_bytes, b.sweep.warmup, b.sweep.repeats, port, queue), nprocs=world)
        for row in queue.get():
            yield {**row, "library": "nccl", "library_version": ".".join(str(v) for v in torch.cuda.nccl.version())}
        world *= 2


SECTIONS = (("gemm", _gemm_rows), ("attention", _attention_rows), ("memory", _memory_rows), ("collectives", _collective_rows))


def run(*, device: str = "cuda", quick: bool = False, seed: int = 0, gpu: str | None = None,
        progress: bool | None = None) -> list[dict[str, Any]]:
    """Run every sweep on ``device`` ("cuda" or "cpu"); rows follow ``schema.COLUMNS``."""
    try:
        import torch
    except ImportError:
        raise RuntimeError("the microbenchmark harness needs PyTorch: pip install 'llmsim[calibrate]'") from None
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("no CUDA device visible to PyTorch; use --device cpu to run the harness on the CPU")
    torch.manual_seed(seed)
    sweep = sweep_for(device, quick)
    bench = _Bench(torch, device, sweep, seed)
    env = environment(torch, device)
    if gpu:
        env["gpu"] = gpu
    show = sys.stderr.isatty() if progress is None else progress
    total = len(sweep.gemm) * len(bench.precisions()) + len(sweep.prefill) + len(sweep.decode) + len(sweep.memory_bytes) + len(sweep.copy_bytes) + 1
    bar = None
    if show:
        from tqdm import tqdm

        bar = tqdm(total=total, desc="calibrate", unit="op", file=sys.stderr)
    rows = []
    with torch.no_grad():
        for section, rows_of in SECTIONS:
            if bar is not None:
                bar.set_postfix_str(section)
            for row in rows_of(bench):
                rows.append({**env, **row})
                if bar is not None:
                    bar.update(1)
    if bar is not None:
        bar.close()
    return rows
