"""A pricing cache keys a GPU on every one of its fields: two GPUs that differ only in a field the
cost model reads (L2 bandwidth prices stream-K split-K partials and per-query-head decode) must not
share cached prices."""

from __future__ import annotations

import dataclasses

from hardware.catalog import get_gpu
from hardware.specs import GpuSpec
from sim.training.pricing_cache import PricingCache, gpu_fingerprint


def test_every_gpu_field_is_in_the_fingerprint() -> None:
    gpu = get_gpu("h100-sxm-80gb")
    changed = {
        "l2_bandwidth_Bps": gpu.l2_bandwidth_Bps + 1e12, "architecture": "ampere", "calibration": None,
        "sm_count": gpu.sm_count - 1, "peak_flops_per_s": {**gpu.peak_flops_per_s, "bf16": 1.0},
    }
    assert {f.name for f in dataclasses.fields(GpuSpec)} >= set(changed)
    for name, value in changed.items():
        other = dataclasses.replace(gpu, **{name: value})
        assert gpu_fingerprint(other) != gpu_fingerprint(gpu), name
        cache = PricingCache()
        assert cache.gpu_id(gpu) != cache.gpu_id(other), name
    cache = PricingCache()
    assert cache.gpu_id(gpu) == cache.gpu_id(dataclasses.replace(gpu))  # equal specs still share
