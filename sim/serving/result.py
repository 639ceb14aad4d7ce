"""``ServingResult``: the serving run's metrics (INTERFACE.md serving JSON), table, per-request CSV
and Chrome trace."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from sim.serving.engine import Replica, StepEvent
from sim.jsonout import dumps
from sim.serving.metrics import RequestRecord, SloSpec, records_frame, summarize
from sim.serving.request import SimRequest, Status

if TYPE_CHECKING:
    from sim.serving.run import ServingSystem

SWEEP_METRICS = (
    "ttft_s.p50", "ttft_s.p99", "tpot_s.p50", "tpot_s.p99", "itl_s.p99", "e2e_s.p50",
    "output_tokens_per_s", "request_throughput_per_s", "goodput_requests_per_s", "slo_attainment",
)
_US = 1e6  # Chrome trace timestamps are microseconds (the format requires it)


def to_record(request: SimRequest) -> RequestRecord:
    """The frozen result record of a simulated request."""
    rejected = request.status == Status.REJECTED
    return RequestRecord(
        request_id=request.request_id,
        arrival_s=request.arrival_s,
        prompt_tokens=request.prompt_tokens,
        output_tokens=request.output_tokens,
        first_scheduled_s=request.first_scheduled_s,
        first_token_s=None if rejected else request.first_token_s,
        finish_s=request.finish_s if request.status == Status.FINISHED else None,
        token_times_s=tuple(request.token_times_s),
        token_counts=tuple(request.token_counts),
        preemptions=request.preemptions,
        cached_prompt_tokens=request.cached_tokens,
        rejected=rejected,
        reject_reason=request.reject_reason,
        replica=max(request.replica, 0),
    )


@dataclass(slots=True, kw_only=True)
class ServingResult:
    system: ServingSystem
    requests: Sequence[SimRequest]
    replicas: Sequence[Replica]
    events: Sequence[StepEvent]
    slo: SloSpec | None = None
    offered_rate_per_s: float | None = None
    replicas_derived: bool = False  # replicas = num_gpus / (tp x ep x pp), not given in [serving]
    seed: int = 0  # the seed the workload generator used
    _records: list[RequestRecord] | None = field(default=None, repr=False)
    _metrics: dict[str, Any] | None = field(default=None, repr=False)

    def records(self) -> list[RequestRecord]:
        if self._records is None:
            self._records = [to_record(r) for r in self.requests]
        return self._records

    def metrics(self) -> dict[str, Any]:
        if self._metrics is None:
            self._metrics = self._compute_metrics()
        return self._metrics

    def _compute_metrics(self) -> dict[str, Any]:
        out = summarize(self.records(), slo=self.slo, offered_rate_per_s=self.offered_rate_per_s)
        system = self.system
        spec = system.spec
        duration = out["duration_s"]
        pools = []
        for pool in system.pools:
            m = pool.memory
            pools.append({
                "role": pool.role,
                "replicas": len(pool.replicas),
                "tp": pool.shape.tp,
                "ep": pool.shape.ep,
                "pp": pool.shape.pp,
                "kv_capacity_tokens": m.capacity_tokens,
                "memory_bytes": {
                    "weights": m.weights_bytes, "kv_cache": max(m.kv_bytes, 0.0),
                    "activations": m.workspace_bytes, "other": m.comm_bytes + m.runtime_bytes,
                },
                "fits_in_memory": m.fits,
                "shortfall_bytes": m.shortfall_bytes,
                "utilization": [r.busy_s / duration if duration > 0 else 0.0 for r in pool.replicas],
                "steps": [r.steps for r in pool.replicas],
            })
        out["speculative"] = self._speculative_metrics()
        records = self.records()
        prompt = max(1, round(sum(r.prompt_tokens for r in records) / len(records))) if records else 1
        output = max(1, round(sum(r.output_tokens for r in records) / len(records))) if records else 1
        for pool, entry in zip(system.pools, pools):
            entry["cost_sources"] = pool.cost.cost_sources(prompt, output)
        out.update({
            "cost_sources": pools[0]["cost_sources"] if pools else {},
            "scheduler": spec.scheduler,
            "framework": spec.framework,
            "model": system.model.name,
            "gpu": system.cluster.gpu.name,
            "num_gpus": sum(len(pool.replicas) * pool.shape.num_gpus for pool in system.pools),
            "fits_in_memory": all(p["fits_in_memory"] for p in pools),
            "pools": pools,
        })
        return out

    def _speculative_metrics(self) -> dict[str, Any] | None:
        """Measured speculation: tokens each decode emission delivered per sequence, against the
        expectation (1 - a^(k+1)) / (1 - a), and the share of drafting steps' time spent drafting."""
        spec = self.system.spec.speculative
        if spec is None:
            return None
        emitted = [count for r in self.records() for count in r.token_counts[1:]]
        costs = [pool.cost for pool in self.system.pools if pool.role != "prefill"]
        step_s = sum(c.speculative_step_s for c in costs)
        return {
            "num_speculative_tokens": spec.num_speculative_tokens,
            "acceptance_rate": spec.acceptance_rate,
            "accepted_tokens_per_step": sum(emitted) / len(emitted) if emitted else None,
            "expected_tokens_per_step": spec.expected_tokens_per_step(),
            "draft_time_share": sum(c.draft_s for c in costs) / step_s if step_s > 0 else None,
            "speculative_steps": sum(c.speculative_steps for c in costs),
        }

    def table(self) -> str:
        m = self.metrics()
        lines = [
            f"serving {m['model']} on {m['num_gpus']} x {m['gpu']}, scheduler {m['scheduler']}"
            + (f", replicas {self.system.spec.replicas} (from num_gpus / (tp x ep x pp))" if self.replicas_derived else ""),
        ]
        for p in m["pools"]:
            gib = 2**30
            mem = p["memory_bytes"]
            lines.append(
                f"  {p['role']}: {p['replicas']} x (tp {p['tp']}, ep {p['ep']}, pp {p['pp']}); per GPU: weights {mem['weights'] / gib:.1f} GiB, "
                f"KV {mem['kv_cache'] / gib:.1f} GiB; per replica: KV room for {p['kv_capacity_tokens']:,} tokens"
                + ("" if p["fits_in_memory"] else f"  DOES NOT FIT (short {p['shortfall_bytes'] / gib:.2f} GiB)")
            )
        lines.append(
            f"requests {m['num_requests']}: completed {m['completed']}, rejected {m['rejected']}, "
            f"unfinished {m['unfinished']}, preemptions {m['preemptions']}"
        )
        reasons = sorted(m["reject_reasons"].items(), key=lambda item: -item[1])
        for reason, count in reasons[:5]:
            lines.append(f"  rejected x{count}: {reason}")
        if len(reasons) > 5:
            rest = sum(count for _, count in reasons[5:])
            lines.append(f"  ... {rest} more rejected for {len(reasons) - 5} other reasons (requests.csv lists each)")
        lines.append(
            f"duration {m['duration_s']:.2f} s; throughput {m['request_throughput_per_s']:.3f} req/s, "
            f"{m['output_tokens_per_s']:.1f} output tok/s, {m['total_tokens_per_s']:.1f} total tok/s"
        )
        lines.append(f"{'latency (s)':<12} {'mean':>10} {'p50':>10} {'p90':>10} {'p99':>10}")
        for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s", "queue_s"):
            stats = m.get(key)
            if stats:
                lines.append(
                    f"{key:<12} {stats['mean']:>10.4f} {stats['p50']:>10.4f} {stats['p90']:>10.4f} {stats['p99']:>10.4f}"
                )
        if m["goodput_requests_per_s"] is not None:
            lines.append(
                f"goodput {m['goodput_requests_per_s']:.3f} req/s; SLO attainment {m['slo_attainment']:.1%}"
            )
        sp = m.get("speculative")
        if sp:
            accepted = sp["accepted_tokens_per_step"]
            share = sp["draft_time_share"]
            lines.append(
                f"speculation k={sp['num_speculative_tokens']} alpha={sp['acceptance_rate']:g}: "
                + (f"{accepted:.2f} tokens per decode step (expected {sp['expected_tokens_per_step']:.2f})" if accepted else "no decode steps")
                + (f"; drafting {share:.1%} of step time" if share is not None else "")
            )
        if m["prefix_cache_hit_rate"]:
            lines.append(f"prefix cache hit rate {m['prefix_cache_hit_rate']:.1%}")
        if m["saturated"]:
            lines.append(
                "SATURATED: the queue grows without bound at this offered rate; the numbers describe a transient"
            )
        return "\n".join(lines)

    def write_outputs(self, out_dir: Path) -> list[Path]:
        out_dir = Path(out_dir)
        requests_csv = out_dir / "requests.csv"
        records_frame(self.records()).to_csv(requests_csv, index=False)
        metrics_json = out_dir / "metrics.json"
        metrics_json.write_text(dumps(self.metrics(), indent=2) + "\n")
        return [requests_csv, metrics_json]

    def write_trace(self, path: Path) -> None:
        """Chrome/Perfetto trace: one process per replica, one complete event per batch step."""
        trace: list[dict[str, Any]] = []
        for replica in self.replicas:
            trace.append({"name": "process_name", "ph": "M", "pid": replica.index, "tid": 0,
                          "args": {"name": f"{replica.role} {replica.index}"}})
            for stage in range(replica.stages):
                name = "batch steps" if replica.stages == 1 else f"pipeline stage {stage}"
                trace.append({"name": "thread_name", "ph": "M", "pid": replica.index, "tid": stage, "args": {"name": name}})
        for e in self.events:
            kind = "prefill" if e.decode_tokens == 0 else ("decode" if e.prefill_tokens == 0 else "mixed")
            trace.append({
                "name": kind, "ph": "X", "pid": e.replica, "tid": e.stage, "ts": e.start_s * _US, "dur": e.duration_s * _US,
                "args": {"requests": e.requests, "prefill_tokens": e.prefill_tokens,
                         "decode_tokens": e.decode_tokens, "preempted": e.preempted},
            })
        Path(path).write_text(json.dumps({"traceEvents": trace, "displayTimeUnit": "ms"}))

    def sweep_metrics(self) -> list[str]:
        return list(SWEEP_METRICS)
