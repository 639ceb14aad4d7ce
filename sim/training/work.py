"""The contract between the training cost builder and the pipeline executors.

``sim.training.iteration`` turns (model, plan, job, cluster) into a ``PipelineWork``: how long each
micro-batch's forward (F), input-gradient backward (B) and weight-gradient backward (W) take on
every model chunk, what crosses each stage boundary, and the per-stage data-parallel and optimizer
work. The SimPy executor (``sim.training.pipeline_des``) and the analytic estimator both consume it,
so they price the same work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True, slots=True, kw_only=True)
class CommWork:
    """One collective on a communication stream, already priced on the topology."""

    axis: str  # "tp" | "cp" | "ep" | "dp" | "pp"
    kind: str  # hardware.collectives.Collective value
    message_bytes: float
    duration_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class ChunkWork:
    """One micro-batch through one model chunk (a contiguous range of layers on one stage).

    Compute durations include the communication that blocks the compute stream (TP/CP/EP
    collectives not overlapped); ``exposed_comm_s`` says how much of each duration that is, per axis.
    """

    forward_s: float
    backward_input_s: float  # B: activation gradients, incl. recompute of the forward when recomputing
    backward_weight_s: float  # W: weight gradients
    exposed_comm_s: dict[str, float]  # per axis, the part of F + B + W that is blocking communication
    recompute_s: float  # the part of backward_input_s spent re-running forward ops
    activation_bytes: float  # stored from the end of F until the end of B (W keeps no extra)
    send_bytes: float  # activation (forward) or gradient (backward) message to the neighbouring chunk
    layers: int  # transformer layers in the chunk (embedding / LM head ride on the first / last)


@dataclass(frozen=True, slots=True, kw_only=True)
class StageWork:
    """Everything one pipeline stage (one GPU of the tp x cp group, by symmetry) does per iteration."""

    stage: int
    chunks: tuple[ChunkWork, ...]  # local chunks in model order (virtual_stages entries)
    grad_sync: tuple[CommWork, ...]  # data-parallel gradient buckets, in the order backward makes them ready
    param_gather: tuple[CommWork, ...]  # ZeRO-3/FSDP parameter all-gathers per chunk (empty otherwise)
    optimizer_s: float  # optimizer step after gradients are synchronized (incl. offload traffic)
    static_memory_bytes: float  # weights + gradients + optimizer + buffers held all iteration
    # the gradient buckets' seconds when they run after the backward, before the optimizer
    # (``dp_comm_overlap = false``; ``grad_sync`` is then empty): exposed data-parallel time
    serial_grad_sync_s: float = 0.0
    # FSDP units (``fsdp_unit``; empty: each gather is one unit, waited on whole): per chunk, the
    # seconds from a gather's start until its first unit is gathered (the chunk's F or B may start
    # then), and the share of the F's or B's compute that runs after the last unit is gathered
    param_gather_first_s: tuple[float, ...] = ()
    param_gather_tail_share: tuple[float, ...] = ()
    # True: ``param_gather`` is ZeRO-1/2's all-gather of the updated parameters, needed once per
    # iteration before each chunk's first forward (``param_gather_pacing = "bucket"``), not FSDP's
    param_gather_first_forward_only: bool = False
    # per chunk, the gather before a B and its units where it differs from the F's (units the stack
    # keeps gathered from their forward to their backward, ``fsdp_kept_after_forward``); empty: the F's
    param_gather_backward: tuple[CommWork, ...] = ()
    param_gather_backward_first_s: tuple[float, ...] = ()
    param_gather_backward_tail_share: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineWork:
    """A data-parallel replica's pipeline for one iteration."""

    schedule: str  # "gpipe" | "1f1b" | "interleaved" | "zb-h1"
    num_microbatches: int
    virtual_stages: int
    stages: tuple[StageWork, ...]
    # entry i: the link between stage i and stage (i + 1) % pp (the wrap-around serves interleaving)
    p2p_bandwidth_Bps: tuple[float, ...]
    p2p_latency_s: tuple[float, ...]
    overlap_slowdown: float  # compute slowdown while a communication kernel shares the SMs (>= 1)

    @property
    def pp(self) -> int:
        return len(self.stages)


def compute_beside_communication(work_s: float, window_s: float, slowdown: float) -> tuple[float, float]:
    """Nominal compute ``work_s`` started at the opening of a ``window_s`` window in which
    communication kernels hold some of the SMs, so that compute progresses at rate
    ``1 / slowdown`` (``overlap_slowdown``): (wall seconds it runs inside the window, nominal
    seconds left when the window closes). The one rule of both fidelities: the DES applies it to
    every data-parallel kernel interval in turn (``pipeline_des._DpStream``), the analytic
    fidelity to the data-parallel stream that overlaps a stage's compute (``analytic.finish_iteration``)."""
    capacity = window_s / slowdown
    if work_s <= capacity:
        return work_s * slowdown, 0.0
    return window_s, work_s - capacity


def overlap_stretch_s(work_s: float, window_s: float, slowdown: float) -> float:
    """Seconds that ``window_s`` of overlapping communication adds to ``work_s`` of nominal compute
    (``compute_beside_communication``): 0 without a slowdown."""
    if slowdown == 1.0 or window_s <= 0.0 or work_s <= 0.0:
        return 0.0
    inside, left = compute_beside_communication(work_s, window_s, slowdown)
    return inside + left - work_s


def host_bound_pass_s(gpu_s: Sequence[float], host_s: Sequence[float]) -> float:
    """Seconds from a common start until the GPU finishes ops issued by a host that runs ahead of
    it: the host spends ``host_s[i]`` dispatching op i (Python, the ATen dispatcher, the launch)
    before the op enters the stream, and the GPU runs op i for ``gpu_s[i]`` once it is both
    issued and the previous op is done (start_i = max(end_{i-1}, issued_i)). Unrolled, the end of
    the last op is the largest, over k, of the host's time to issue ops 0..k plus the GPU time of
    ops k..n-1 (the op k after which the GPU never waits again); >= sum(gpu_s), and equal to
    sum(host_s) + gpu_s[-1] when every op is shorter than the next op's dispatch. Both
    fidelities read it through ``ChunkWork`` (``sim.training.costs.chunk_cost``)."""
    issued = 0.0
    suffix = float(sum(gpu_s))
    end = 0.0
    for gpu, host in zip(gpu_s, host_s):
        issued += host
        end = max(end, issued + suffix)
        suffix -= gpu
    return end


def chain_host_bound(first: tuple[float, float, float], second: tuple[float, float, float]) -> tuple[float, float, float]:
    """Two op sequences run one after the other, each given as (GPU seconds, host seconds, seconds
    from a common start to the GPU's end: ``host_bound_pass_s``): the same triple for the whole.
    The second sequence's host starts when the first one's host is done, its GPU when the first
    one's GPU is done, so its end is the later of the first end plus its GPU seconds and the first
    host time plus its own span (the max-plus product; associative, so any grouping of layers
    gives the same end)."""
    gpu_a, host_a, end_a = first
    gpu_b, host_b, end_b = second
    return gpu_a + gpu_b, host_a + host_b, max(end_a + gpu_b, host_a + end_b)
