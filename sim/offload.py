"""Throughput-oriented generation on one GPU with weights, KV cache and activations spread over GPU
HBM, CPU DRAM and NVMe (FlexGen, Sheng et al., ICML 2023): the per-layer cost terms of a placement
policy (shared by the planner's LP in ``search.offload`` and by the simulation here) and a SimPy run of
FlexGen's zig-zag block schedule.

A *block* is ``num_gpu_batches`` GPU batches of ``gpu_batch`` sequences each. The schedule walks the
layers once per generated token; inside a layer it runs every GPU batch of the block before moving
on, so a layer's streamed weights are loaded once per block and reused ``num_gpu_batches`` times.
Transfers for the next batch (its KV cache and hidden states) and for the next layer (its weights) are
prefetched while the current batch computes; stores of the new KV and hidden states drain behind it.
Data on disk is staged through CPU memory (disk -> CPU -> GPU, GPU -> CPU -> disk).

Every layer carries ``1 / layers`` of the embeddings and LM head (weights and compute), as FlexGen's
cost model folds them into its per-layer terms. Attention over CPU- or disk-resident KV runs on the
GPU after the KV is copied in (FlexGen's default; its ``cpu_cache_compute`` option is not modelled).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import simpy

from hardware.specs import Tier
from hardware.topology import Cluster
from hardware.transfer import transfer_time_s
from sim.serving.capacity import kv_bytes_per_token_per_gpu, weights_bytes_per_gpu, workspace_bytes_per_gpu
from sim.serving.stepcost import ReplicaShape, StepCostModel
from workloads.model import ModelSpec
from workloads.precision import bytes_per_element

TIERS = ("gpu", "cpu", "disk")
# The five concurrent resources of one layer step (FlexGen's cost model terms), in report order.
RESOURCES = ("compute", "cpu_to_gpu", "gpu_to_cpu", "disk_to_cpu", "cpu_to_disk")


@dataclass(frozen=True, slots=True, kw_only=True)
class TierFractions:
    """Shares of one kind of tensor on GPU, CPU and disk (they sum to 1)."""

    gpu: float
    cpu: float
    disk: float

    def __post_init__(self) -> None:
        for tier in TIERS:
            if getattr(self, tier) < -1e-9:
                raise ValueError(f"tier fraction {tier} = {getattr(self, tier)} must be >= 0")
        total = self.gpu + self.cpu + self.disk
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"tier fractions sum to {total}, not 1")

    @property
    def off_gpu(self) -> float:
        return self.cpu + self.disk

    def as_dict(self) -> dict[str, float]:
        return {tier: round(getattr(self, tier), 6) for tier in TIERS}


@dataclass(frozen=True, slots=True, kw_only=True)
class OffloadPolicy:
    gpu_batch: int
    num_gpu_batches: int
    weights: TierFractions
    kv_cache: TierFractions
    activations: TierFractions

    @property
    def block_size(self) -> int:
        """Sequences generated together (FlexGen's effective batch size)."""
        return self.gpu_batch * self.num_gpu_batches


@dataclass(frozen=True, slots=True, kw_only=True)
class OffloadJob:
    """What to generate where: a model on one GPU of ``cluster``'s node, fixed prompt/output lengths."""

    model: ModelSpec
    cluster: Cluster
    prompt_tokens: int
    output_tokens: int
    weight_precision: str = "fp16"
    kv_precision: str = "fp16"
    activation_precision: str = "fp16"

    def shape(self) -> ReplicaShape:
        return ReplicaShape(
            model=self.model, cluster=self.cluster, tp=1, weight_precision=self.weight_precision,
            kv_precision=self.kv_precision, activation_precision=self.activation_precision,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerTerms:
    """Bytes and seconds of one layer for one GPU batch of ``gpu_batch`` sequences (block-independent)."""

    layers: int
    gpu_batch: int
    prompt_tokens: int
    output_tokens: int
    weights_bytes: float  # one layer's weights (with its share of embeddings and LM head)
    kv_bytes_per_token: float  # one layer, one sequence
    hidden_bytes_per_token: float  # hidden state of one token between layers
    workspace_bytes: float  # activation workspace of the largest step (prefill of the GPU batch)
    prefill_compute_s: float  # one layer, one GPU batch, whole prompts
    decode_compute_first_s: float  # one layer, one GPU batch, first generated token (context = prompt)
    decode_compute_slope_s: float  # increase per extra token of context (attention is linear in keys)
    cpu_to_gpu_Bps: float
    gpu_to_cpu_Bps: float
    disk_read_Bps: float
    disk_write_Bps: float

    def decode_compute_s(self, step: int) -> float:
        """Decode step ``step`` (1 .. output_tokens - 1): the new token attends to prompt + step keys."""
        return self.decode_compute_first_s + (step - 1) * self.decode_compute_slope_s

    @property
    def mean_decode_compute_s(self) -> float:
        """Mean over the ``output_tokens - 1`` decode steps (exact: the step cost is affine in the step)."""
        steps = self.output_tokens - 1
        return self.decode_compute_first_s + (steps - 1) / 2 * self.decode_compute_slope_s if steps else 0.0

    @property
    def prefill_kv_bytes(self) -> float:
        """KV a GPU batch writes at one layer in prefill."""
        return self.gpu_batch * self.prompt_tokens * self.kv_bytes_per_token

    @property
    def mean_decode_kv_bytes(self) -> float:
        """KV a decode step reads at one layer for one GPU batch, mean over the decode steps: step i
        (1 .. output_tokens - 1) reads the keys of the prompt and of the i - 1 tokens decoded before
        it (its own key is computed, not read)."""
        steps = self.output_tokens - 1
        mean_context = self.prompt_tokens + (steps - 1) / 2 if steps else self.prompt_tokens
        return self.gpu_batch * mean_context * self.kv_bytes_per_token

    def decode_kv_bytes(self, step: int) -> float:
        """KV decode step ``step`` reads at one layer for one GPU batch (0 for the prompt pass)."""
        return 0.0 if step == 0 else self.gpu_batch * (self.prompt_tokens + step - 1) * self.kv_bytes_per_token

    @property
    def new_kv_bytes(self) -> float:
        """KV of one new token per sequence of a GPU batch at one layer."""
        return self.gpu_batch * self.kv_bytes_per_token

    @property
    def prefill_hidden_bytes(self) -> float:
        return self.gpu_batch * self.prompt_tokens * self.hidden_bytes_per_token

    @property
    def decode_hidden_bytes(self) -> float:
        return self.gpu_batch * self.hidden_bytes_per_token

    @property
    def full_kv_bytes(self) -> float:
        """One layer's KV of one GPU batch at the longest context (prompt + output)."""
        return self.gpu_batch * (self.prompt_tokens + self.output_tokens) * self.kv_bytes_per_token


def layer_terms(job: OffloadJob, gpu_batch: int) -> LayerTerms:
    """The per-layer terms of ``job`` for GPU batches of ``gpu_batch`` sequences, priced with the
    serving step-cost model (the same GEMM, attention and memory cost functions as ``simulate``)."""
    shape = job.shape()
    model, node = job.model, job.cluster.node
    layers = model.layers
    cost = StepCostModel(shape, step_overhead_s=0.0, request_overhead_s=0.0)
    s = job.prompt_tokens
    b = gpu_batch
    prefill = cost.forward_time_s(b * s, [(s, s)] * b, b) / layers
    first = cost.forward_time_s(b, [(1, s + 1)] * b, b) / layers
    second = cost.forward_time_s(b, [(1, s + 2)] * b, b) / layers
    return LayerTerms(
        layers=layers, gpu_batch=b, prompt_tokens=s, output_tokens=job.output_tokens,
        weights_bytes=weights_bytes_per_gpu(shape) / layers,
        kv_bytes_per_token=kv_bytes_per_token_per_gpu(shape) / layers,
        hidden_bytes_per_token=model.hidden * bytes_per_element(job.activation_precision),
        workspace_bytes=workspace_bytes_per_gpu(shape, b * s, b),
        prefill_compute_s=prefill, decode_compute_first_s=first, decode_compute_slope_s=max(second - first, 0.0),
        cpu_to_gpu_Bps=node.host_to_device_Bps, gpu_to_cpu_Bps=node.device_to_host_Bps,
        disk_read_Bps=node.nvme_read_Bps, disk_write_Bps=node.nvme_write_Bps,
    )


# ---- the SimPy run -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class OffloadRun:
    """What the simulation measured for one block."""

    total_s: float
    prefill_s: float  # until the last layer of the prompt pass finished
    output_tokens: int  # generated in the block (block size x output length)
    busy_s: dict[str, float]  # seconds each resource was busy

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.total_s

    @property
    def bottleneck(self) -> str:
        return max(RESOURCES, key=lambda r: self.busy_s[r])


class _Links:
    """The five resources. Each is one FIFO server: a use that arrives at ``now`` starts when the
    resource is free (requests arrive in time order, since SimPy runs processes in time order, so
    this is a capacity-1 ``simpy.Resource`` without its request/release events)."""

    def __init__(self, env: simpy.Environment, job: OffloadJob) -> None:
        self.env = env
        self.node, self.gpu = job.cluster.node, job.cluster.gpu
        self.free_at_s = dict.fromkeys(RESOURCES, 0.0)
        self.busy_s = dict.fromkeys(RESOURCES, 0.0)
        self._copy_s: dict[tuple[float, Tier, Tier], float] = {}

    def use(self, name: str, seconds: float) -> Iterator[simpy.Event]:
        if seconds <= 0:
            return
        start = max(self.env.now, self.free_at_s[name])
        self.free_at_s[name] = start + seconds
        self.busy_s[name] += seconds
        yield self.env.timeout(start + seconds - self.env.now)

    def move(self, sizes: list[float], src: Tier, dst: Tier) -> Iterator[simpy.Event]:
        """Copies of ``sizes`` bytes between two adjacent tiers, back to back on the link that joins
        them (one cudaMemcpy / file read each, issued together, so no other transfer comes between)."""
        seconds = 0.0
        for size in sizes:
            if size > 0:
                key = (size, src, dst)
                copy_s = self._copy_s.get(key)
                if copy_s is None:
                    copy_s = self._copy_s[key] = transfer_time_s(size, src, dst, self.node, self.gpu)
                seconds += copy_s
        yield from self.use(_LINK_OF[(src, dst)], seconds)


_LINK_OF = {(Tier.CPU, Tier.HBM): "cpu_to_gpu", (Tier.HBM, Tier.CPU): "gpu_to_cpu",
            (Tier.NVME, Tier.CPU): "disk_to_cpu", (Tier.CPU, Tier.NVME): "cpu_to_disk"}


def simulate_offload(job: OffloadJob, policy: OffloadPolicy, terms: LayerTerms | None = None) -> OffloadRun:
    """Run one block of ``policy`` through every layer for the prompt and each generated token.

    Work items run in the schedule's order (token step, layer, GPU batch). Loads are pipelined two
    deep: while item i computes, the CPU -> GPU copies of item i + 1 and the disk reads of item i + 2
    run (weights likewise by layer, launched with a layer's first GPU batch), so the disk hop and the
    PCIe hop of staged data overlap as the LP's separate terms assume. An item computes when its
    weights, KV cache and hidden state are on the GPU; a hidden state is loaded only after the
    previous layer stored it. Stores (GPU -> CPU, then CPU -> disk) drain behind the computation.
    """
    terms = terms or layer_terms(job, policy.gpu_batch)
    if terms.gpu_batch != policy.gpu_batch:
        raise ValueError(f"terms are for gpu_batch {terms.gpu_batch}, the policy has {policy.gpu_batch}")
    env = simpy.Environment()
    links = _Links(env, job)
    w, c, h = policy.weights, policy.kv_cache, policy.activations
    layers, batches, steps = terms.layers, policy.num_gpu_batches, job.output_tokens
    items = [(step, layer, batch) for step in range(steps) for layer in range(layers) for batch in range(batches)]
    layer_items = [(step, layer) for step in range(steps) for layer in range(layers)]
    stored: dict[tuple[int, int, int], simpy.Event] = {}

    def stored_event(key: tuple[int, int, int]) -> simpy.Event:
        if key not in stored:
            stored[key] = env.event()
        return stored[key]

    def hidden_bytes(step: int) -> float:
        return terms.prefill_hidden_bytes if step == 0 else terms.decode_hidden_bytes

    def staged(waits: list[simpy.Event], parts: list[tuple[float, TierFractions]]) -> Iterator[simpy.Event]:
        """Disk -> CPU reads of the disk shares of ``parts`` (bytes, fractions), after ``waits``."""
        for event in waits:
            yield event
        yield from links.move([total * fractions.disk for total, fractions in parts], Tier.NVME, Tier.CPU)

    def to_gpu(disk_done: simpy.Event, parts: list[tuple[float, TierFractions]]) -> Iterator[simpy.Event]:
        """CPU -> GPU copies of the off-GPU shares of ``parts``, once their disk reads are done."""
        yield disk_done
        yield from links.move([total * fractions.off_gpu for total, fractions in parts], Tier.CPU, Tier.HBM)

    def store(parts: list[tuple[float, TierFractions]], done: simpy.Event | None = None) -> Iterator[simpy.Event]:
        """Write the off-GPU shares of new tensors back: GPU -> CPU, and the disk shares on to disk."""
        yield from links.move([total * fractions.off_gpu for total, fractions in parts], Tier.HBM, Tier.CPU)
        yield from links.move([total * fractions.disk for total, fractions in parts], Tier.CPU, Tier.NVME)
        if done is not None:
            done.succeed()

    def item_parts(index: int) -> tuple[list[simpy.Event], list[tuple[float, TierFractions]]]:
        step, layer, batch = items[index]
        waits = [stored_event((step, layer - 1, batch))] if layer > 0 and h.off_gpu > 0 else []
        return waits, [(terms.decode_kv_bytes(step), c), (hidden_bytes(step), h)]

    disk_item: dict[int, simpy.Event] = {}
    gpu_item: dict[int, simpy.Event] = {}
    disk_layer: dict[int, simpy.Event] = {}
    gpu_layer: dict[int, simpy.Event] = {}
    weight_parts = [(terms.weights_bytes, w)]

    def launch_item_disk(index: int) -> None:
        if index < len(items):
            disk_item[index] = env.process(staged(*item_parts(index)))

    def launch_item_gpu(index: int) -> None:
        if index < len(items):
            gpu_item[index] = env.process(to_gpu(disk_item.pop(index), item_parts(index)[1]))

    def launch_layer_disk(index: int) -> None:
        if index < len(layer_items):
            disk_layer[index] = env.process(staged([], weight_parts))

    def launch_layer_gpu(index: int) -> None:
        if index < len(layer_items):
            gpu_layer[index] = env.process(to_gpu(disk_layer.pop(index), weight_parts))

    prefill_end = [0.0]

    def driver() -> Iterator[simpy.Event]:
        launch_layer_disk(0)
        launch_layer_disk(1)
        launch_layer_gpu(0)
        launch_item_disk(0)
        launch_item_disk(1)
        launch_item_gpu(0)
        for index, (step, layer, batch) in enumerate(items):
            layer_index = step * layers + layer
            if batch == 0:
                launch_layer_disk(layer_index + 2)
                launch_layer_gpu(layer_index + 1)
            launch_item_disk(index + 2)
            launch_item_gpu(index + 1)
            yield gpu_layer[layer_index] & gpu_item.pop(index)
            compute_s = terms.prefill_compute_s if step == 0 else terms.decode_compute_s(step)
            yield from links.use("compute", compute_s)
            done = stored_event((step, layer, batch)) if h.off_gpu > 0 and layer + 1 < layers else None
            new_kv = terms.prefill_kv_bytes if step == 0 else terms.new_kv_bytes
            env.process(store([(new_kv, c), (hidden_bytes(step), h)], done))
            if batch == batches - 1:
                gpu_layer.pop(layer_index)
            if step == 0 and layer == layers - 1 and batch == batches - 1:
                prefill_end[0] = env.now

    env.process(driver())
    env.run()
    return OffloadRun(
        total_s=env.now, prefill_s=prefill_end[0], output_tokens=policy.block_size * steps, busy_s=dict(links.busy_s),
    )
