"""How far the analytic fidelity reads from the DES on random training plans (prints the distribution
by ZeRO stage and schedule, and the worst plans as configs; not a test: a few minutes of CPU).

The DESIGN rule: the two fidelities agree wherever they model the same overlap. This draws plans
from a seeded generator over what a search or a user may ask: catalog models (dense, MoE), A100 /
H100 / H200, tp, pp, cp (every exchange), ep, ZeRO 0-3 (HSDP, both FSDP units), every schedule,
micro-batch counts from 1 to 256, recompute, sequence parallelism and its overlap, data-parallel
overlap, bf16 / fp8 / fp16, every training stack, optimizer and activation offload, vocabulary
parallelism, uneven layer splits, A100 + H100 clusters and MoE experts folded over the tp ranks
(etp 1). Plans the simulator refuses as bad input
are counted and skipped. Each plan runs through ``sim.runner.simulate``, the path ``llmsim simulate``
takes, once per fidelity.

    PYTHONPATH=. python benchmarks/fidelity_agreement_fuzz.py [--plans N] [--seed S] [--workers W] [--worst K]

With ZB-H2's span counting the gather its first op waits for and ZB-H1 at one stage followed op by op
(2026-12-06, later; the same draw): ZeRO 0-2 0.33 %, 91 beyond 5 %, 23 beyond 10 %, worst +17.7 %; ZeRO-3
1.92 %, 297 beyond 5 %, 83 beyond 10 %, worst +35.1 % (a Mixtral V-Min pipeline); ZB-H1 1.59 -> 1.40 %,
ZB-H2 1.92 -> 1.79 % (worst +41.9 -> -11.2 %).
With the MoE plans drawn half on the flex dispatcher (micro-batch 1) and, where Megatron-Core runs it, on
the combined 1F1B (ep_comm_overlap; 2026-12-06, the same seed): ZeRO 0-2 unchanged (0.33 %, 90 beyond
5 %, 23 beyond 10 %, worst +17.7 %), ZeRO-3 1.95 %, 294 beyond 5 %, 85 beyond 10 %, worst +41.9 % (a dense
ZB-H2 plan at pp 1): both settings price the same per-pass costs in each fidelity.
Before them (2026-12, 2-core machine, 2 workers, about five minutes), 15,000 configs of seed 1:
the 9,992 ZeRO 0-2 plans read 0.33 % from the DES on average, 88 beyond 5 % and 21 beyond 10 %, worst
+22.3 % (breadth-first, Hanayo, ZB-V and V-Half plans of few micro-batches: the closed form counts
their buckets against dense compute where the stage idles between its last gradient ops); the 2,534
ZeRO-3 plans 1.95 %, 86 beyond 10 %, worst +42.7 % (ZB-H2 at pp 1, one FSDP unit per chunk). Of
them, the 969 plans with experts folded over the tp ranks (etp 1): 0.91 %, 21 beyond 10 %, worst
+23.1 % (ZeRO 0-2 0.48 %, ZeRO-3 2.55 %). Before the folded draws (the same seed, another plan set):
ZeRO 0-2 0.32 %, 70 beyond 5 %, 14 beyond 10 %, worst +19.9 %; ZeRO-3 1.92 %, 77 beyond 10 %,
worst +56.2 % (ZB-H2 on a split of 28 to 1 layers per stage).
The code before pricing differing 1F1B / GPipe stages on their longest paths (2ae7f3d, the same draw):
ZeRO 0-2 0.47 %, 160 beyond 5 %, 39 beyond 10 %, worst +24.2 % (1F1B); ZeRO-3 2.04 %, 84 beyond 10 %.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
from collections import defaultdict
from typing import Any

import numpy as np

from sim.errors import ConfigError
from sim.runner import RunOptions, simulate
from workloads.catalog import get_model
from workloads.errors import InvalidPlanError, WorkloadError
from hardware.errors import CatalogError

# model -> sequence lengths drawn
MODELS = {"gpt3-1.7b": (2048,), "gpt3-7.5b": (2048,), "gpt3-39.1b": (2048,), "gpt3-175b": (2048,),
          "llama3-8b": (2048, 4096, 8192), "llama3-70b": (4096, 8192), "llama3.1-405b": (8192,),
          "mixtral-8x7b": (4096,), "mixtral-8x22b": (4096,), "deepseek-v3": (4096,)}
STACKS = ("megatron-core", "megatron-2021", "deepspeed-zero-2021", "llm-foundry", "megatron-bridge", "nemo",
          "nemo-1.17", "nemo-1.20", "torchtitan")
SCHEDULES = {"1f1b": 1, "gpipe": 1, "interleaved": 2, "zb-h1": 1, "zb-h2": 1, "zb-v": 2, "v-half": 2, "v-min": 2,
             "bfs": 2, "hanayo": 2}  # schedule -> virtual stages
REFUSED = (ConfigError, InvalidPlanError, WorkloadError, CatalogError)


def draw(rng: np.random.Generator) -> dict[str, Any]:
    """One random training config."""
    def one(*values: Any) -> Any:
        return values[int(rng.integers(len(values)))]

    model = one(*MODELS)
    moe = get_model(model).is_moe
    tp, pp, cp = one(1, 2, 4, 8), one(1, 2, 4, 8, 16), one(1, 1, 1, 2, 4)
    ep = one(1, 2, 4, 8) if moe else 1
    schedule = one(*SCHEDULES)
    dp = one(*[d for d in (1, 2, 4, 8, 16, 32, 64) if 8 <= tp * pp * cp * d <= 1024 and (d * cp) % ep == 0] or [8])
    m, micro_batch = one(1, 2, 4, 8, 16, 32, 64, 256), one(1, 1, 2, 4)
    if schedule == "interleaved":
        m = pp * max(1, m // pp)
    parallel: dict[str, Any] = {
        "tp": tp, "pp": pp, "cp": cp, "ep": ep, "dp": dp, "schedule": schedule,
        "virtual_stages": SCHEDULES[schedule] if schedule != "interleaved" else one(2, 3, 4),
        "zero": one(0, 1, 1, 2, 3), "recompute": one("none", "selective", "full"),
        "sequence_parallel": tp > 1 and bool(rng.random() < 0.7),
    }
    if parallel["sequence_parallel"]:
        parallel["tp_comm_overlap"] = bool(rng.random() < 0.5)
        if moe and rng.random() < 0.5:  # the experts folded over the tp ranks too (etp 1, ep up to tp x cp x dp)
            experts = get_model(model).experts
            parallel["etp"] = 1
            parallel["ep"] = one(*[e for e in (2, 4, 8, 16, 32, 64) if (tp * cp * dp) % e == 0 and experts % e == 0] or [ep])
    if rng.random() < 0.5:
        parallel["dp_comm_overlap"] = bool(rng.random() < 0.6)
    if cp > 1:
        parallel["cp_comm"] = one("ring", "all_gather", "ulysses")
    if parallel["zero"] == 3 and rng.random() < 0.3:
        parallel["hsdp"] = True
    if rng.random() < 0.1:
        parallel["offload"] = one("optimizer", "optimizer+params", "nvme")
    if rng.random() < 0.1:
        parallel["activation_offload"] = one(0.25, 0.5, 1.0)
    if pp > 1 and rng.random() < 0.05:
        parallel["vocab_parallel"] = True
    if pp > 1 and parallel["virtual_stages"] == 1 and rng.random() < 0.08:  # an uneven split of the layers
        cuts = np.sort(rng.choice(np.arange(1, get_model(model).layers), pp - 1, replace=False))
        parallel["layers_per_stage"] = np.diff(np.concatenate(([0], cuts, [get_model(model).layers]))).tolist()
    precision = one("bf16", "bf16", "fp8", "fp16")
    gpu = one("a100-sxm-80gb", "h100-sxm-80gb", "h200-sxm-141gb")
    if precision == "fp8" and gpu.startswith("a100"):
        precision = "bf16"
    training: dict[str, Any] = {"seq_len": one(*MODELS[model]), "global_batch": m * dp * micro_batch,
                                "micro_batch": micro_batch, "precision": precision, "framework": one(*STACKS)}
    if parallel["zero"] == 3:
        training["fsdp_unit"] = one("layer", "chunk")
    if moe and micro_batch == 1:  # the flex dispatcher on half the MoE plans, without a draw that would shift the others
        training["moe_dispatcher"] = "flex"
    if moe and m % 4 == 0 and parallel["recompute"] != "full" and not parallel.get("recompute_layers") and (
            pp == 1 or parallel["schedule"] == "interleaved"):  # the combined 1F1B where Megatron-Core runs it
        parallel["ep_comm_overlap"] = True
    num_gpus = tp * pp * cp * dp
    cluster: dict[str, Any] = {"gpu": gpu, "num_gpus": num_gpus}
    if pp % 2 == 0 and precision != "fp8" and rng.random() < 0.05:  # half the stages on A100, half on H100
        cluster = {"groups": [{"gpu": "a100-sxm-80gb", "num_gpus": num_gpus // 2},
                              {"gpu": "h100-sxm-80gb", "num_gpus": num_gpus // 2}]}
    return {"model": {"name": model}, "cluster": cluster, "training": training, "parallel": parallel}


def compare(config: dict[str, Any]) -> tuple[dict[str, Any], float | None]:
    """(the config, analytic / DES - 1), or None where the simulator refuses the plan."""
    try:
        analytic, des = (simulate(config, RunOptions(fidelity=f)).metrics()["iteration_time_s"] for f in ("analytic", "des"))
    except REFUSED:
        return config, None
    return config, analytic / des - 1.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plans", type=int, default=5000, help="configs drawn")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--worst", type=int, default=5, help="worst plans printed as configs")
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    configs = [draw(rng) for _ in range(args.plans)]
    with multiprocessing.Pool(args.workers) as pool:
        results = pool.map(compare, configs, chunksize=16)
    valid = [(config, error) for config, error in results if error is not None]
    print(f"{len(configs)} configs drawn (seed {args.seed}), {len(configs) - len(valid)} refused as bad input")
    groups: dict[str, list[float]] = defaultdict(list)
    for config, error in valid:
        zero = "ZeRO-3" if config["parallel"]["zero"] == 3 else "ZeRO 0-2"
        groups[zero].append(error)
        groups[f"{zero} {config['parallel']['schedule']}"].append(error)
    print(f"{'plans':<24} {'count':>6} {'mean |e|':>9} {'median':>8} {'> 5 %':>6} {'> 10 %':>7} {'worst':>8}")
    for name, errors in sorted(groups.items()):
        size = [abs(e) for e in errors]
        print(f"{name:<24} {len(errors):6d} {100 * statistics.mean(size):8.2f}% {100 * statistics.median(size):7.2f}% "
              f"{sum(s > 0.05 for s in size):6d} {sum(s > 0.10 for s in size):7d} {100 * max(errors, key=abs):+7.1f}%")
    for config, error in sorted(valid, key=lambda item: -abs(item[1]))[:args.worst]:
        print(f"{100 * error:+.1f}%  {config}")


if __name__ == "__main__":
    main()
