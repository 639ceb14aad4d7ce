"""Every config key the simulator reads, per section: the one list docs/configuration.md is tested
against (tests/test_docs_configuration.py), and the sections each config kind uses.

The tables themselves live next to the code that parses them; this module only collects them.
``[search]`` keys belong to ``search/`` (which ``sim`` never imports): the docs test gathers them there.
"""

from __future__ import annotations

import dataclasses

from sim.config import CLUSTER_KEYS
from sim.serving.config import DISAGGREGATED_KEYS, SERVING_KEYS, SPECULATIVE_KEYS
from sim.serving.metrics import _SLO_KEYS
from sim.training.config import PARALLEL_KEYS, TRAINING_KEYS
from sim.training.hetero import GROUP_KEYS
from sim.training.goodput import CHECKPOINT_KEYS, FAILURE_KEYS
from workloads.model import ModelSpec
from workloads.requests import _LENGTH_KEYS, _SESSION_KEYS, _WORKLOAD_KEYS

# Sections each kind of config reads (``[search]`` is read only by ``llmsim search``).
TRAINING_SECTIONS = ("model", "cluster", "training", "parallel", "published")
SERVING_SECTIONS = ("model", "cluster", "serving", "workload", "slo", "published")

# ``[published]``: a published measurement of the run the config describes; `simulate` prints the
# prediction beside it (sim/cli_support.published_comparison). Each key but ``source`` is a metric.
PUBLISHED_METRICS = {
    "model_tflops_per_gpu": ("model TFLOP/s per GPU", "model_flops_per_s_per_gpu", 1e-12),
    "hardware_tflops_per_gpu": ("TFLOP/s per GPU counting recompute", "hardware_flops_per_s_per_gpu", 1e-12),
    "iteration_time_s": ("iteration time (s)", "iteration_time_s", 1.0),
    "tokens_per_s": ("tokens/s", "tokens_per_s", 1.0),
    "mfu": ("MFU", "mfu", 1.0),
    # the same under the full-attention (PaLM Appendix B) FLOP convention: for publications that count
    # attention without the causal halving (docs/outputs.md, mfu_full_attention)
    "model_tflops_per_gpu_full_attention": (
        "model TFLOP/s per GPU, full attn.", "model_flops_full_attention_per_s_per_gpu", 1e-12),
    "mfu_full_attention": ("MFU, full attention", "mfu_full_attention", 1.0),
    "output_tokens_per_s": ("output tokens/s", "output_tokens_per_s", 1.0),
    "request_throughput_per_s": ("requests/s", "request_throughput_per_s", 1.0),
}
PUBLISHED_KEYS = ("source", *PUBLISHED_METRICS)


def length_keys() -> tuple[str, ...]:
    """Keys of a token-length table (``prompt_tokens = {distribution = ..., ...}``)."""
    keys = {"distribution"}
    for required, optional in _LENGTH_KEYS.values():
        keys |= required | optional
    return tuple(sorted(keys))


def key_tables() -> dict[str, tuple[str, ...]]:
    """Section name (as written in TOML, dotted for sub-tables) -> the keys the code accepts."""
    return {
        "model": tuple(f.name for f in dataclasses.fields(ModelSpec)),
        "cluster": tuple(CLUSTER_KEYS),
        "cluster.groups": tuple(GROUP_KEYS),
        "training": tuple(k for k in TRAINING_KEYS if k not in ("checkpoint", "failures")),
        "training.checkpoint": tuple(CHECKPOINT_KEYS),
        "training.failures": tuple(FAILURE_KEYS),
        "parallel": tuple(PARALLEL_KEYS),
        "serving": tuple(k for k in SERVING_KEYS if k not in ("disaggregated", "speculative")),
        "serving.disaggregated": tuple(DISAGGREGATED_KEYS),
        "serving.speculative": tuple(SPECULATIVE_KEYS),
        "workload": tuple(_WORKLOAD_KEYS),
        "workload.prompt_tokens": length_keys(),
        "workload.sessions": tuple(_SESSION_KEYS),
        "slo": tuple(_SLO_KEYS),
        "published": PUBLISHED_KEYS,
    }
