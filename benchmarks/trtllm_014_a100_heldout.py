"""Held-out check of the TensorRT-LLM 0.14 engine model on another GPU (prints a table; not a test:
32 serving runs take about 95 s of CPU at the benchmark's request counts).

The 0.14 perf-overview table that gives the suite's H100 FP16 rows (NVIDIA TensorRT-LLM
docs/source/performance/perf-overview.md, "All data in the table below was generated using version
0.14.0"; stored in the public fork arthurrasmusson/TensorRT-LLM at e00d4e65) has an
"A100-SXM4-80GB FP16" column for the same models, lengths and TP sizes, built and run the same way
(trtllm-bench build --dataset, trtllm-bench throughput). This script runs each suite row's own config
(``validation.serving_suite.row_config``, what ``llmsim validate -v`` prints) with the GPU swapped for
``a100-sxm-80gb`` (its trtllm-bench engine settings recomputed for that GPU) through the user path and
compares with that column. The engine model (stack "trtllm", scheduler "inflight") is the same on both
GPUs, so the difference between the two summaries is what the H100's pricing adds.

    PYTHONPATH=. python benchmarks/trtllm_014_a100_heldout.py

At the benchmark's own request counts (the perf-overview's $num_requests table, the rows' batch column), with
the executor's memory as its source sizes it (the CUDA runtime's total, 791 MiB outside its logged allocations,
its runtime and decoder buffers per slot; the A100 keeps its datasheet 80 GiB, its runtime total not being in
the catalog): A100 MAPE 11.3 %, signed +11.3 %, worst +22.7 % (70B TP4 5000/500); H100 (the suite) 9.2 %,
+9.2 %, +21.2 % (70B TP8 1000/1000): every row optimistic on both GPUs. 62 s wall on one core.

Before that memory: A100 MAPE 12.3 %, signed +12.3 %, worst +22.9 %; H100 10.1 %, +10.1 %, +21.5 %.

With 1,000 requests per row and the 'trtllm' stack's 270 us of serial host work per step (NVIDIA/TensorRT-LLM PR #10018): A100
MAPE 10.6 %, signed +9.8 %, worst +22.3 %; H100 (the suite) 12.1 %, +10.8 %, +22.8 %.

Before it, on main after the rows took the checkpoint's bf16 (trtllm-bench builds at the Hugging Face torch_dtype;
the profiles' measured bf16 GEMM tables apply, where fp16 fell back to the roofline): A100 MAPE 10.9 %,
signed +10.1 %, worst +22.4 % (70B TP4 5000/500); H100 (the suite) 11.9 %, +10.5 %, +22.0 % (12.6 %,
+11.4 %, +23.0 % once the H100 HBM efficiency became the measured 0.887): as
optimistic on both GPUs, row by row. With fp16 rows at the roofline it read A100 7.0 %, +4.4 %, worst
+15.3 %; H100 12.6 %, +11.6 %, +22.8 %.
"""

from __future__ import annotations

import dataclasses

from validation.serving_suite import load_rows, predict

# A100-SXM4-80GB FP16 column, total output tokens/s of the TP group (perf-overview 0.14.0, Llama 3.1)
A100_SXM_FP16 = {
    ("llama3-8b", 1, 1000, 1000): 3634.3886, ("llama3-8b", 1, 128, 128): 6701.7958,
    ("llama3-8b", 1, 2048, 128): 795.389, ("llama3-8b", 1, 500, 2000): 3945.1912,
    ("llama3-8b", 1, 5000, 500): 790.6631, ("llama3-8b", 1, 2048, 2048): 2264.9513,
    ("llama3-70b", 2, 1000, 1000): 468.6383, ("llama3-70b", 4, 1000, 1000): 1762.6831,
    ("llama3-70b", 8, 1000, 1000): 3190.0211, ("llama3-70b", 2, 128, 128): 1346.9692,
    ("llama3-70b", 4, 128, 128): 2420.8665, ("llama3-70b", 8, 128, 128): 4572.3445,
    ("llama3-70b", 4, 2048, 128): 278.4018, ("llama3-70b", 8, 2048, 128): 550.4751,
    ("llama3-70b", 4, 5000, 500): 362.9361, ("llama3-70b", 8, 5000, 500): 670.3742,
}


def _summary(errors: list[float]) -> str:
    mape = 100 * sum(map(abs, errors)) / len(errors)
    signed = 100 * sum(errors) / len(errors)
    worst = max(errors, key=abs)
    return f"MAPE {mape:.1f} %, signed {signed:+.1f} %, worst {100 * worst:+.1f} %"


def main() -> None:
    rows = [r for r in load_rows() if r.benchmark == "inflight"]
    h100, a100 = [], []
    print(f"{'row':34s} {'H100 pub':>9s} {'pred':>8s} {'err':>7s} | {'A100 pub':>9s} {'pred':>8s} {'err':>7s}")
    for row in rows:
        key = (row.model, row.tp, row.input_tokens, row.output_tokens)
        other = dataclasses.replace(row, gpu="a100-sxm-80gb", published=A100_SXM_FP16[key] / row.tp)
        p_h, p_a = predict(row), predict(other)
        h100.append(p_h / row.published - 1)
        a100.append(p_a / other.published - 1)
        print(f"{row.label:34s} {row.published:9.1f} {p_h:8.1f} {100 * h100[-1]:+6.1f}% | "
              f"{other.published:9.1f} {p_a:8.1f} {100 * a100[-1]:+6.1f}%", flush=True)
    print(f"H100 SXM (the suite): {_summary(h100)}")
    print(f"A100 SXM (held out):  {_summary(a100)}")


if __name__ == "__main__":
    main()
