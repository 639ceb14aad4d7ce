"""The training suite: predicted vs published iteration times and memory (Megatron-LM papers).

Rows live in ``validation/published/training.csv`` and ``training_memory.csv``, each with its
citation and the assumptions the publication leaves open. Published throughputs are converted to
iteration times with the convention the paper used, so every row compares a convention-free
quantity: Narayanan et al. 2021 Table 1 counts FLOPs with Eq. 3 (recompute included),
F = 96 B s L h^2 (1 + s/(6h) + V/(16 L h)); the Megatron-Core H100 table uses model FLOPs,
F = 72 B s L h^2 (1 + s/(6h) + V/(12 L h)); Korthikanti et al. 2022 report iteration times.
One hardware description per GPU serves every row.
"""

from __future__ import annotations

import csv
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hardware import units
from hardware.collectives import Collective, network_floor_s
from sim.runner import RunOptions, simulate
from sim.training.config import parse_training
from sim.training.costs import group_links
from sim.training.data_parallel import stage_parameters_per_rank
from sim.training.memory import memory_per_stage
from validation.published import Comparison, SuiteReport, Threshold, with_calibration

PUBLISHED_DIR = Path(__file__).parent / "published"

# Iteration time: regression bounds at today's errors (MAPE 6.4 %, worst 17.5 %: the Megatron-Core
# H100 1.7B row); issue 11's target is 7 % / 15 % over these and the modern rows together. Memory
# within 10 %.
THRESHOLDS = (
    # worst row: the Megatron-Core 32B row, over-predicted (+27.7 %, its exposed fp32 reduce-scatter and
    # its DDP's passes over the 16 GB gradient buffer). Loosened 6.1 % / 23 % -> 6.6 % / 28 % by the H100's
    # sustained clock (1,660 of 1,830 MHz, hardware/cost.py sustained_clock_factor): the Megatron-Core H100
    # rows 16B-462B went from -5.5..+2.3 % to +1.7..+10.8 % (32B +22.8 -> +27.7 %) while 1.7B / 7.1B
    # improved (-16.3 / -13.6 -> -12.0 / -8.0 %) and the 24 training-modern rows went 9.0 -> 6.4 %. Tightened
    # 6.6 % / 28 % -> 6.5 % / 25 % by cuDNN fused attention, which Transformer Engine >= 1.2 runs on Hopper
    # (attention_kernel "cudnn" on megatron-core): 6.5 -> 6.4 %, 32B +27.7 -> +24.8 %, signed +0.3 -> -0.7 %.
    # Worst row loosened 25 % -> 25.2 % by attention dropout priced on the kernel time, not the wall time,
    # of NVIDIA/TransformerEngine#3312 (sim.training.costs.ATTENTION_DROPOUT_RATE 0.967 -> 0.896): the nine
    # Megatron-Core H100 rows +0.3..+0.9 points (1.7B / 7.1B -18.5 / -12.6 -> -17.6 / -11.9 %, 32B
    # +24.8 -> +25.1 %), MAPE 6.36 -> 6.35 %, signed -0.7 -> -0.6 %. Loosened 6.5 % / 25.2 % -> 8.1 % / 44.2 %
    # by Megatron-Core's parameter all-gather paced bucket by bucket in each chunk's first forward
    # (param_gather_pacing "bucket", distrib_optimizer _finish_param_sync_helper at core_r0.8.0), which the
    # model had priced as hidden: the Megatron-Core H100 rows 16B-462B +0.10..+0.20 s (16B +3.4 -> +11.1 %,
    # 32B +25.1 -> +44.1 %, 70B +5.4 -> +14.4 %), MAPE 6.4 -> 8.0 %, signed -0.6 -> +1.2 %. Tightened
    # 8.1 % / 44.2 % -> 7.4 % / 20.6 % when the Megatron-Core H100 rows took the plan their evidence
    # implies (the 1.7B row's assumptions): the rows without a pipeline one micro-batch of 4, the pipelined
    # rows interleaved with one layer per virtual stage: 32B +44.1 -> -6.0 %, 16B +11.1 -> -10.6 %, 70B
    # +14.4 -> -3.9 %, 119B +5.1 -> -16.9 %, 177B +3.4 -> -16.8 %, 1.7B -17.0 -> -20.5 %; MAPE 8.0 -> 7.3 %,
    # signed +1.2 -> -5.1 %: the nine rows are 3.9-20.5 % fast, mean -11.9 % (see TRAINING_NOTES). Worst row
    # tightened 20.6 % -> 19.6 % by the embedding's gradient reduced after the backward
    # (closing_gradient_parameters): the nine rows 4.0-19.5 % fast, mean -11.3 %; MAPE 7.1 %, signed -4.9 %
    # (analytic 7.3 %, which the MAPE limit still holds). Worst row loosened 19.6 % -> 19.8 % by the
    # attention grid occupancy (hardware.calibration attention_grid_occupancy): the TP-sharded rows' few
    # heads per GPU slow their attention (119B / 177B -16.6 -> -15.5 / -15.7 %, 70B -4.0 -> -2.5 %) while
    # the 1.7B's grid is the FlashAttention benchmarks' own, and its attention dropout, re-derived over the
    # model's new kernel price of TE#3312's shape (ATTENTION_DROPOUT_RATE 0.896 -> 0.916), costs less:
    # 1.7B -19.5 -> -19.7 %; MAPE 7.1 -> 7.0 % (analytic 7.2 %), signed -4.9 -> -4.8 %. Tightened 7.4 % / 19.8 %
    # -> 6.9 % / 19.0 % by the H100's long-run clock (1,630 of 1,830 MHz, not the 1,660 its GEMM tables' bursts
    # of under a second read: catalog sustained_clock_source): the nine Megatron-Core H100 rows 0.8-1.5 points
    # slower (1.7B -19.7 -> -18.9 %, 119B / 177B -15.5 / -15.7 -> -14.3 / -14.4 %), MAPE 7.0 -> 6.6 % (analytic
    # 6.8 %), signed -4.8 -> -4.4 %. Tightened 6.9 % / 19.0 % -> 6.7 % / 17.6 % by attention kernels at the
    # sustained clock too (their rates are the FlashAttention benchmarks', short calls at the boost clock:
    # hardware.cost.sustained_clock_factor): the Megatron-Core H100 rows 0.4-1.4 points slower (1.7B -18.9 ->
    # -17.5 %), the 2021-22 rows unchanged (their attention is unfused: GEMMs), MAPE 6.6 -> 6.4 % (analytic
    # 6.6 %), signed -4.4 -> -4.2 %. Tightened 6.7 % / 17.6 % -> 6.3 % / 14.6 % by the H100's framework
    # memory-bound kernels at 0.807 of the STREAM rate (catalog efficiency.memory_kernels: the mean of four
    # published H100 timings of Megatron-Core's kernels) and a residual add's backward counted as the sum of
    # its two gradients: the Megatron-Core H100 rows 0.5-4.2 points slower (1.7B -17.5 -> -13.3 %), the A100
    # rows 0.1-0.7 points faster; MAPE 6.4 -> 6.0 % (analytic 6.2 %, worst 14.5 %), signed -4.2 -> -4.0 %
    Threshold(metric="iteration_time_s", max_mape=0.063, max_row_error=0.146),
    Threshold(metric="model_states_bytes", max_mape=0.10, max_row_error=0.10),
    Threshold(metric="activations_bytes", max_mape=0.10, max_row_error=0.10),
)


def published_rows(name: str) -> list[dict[str, str]]:
    """The rows of one published table (validation/published/``name``), as strings."""
    with (PUBLISHED_DIR / name).open(newline="") as f:
        return list(csv.DictReader(f))


def _bool(text: str) -> bool:
    """A true/false cell of a published table; anything else is a malformed row, not False."""
    value = text.strip().lower()
    if value not in ("true", "false"):
        raise ValueError(f"published table cell {text!r} must be true or false")
    return value == "true"


def row_config(row: dict[str, str]) -> dict[str, Any]:
    """The llmsim config a published row describes."""
    if row["model"] == "inline":
        hidden = int(row["hidden"])
        model: dict[str, Any] = {  # no name ("custom") and max_seq_len = the run's length, as a user writes it
            "hidden": hidden,
            "layers": int(row["layers"]),
            "heads": int(row["heads"]),
            "kv_heads": int(row["heads"]),
            "ffn_hidden": 4 * hidden,
            "vocab": int(row["vocab"]),
            "activation": row.get("activation") or "gelu",  # the recipe's MLP activation (else GPT's GeLU)
            "position": row["position"] or "rope",
            "tied_embeddings": _bool(row["tied_embeddings"]),
        }
        if row.get("bias"):  # biases on every projection where the row's recipe has them (else none)
            model["bias"] = _bool(row["bias"])
    else:
        model = {"name": row["model"]}
    tp, pp = int(row["tp"]), int(row["pp"])
    virtual = int(row["virtual_stages"])
    parallel_extra = {"recompute_layers": int(row["recompute_layers"])} if row.get("recompute_layers") else {}
    if row.get("layers_per_stage"):  # the recipe's uneven split, one count per stage or per virtual chunk
        parallel_extra["layers_per_stage"] = [int(count) for count in row["layers_per_stage"].split()]
    if row.get("dp_comm_overlap"):  # the row's DDP overlapped the gradient reduction (else its stack's rule)
        parallel_extra["dp_comm_overlap"] = _bool(row["dp_comm_overlap"])
    # the recipe's hidden / attention dropout (empty: none, as Llama-style and MPT recipes)
    training_extra = {"dropout": float(row["dropout"])} if row.get("dropout") else {}
    if row.get("cross_entropy"):  # the recipe's loss implementation where it sets one (else its stack's)
        training_extra["cross_entropy"] = row["cross_entropy"]
    if row.get("grad_reduce_dtype"):  # the run's gradient-reduction dtype where it differs from its stack's
        training_extra["grad_reduce_dtype"] = row["grad_reduce_dtype"]
    if row.get("optimizer_kernels"):  # the run's optimizer implementation where it differs from its stack's
        training_extra["optimizer_kernels"] = row["optimizer_kernels"]
    if row.get("elementwise"):  # the run's norm kernel where its config names one (torchtitan norm_type)
        training_extra["elementwise"] = row["elementwise"]
    return {
        "model": model,
        "cluster": {"gpu": row["gpu"], "node": row["node"], "network": row["network"], "num_gpus": int(row["num_gpus"])},
        "training": {
            "seq_len": int(row["seq_len"]),
            "global_batch": int(row["global_batch"]),
            "micro_batch": int(row["micro_batch"]),
            "precision": row["precision"],
            # the software stack the row ran (sim/stacks/training/): attention kernel, whether the
            # gradient reduction overlaps backward, main-grad accumulation, reduction dtype
            "framework": row["framework"],
            **training_extra,
        },
        "parallel": {
            "tp": tp,
            "pp": pp,
            "cp": int(row["cp"] or 1),
            "dp": "auto",
            "sequence_parallel": _bool(row["sequence_parallel"]),
            "zero": int(row["zero"]),
            "schedule": "interleaved" if virtual > 1 else "1f1b",
            "virtual_stages": virtual,
            "recompute": row["recompute"],
            "tp_comm_overlap": _bool(row["tp_comm_overlap"]),
            **parallel_extra,
        },
    }


def data_parallel_network_floor_s(config: dict[str, Any]) -> float:
    """The least time a row's data-parallel traffic needs on its cluster's network: on each pipeline stage
    the gradients reduced once (in the stack's reduction dtype) and, under ZeRO >= 1, the parameters
    gathered once (16-bit; 8-bit for fp8 runs, in case their weights travel in fp8), each at
    ``hardware.collectives.network_floor_s``; the slowest stage's. Real runs move more (FSDP gathers again
    for backward, buckets pay latency, a ring all-reduce moves twice the floor's bytes), so a published
    iteration shorter than this did not run on the cluster as the row describes it. 0 for HSDP and MoE
    models (their gradients reduce over other groups)."""
    setup = parse_training(config)
    plan = setup.plan
    if plan.hsdp or setup.model.is_moe:
        return 0.0
    reduce_kind = Collective.ALL_REDUCE if plan.zero == 0 else Collective.REDUCE_SCATTER
    parameter_bytes = 1.0 if setup.job.precision == "fp8" else 2.0
    floor = 0.0
    for stage in range(plan.pp):
        group = group_links(setup, stage)["dp"]
        params = stage_parameters_per_rank(setup, stage)
        seconds = network_floor_s(reduce_kind, params * setup.grad_reduce_bytes, group)
        if plan.zero >= 1:
            seconds += network_floor_s(Collective.ALL_GATHER, params * parameter_bytes, group)
        floor = max(floor, seconds)
    return floor


def network_floor_exclusion(config: dict[str, Any], published_s: float) -> str:
    """Why a row is reported but not counted (its published iteration is shorter than its data-parallel
    traffic's floor on the row's network, ``data_parallel_network_floor_s``: the cluster it ran on is not
    the one the row assumes), or "" when it is counted. One rule for every training row, as the serving
    suites' HBM roofline."""
    floor = data_parallel_network_floor_s(config)
    if published_s >= floor:
        return ""
    network = config["cluster"].get("network", "the default network")
    return (f"published {published_s:.2f} s is below the {floor:.2f} s its data-parallel traffic needs at least "
            f"on {network} at the catalog's measured efficiency: the row's cluster had more network than assumed")


def published_iteration_time_s(row: dict[str, str], config: dict[str, Any]) -> float:
    """The row's published number as an iteration time, with the paper's FLOP convention."""
    value = float(row["published"])
    if row["metric"] == "iteration_time_s":
        return value
    if row["metric"] == "tokens_per_s_per_gpu":  # tokens per iteration / (tokens/s per GPU x GPUs)
        return int(row["global_batch"]) * int(row["seq_len"]) / (value * int(row["num_gpus"]))
    setup = parse_training(config)
    model, job = setup.model, setup.job
    s, h, layers, vocab = job.seq_len, model.hidden, model.layers, model.vocab
    batch = job.global_batch
    if row["metric"] == "eq3_tflops_per_gpu":
        flops = 96.0 * batch * s * layers * h**2 * (1 + s / (6 * h) + vocab / (16 * layers * h))
    elif row["metric"] == "model_tflops_per_gpu":
        flops = 72.0 * batch * s * layers * h**2 * (1 + s / (6 * h) + vocab / (12 * layers * h))
    else:
        raise ValueError(f"{row['row']}: unknown metric '{row['metric']}'")
    return flops / (value * units.TFLOPS * setup.cluster.num_gpus)


@dataclass(frozen=True, slots=True, kw_only=True)
class TimedRow:
    row: str
    citation: str
    published_s: float
    predicted_s: float
    fits_in_memory: bool
    config: dict[str, Any]
    excluded: str  # network_floor_exclusion's reason, "" when the row is counted


def iteration_rows(fidelity: str = "des", table: str = "training.csv", calibration: str | None = None) -> list[TimedRow]:
    """Every row of ``table`` simulated exactly as ``llmsim simulate --fidelity FIDELITY`` runs its config
    (with ``[cluster] calibration = calibration`` when given, ``validation.published.with_calibration``)."""
    out = []
    for row in published_rows(table):
        config = with_calibration(row_config(row), calibration)
        metrics = simulate(config, RunOptions(fidelity=fidelity)).metrics()
        published_s = published_iteration_time_s(row, config)
        out.append(
            TimedRow(
                row=row["row"],
                citation=row["citation"],
                published_s=published_s,
                predicted_s=metrics["iteration_time_s"],
                fits_in_memory=metrics["fits_in_memory"],
                config=config,
                excluded=network_floor_exclusion(config, published_s),
            )
        )
    return out


def memory_comparisons() -> list[Comparison]:
    """Korthikanti et al. 2022 Figure 1: first-stage model states and activations per GPU (fp16,
    dp = 1, attention scores stored as in the paper's kernels)."""
    comparisons = []
    for row in published_rows("training_memory.csv"):
        virtual = int(row["virtual_stages"])
        base = {
            "model": {"name": row["model"]},
            "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": int(row["num_gpus"])},
            "training": {
                "seq_len": int(row["seq_len"]),
                "global_batch": int(row["global_batch"]),
                "micro_batch": int(row["micro_batch"]),
                "precision": "fp16",
                "attention_kernel": "unfused",
            },
        }
        for label, recompute, sp, column in (
            ("none", "none", False, "activations_none_GiB"),
            ("sp+selective", "selective", True, "activations_sp_selective_GiB"),
        ):
            config = dict(base)
            config["parallel"] = {
                "tp": int(row["tp"]),
                "pp": int(row["pp"]),
                "schedule": "interleaved" if virtual > 1 else "1f1b",
                "virtual_stages": virtual,
                "recompute": recompute,
                "sequence_parallel": sp,
            }
            setup = parse_training(config)
            stages = memory_per_stage(
                setup.model, setup.plan, setup.job, capacity_bytes=setup.cluster.gpu.hbm_capacity_bytes, flash_attention=False
            )
            first = stages[0]
            # Figure 1's model states are 18 bytes x 12 L h^2 / (t p): the transformer layers of one
            # stage without the embedding, so they compare with a middle stage when pp > 1.
            middle = stages[min(1, len(stages) - 1)]
            comparisons.append(
                Comparison(
                    suite="training",
                    row=f"{row['row']} activations {label}",
                    metric="activations_bytes",
                    published=float(row[column]) * units.GiB,
                    predicted=first.activations_bytes,
                    citation=row["citation"],
                )
            )
            if label == "none":
                comparisons.append(
                    Comparison(
                        suite="training",
                        row=f"{row['row']} params+grads+optimizer",
                        metric="model_states_bytes",
                        published=float(row["model_states_GiB"]) * units.GiB,
                        predicted=middle.model_state_bytes,
                        citation=row["citation"],
                    )
                )
    return comparisons


# The 2023-25 stacks (published-training.md A9-A11, A13: NeMo / Megatron-Bridge / MLPerf fp8 on H100,
# llm-foundry FSDP): the issue's target is MAPE <= 7 % and no row worse than 15 %; the model is not
# there yet (most rows are predicted too fast, see MISSING_MECHANISMS), so these bounds only keep it
# from getting worse than it is now (9.4 % / 20.9 % with the DES, 9.1 % analytic; 9.7 % before the data-parallel
# stream's NCCL-channel SMs and llm-foundry's FSDP1 gradient path; the worst row, NeMo GPT-3 5B, went from -17.5 to
# -19.8 % when its row took the 24.07 recipe's no-recompute, and to -20.9 % when the H100's HBM efficiency became
# the measured 0.887 instead of an interpolated 0.83: 9.3 / 19.8 -> 9.7 / 20.9 %, limits loosened as far as
# needed; 9.3 / 20.0 % with the QKV split, qkv_split; 6.4 / 14.8 %, signed -8.2 -> -3.5 %, with the H100's
# sustained clock, 1,660 of 1,830 MHz, hardware/cost.py sustained_clock_factor; 6.2 / 14.8 %, signed -3.2 %, with
# host dispatch per op, host_forward_op_us: the MLPerf v3.x rows, one layer per chunk with 2023 TE's per-module
# scale-update kernels, -8.0..-9.5 -> -3.9..-8.7 %; 6.1 / 12.2 % after Megatron-Core's bias gradients and TE 1.x's
# flash-attn layout copies; 6.0 / 12.2 % with those copies in the MLPerf code's TE 0.8 / 09ba8427, attention_layout
# flash_bshd on nemo-1.17 / nemo-1.20: its five rows -3.1..-7.9 %; 5.3 / 12.2 %, signed -3.4 %, with cuDNN fused
# attention on Megatron-Bridge (TE 2.x on Hopper, attention_kernel "cudnn"): bridge-llama3-8b / 70b +10.4 / +11.5 ->
# -0.0 / +5.6 %; 5.2 / 11.8 %, signed -3.3 %, with attention dropout priced on TE#3312's kernel time rather than
# its wall time, ATTENTION_DROPOUT_RATE 0.967 -> 0.896: nemo-gpt3-5b / 20b -12.2 / -7.0 -> -11.2 / -6.3 %,
# 175b +5.0 / +5.1 -> +5.4 / +5.5 %; with the eight torchtitan A100 rows of A12 on the assumed p4de EFA nodes at an efficiency
# transferred from HDR InfiniBand (0.90): -5.1..+2.1 % but the Llama 2 70B per-op-AC row at local batch 1, +15.0 %;
# with the EFA efficiency measured on p4d (0.59, NVIDIA/nccl#527): seven rows +5.3..+12.2 %, and that row +73.6 %,
# reported but not counted (its published step is shorter than its data-parallel traffic's floor on that network,
# network_floor_exclusion): 6.1 / 12.2 %, signed -0.6 % over the 31 counted rows; with FSDP's per-block units
# (fsdp_unit "layer": torchtitan, llm-foundry): the seven torchtitan rows -9.5..+2.8 %, llm-foundry's 13B on one
# H100 node -7.8 -> -12.8 % (the worst row; its whole-model first gather had been exposed): 5.6 / 12.8 %, signed
# -3.9 % (analytic 5.3 / 12.8 %, signed -3.8 %). The analytic fidelity's gradient buckets hide behind the
# compute after each chunk's own last backward, bucket by bucket as the DES runs them
# (analytic.grad_sync_exposed_s), not behind one micro-batch's backward: its interleaved MLPerf v3.1 DFW rows
# lose an exposed data-parallel time the DES never had (-3.6 / -4.3 -> -9.5 / -10.0 %, DES -7.4 / -7.9 %):
# analytic 5.3 -> 5.8 %, limit 5.7 -> 5.8 %; the DES unchanged. With A9's two Nemotron rows (NeMo 24.07 fp8,
# squared-ReLU MLP, 256,000-token vocabulary), which had been left out: -10.2 / -8.5 % (analytic -10.2 / -9.1 %),
# 33 counted rows 5.6 -> 5.8 %, signed -3.9 -> -4.3 % (analytic 5.8 -> 6.0 %), limit 5.8 -> 6.0 %; and A10's
# Megatron-Bridge Llama 3.1 405B on 1,024 H100 (its recipe's 1 / 62 x 2 / 1 layers over 64 virtual chunks):
# -3.4 % (analytic -4.4 %), 34 counted rows 5.8 %, signed -4.2 % (analytic 5.9 %); with torchtitan's eager
# elementwise chains and torch SDPA's copies (workloads.eager): its seven counted rows -9.5..+2.8 -> -8.1..+2.8 %,
# 5.3 / 12.8 %, signed -3.7 % (analytic 5.5 %), limit 6.0 -> 5.6 %; with PyTorch's own cross-entropy kernels for
# torchtitan and llm-foundry (cross_entropy torch / torch_16bit, 36 / 12 B per logit where Megatron's unfused path
# moves 52): 5.4 / 12.9 %, signed -3.8 % (analytic 5.6 %), limits 5.7 / 13.0 %; with fp8 runs' sequence-parallel
# all-gathers in fp8 (fp8_all_gather): 5.3 / 12.9 %, signed -4.4 % (analytic 5.5 %); with the embedding's gradient
# reduced after the backward (closing_gradient_parameters): 5.0 / 12.7 %, signed -4.0 % (analytic 5.2 %); with
# llm-foundry's residual adds as kernels of their own (elementwise "eager": one add of 6 B per element each way
# where the fused pricing's add + norm had read 8 / 12 + 16 B): 5.1 / 13.0 %, signed -4.1 % (analytic 5.2 %),
# limits 5.3 / 13.1 %; with FSDP's kept units left out of the gather before each B (fsdp_kept_after_forward: the
# root unit, and torchtitan's last block): 5.1 / 13.1 %, signed -4.1 % (analytic 5.2 %); with llm-foundry's
# loss as its default fused_crossentropy runs it (flash-attention's xentropy kernel on the 16-bit logits,
# 4 / 4 B per logit where torch's on fp32 logits moved 14 / 22): 5.2 / 14.5 %, signed -4.3 % (the MPT-3B
# fp8 row -13.1 -> -14.5 %; analytic 5.3 %), limits 5.4 / 14.6 %. Every row must fit (require_fit): the loss's memory
# per logit (CROSS_ENTROPY_MEMORY) had read llm-foundry's MPT-7B on 128 A100 40 GB over capacity with
# torch's 12 B at its peak. With the H100's long-run clock (1,630 of 1,830 MHz, not 1,660: catalog
# sustained_clock_source): the 23 H100 rows 0.7-1.5 points slower, 4.5 / 13.8 %, signed -3.5 -> -2.8 % (analytic
# 4.6 %, signed -3.1 %), limits 4.7 / 13.9 %. With attention kernels at the sustained clock too (the
# FlashAttention benchmarks' rates are short calls at the boost clock): 4.1 / 10.6 %, signed -2.8 -> -1.3 %
# (analytic 4.2 %, signed -1.6 %; MPT-3B fp8 -13.8 -> -10.2 %, the long-sequence MPT-7B +5.0 -> +10.6 %, the
# worst row now), limits 4.3 / 10.7 %. With the H100's framework memory-bound kernels at 0.807 of the STREAM
# rate (catalog efficiency.memory_kernels) and a residual add's backward counted as the sum of its two
# gradients: 3.9 / 11.7 %, signed -1.3 -> +0.2 % (analytic 4.0 %, signed -0.1 %; NeMo GPT-3 5B -8.5 -> -4.8 %,
# MPT-3B fp8 -10.2 -> -6.9 %, the long-sequence MPT-7B +10.6 -> +11.7 %), limits 4.1 / 11.8 %.
MODERN_THRESHOLDS = (Threshold(metric="iteration_time_s", max_mape=0.041, max_row_error=0.118),)
MISSING_MECHANISMS = (
    "rows of the 2023-25 stacks are predicted 4.4 % too fast on average (the 24 rows before torchtitan A12; the seven counted torchtitan rows are -7.6..+1.7 % on the measured EFA bandwidth with their eager elementwise ops, torch's own cross-entropy, the root unit's reduce-scatter after the backward and the units FSDP keeps gathered for it, and the 31 counted rows -3.8 %; with A9's two Nemotron rows, -10.6 / -8.8 %, and A10's Llama 3.1 405B, -5.1 %, the 34 counted rows -4.1 %; -2.8 % at the H100's long-run clock). Modelled: the split of the fused QKV output into views, whose backward concatenates dQ, dK, dV, and Transformer Engine's copy of V after RoPE (qkv_split); fp8 GEMMs with fast accumulation "
    "in forward and Transformer Engine's split accumulator in dgrad and wgrad (the fp8 MAMF, 1.1x slower; "
    "pytorch/ao#2377), priced on H100/H200 from the measured TensorRT-LLM fp8 GEMM tables less their activation "
    "quantization; llm-foundry's FA1-class Triton attention (FA1's measured fraction of FA2 at the head dim: 0.464 at 128) and per-op Composer AdamW; bf16 gradient buffers; data-parallel collectives holding one SM per NCCL channel of their group (32 inside an H100 node: FSDP on 8 H100); torch FSDP1's FlatParameter gradient copy and predivide, and the 16-bit reduction of Composer's DEFAULT mixed precision before v0.16.4; "
    "which fp8 casts each stack fuses (Megatron-Core's MLP casts its activation separately, TE's LayerNormMLP "
    "of the 2023 MLPerf code fuses it; fused casts pay the fp8 transpose in backward) and the loss kernel "
    "(Megatron's unfused fp32 cross-entropy, its torch.compile'd fusion for the NeMo Llama 3 recipes, TE's Triton "
    "kernel for Megatron-Bridge); FlashAttention-1 in the MLPerf v3.0 code (TE 0.8) and the 2023 TE's amax-history "
    "and scale update in every fp8 module each pass (MLPerf v3.0 / v3.1); "
    "fp8 primary weights and Megatron-Bridge FP8-CS's bf16 first and last layers; Transformer Engine's userbuffer "
    "overlap GEMM by GEMM (ring-exchange GEMMs in tp chunks of m/tp rows, pipeline GEMMs in 4 chunks, bulk GEMMs "
    "on the SMs the 16-SM communication kernel leaves) and the sequence-parallel re-gather of each TP GEMM's input "
    "for its weight gradient; hidden and attention dropout where the recipe sets it (NeMo GPT-3: 0.1; the "
    "bias-dropout-add masks and the fused attention kernel at 0.916 of its rate (0.896 before the attention grid occupancy): NVIDIA/TransformerEngine#3312's +0.020 ms for dropout 0.1 on H200 cuDNN over this model's 0.218 ms kernel price of that shape (0.172 ms before), not over its 0.594 ms wall time, 37 % kernels: nemo-gpt3-5b / 20b -12.2 / -7.0 -> -11.2 / -6.3 %, 175b +5.0 / +5.1 -> +5.4 / +5.5 %); the flash-attn 2 library kernel at the FA2 rate for NeMo 24.07 (its launcher sets NVTE_FUSED_ATTN=0) and MLPerf v3.1 (flash-attn 2.0.8 ahead of cuDNN), not the profiles' TensorRT-LLM attention rows; cuDNN fused attention for Megatron-Bridge (NeMo 25.11: TE 2.x gives FusedAttention preference on Hopper and the recipes keep attention_backend auto) at its H100 rate relative to FA2 from the FlashAttention-3 paper's cuDNN bars (1.61x forward, 1.57x backward at head dim 128; attention_kernel cudnn): bridge-llama3-8b / 70b +10.4 / +11.5 -> -0.0 / +5.6 %, 6.0 -> 5.3 %, signed -2.7 -> -3.4 %; fp8 weight casts (cast + transpose, 4 bytes per weight) once per step, in the first micro-batch (is_first_microbatch); TE 1.x's blocking amax all-reduce over the stage's ranks in each chunk's forward and backward (NeMo 24.07). The NeMo GPT-3 rows run the 24.07 launcher configs: no activation recompute, and no TP overlap for 175B (ub_tp_comm_overlap: False), with biases (NeMo's bias: True): Megatron-Core adds the output-projection and MLP biases in bias_dropout_add / bias_gelu and autograd reduces their gradients in column sums of their own (linear_bias skip_bias_add), and TE 1.x's flash-attn backend copies Q, K, V into [b, s] order and (micro-batch > 1) its output back (attention_layout flash_bshd): nemo-gpt3-5b -14.8 -> -12.2 %, 20b -9.1 -> -7.0 %, 175b +4.0 / +3.8 -> +5.0 / +5.1 %. The same FlashAttention code in the MLPerf v3.0 / v3.1 TE (release_v0.8, 09ba8427) copies the packed QKV into [b, s] order and, behind TransformerLayer's no-op split backward, its gradient back (fa_prepare_fwd / fa_prepare_bwd, 75.5 MB each way per layer per micro-batch on a TP4 rank; no output copy at micro-batch 1; attention_layout flash_bshd on nemo-1.17 / nemo-1.20): the five MLPerf rows -7.1 / -7.4 / -3.9 / -8.2 / -8.7 -> -6.3 / -6.7 / -3.1 / -7.4 / -7.9 %, 6.1 -> 6.0 %. "
    "The H100's sustained clock under its 700 W limit prices every GEMM; the shipped H100 profile is fitted at "
    "the boost clock its short-burst tables ran at (gemm_clock): at 1,660 of 1,830 MHz (the aiconfigurator tables' "
    "long-burst rows) 9.0 -> 6.4 %, signed -8.2 -> -3.5 %; at the long-run 1,630 MHz (catalog "
    "sustained_clock_source: the same burst method reads the A100 2.0 % above the 1,305 MHz it holds through HPL; "
    "Azure's fp8 cuBLASLt runs after 10,000 warm-up iterations read 1,635-1,640 MHz) the 23 H100 rows 0.7-1.5 points slower, "
    "training-modern 4.8 -> 4.5 %, signed -3.5 -> -2.8 %; and every attention kernel at the sustained clock too (its rates "
    "are the FlashAttention benchmarks', short calls at the boost clock, as the MAMF's matmuls; the model at the boost "
    "clock reproduces NVIDIA/Fuser's single-round nsys of FlashAttention-2's backward within 2 %): 4.5 -> 4.1 %, signed "
    "-2.8 -> -1.3 % (the long-sequence MPT-7B +5.0 -> +10.6 %, MPT-3B fp8 -13.8 -> -10.2 %). Ruled out: host dispatch (the "
    "fast small-model rows' kernels run 18-800 us, and a layer's ~40 launches take less host time than its GPU "
    "time). torchtitan A12 (docs/performance.md, 64 A100 80GB, FSDP2 eager, April 2024): the cluster is not published; "
    "the rows assume AWS p4de.24xlarge with 400 Gb/s EFA (the repository's multinode_trainer.slurm at the same commit is "
    "'optimized for AWS with EFA', 'Enable for A100'), at the EFA efficiency measured on p4d, 0.59 (NVIDIA/nccl#527, 2022: "
    "4-node all_reduce_perf busbw 29.6 GB/s of 4 x 12.5 GB/s per node), so FSDP's bf16 all-gathers (twice: reshard after "
    "forward) and fp32 reduce-scatter, 8 bytes per parameter per step, are what binds: seven rows +5.3..+12.2 % "
    "(+1.6..-5.1 % at HDR InfiniBand's 0.90) with one gather per chunk, the whole model's first gather exposed; "
    "FSDP2 gathers per transformer block (fsdp_unit 'layer': fully_shard per TransformerBlock and the root, "
    "parallelize_llama.py at 6aafe3cdf), each all-gather priced at its block's size, prefetched, compute starting "
    "after the first unit: -9.5..+2.8 % (Llama 2 13B -9.5 / -7.6 / +2.8 %, Llama 3 8B -7.6 / -5.8 %, the 70B "
    "full-AC rows -4.4 / -4.2 %; the Llama 2 13B no-AC and per-op-AC steps now sit on their FSDP stream and are "
    "predicted alike, 3.90 s, where the published steps differ by 14 %). FSDP keeps the root unit (embedding, "
    "final norm, LM head) gathered from its forward to its backward (FSDP1's _post_forward_reshard frees no root "
    "parameters, FSDP2 sets the root's reshard_after_forward False) and torchtitan its last block too "
    "(reshard_after_forward = False), so the gather before each B leaves them out (fsdp_kept_after_forward: 16 % "
    "of Llama 3 8B's backward gathers, 5 % of Llama 2 13B's): torchtitan Llama 2 13B +2.6 / -4.5 / -7.4 -> "
    "+1.4 / -4.6 / -7.6 %, Llama 3 8B -0.3 / -1.4 -> -0.8 / -1.9 %, the 70B full-AC rows +1.4 / +1.9 -> +1.3 / "
    "+1.7 %, llm-foundry within 0.1 points; not modelled: the memory they hold meanwhile beyond the gathered-layer "
    "working buffer, and torchtitan's every block kept under PP. The Llama 2 70B per-op-AC row at local batch 1 is +74.6 % (+75.5 % gathering its kept units again, +73.6 % with one gather per chunk: "
    "its smaller per-block messages run below the whole model's bus bandwidth): "
    "a ring moves 8 x 69.0e9 x 63/64 = 543 GB through each node's NICs per 11.5 s step, 47 GB/s, 94 % of the p4de's "
    "50 GB/s line rate and 159 % of the measured 29.6 GB/s, so the published step is not reachable on a p4de at that "
    "measurement: the cluster had more network than a p4de, or 2024 NCCL / aws-ofi-nccl moved much more than 2022's "
    "(no newer p4d/p4de multi-node busbw found); nothing was changed for it, and it is reported but not counted by the "
    "one rule every training row is held to: a published step shorter than the least time its data-parallel traffic "
    "needs on the row's network (gradients reduced once, parameters gathered once, (n-1)/n of each through each "
    "node's NICs at the catalog's measured efficiency; 13.81 s here) did not run on the cluster as the row describes "
    "it (network_floor_exclusion; of the other rows only the Megatron-Core 32B comes within half of its floor, 0.49 of "
    "0.89 s). "
    "torchtitan runs eagerly (compile = false in every A12 config): its RMSNorm, complex fp32 RoPE, SwiGLU and residual adds are ATen op chains, counted op by op on its Llama code (workloads.eager, benchmarks/eager_elementwise_bytes.py: RMSNorm 36 / 92 B per element in 8 / 16 kernels forward / backward where a fused norm moves 4 / 8, RoPE 20 / 20 B per Q or K element where fused moves 4 / 8, SwiGLU 10 / 18 B per FFN element where fused moves 6 / 12, a residual connection's add and, in backward, its gradient sum 6 / 6 B), each kernel with its launch and host dispatch (elementwise 'eager'; the 13B and 8B configs' norm_type 'fused_rmsnorm', torchtitan's Triton RMSNorm, keeps one norm kernel: 'eager_fused_norm'), and torch SDPA's layout copies (attention_layout 'torch_sdpa': Llama 3's K and V repeated from 8 to the query heads before the kernel, the output copied back to [b, s, h, d]): Llama 2 13B -9.5 / -7.6 / +2.8 -> -8.1 / -5.2 / +2.8 %, Llama 3 8B -7.6 / -5.8 -> -4.7 / -3.5 %, the 70B full-AC rows -4.4 / -4.2 -> +1.2 / +1.0 %; training-modern 5.8 -> 5.3 %, signed -4.2 -> -3.7 % (analytic 5.9 -> 5.5 %). Their loss is torch's own F.cross_entropy, priced ATen op by ATen op (cross_entropy 'torch' on fp32 logits, 14 / 22 B per logit forward / backward, for Composer / llm-foundry under bf16 autocast and torchtitan from its pred.float(); 'torch_16bit', 4 / 8 B, for torchtitan's April 2024 train.py on the 16-bit logits) instead of Megatron's unfused 38 / 14 B: the torchtitan rows -8.1..+2.8 -> -8.2..+2.8 %, llm-foundry -12.8..+3.8 -> -12.9..+3.6 % (MPT-3B fp8 -11.8 -> -12.6 %), training-modern 5.3 -> 5.4 %, signed -3.7 -> -3.8 %. fp8 runs gather in fp8 under sequence parallelism (fp8_all_gather: Transformer Engine's norm writes fp8 before gather_along_first_dim and its grad_output_preprocess casts a row-parallel output gradient before its gather, TE 0.8 to 2.x; torchao's Float8ColwiseParallel / Float8RowwiseParallel the same): one byte per element where the 16-bit gather moved two, the reduce-scatters unchanged: NeMo GPT-3 175B (TP 4, no TP overlap) +5.4 / +5.5 -> +1.7 / +1.6 %, 20B -6.3 -> -6.9 %, Llama 2 70B -0.9 -> -3.3 %, Nemotron -10.2 / -8.5 -> -10.9 / -8.9 %, Llama 3 70B CP 2 +2.6 -> +0.4 %, Megatron-Bridge 70B / 405B +5.7 / -3.4 -> +3.5 / -5.2 %, MLPerf -6.3..-3.1 -> -7.1..-3.5 % (-7.9 -> -8.3 % at 1,024 nodes); training-modern 5.4 -> 5.3 %, signed -3.8 -> -4.4 % (analytic 5.6 -> 5.5 %). A cast before such a gather runs on the sequence shard, one layout, and the weight gradient's transpose on the gathered fp8 tensor (sim.training.costs FP8_CAST_BYTES; the gathered tensor had been cast and transposed): Megatron-Bridge 70B / 405B +9.4 / -0.5 -> +8.3 / -2.2 %, the NeMo and MLPerf rows 0.1-0.3 points faster. The same count predicts A12's torch.compile speedup of Llama 3.1 8B FSDP on 8 / 128 H100 (Table 1 / 3: 1.157 / 1.162) at 1.169 / 1.171 on the catalog's 700 W 80 GB H100 (the rows' 500 W 96 GB HBM2e part, whose clock is not published, has no catalog entry, so their absolute steps are not in the suite). The embedding's gradient is the backward's last: Megatron's DDP fills its buckets in reverse parameter order, so the embedding table and the first layer's leftover form the last bucket, reduced after the embedding's backward and gathered first in the next forward (param_and_grad_buffer.py params[::-1], core_r0.8.0), and FSDP reduce-scatters its root unit, the embedding with the LM head it holds, in the root's post-backward, after every layer's (closing_gradient_parameters; they had been spread evenly over the backward): torchtitan Llama 3 8B -4.3 / -5.5 -> -0.3 / -1.4 %, Llama 2 13B +2.8 / -5.3 / -8.2 -> +2.6 / -4.5 / -7.4 %, the 70B full-AC rows +1.2 / +0.9 -> +1.4 / +1.9 %, the Megatron / NeMo rows within 0.4 points; training-modern 5.3 -> 5.0 %, signed -4.4 -> -4.0 % (analytic 5.5 -> 5.2 %). llm-foundry's MPT runs eagerly too: each residual add is a kernel of its own beside the LayerNorm after it, 6 B per element each way (elementwise 'eager'; its LayerNorm and GeLU are one ATen kernel each), where the fused pricing's add + norm read 8 B forward and its add's backward 12 B: the eight llm-foundry rows 0.0-0.4 points faster (MPT-3B fp8 -12.6 -> -13.0 %, MPT-13B -12.7 -> -12.9 %); training-modern 5.0 -> 5.1 %, signed -4.0 -> -4.1 %. llm-foundry's loss is its default fused_crossentropy (modeling_mpt.py at 061f2c7c: loss_fn defaults to 'fused_crossentropy', which the benchmark yamls keep), flash-attention's xentropy kernel on the 16-bit logits (cross_entropy 'xentropy': two reads of the logits forward, a read and the gradient's write backward, 4 / 4 B per logit), not torch's on fp32 logits (14 / 22 B): the eight rows 0.0-1.9 points faster (MPT-3B fp8 -13.1 -> -14.5 %, MPT-1B -5.6 -> -7.3 %, MPT-13B -12.9 -> -13.2 %); training-modern 5.1 -> 5.2 %, signed -4.1 -> -4.3 %. The loss's memory is its implementation's (CROSS_ENTROPY_MEMORY: per logit, what it keeps for the backward and what it holds at its peak with every layer's activations still held; torch's F.cross_entropy on fp32 logits holds its log-softmax output, that output's gradient and the result of its backward at once, 12 B, where Megatron's formula counted 4), which puts torchtitan's Llama 3.1 8B FSDP runs within 4 % of their logged peak reserved memory (training-pairs); with torch's 12 B the MPT-7B row on 128 A100 40 GB had read over capacity, with xentropy's 4 B it fits. "
    "The MLPerf v3.0/v3.1 rows compare the logged train_step_timing (their logged throughput also counts "
    "the validation runs) at their own interleaving 12 and stay the worst; see the closing note of issue 11",
)
TRAINING_NOTES = (
    "the 2021-22 Megatron rows are predicted 1.9 % fast on average and the Megatron-Core H100 rows 9.0 % fast "
    "(all run Megatron's default hidden and attention dropout 0.1, modelled; the Megatron-Core rows pay its DDP's "
    "zeroing, NaN-check norm and 1/dp pre-scaling of the whole fp32 gradient buffer each iteration, "
    "grad_buffer_passes, and the concatenation of the QKV split's gradients with Transformer Engine's copy of V "
    "after RoPE, qkv_split). The Megatron-Core rows run the plan their evidence implies (the 1.7B row's "
    "assumptions: one micro-batch of 4 without a pipeline, one layer per virtual stage with one): 1.7B -17.5, 7.1B "
    "-11.3, 16B -7.5, 32B -2.9, 70B -1.1, 119B -13.7, 177B -13.9, 314B -6.0, 462B -7.1 % (at the H100's long-run "
    "clock, 1,630 MHz, their attention kernels at it too; -19.7..-2.5 % and 10.9 % fast on average at 1,660 MHz with "
    "attention at the boost clock; with the embedding's "
    "gradient reduced after the backward, closing_gradient_parameters: -20.5..-3.9 % before; with the attention "
    "grid occupancy of the TP-sharded rows' few heads per GPU, hardware.calibration attention_grid_occupancy: "
    "119B / 177B -16.6 / -16.6 % before). At micro-batch 1 and 1F1B "
    "they had read -17.0..+44.1 % (signed +7.8 %): the 1F1B bubble and the 32B's exposed reduce-scatter hid the same "
    "optimism. Its size where nothing but a micro-batch's compute counts: the README's strong-scaling 177B at 96 "
    "GPUs (576 micro-batches, data parallelism 2) reads 54.9 % MFU against the published 47 % "
    "(benchmarks/megatron_strong_scaling.py), and 1.7B at one GPU per replica -18.9 %. Nothing sourced explains it "
    "(host dispatch, modelled at 13.48 us per op from torch.nn.Linear's forward on a DGX H100 host, "
    "TransformerEngine#2053, does not bind at their shapes: it would take about 145 us per modelled op to explain "
    "the 1.7B row; their memory-bound kernels are priced at 2.2-2.6 TB/s, near the H100's modelled stream rate; "
    "their attention runs cuDNN fused attention, which Transformer Engine >= 1.2 prefers on Hopper "
    "(attention_kernel cudnn, at the FlashAttention-3 paper's H100 cuDNN / FA2 ratios, 1.61x forward and 1.57x "
    "backward at head dim 128), and that made the 1.7B / 7.1B rows faster still (-12.0 / -8.0 -> -18.5 / -12.6 % at "
    "micro-batch 1). Attention dropout is not the rest: NVIDIA/TransformerEngine#3312's 0.594 / 0.614 ms cuDNN "
    "forward + backward (4 sequences of 1,024 tokens on H200) is 63 % outside the kernels by this model's 0.218 ms "
    "kernel price, so its +0.020 ms is priced on the kernel time, 0.916 of the kernel's rate instead of 0.967; even "
    "FlashAttention-1's A100 compute-bound 0.806 (arXiv 2205.14135 Tables 17 / 20, head dim 64) would leave the 1.7B "
    "at micro-batch 1 at -16.2 %: its attention is 13 % of the modelled step. Unmeasured: the fp32 main-gradient "
    "epilogue of the weight-gradient GEMMs (priced as hidden; reading and writing 8 bytes per output element is "
    "up to 23 % of a wgrad GEMM over 4,096 tokens, 6 % over 16,384, if the epilogue is exposed) and the "
    "attention with dropout on cuDNN at these shapes: benchmarks/gpu_small_model_kernels.py measures both on a "
    "GPU). Why the plan: the table "
    "gives neither micro-batch nor schedule (NVIDIA/Megatron-LM#1571 asks for the scripts, unanswered). At "
    "core_r0.8 (f2e5db402c) bf16 forces fp32 gradient reduction (arguments.py accumulate_allreduce_grads_in_fp32, "
    "training.py grad_reduce_in_fp32), buckets reduce only in the last micro-batch (ParamAndGradBuffer."
    "register_grad_ready, is_last_microbatch) and the parameter all-gather runs one bucket ahead of the first "
    "forward (distrib_optimizer _finish_param_sync_helper, param_gather_pacing bucket); the 32B row's 8 "
    "data-parallel groups per node run at once, one NIC each, so 15.4 GB of reduce-scatter and 7.7 GB of "
    "all-gather per GPU take >= 0.46 s at the 50 GB/s line rate; at micro-batch 1 they could hide only behind the "
    "last backward and the first forward, a quarter of 4 micro-batches' compute C, so 0.89 s >= 0.46 s + 0.75 C "
    "would bound C to 0.57 s, 717 TFLOP/s per GPU (the table's best row: 489 end to end; micro-batch 2 needs 478): "
    "the row ran its 4 sequences as one micro-batch (+44.1 % at 1, +18.5 % at 2, -6.0 % at 4), and so, by one rule, "
    "do the other rows without a pipeline (1.7B and 7.1B 4 % faster than at micro-batch 1, 16B 19 %: its "
    "reduce-scatter is the 32B's). The README's 'pipeline-parallel communication "
    "(enabled by default)' overlap exists only under the interleaved schedule at core_r0.8 (arguments.py sets "
    "overlap_p2p_comm False otherwise), the strong-scaling 177B keeps 42 % MFU at 4,608 GPUs with 12 micro-batches "
    "per replica where 1F1B reads 33.7 % even at this model's fast compute, and the 119B's 23 and the 462B's 7 "
    "layers per stage are prime: one layer per virtual stage is the one interleaving every pipelined row allows",
)


@functools.cache  # a suite run is a pure function of the code and the data: callers (tests) share it
def run_training_modern_suite(fidelity: str = "des", calibration: str | None = None) -> SuiteReport:
    comparisons = tuple(
        Comparison(
            suite="training-modern", row=r.row, metric="iteration_time_s", published=r.published_s,
            predicted=r.predicted_s, citation=r.citation, config=r.config, fits_in_memory=r.fits_in_memory,
            excluded=r.excluded,
        )
        for r in iteration_rows(fidelity, "training_modern.csv", calibration)
    )
    return SuiteReport(suite="training-modern", comparisons=comparisons, thresholds=MODERN_THRESHOLDS,
                       notes=MISSING_MECHANISMS)


@functools.cache  # a suite run is a pure function of the code and the data: callers (tests) share it
def run_training_suite(fidelity: str = "des", calibration: str | None = None) -> SuiteReport:
    comparisons = [
        Comparison(
            suite="training",
            row=r.row,
            metric="iteration_time_s",
            published=r.published_s,
            predicted=r.predicted_s,
            citation=r.citation,
            config=r.config,
            fits_in_memory=r.fits_in_memory,
            excluded=r.excluded,
        )
        for r in iteration_rows(fidelity, calibration=calibration)
    ]
    comparisons += memory_comparisons()
    return SuiteReport(suite="training", comparisons=tuple(comparisons), thresholds=THRESHOLDS, notes=TRAINING_NOTES)
