"""The contract between the training cost builder and the pipeline executors.

``sim.training.iteration`` turns (model, plan, job, cluster) into a ``PipelineWork``: how long each
micro-batch's forward (F), input-gradient backward (B) and weight-gradient backward (W) take on
every model chunk, what crosses each stage boundary, and the per-stage data-parallel and optimizer
work. The SimPy executor (``sim.training.pipeline_des``) and the analytic estimator both consume it,
so they price the same work.
"""

from __future__ import annotations

from dataclasses import dataclass


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
