"""One training simulation: config -> priced pipeline -> analytic or DES -> metrics and outputs."""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import networkx as nx

from hardware import cost, units
from sim import costmodel
from sim.errors import ConfigError
from sim.runner import RunOptions
from sim.training.analytic import PipelineEstimate, analytic_iteration
from sim.training.config import TrainingSetup, parse_training
from sim.training.goodput import goodput_metrics
from sim.training.costs import attention_sequences, cp_heads_split, group_links, layer_passes
from sim.training.iteration import IterationWork, build_iteration
from sim.training.hetero import describe, peak_flops_per_s, setup_memory, stage_setup
from sim.training.memory import MemoryBreakdown
from workloads.graph import op_graph

if TYPE_CHECKING:
    import pandas as pd

AXES = ("tp", "pp", "dp", "cp", "ep")
_TOTAL_BYTES = attrgetter("total_bytes")


def model_flops_per_iteration(setup: TrainingSetup, *, full_attention: bool = False) -> float:
    """Forward + backward matmul FLOPs without recompute (3 x forward), INTERFACE.md's convention:
    Narayanan et al. 2021 Eq. 3 without the recompute pass, 72 B s L h^2 (1 + s/6h + V/12hL) for GPT
    with GQA, SwiGLU and MoE top-k through ``ModelSpec.matmul_parameters_per_token``; the attention
    score and value FLOPs are the ones the time model prices (``costs.attention_sequences``): causal
    halving and sliding windows for fused (flash) kernels, the full score matrix for the unfused
    kernels that compute and then mask it (Eq. 3's s/6h term), so MFU <= 1 holds at any length.

    ``full_attention``: every query of a sequence against all its keys, no causal halving nor
    sliding window, whatever the kernel: the PaLM convention (Chowdhery et al. 2022, Appendix B,
    6 N + 12 L H Q T per token) that torchtitan's MFU uses ("we follow the convention and do not
    account for sparsity in causal attention", torchtitan ``get_num_flop_per_token``)."""
    job, model, plan = setup.job, setup.model, setup.plan
    tokens = job.global_batch * job.seq_len
    matmul = 2.0 * model.matmul_parameters_per_token() * tokens
    if model.is_mla:
        qk, v = model.qk_nope_head_dim + model.qk_rope_head_dim, model.v_head_dim
    else:
        qk = v = model.head_dim
    microbatches = job.global_batch / job.micro_batch
    if full_attention:
        whole = ((job.seq_len, job.seq_len),) * job.micro_batch
        per_microbatch = cost.attention_flops(whole, heads=model.heads, head_dim=qk, causal=False, v_head_dim=v)
        return 3.0 * (matmul + model.layers * per_microbatch * microbatches)
    sequences, causal = attention_sequences(setup)
    if not setup.fused_attention:
        causal = False  # the unfused kernels compute every score of each (query, key) pair, then mask
    # each of the cp ranks attends its sequences with heads / (the factor CP splits heads by)
    heads = model.heads // cp_heads_split(plan)
    per_microbatch_rank = cost.attention_flops(sequences, heads=heads, head_dim=qk, causal=causal, v_head_dim=v)
    attention = model.layers * per_microbatch_rank * plan.cp * microbatches
    return 3.0 * (matmul + attention)


def with_goodput(setup: TrainingSetup, metrics: dict[str, Any]) -> dict[str, Any]:
    """``metrics`` plus the checkpoint / failure fields (``sim.training.goodput``) when configured."""
    metrics.update(goodput_metrics(setup, metrics))
    return metrics


def training_metrics(
    setup: TrainingSetup,
    estimate: PipelineEstimate,
    memory: Sequence[MemoryBreakdown],
    *,
    recompute_flops_per_replica: float,
    fidelity: str,
    model_flops: float | None = None,
    model_flops_full_attention: float | None = None,
) -> dict[str, Any]:
    """The ``--format json`` training metrics (``TrainingResult.metrics``). ``memory``: every stage's
    breakdown, or any subset holding the first stage to reach the largest total
    (``memory.peak_stage_memory``), all with the GPU's one capacity: the stage with the largest
    total decides whether all fit and the largest shortfall (x - capacity is monotone in x).
    ``model_flops``: ``model_flops_per_iteration(setup)`` when the caller has it (a search memoizes it)."""
    job, plan = setup.job, setup.plan
    gpus = setup.cluster.num_gpus
    seconds = estimate.iteration_time_s
    tokens = job.global_batch * job.seq_len
    if model_flops is None:
        model_flops = model_flops_per_iteration(setup)
    if model_flops_full_attention is None:
        model_flops_full_attention = model_flops_per_iteration(setup, full_attention=True)
    recompute_flops = recompute_flops_per_replica * plan.dp
    peak = setup.cluster.gpu.peak(job.precision)
    worst = max(memory, key=_TOTAL_BYTES)
    exposed = estimate.exposed_comm_s
    fits, shortfall = worst.fits_in_memory, worst.shortfall_bytes
    if setup.groups:  # every stage against its own GPU's capacity and peak
        fits = all(b.fits_in_memory for b in memory)
        shortfall = max(b.shortfall_bytes for b in memory)
        peak = peak_flops_per_s(setup, job.precision) / gpus
    return {
        "iteration_time_s": seconds,
        "tokens_per_s": tokens / seconds,
        "tokens_per_s_per_gpu": tokens / seconds / gpus,
        "model_flops_per_s_per_gpu": model_flops / seconds / gpus,
        "mfu": model_flops / (seconds * gpus * peak),
        "model_flops_full_attention_per_s_per_gpu": model_flops_full_attention / seconds / gpus,
        "mfu_full_attention": model_flops_full_attention / (seconds * gpus * peak),
        "hfu": (model_flops + recompute_flops) / (seconds * gpus * peak),
        "mfu_peak_precision": job.precision,
        "bubble_fraction": estimate.bubble_fraction,
        "exposed_communication_s": {axis: exposed.get(axis, 0.0) for axis in AXES},
        "peak_memory_bytes": worst.total_bytes,
        "memory_bytes": {
            "weights": worst.weights_bytes,
            "gradients": worst.gradients_bytes,
            "optimizer": worst.optimizer_bytes,
            "activations": worst.activations_bytes,
            "other": worst.other_bytes,
        },
        "fits_in_memory": fits,
        "memory_shortfall_bytes": shortfall,
        "offloaded_bytes": {"cpu": worst.cpu_offload_bytes, "nvme": worst.nvme_offload_bytes},
        "num_microbatches": setup.num_microbatches,
        "parallel": {"tp": plan.tp, "pp": plan.pp, "dp": plan.dp, "cp": plan.cp, "ep": plan.ep, "etp": plan.expert_tp},
        "fidelity": fidelity,
        "framework": setup.framework,
    }


def _goodput_lines(m: dict[str, Any]) -> list[str]:
    """Table lines of the checkpoint / failure metrics that are present."""
    lines = []
    if "checkpoint_stall_s" in m:
        lines.append(
            f"checkpoint            {m['checkpoint_bytes'] / units.GB:,.1f} GB, stall {m['checkpoint_stall_s']:.2f} s each "
            f"({m['checkpoint_stall_s_per_iteration']:.4f} s per iteration)"
        )
    if "job_mtbf_s" in m:
        lines.append(
            f"failures              job MTBF {m['job_mtbf_s'] / 3600:.2f} h, lost per failure {m['expected_lost_work_s']:.0f} s, "
            f"optimal interval {m['optimal_checkpoint_interval_s']:.0f} s (Young/Daly)"
        )
    if "goodput_tokens_per_s" in m:
        lines.append(f"goodput               {m['goodput_tokens_per_s']:,.0f} tokens/s ({m['goodput_tokens_per_s'] / m['tokens_per_s']:.1%} of throughput)")
    return lines


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingResult:
    setup: TrainingSetup
    work: IterationWork
    estimate: PipelineEstimate
    memory: tuple[MemoryBreakdown, ...]
    fidelity: str
    events: tuple[Any, ...] = ()
    memory_timeline: tuple[Any, ...] = ()

    # ---- metrics -----------------------------------------------------------------------------
    def metrics(self) -> dict[str, Any]:
        metrics = with_goodput(self.setup, training_metrics(
            self.setup,
            self.estimate,
            self.memory,
            recompute_flops_per_replica=self.work.recompute_flops_per_replica,
            fidelity=self.fidelity,
        ))
        metrics["cost_sources"] = self.cost_sources()
        return metrics

    def cost_sources(self) -> dict[str, float]:
        """Fractions of one layer's predicted op time (F, B and W of every op, as ``op_frame``)
        priced from the GPU's measured calibration profile, a transferred one, or the roofline model."""
        frame = self.op_frame()
        by_source = frame.groupby("cost_source")["seconds"].sum().to_dict()
        return costmodel.source_fractions(by_source)

    def sweep_metrics(self) -> list[str]:
        return ["iteration_time_s", "mfu", "bubble_fraction", "peak_memory_bytes"]

    # ---- human table ----------------------------------------------------------------------------
    def table(self) -> str:
        m = self.metrics()
        setup = self.setup
        plan = setup.plan
        fits = m["fits_in_memory"]
        worst = max(self.memory, key=lambda b: b.shortfall_bytes)
        header = [] if fits else [
            f"DOES NOT FIT: stage {worst.stage} needs {worst.total_bytes / units.GiB:.2f} GiB per GPU of "
            f"{worst.capacity_bytes / units.GiB:.0f} GiB (short {worst.shortfall_bytes / units.GiB:.2f} GiB); "
            "the throughput below is what the plan would reach if it fitted",
        ]
        tag = "" if fits else "  (if it fitted)"
        lines = header + [
            (f"model {setup.model.name} on {describe(setup)}, {setup.cluster.network.name}, stage groups "
             f"{list(setup.stage_group)}" if setup.groups else
             f"model {setup.model.name} on {setup.cluster.num_gpus} x {setup.cluster.gpu.name} "
             f"({setup.cluster.node.name}, {setup.cluster.network.name})"),
            f"plan  tp {plan.tp}  pp {plan.pp}  dp {plan.dp}  cp {plan.cp}  ep {plan.ep}"
            f"{f'  etp {plan.expert_tp}' if plan.expert_tp != plan.tp else ''}  zero {plan.zero}  "
            f"schedule {plan.schedule}{f' (v={plan.virtual_stages})' if plan.virtual_stages > 1 else ''}  "
            f"recompute {plan.recompute}"
            f"{f' (full on {list(plan.recompute_layers)} layers per stage)' if plan.recompute_layers else ''}"
            f"  micro-batches {m['num_microbatches']}  fidelity {m['fidelity']}",
            "",
            f"iteration time        {m['iteration_time_s']:.4f} s{tag}",
            f"tokens/s              {m['tokens_per_s']:,.0f}  ({m['tokens_per_s_per_gpu']:,.1f} per GPU){tag}",
            f"model TFLOP/s per GPU {m['model_flops_per_s_per_gpu'] / units.TFLOPS:.1f}{tag}",
            f"MFU / HFU             {m['mfu']:.1%} / {m['hfu']:.1%}  "
            f"(of the {setup.job.precision} dense peak, {peak_flops_per_s(setup, setup.job.precision) / setup.cluster.num_gpus / units.TFLOPS:,.0f} TFLOP/s{' per GPU on average' if setup.groups else ''}){tag}",
            f"bubble fraction       {m['bubble_fraction']:.1%}",
            "exposed comm (s)      " + "  ".join(f"{a} {m['exposed_communication_s'][a]:.4f}" for a in AXES),
            *_goodput_lines(m),
            "",
            "memory per GPU (GiB)  stage  weights  grads  optim  activ  other  total / capacity",
            "  (other: NCCL buffers, cuBLAS workspace, CUDA context and allocator reserve, logits, recompute and gather buffers)",
        ]
        for b in self.memory:
            lines.append(
                f"                      {b.stage:>5}  {b.weights_bytes / units.GiB:7.2f} {b.gradients_bytes / units.GiB:6.2f} "
                f"{b.optimizer_bytes / units.GiB:6.2f} {b.activations_bytes / units.GiB:6.2f} {b.other_bytes / units.GiB:6.2f}  "
                f"{b.total_bytes / units.GiB:6.2f} / {b.capacity_bytes / units.GiB:.0f}"
                + ("" if b.fits_in_memory else f"  DOES NOT FIT: short {b.shortfall_bytes / units.GiB:.2f} GiB")
            )
        return "\n".join(lines)

    # ---- files ----------------------------------------------------------------------------------
    def stage_frame(self) -> pd.DataFrame:
        import pandas as pd  # here, not at import: the plan search and the CLI's other paths never need it

        rows = []
        for stage, breakdown in zip(self.work.pipeline.stages, self.memory):
            rows.append(
                {
                    "stage": stage.stage,
                    "layers": sum(c.layers for c in stage.chunks),
                    "forward_s_per_microbatch": sum(c.forward_s for c in stage.chunks),
                    "backward_input_s_per_microbatch": sum(c.backward_input_s for c in stage.chunks),
                    "backward_weight_s_per_microbatch": sum(c.backward_weight_s for c in stage.chunks),
                    "busy_s": self.estimate.stage_busy_s[stage.stage],
                    "grad_sync_s": sum(c.duration_s for c in stage.grad_sync) + stage.serial_grad_sync_s,
                    "optimizer_s": stage.optimizer_s,
                    "weights_bytes": breakdown.weights_bytes,
                    "gradients_bytes": breakdown.gradients_bytes,
                    "optimizer_bytes": breakdown.optimizer_bytes,
                    "activations_bytes": breakdown.activations_bytes,
                    "other_bytes": breakdown.other_bytes,
                    "total_bytes": breakdown.total_bytes,
                    "fits_in_memory": breakdown.fits_in_memory,
                }
            )
            if self.setup.groups:  # a heterogeneous cluster: the stage's group and GPU
                rows[-1]["group"] = self.setup.stage_group[stage.stage]
                rows[-1]["gpu"] = stage_setup(self.setup, stage.stage)[0].cluster.gpu.name
        return pd.DataFrame(rows)

    def op_frame(self) -> pd.DataFrame:
        """Every op of one layer of each kind the model has (dense; MoE for MoE models, whose
        ``dense_layers`` leading layers are dense) with its pass, seconds and FLOPs."""
        import pandas as pd

        links = group_links(self.setup, 0)
        setup, _ = stage_setup(self.setup, 0)  # a heterogeneous cluster: stage 0's group
        model = setup.model
        kinds = ([False] if not model.is_moe or model.dense_layers else []) + ([True] if model.is_moe else [])
        rows = []
        for moe in kinds:
            for pass_name, ops in zip(("F", "B", "W"), layer_passes(setup, moe)):
                graph = op_graph(ops)
                for name in nx.topological_sort(graph):
                    op = graph.nodes[name]["op"]
                    rows.append(
                        {
                            "layer_kind": "moe" if moe else "dense",
                            "pass": pass_name,
                            "op": op.name,
                            "kind": op.kind,
                            "axis": op.axis,
                            "seconds": costmodel.op_time_s(op, setup.cluster.gpu, precision=setup.job.precision, links=links),
                            "cost_source": costmodel.op_cost_source(op, setup.cluster.gpu, precision=setup.job.precision, links=links),
                            "flops": costmodel.op_flops(op),
                            "message_bytes": op.message_bytes,
                            "memory_bytes": op.bytes_moved,
                        }
                    )
        return pd.DataFrame(rows)

    def write_outputs(self, out_dir: Path) -> list[Path]:
        paths = [out_dir / "stages.csv", out_dir / "ops.csv", out_dir / "metrics.json"]
        self.stage_frame().to_csv(paths[0], index=False)
        self.op_frame().to_csv(paths[1], index=False)
        from sim.jsonout import dumps

        paths[2].write_text(dumps(self.metrics(), indent=2) + "\n")
        if self.events:
            from sim.training.trace import plot_pipeline_timeline

            plot = out_dir / "pipeline_timeline.png"
            # enough micro-batches to pass the warm-up (pp x chunks) into the steady state
            plan = self.setup.plan
            shown = min(self.setup.num_microbatches, max(8, 2 * plan.pp * plan.virtual_stages + 2))
            plot_pipeline_timeline(self.events, plot, max_microbatches=shown, total_microbatches=self.setup.num_microbatches)
            paths.append(plot)
        return paths

    def write_trace(self, path: Path) -> None:
        if not self.events:
            raise ConfigError("--trace needs the DES fidelity (--fidelity des)")
        from sim.training.trace import write_chrome_trace

        write_chrome_trace(path, self.events, self.memory_timeline)


def simulate_training(config: Mapping[str, Any], options: RunOptions) -> TrainingResult:
    """Run one training iteration at the requested fidelity."""
    setup = parse_training(config, options.config_dir)
    work = build_iteration(setup)
    memory = setup_memory(setup)
    if options.fidelity == "analytic":
        if options.trace:
            raise ConfigError("--trace needs the DES fidelity (--fidelity des)")
        return TrainingResult(setup=setup, work=work, estimate=analytic_iteration(work.pipeline), memory=memory, fidelity="analytic")
    from sim.training.pipeline_des import run_pipeline

    result = run_pipeline(work.pipeline, trace=options.trace)
    estimate = PipelineEstimate(
        iteration_time_s=result.iteration_time_s,
        pipeline_time_s=result.pipeline_time_s,
        bubble_fraction=result.bubble_fraction,
        exposed_comm_s=dict(result.exposed_comm_s),
        stage_busy_s=tuple(result.compute_busy_s),
    )
    return TrainingResult(
        setup=setup,
        work=work,
        estimate=estimate,
        memory=memory,
        fidelity="des",
        events=tuple(result.events),
        memory_timeline=tuple(result.memory_timeline),
    )
