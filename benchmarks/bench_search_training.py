"""Training plan search speed (prints wall times).

Covers: issue "Planner", Speed: `llmsim search examples/search-gpt3-1t-a100.toml` (GPT-3 1T on
3,072 A100, the whole space of tp, pp, cp, dp, ZeRO, schedule, virtual stages, micro-batch,
recompute and sequence parallelism) must screen at least 10,000 candidates analytically and finish
(MILPs and DES re-ranking of the top 10 included) in at most 20 s wall on 2 cores. For scale:
Calculon's exhaustive search took 97 s for 8,000 configurations on this kind of machine.
Reports the funnel, the wall time, the CPU time of this process and its workers and the load
average (on a shared machine CPU time / workers estimates the wall time on idle cores); the number
is reported, not asserted by a test.

    python benchmarks/bench_search_training.py [--workers N] [--top K]
"""

from __future__ import annotations

import argparse
import os
import resource
import time
from pathlib import Path

from search.run import SearchOptions, run_search
from sim.config import load_config

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "search-gpt3-1t-a100.toml"
TARGET_S = 20.0
MIN_SCREENED = 10_000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--top", type=int, default=None)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    config = load_config(EXAMPLE, args.set)
    start, cpu_start = time.perf_counter(), _cpu_s()
    result = run_search(config, SearchOptions(workers=args.workers, top_k=args.top))
    wall, cpu = time.perf_counter() - start, _cpu_s() - cpu_start
    funnel = result.funnel
    print(f"enumerated {funnel.enumerated:,}, pruned {sum(funnel.pruned.values()):,}, screened {funnel.screened:,}, "
          f"MILPs {sum(funnel.milp_solved.values())}, DES re-ranked {funnel.des_reranked}")
    print(f"wall {wall:.1f} s on {args.workers} workers (target: >= {MIN_SCREENED:,} screened in <= {TARGET_S:.0f} s); "
          f"{funnel.screened / wall:,.0f} screened candidates per second of wall time")
    load = os.getloadavg()
    print(f"CPU {cpu:.1f} s (this process and its workers; / {args.workers} = {cpu / args.workers:.1f} s), "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    best = result.best
    if best is not None:
        c = best.candidate
        print(f"best: tp {c.tp} pp {c.pp} cp {c.cp} zero {c.zero} {c.schedule} v {c.virtual_stages} mb {c.micro_batch} "
              f"{c.recompute} sp {c.sequence_parallel}: {best.metrics['tokens_per_s']:,.0f} tokens/s (DES)")
    return 0 if funnel.screened >= MIN_SCREENED and wall <= TARGET_S else 1


def _cpu_s() -> float:
    """User + system CPU seconds of this process and of its finished children (the pool workers)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


if __name__ == "__main__":
    raise SystemExit(main())
