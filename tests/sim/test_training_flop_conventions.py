"""Model-FLOP conventions: llmsim's count (the attention the kernels run: causal halving for fused
kernels) and the full-attention count (PaLM Appendix B, 6 N + 12 L H Q T per token, torchtitan's
MFU), each against its closed form; context parallelism does not change either."""

from __future__ import annotations

import pytest

from sim.runner import RunOptions
from sim.training.config import parse_training
from sim.training.run import model_flops_per_iteration, simulate_training


def _config(seq_len: int = 8192, **parallel) -> dict:
    return {
        "model": {"name": "llama3-8b"},
        "cluster": {"gpu": "h100-sxm-80gb", "node": "dgx-h100", "network": "ib-ndr-fat-tree", "num_gpus": 8},
        "training": {"seq_len": seq_len, "global_batch": 8, "micro_batch": 1, "precision": "bf16"},
        "parallel": {"tp": 1, "pp": 1, **parallel},
    }


def test_full_attention_convention_is_palm_6n_plus_12lhqt() -> None:
    setup = parse_training(_config())
    model, job = setup.model, setup.job
    tokens = job.global_batch * job.seq_len
    linear = 6.0 * model.matmul_parameters_per_token() * tokens
    palm = linear + 12.0 * model.layers * model.heads * model.head_dim * job.seq_len * tokens
    assert model_flops_per_iteration(setup, full_attention=True) == pytest.approx(palm, rel=1e-12)
    # flash kernels skip the masked half: llmsim's own count has half the attention term
    causal = model_flops_per_iteration(setup)
    assert causal - linear == pytest.approx((palm - linear) / 2, rel=1e-3)


def test_context_parallel_schemes_count_the_same_model_flops() -> None:
    """Ulysses splits heads over cp instead of the sequence: its ranks' attention is not cp times more."""
    ring = model_flops_per_iteration(parse_training(_config(cp=8, cp_comm="ring")))
    no_cp = model_flops_per_iteration(parse_training(_config()))
    assert ring == pytest.approx(no_cp, rel=1e-4)  # ring: s/2 keys a query on average, causal: (s+1)/2
    for scheme in ({"cp_comm": "ulysses"}, {"cp_comm": "all_gather"}, {"cp_comm": "hybrid", "cp_heads": 2}):
        assert model_flops_per_iteration(parse_training(_config(cp=8, **scheme))) == pytest.approx(ring, rel=1e-3)
        assert model_flops_per_iteration(parse_training(_config(cp=8, **scheme)), full_attention=True) == (
            model_flops_per_iteration(parse_training(_config()), full_attention=True)
        )


def test_metrics_report_both_conventions_from_one_iteration_time() -> None:
    m = simulate_training(_config(seq_len=32768, cp=8), RunOptions(fidelity="analytic")).metrics()
    ratio = m["model_flops_full_attention_per_s_per_gpu"] / m["model_flops_per_s_per_gpu"]
    assert ratio > 1.2  # attention dominates at 32k tokens on an 8B model
    assert m["mfu_full_attention"] == pytest.approx(m["mfu"] * ratio, rel=1e-12)


def test_a_sliding_window_longer_sequence_trains_and_counts_the_window() -> None:
    """Mistral 7B (4,096-token window) at 8,192 tokens: each query sees (w (w + 1) / 2 + (s - w) w) / s
    = 3,072.5 keys on average, with or without context parallelism; both fidelities run it (it used
    to stop on a traceback: more queries than keys)."""
    def setup(**parallel):  # type: ignore[no-untyped-def]
        config = _config(**parallel)
        config["model"] = {"name": "mistral-7b"}
        return config

    base = parse_training(setup())
    model, s, w = base.model, base.job.seq_len, base.model.sliding_window
    assert w == 4096 and s == 8192
    tokens = base.job.global_batch * s
    linear = 6.0 * model.matmul_parameters_per_token() * tokens
    mean_keys = round((w * (w + 1) / 2 + (s - w) * w) / s)
    windowed = linear + 12.0 * model.layers * model.heads * model.head_dim * mean_keys * tokens
    for parallel in ({}, {"cp": 2}, {"cp": 4, "cp_comm": "all_gather"}, {"cp": 8, "cp_comm": "ulysses"}):
        assert model_flops_per_iteration(parse_training(setup(**parallel))) == pytest.approx(windowed, rel=1e-3)
    for parallel in ({}, {"cp": 2}):
        times = [simulate_training(setup(**parallel), RunOptions(fidelity=f)).metrics()["iteration_time_s"]
                 for f in ("analytic", "des")]
        assert times[0] == pytest.approx(times[1], rel=1e-6) and times[0] > 0
