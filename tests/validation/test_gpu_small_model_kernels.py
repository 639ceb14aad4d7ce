"""benchmarks/gpu_small_model_kernels.py: the GPU check of the Megatron-Core 1.7B / 7.1B rows takes
its shapes from those rows' own configs, and its tiny-shape CPU run writes the CSV a GPU run would."""

import csv
import importlib.util
from pathlib import Path

import pytest

from benchmarks.gpu_small_model_kernels import ROWS, main, row_shapes


def test_shapes_are_the_rows_own_per_gpu_layer() -> None:
    small = row_shapes("mcore-h100-1.7b")  # hidden 2048, 16 heads, TP 1, micro-batch 4 x 4,096 tokens
    assert (small.tokens, small.heads, small.head_dim, small.seq_len) == (16384, 16, 128, 4096)
    assert dict((n, (r, c)) for n, r, c in small.wgrads) == {
        "qkv": (2048, 6144), "out_proj": (2048, 2048), "mlp_up": (2048, 8192), "mlp_down": (8192, 2048)}
    tp2 = row_shapes("mcore-h100-7.1b")  # hidden 4096, 32 heads, TP 2: each GPU holds half the heads and columns
    assert (tp2.heads, tp2.head_dim) == (16, 128)
    assert dict((n, (r, c)) for n, r, c in tp2.wgrads)["mlp_up"] == (4096, 8192)
    # the memory-bound kernels: norms and residual adds over the sequence-parallel shard, the activation over every token
    assert (small.hidden, small.ffn, small.norm_tokens) == (2048, 8192, 16384)
    assert (tp2.hidden, tp2.ffn, tp2.norm_tokens) == (4096, 8192, 16384 // 2)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="PyTorch not installed (the calibrate extra)")
def test_cpu_run_writes_every_kernel(tmp_path: Path) -> None:
    out = tmp_path / "k.csv"
    assert main(["--device", "cpu", "--warmup", "0", "--repeats", "1", "--out", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    kernels = {(r["row"].split()[0], r["kernel"], r["variant"]) for r in rows}
    for name in ROWS:
        for p in ("0.0", "0.1"):
            assert (name, "attention_forward_backward", f"math dropout {p}") in kernels
        assert (name, "wgrad_mlp_up", "bf16 out + fp32 add (unfused)") in kernels
        for kernel in ("layernorm_forward", "layernorm_forward_backward"):
            assert (name, kernel, "torch") in kernels
        for kernel in ("bias_gelu_forward_backward", "bias_dropout_add_forward_backward"):
            assert (name, kernel, "eager") in kernels
    memory = [r for r in rows if r["model_s"]]
    assert memory and all(float(r["bytes"]) > 0 and float(r["model_s"]) > 0 for r in memory)
    assert all(float(r["latency_s"]) > 0 and r["device"].startswith("cpu") for r in rows)
