"""Pure compute cost functions: GEMM, fused attention, memory-bound ops, kernel launch.

Every function returns seconds for one kernel on one GPU. They are shared by the analytic model, the
DES and the search, so those cannot disagree. No SimPy, no workloads, no wall clock.

Model: time = max(work / (peak x eta_compute), bytes / (HBM bandwidth x eta_memory) + fill) + launch,
where eta_compute is the GPU's best achievable fraction (``GpuSpec.efficiency``) times shape effects:
tile and wave quantization and a k-loop ramp for GEMMs; head-dim, per-query-block overhead and causal
diagonal waste for attention. The constants below are derived in their comments.
"""

from __future__ import annotations

import math
from typing import Sequence

from hardware.specs import GpuSpec

# --- GEMM -------------------------------------------------------------------------------------------
# Output tile of one thread block (CTA). 128x128 is the CUTLASS/cuBLAS default bf16 tile on Ampere and
# the common Hopper tile (128x256 Hopper tiles were tested against the measured tables below and
# predicted H200 m = 65..768 rows 23-42 % too slow (median per m band), so one 128x128 tile serves every architecture).
GEMM_TILE_M = 128
GEMM_TILE_N = 128
# For a skinny dimension libraries switch to narrow tiles (cuBLAS swaps operands and uses small-N
# kernels); 16 is the M of the mma.sync m16n8k16 tensor-core instruction, the narrowest useful tile.
GEMM_MIN_TILE = 16
# Hopper's wgmma instruction has M = 64 per warpgroup, so cuBLAS/CUTLASS sm90 kernels come in 64-row
# and 128-row variants: rows are padded to a multiple of 64, not 128, once m exceeds one tile.
GEMM_HOPPER_ROW_GRANULARITY = 64
# k-loop ramp k / (k + k0): a multistage (cp.async / TMA) pipeline loads stages - 1 k-blocks before the
# first MMA and drains them after the last; with 3 stages of 32 that is 64 k-elements of fixed cost per
# tile (plus the epilogue), so k0 = 64.
GEMM_K_PROLOGUE = 64
# Split-K fills idle SMs when the output has fewer tiles than SMs; each split must keep a few
# k-blocks to amortize its prologue and its fp32 partial-sum reduction, so k/split >= 256.
GEMM_SPLIT_K_MIN_K = 256
# A split-K GEMM writes fp32 partial sums that a reduction reads back (4 bytes per element each way),
# and the reduction is a second kernel: one back-to-back small-kernel floor, the mean of 2.7 us (A100
# 80GB) and 2.5 us (H200) for 64 KB kernels in te42kyfo/gpu-benches gpu-small-kernels.
GEMM_PARTIAL_BYTES_PER_ELEMENT = 4.0
GEMM_SPLIT_K_REDUCE_S = 2.6e-6
# Architectures whose GEMM libraries schedule tiles persistently with stream-K (Osama et al., "Stream-K:
# Work-centric Parallel Decomposition for Dense Matrix-Matrix Multiplication on the GPU", arXiv
# 2301.03598; CUTLASS 3.x sm90 KernelTmaWarpSpecializedCooperative + StreamKScheduler, also on sm100):
# once there are at least as many work units as SMs, the fractional last wave is spread over all SMs,
# so the wave term is 1 instead of quantized; their split-K partials are exchanged through a workspace
# small enough to stay in L2. Others (Volta..Ada, CDNA) launch one CTA per tile, quantize waves and
# reduce split-K partials in a separate kernel through HBM.
GEMM_STREAM_K_ARCHITECTURES = frozenset({"hopper", "blackwell"})

# --- memory -----------------------------------------------------------------------------------------
# DRAM pipeline fill + last-wave drain per memory-bound kernel, on top of the launch overhead. Derived
# from te42kyfo/gpu-benches gpu-small-kernels (back-to-back SCALE kernels): time = a + V/b fitted on the
# DRAM-resident sizes gives a = 5.1 us (A100 80GB, 84-392 MB) and 3.3 us (H200, 85-288 MB), while the
# smallest (64 KB, cache-resident) kernels take 2.7 and 2.5 us; the difference is 2.4 and 0.8 us, mean
# 1.6 us. (Little's law alone, DRAM latency ~570 cycles / 1.41 GHz = 0.4 us on A100 from
# gpu-benches cuda-latency/a100_80.txt, is the lower bound of this term.)
MEMORY_FILL_S = 1.6e-6

# --- attention (FlashAttention-2 style fused kernel) -------------------------------------------------
# Fitted to the FA2 fwd+bwd tables (A100, H100: hd 64/128, causal/non-causal, seq 512..16k; 47 points)
# jointly with the H100 FA2 forward-only column of the FA3 chart (24 points), least squares on relative
# error, then rounded (Dao-AILab/flash-attention assets flash2_{a100,h100}_fwd_bwd_benchmark.png,
# flash3_fp16_fwd.png; reference/microbenchmarks.md C1). Fit: c_hd 19.5, s0 fwd 132, s0 bwd 226,
# bwd/fwd rate 0.896.
ATTENTION_HEAD_DIM_OVERHEAD = 20.0  # c_hd in eta_hd = hd / (hd + c_hd)
# FA2 at hd256 (forward 326 TFLOP/s on H100) is no faster than hd64 (324): it must shrink its tiles to
# fit shared memory, so the head-dim benefit stops at 128.
ATTENTION_HEAD_DIM_SATURATION = 128
ATTENTION_QUERY_OVERHEAD_KEYS_FWD = 130.0  # s0: per-query fixed cost (load Q, write O, final rescale) in keys
ATTENTION_QUERY_OVERHEAD_KEYS_BWD = 225.0  # s0 of the backward (also loads dO, LSE; writes dQ partials)
ATTENTION_BLOCK = 128  # query/key block: each causal query block computes a half-masked diagonal tile
# Backward rate / forward rate: H100 FA2 fwd 370 (hd128) and 324 (hd64) TFLOP/s at 16k non-causal vs
# fwd+bwd 338 and 296 give 3.5/338 = 1/370 + 2.5/B => B/F = 0.88 (both head dims); the joint fit: 0.89.
ATTENTION_BWD_OVER_FWD_RATE = 0.89
# efficiency.attention is the fwd+bwd asymptote (what the FA2 benchmark reports). With forward rate F
# and backward 0.89 F, 3.5 / (1/F + 2.5/(0.89 F)) = fwd+bwd rate => F = rate x (1 + 2.5/0.89) / 3.5.
ATTENTION_FWD_RATE_FACTOR = (1.0 + 2.5 / ATTENTION_BWD_OVER_FWD_RATE) / 3.5
ATTENTION_BWD_RATE_FACTOR = ATTENTION_FWD_RATE_FACTOR * ATTENTION_BWD_OVER_FWD_RATE
ATTENTION_BACKWARD_FLOP_RATIO = 2.5  # FA2 counting: backward = 2.5 x forward FLOPs (fwd+bwd = 3.5 x fwd)
# A FlashAttention-1-class kernel (FA1, and the 2022 Triton kernel, which matches FA1 on A100: hd64
# non-causal 90-102 vs FA1 91-110 TFLOP/s) relative to the FA2 rate this model is fitted to, by head
# dim: the mean FA1 / FA2 fwd+bwd ratio of the causal bars at seq 512..16k is 0.580 (A100) and 0.599
# (H100) at hd64 but 0.464 on both at hd128 (Dao-AILab/flash-attention
# flash2_{a100,h100}_fwd_bwd_benchmark.png, reference/microbenchmarks.md C1): FA2's gain over FA1
# grows with the head dim. Linear in the head dim between the two bars, held outside them.
ATTENTION_FA1_RATE_BY_HEAD_DIM = ((64, 0.59), (128, 0.464))
# cuDNN's fused attention (the F16_arbitrary_seqlen backend Transformer Engine runs on Hopper)
# relative to the FA2 rate this model is fitted to, by GPU architecture, pass and head dim: the mean
# cuDNN / FA2 ratio of the H100 80GB SXM5 bars at seq 512..16k (hidden 2048, 16k tokens per batch) in
# the FlashAttention-3 paper's benchmarks (Shah et al. 2024, arXiv 2407.08608, Dao-AILab/flash-attention
# assets/flash3_fp16_fwd.png; reference/microbenchmarks.md C1): forward, causal, 1.274 at hd64
# (cuDNN 225..388 vs FA2 180..299 TFLOP/s) and 1.612 at hd128 (315..539 vs 191..335); backward, the
# paper's non-causal bars (it shows no causal backward), 1.465 at hd64 (266..433 vs 198..291) and
# 1.572 at hd128 (305..516 vs 214..322). The forward's causal and non-causal ratios agree within 3 %
# (non-causal 1.246 at hd64, 1.640 at hd128), so the non-causal backward ratio is taken for causal
# training. Linear in the head dim between the two bars, held outside them. Architectures without a
# measurement run at the FA2 rate (Transformer Engine on sm80 prefers flash-attn anyway; TE 2.x's
# preference for cuDNN on Blackwell, ``device_compute_capability >= (9, 0)``, is not priced: no
# public cuDNN / FA2 pair on that GPU is cited here).
CUDNN_ATTENTION_RATE_BY_HEAD_DIM = {
    "hopper": {"forward": ((64, 1.274), (128, 1.612)), "backward": ((64, 1.465), (128, 1.572))},
}
# Fused attention kernel families: "flash" (FlashAttention-2 / cuDNN / the serving engines' own
# kernels: the rate fitted above, and a calibration profile's measured attention rows apply),
# "flash2" (Dao's FlashAttention-2 library kernel itself: the FA2 rate fitted above, which its own
# benchmark tables give; a profile's rows measure other kernels, e.g. TensorRT-LLM's Hopper context
# FMHA, and do not apply to it), "flash1" (FlashAttention-1-class: ``attention_fa1_rate`` x the
# FA2 rate; a profile's rows do not apply to it either) and "cudnn" (cuDNN fused attention, the
# backend Transformer Engine selects on Hopper: ``attention_cudnn_rate`` x the FA2 rate; a profile's
# rows do not apply to it).
ATTENTION_KERNELS = ("flash", "flash2", "flash1", "cudnn")


def _by_head_dim(points: tuple[tuple[int, float], tuple[int, float]], head_dim: float) -> float:
    (d0, r0), (d1, r1) = points
    d = min(max(float(head_dim), d0), d1)
    return r0 + (r1 - r0) * (d - d0) / (d1 - d0)


def attention_cudnn_rate(architecture: str | None, head_dim: float, *, backward: bool) -> float:
    """Compute rate of cuDNN fused attention relative to FA2 on this GPU architecture at this head
    dim (``CUDNN_ATTENTION_RATE_BY_HEAD_DIM``; 1.0 where no measurement is cited)."""
    rates = CUDNN_ATTENTION_RATE_BY_HEAD_DIM.get(architecture or "")
    if rates is None:
        return 1.0
    return _by_head_dim(rates["backward" if backward else "forward"], head_dim)


def attention_fa1_rate(head_dim: float) -> float:
    """Compute rate of a FlashAttention-1-class kernel relative to FA2 at this head dim."""
    return _by_head_dim(ATTENTION_FA1_RATE_BY_HEAD_DIM, head_dim)


def launch_overhead_s(gpu: GpuSpec) -> float:
    """Fixed host-side cost of launching one kernel (the calibration profile's measurement if any)."""
    calibration = gpu.calibration
    if calibration is not None and calibration.launch_overhead_s is not None:
        return calibration.launch_overhead_s
    return gpu.efficiency.launch_overhead_s


def hbm_time_s(gpu: GpuSpec, bytes_moved: float) -> float:
    """Seconds for a kernel's HBM traffic alone (no launch): fill/drain plus streaming at the
    achievable bandwidth ``efficiency.memory x hbm_bandwidth_Bps``. Zero bytes cost zero."""
    if bytes_moved < 0:
        raise ValueError(f"bytes_moved = {bytes_moved} must be >= 0")
    if bytes_moved == 0:
        return 0.0
    return MEMORY_FILL_S + bytes_moved / (gpu.hbm_bandwidth_Bps * gpu.efficiency.memory)


def calibrated_kernel_s(gpu: GpuSpec, kernel_s: float, ratio: float, bytes_moved: float) -> float:
    """Kernel seconds with a calibration profile's measured / analytic efficiency ``ratio``, never
    below the compulsory HBM traffic at the datasheet bandwidth (``bytes_moved / hbm_bandwidth_Bps``).

    Measurement tables time one kernel called back to back on the same buffers, so operands that fit
    in L2 (a small GEMM's weights, a decode batch's KV cache) can be served from it and a table row
    can run faster than HBM allows; in a model's forward pass every layer reads its own weights and
    KV cache from HBM, so no calibrated kernel may beat that bound."""
    return max(kernel_s / ratio, bytes_moved / gpu.hbm_bandwidth_Bps)


def stream_kernel_time_s(gpu: GpuSpec, bytes_moved: float, rate: float = 1.0) -> float:
    """A streaming kernel (STREAM's scale or copy, what ``llmsim calibrate run`` times) that reads plus
    writes ``bytes_moved`` of HBM, at ``rate`` times the STREAM rate.

    Small kernels are launch- and latency-bound (launch + fill); large ones stream at the STREAM rate
    ``efficiency.memory``. A calibration profile's measured efficiency at this size (``[memory]``)
    replaces fill + the STREAM rate.
    """
    measured = None if gpu.calibration is None or bytes_moved <= 0 else gpu.calibration.memory_efficiency(bytes_moved)
    if measured is None:  # fill, then the bytes at rate x the STREAM rate
        return hbm_time_s(gpu, bytes_moved / rate) + launch_overhead_s(gpu)
    return bytes_moved / (gpu.hbm_bandwidth_Bps * measured * rate) + launch_overhead_s(gpu)


def memory_op_time_s(gpu: GpuSpec, bytes_moved: float) -> float:
    """A framework's memory-bound kernel (elementwise, norm, copy, the loss, the optimizer) that reads
    plus writes ``bytes_moved`` of HBM: a streaming kernel at ``efficiency.memory_kernels`` of the
    STREAM rate, the rate such kernels measurably attain on this GPU."""
    return stream_kernel_time_s(gpu, bytes_moved, gpu.efficiency.memory_kernels)


def sustained_clock_factor(gpu: GpuSpec) -> float:
    """Compute rate of a GEMM in a sustained workload over the rate ``efficiency.gemm`` was measured
    at: ``sustained_clock / boost_clock`` where the catalog gives a sustained clock, else 1.

    ``efficiency.gemm`` is the MAMF (ml-engineering mamf-finder), timed with an L2 flush (a 256 MB
    memset) and a copy into C before every matmul: the tensor cores idle between iterations, the
    board's average power stays below its limit and the SM clock stays near boost. When tensor-core
    work runs back to back (a training step, a long prefill, every measured table of back-to-back
    replays) the power limit holds the SM clock at the sustained clock instead. The A100 SXM 80GB
    table of aiconfigurator-core 0.12.0 (sglang 0.5.10, back-to-back CUDA-graph replays) shows it: its
    m = 2,048..32,768, n, k = 4,096..16,384 bf16 rows plateau at 0.79-0.81 of the 312 TFLOP/s peak
    whatever their length (1 to 16 ms), where the MAMF is 0.869; 0.869 x 1,305 / 1,410 = 0.804.
    The HBM clock is not the SM clock and is not lowered, so only the compute side is scaled. Fused
    attention's efficiency is fitted to the FlashAttention benchmarks, whose calls (about 0.3 ms at
    their short sequences, a few ms at 16k) run at the boost clock the MAMF's matmuls do; the model
    reproduces NVIDIA/Fuser's single-round nsys timing of FlashAttention-2's backward on an H100 within
    2 % at that clock (``tests/hardware/test_attention_grid_occupancy.py``), so attention's compute is
    scaled alike. A calibration profile's GEMM and attention ratios are fitted against the analytic
    model at the clock its tables ran at (``validation/calibration/fit.py``, ``gemm_clock``), so a
    measured table that already ran at the sustained clock is reproduced, not slowed twice."""
    if gpu.sustained_clock_Hz is None:
        return 1.0
    return min(1.0, gpu.sustained_clock_Hz / gpu.boost_clock_Hz)


def _gemm_tile(dim: int, default_tile: int) -> int:
    """Tile extent a library picks for one output dimension: the default tile, or a narrower power of
    two (>= GEMM_MIN_TILE) when the dimension is smaller than the default tile."""
    if dim >= default_tile:
        return default_tile
    return max(GEMM_MIN_TILE, 1 << max(0, math.ceil(math.log2(dim))))


def _check_positive_int(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} = {value!r} must be an integer >= 1")


def _gemm_plan(
    gpu: GpuSpec, m: int, n: int, k: int, *, batch: int, peak_flops_per_s: float, bytes_moved: float | None,
    precision: str = "bf16", split_accumulator: bool = False,
) -> tuple[float, float]:
    """(kernel seconds without launch, MMA-loop fraction of peak) of the fastest split-K plan.

    For each split s (1 .. enough work units to cover the SMs once, k/s >= GEMM_SPLIT_K_MIN_K):
      compute = FLOPs / (peak x efficiency.gemm x sustained clock factor x tile x wave x ramp(k/s));
      memory  = MEMORY_FILL_S + bytes / (HBM x weight efficiency x min(1, units / SMs)), since a grid
                with fewer CTAs than SMs cannot keep every SM's loads in flight;
      split-K (s > 1) adds the reduction kernel floor and 2 x s x m n x 4 B of fp32 partials.
    ``bytes_moved`` None chooses on compute (+ reduction) alone.
    """
    for name, value in (("m", m), ("n", n), ("k", k), ("batch", batch)):
        _check_positive_int(name, value)
    stream_k = gpu.architecture in GEMM_STREAM_K_ARCHITECTURES
    tile_m, tile_n = _gemm_tile(m, GEMM_TILE_M), _gemm_tile(n, GEMM_TILE_N)
    tiles_m, tiles_n = -(-m // tile_m), -(-n // tile_n)
    padded_m = tiles_m * tile_m
    if stream_k and m > GEMM_TILE_M:
        padded_m = -(-m // GEMM_HOPPER_ROW_GRANULARITY) * GEMM_HOPPER_ROW_GRANULARITY
    base_eff = gpu.efficiency.gemm_fraction(precision, split_accumulator=split_accumulator) * sustained_clock_factor(gpu) * (m * n) / (padded_m * tiles_n * tile_n)
    tiles = tiles_m * tiles_n * batch
    sms = gpu.sm_count
    flops = 2.0 * m * n * k * batch
    weight_eff = gpu.efficiency.gemm_memory if gpu.efficiency.gemm_memory is not None else gpu.efficiency.memory
    weight_Bps = gpu.hbm_bandwidth_Bps * weight_eff
    partial_bytes_per_split = GEMM_PARTIAL_BYTES_PER_ELEMENT * m * n * batch
    max_split = max(1, min(-(-sms // tiles), k // GEMM_SPLIT_K_MIN_K))
    best_s, best_eff = math.inf, 0.0
    for split in range(1, max_split + 1):
        units = tiles * split
        wave = 1.0 if stream_k and units >= sms else units / (-(-units // sms) * sms)
        k_per_split = k / split
        eff = base_eff * wave * k_per_split / (k_per_split + GEMM_K_PROLOGUE)
        time_s = flops / (peak_flops_per_s * eff)
        if bytes_moved is not None:
            memory_s = MEMORY_FILL_S + bytes_moved / (weight_Bps * min(1.0, units / sms))
            time_s = max(time_s, memory_s)
        if split > 1:
            partial_bytes = partial_bytes_per_split * split
            if stream_k and gpu.l2_bandwidth_Bps > 0 and partial_bytes <= gpu.l2_cache_bytes:
                partial_Bps = gpu.l2_bandwidth_Bps
            else:
                partial_Bps = gpu.hbm_bandwidth_Bps * gpu.efficiency.memory
            time_s += GEMM_SPLIT_K_REDUCE_S + 2.0 * partial_bytes / partial_Bps
        if time_s < best_s:
            best_s, best_eff = time_s, eff
    return best_s, best_eff


def gemm_efficiency(
    gpu: GpuSpec, m: int, n: int, k: int, *, batch: int = 1, precision: str | None = None, split_accumulator: bool = False,
) -> float:
    """Achieved fraction of dense peak of the MMA loop for ``batch`` (m x k) @ (k x n) GEMMs, compute
    side only (memory traffic ignored), for the split-K plan that minimizes compute plus reduction time.

    efficiency.gemm (for fp8, when measured: efficiency.gemm_fp8, times gemm_fp8_fast_accumulation
    unless ``split_accumulator``) x sustained clock factor
    (``sustained_clock_factor``) x tile quantization x wave x k ramp:
    - tile: useful m n / padded m x padded n (rows padded to 64 on stream-K architectures once m > 128);
    - wave: work units u = tiles x s; u / (ceil(u / SMs) x SMs), or 1 once u >= SMs under stream-K;
    - ramp: (k/s) / (k/s + GEMM_K_PROLOGUE).
    ``precision`` (default bf16, else fp16) sets the peak the reduction time is weighed against.
    """
    if precision is None:
        precision = "bf16" if "bf16" in gpu.peak_flops_per_s else "fp16"
    return _gemm_plan(gpu, m, n, k, batch=batch, peak_flops_per_s=gpu.peak(precision), bytes_moved=None,
                      precision=precision, split_accumulator=split_accumulator)[1]


def gemm_time_s(
    gpu: GpuSpec,
    m: int,
    n: int,
    k: int,
    *,
    precision: str,
    bytes_per_element: float,
    batch: int = 1,
    split_accumulator: bool = False,
) -> float:
    """``batch`` independent (m x k) @ (k x n) matmuls at ``precision``; operands and output of
    ``bytes_per_element`` each. The fastest split-K plan of max(compute, weight streaming) plus its
    reduction (see ``_gemm_plan``), plus launch. Inside a calibration profile's GEMM coverage the
    kernel seconds are divided by the measured / analytic efficiency ratio at this shape.

    ``split_accumulator``: an fp8 GEMM that promotes its partial sums to fp32 (Transformer Engine's
    dgrad and wgrad, torchao's grad_input and grad_weight) runs at ``efficiency.gemm_fp8`` instead of
    the fast-accumulation rate; a profile's fp8 surface, fitted on fast-accumulation tables against
    the fast-accumulation analytic rate, scales both alike."""
    if bytes_per_element <= 0:
        raise ValueError(f"bytes_per_element = {bytes_per_element} must be > 0")
    bytes_moved = (m * k + k * n + m * n) * bytes_per_element * batch
    kernel_s, _ = _gemm_plan(gpu, m, n, k, batch=batch, peak_flops_per_s=gpu.peak(precision), bytes_moved=bytes_moved,
                             precision=precision, split_accumulator=split_accumulator)
    calibration = gpu.calibration
    if calibration is not None:
        ratio = calibration.gemm_ratio(precision, m, n, k, batch)
        if ratio is not None:
            kernel_s = calibrated_kernel_s(gpu, kernel_s, ratio, bytes_moved)
    return kernel_s + launch_overhead_s(gpu)


def _check_sequences(sequences: Sequence[tuple[int, int]], causal: bool) -> None:
    """A causal sequence's queries are the last of its keys (0 <= queries <= keys); an unmasked one
    (a sliding window's mean, a context-parallel shard) may hold more queries than keys."""
    for q, kv in sequences:
        if q < 0 or kv < 0 or (causal and kv < q):
            raise ValueError(f"sequence (queries={q}, keys={kv}) needs 0 <= queries{' <= keys' if causal else ', 0 <= keys'}")


def attention_flops(
    sequences: Sequence[tuple[int, int]], *, heads: int, head_dim: int, causal: bool, v_head_dim: int | None = None
) -> float:
    """Forward score (QK^T) and value (AV) FLOPs for ``sequences`` of (new query tokens, total keys).

    A sequence's queries are its last ``q`` positions among ``kv`` keys. Causal masking skips the
    keys after each query, so query i (0-based among the new ones) sees ``kv - q + i + 1`` keys.
    Per-sequence sums: a varlen batch costs exactly the sum of its sequences.
    """
    _check_sequences(sequences, causal)
    v_dim = head_dim if v_head_dim is None else v_head_dim
    keys_seen = 0.0
    for q, kv in sequences:
        if causal:
            keys_seen += q * (kv - q) + q * (q + 1) / 2.0
        else:
            keys_seen += float(q) * kv
    return 2.0 * heads * (head_dim + v_dim) * keys_seen


def attention_asymptote_flops_per_s(gpu: GpuSpec, *, head_dim: int, precision: str, v_head_dim: int | None = None) -> float:
    """Long-sequence fwd+bwd FLOP/s of the GPU's fused attention kernel at this head dim:
    peak x efficiency.attention x hd / (hd + c_hd), hd = mean of QK and V head dims capped at 128."""
    v_dim = head_dim if v_head_dim is None else v_head_dim
    hd = min((head_dim + v_dim) / 2.0, float(ATTENTION_HEAD_DIM_SATURATION))
    return gpu.peak(precision) * gpu.efficiency.attention * hd / (hd + ATTENTION_HEAD_DIM_OVERHEAD)


def attention_time_s(
    gpu: GpuSpec,
    sequences: Sequence[tuple[int, int]],
    *,
    heads: int,
    kv_heads: int,
    head_dim: int,
    precision: str,
    bytes_per_element: float,
    causal: bool = True,
    backward: bool = False,
    v_head_dim: int | None = None,
    kernel_rate: float = 1.0,
    kernel: str = "flash",
) -> float:
    """One fused (FlashAttention-style) kernel over a varlen batch of ``sequences``.

    Each entry is (new query tokens, total key tokens including the new ones): prefill is (s, s),
    a prefill chunk with cached prefix is (chunk, prefix + chunk), decode is (1, context).

    Compute: work in "keys processed" summed over sequences (never averaged):
      useful keys (as ``attention_flops``) + causal diagonal waste q x min(q, 128)/2 (half of each
      query block's diagonal tile is masked but computed) + q x s0 (per-query fixed cost: loading Q,
      writing O, the final rescale; the matmul work per key scales with head_dim, this does not, so it
      is counted in keys: s0 = 130 fwd, 225 bwd),
    at rate peak x efficiency.attention x hd/(hd + 20) x (1.088 fwd | 0.969 bwd) x the sustained clock
    factor (``sustained_clock_factor``). efficiency.attention is the GPU's FA2 fwd+bwd asymptote at
    large head dim, from benchmarks of short calls at the boost clock; the factors split it into forward
    and backward rates (bwd = 0.89 x fwd) so that fwd + bwd reproduces it. Backward does 2.5x the
    forward FLOPs.
    Memory: Q, O read/written once; K, V read once per sequence (decode is KV-read bound); x2 backward.
    ``kernel_rate``: a further factor on the compute rate (e.g. dropout inside the kernel);
    ``kernel``: the kernel family (ATTENTION_KERNELS; "flash1" runs at ``attention_fa1_rate`` of FA2,
    "cudnn" at ``attention_cudnn_rate``; only "flash" reads a calibration profile's attention rows,
    and the others, and every backward, at a causal self-attention shape keep the share of their rate
    the profile's prefill surface gives their grid of sequences x heads:
    ``CalibrationProfile.attention_grid_occupancy``).
    """
    if heads < 1 or kv_heads < 1 or heads % kv_heads != 0:
        raise ValueError(f"heads = {heads}, kv_heads = {kv_heads}: need kv_heads >= 1 dividing heads")
    # Sums in integers: twice the keys processed (the per-sequence term of
    # ``attention_keys_processed`` is a multiple of 1/2), so the total is exact and the same float as a
    # sequence-by-sequence floating-point sum (exact too while it stays below 2^52).
    twice_keys = 0
    q_tokens = 0
    kv_tokens = 0
    block = ATTENTION_BLOCK
    _check_sequences(sequences, causal)
    for q, kv in sequences:
        q_tokens += q
        kv_tokens += kv
        if causal:
            # 2 [q (kv - q) + q (q + 1) / 2 + q min(q, block) / 2]
            twice_keys += q * (2 * kv - q + 1 + (q if q < block else block))
        else:
            twice_keys += 2 * q * kv
    computed_keys = twice_keys / 2.0
    return attention_time_from_totals_s(
        gpu, computed_keys=computed_keys, query_tokens=q_tokens, key_tokens=kv_tokens, heads=heads,
        kv_heads=kv_heads, head_dim=head_dim, precision=precision, bytes_per_element=bytes_per_element,
        backward=backward, v_head_dim=v_head_dim, num_sequences=len(sequences), causal=causal,
        kernel_rate=kernel_rate, kernel=kernel,
    )


def attention_keys_processed(queries: int, keys: int, *, causal: bool = True) -> float:
    """Keys one sequence of ``queries`` new tokens among ``keys`` costs the fused kernel (useful keys
    plus the causal diagonal waste), the per-sequence term ``attention_time_s`` sums."""
    if causal:
        return queries * (keys - queries) + queries * (queries + 1) / 2.0 + queries * min(queries, ATTENTION_BLOCK) / 2.0
    return float(queries) * keys


def single_query_keys_processed(num_sequences: int, key_tokens: int, *, causal: bool = True) -> float:
    """``attention_keys_processed(1, kv)`` summed over ``num_sequences`` single-query sequences
    (decodes) of ``key_tokens`` keys in all: kv - 1 useful keys before the query, its own key and half
    a diagonal tile, kv + 1/2 each (kv without causal masking). Exact while below 2^52."""
    return key_tokens + num_sequences / 2.0 if causal else float(key_tokens)


def attention_time_from_totals_s(
    gpu: GpuSpec,
    *,
    computed_keys: float,
    query_tokens: int,
    key_tokens: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    precision: str,
    bytes_per_element: float,
    backward: bool = False,
    v_head_dim: int | None = None,
    num_sequences: int | None = None,
    causal: bool = True,
    kernel_rate: float = 1.0,
    kernel: str = "flash",
) -> float:
    """``attention_time_s`` from the three sums it depends on: keys processed
    (``attention_keys_processed`` summed over the sequences), query tokens and key tokens. A caller
    that keeps these sums incrementally gets the same seconds without a list of sequences; the sums
    are exact in floating point (every term is a multiple of 1/2 below 2^52), so the result is
    bit-identical to ``attention_time_s`` on the same batch. With ``num_sequences`` given and a
    calibration profile covering the batch (causal forward prefill or decode), a "flash" kernel's
    seconds are divided by the profile's measured / analytic efficiency ratio (fitted at the clock the
    profile's tables ran at, ``gemm_clock``, as its GEMM ratios are)."""
    if heads < 1 or kv_heads < 1 or heads % kv_heads != 0:
        raise ValueError(f"heads = {heads}, kv_heads = {kv_heads}: need kv_heads >= 1 dividing heads")
    if head_dim < 1:
        raise ValueError(f"head_dim = {head_dim} must be >= 1")
    if query_tokens < 0 or key_tokens < 0 or (causal and key_tokens < query_tokens) or computed_keys < 0:
        raise ValueError(
            f"totals (keys processed={computed_keys}, queries={query_tokens}, keys={key_tokens}) need "
            f"0 <= queries{' <= keys' if causal else ', 0 <= keys'} and keys processed >= 0"
        )
    v_dim = head_dim if v_head_dim is None else v_head_dim
    if backward:
        overhead_keys = ATTENTION_QUERY_OVERHEAD_KEYS_BWD
        rate_factor = ATTENTION_BWD_RATE_FACTOR
        flop_ratio = ATTENTION_BACKWARD_FLOP_RATIO
    else:
        overhead_keys = ATTENTION_QUERY_OVERHEAD_KEYS_FWD
        rate_factor = ATTENTION_FWD_RATE_FACTOR
        flop_ratio = 1.0
    work_flops = flop_ratio * 2.0 * heads * (head_dim + v_dim) * (computed_keys + query_tokens * overhead_keys)
    if not 0.0 < kernel_rate <= 1.0:
        raise ValueError(f"kernel_rate = {kernel_rate} must be in (0, 1]")
    if kernel not in ATTENTION_KERNELS:
        raise ValueError(f"kernel = {kernel!r} must be one of {', '.join(ATTENTION_KERNELS)}")
    rate = attention_asymptote_flops_per_s(gpu, head_dim=head_dim, precision=precision, v_head_dim=v_dim) * rate_factor
    # efficiency.attention is the FlashAttention benchmarks' rate, short calls at the boost clock as the
    # MAMF's matmuls are: under sustained work the kernel runs at the sustained clock, as a GEMM does
    rate *= kernel_rate * sustained_clock_factor(gpu)
    if kernel == "flash1":
        rate *= attention_fa1_rate((head_dim + v_dim) / 2.0)
    elif kernel == "cudnn":
        rate *= attention_cudnn_rate(gpu.architecture, (head_dim + v_dim) / 2.0, backward=backward)
    compute_s = work_flops / rate
    bytes_moved = (query_tokens * heads * (head_dim + v_dim) + key_tokens * kv_heads * (head_dim + v_dim)) * bytes_per_element
    if backward:
        bytes_moved *= 2.0
    kernel_s = max(compute_s, hbm_time_s(gpu, bytes_moved))
    calibration = gpu.calibration
    if calibration is not None and num_sequences is not None:
        ratio = None
        if kernel == "flash":
            ratio = calibration.attention_ratio(
                precision=precision, num_sequences=num_sequences, query_tokens=query_tokens, key_tokens=key_tokens,
                heads=heads, kv_heads=kv_heads, head_dim=head_dim, v_head_dim=v_dim, causal=causal, backward=backward,
            )
        if ratio is None and causal and key_tokens == query_tokens and head_dim == v_dim:
            # a kernel the profile did not time (a backward, another library's kernel) at a
            # prefill shape: its grid of sequences x heads x query blocks fills the GPU as the
            # measured kernel's does
            ratio = calibration.attention_grid_occupancy(
                precision=precision, num_sequences=num_sequences, query_tokens=query_tokens, heads=heads,
                head_dim=head_dim,
            )
        if ratio is not None:
            kernel_s = calibrated_kernel_s(gpu, kernel_s, ratio, bytes_moved)
    return kernel_s + launch_overhead_s(gpu)
