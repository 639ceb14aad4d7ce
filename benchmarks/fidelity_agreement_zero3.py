"""How far the analytic fidelity's ZeRO-3 / FSDP pipelines read from the DES (prints a table and the
distribution; not a test: about four minutes of CPU).

The DESIGN rule: the two fidelities agree wherever they model the same overlap (issue 11, on FSDP /
ZeRO-3 plans too). One stage running F0 B0 W0 F1 ... (fused or split backward) is followed op by op (``analytic.fsdp_alternating_s``,
tests/sim/test_training_fsdp_fidelities.py); with several stages or chunks the analytic fidelity prices
the stream in aggregate and bounds it from each stage's first B (``analytic.first_backward_starts``).
This sweep measures what that leaves: Llama 3 8B (64 H100, TP 1), Llama 3 70B (256 H100, TP 4) and
Mixtral 8x7B (256 H100, EP 4), sequence 4,096, micro-batch 1, full recompute, ZeRO-3, pipeline depths
1, 2, 4, 8 under GPipe, 1F1B, interleaved (2 virtual stages) and ZB-H1 at global batch 64 / 256 /
1,024, HSDP on and off, FSDP units of one layer and of one chunk (about ten minutes).

    PYTHONPATH=. python benchmarks/fidelity_agreement_zero3.py [--worst N] [--csv FILE]

On merged main (2026-12-06, later), with ZB-H1 at one stage followed op by op too
(``fsdp_alternating_s`` with ``split_weight_s``): 504 plans, mean 1.46 %, median 1.01 %, beyond 5 %
18, worst +13.6 % (the same Llama 3 70B plan); the pp 1 ZB-H1 plans now sit on the DES.
Before (2026-12-06, 8 s of CPU), with the Mixtral plans' experts sharded and gathered over
their expert-data-parallel group (under HSDP its ranks inside a shard group, replicated across): 504
plans, mean 1.65 %, median 1.16 %, beyond 5 % 23, beyond 10 % 3, worst +13.6 % (the same Llama 3 70B
plan), then Mixtral pp 1 ZB-H1 chunk units -11.9 % (the 72 Mixtral plans without HSDP 1.14 -> 3.17 %:
their heavier expert gathers put the analytic aggregate's drift on the critical path; all 144 Mixtral
plans 2.41 %). With the experts over the whole expert group and HSDP on the dense groups: 1.82 %, 31
beyond 5 %. Before the experts' groups (2026-12, 2-core machine): 504 plans, mean |analytic / DES - 1|
1.49 %, median 0.96 %, beyond 5 % 21, beyond 10 % 2, worst +13.7 % (Llama 3 70B, pp 2, 1F1B, 2
micro-batches, per-layer units: the aggregate); before the first-gradient-op bounds (7a492f3): 3.75 %,
1.52 %, 111, 74, -28.0 % (ZB-H1). By schedule (mean / worst): 1F1B 1.32 / 13.7 %, GPipe 1.47 / 6.6 %,
interleaved 1.20 / 4.2 %, ZB-H1 1.89 / 10.8 % (before: 2.10 / 14.6, 3.55 / 14.6, 2.12 / 12.8, 6.76 /
28.0). The aggregate's window of m slowest-stage cycles (not the stage's own compute) moved 61 plans
closer and 21 further (at most 3.7 points), from 1.62 % and 1.17 %.
"""

from __future__ import annotations

import argparse
import itertools
import statistics

import pandas as pd

from sim.runner import RunOptions, simulate
from workloads.errors import InvalidPlanError

MODELS = (("llama3-70b", 256, 4, 1), ("llama3-8b", 64, 1, 1), ("mixtral-8x7b", 256, 1, 4))  # (model, GPUs, tp, ep)
SCHEDULES = ("1f1b", "interleaved", "gpipe", "zb-h1")


def plans():
    for (model, gpus, tp, ep), pp, batch, schedule, hsdp, unit in itertools.product(
        MODELS, (1, 2, 4, 8), (64, 256, 1024), SCHEDULES, (False, True), ("layer", "chunk")
    ):
        if schedule == "interleaved" and pp == 1:
            continue
        parallel = {"tp": tp, "pp": pp, "ep": ep, "zero": 3, "hsdp": hsdp, "recompute": "full", "schedule": schedule,
                    **({"virtual_stages": 2} if schedule == "interleaved" else {})}
        label = f"{model} pp {pp} batch {batch} {schedule} hsdp {hsdp} unit {unit}"
        yield label, {"model": {"name": model}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": gpus},
                      "training": {"seq_len": 4096, "global_batch": batch, "micro_batch": 1, "precision": "bf16",
                                   "fsdp_unit": unit},
                      "parallel": parallel}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worst", type=int, default=15, help="rows of the worst plans to print")
    parser.add_argument("--csv", help="also write every plan's row to this CSV file")
    args = parser.parse_args()
    errors = []
    for label, config in plans():
        try:
            analytic = simulate(config, RunOptions(fidelity="analytic")).metrics()["iteration_time_s"]
            des = simulate(config, RunOptions(fidelity="des")).metrics()["iteration_time_s"]
        except InvalidPlanError:
            continue
        errors.append((analytic / des - 1.0, label, analytic, des))
    if args.csv:
        pd.DataFrame(errors, columns=["error", "plan", "analytic_s", "des_s"]).to_csv(args.csv, index=False)
    size = [abs(e) for e, *_ in errors]
    print(f"{len(errors)} plans: mean |analytic / DES - 1| {100 * statistics.mean(size):.2f} %, "
          f"median {100 * statistics.median(size):.2f} %, worst {100 * max(size):.2f} %; "
          f"beyond 2 %: {sum(s > 0.02 for s in size)}, beyond 5 %: {sum(s > 0.05 for s in size)}; "
          f"analytic above the DES in {sum(e > 0 for e, *_ in errors)}")
    print(f"{'plan':<58} {'analytic s':>11} {'DES s':>9} {'error':>8}")
    for error, label, analytic, des in sorted(errors, key=lambda row: -abs(row[0]))[:args.worst]:
        print(f"{label:<58} {analytic:11.3f} {des:9.3f} {100 * error:+7.2f}%")


if __name__ == "__main__":
    main()
