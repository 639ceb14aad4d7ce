"""``hardware.cost.attention_time_from_totals_s``: the aggregate entry point of the attention cost
gives the same float as ``attention_time_s`` on the sequences."""

from __future__ import annotations

import numpy as np
import pytest

from hardware import cost
from hardware.catalog import analytic_gpu as get_gpu  # the analytic model (no calibration profile) is under test


def test_attention_totals_entry_point_is_bit_identical() -> None:
    # attention_time_s depends on the sequences only through three sums; the aggregate entry point
    # must give the same float, so callers can keep the sums incrementally
    gpu = get_gpu("h100-sxm-80gb")
    rng = np.random.default_rng(0)
    kw = dict(heads=64, kv_heads=8, head_dim=128, precision="bf16", bytes_per_element=2.0)
    for causal in (True, False):
        for _ in range(200):
            n = int(rng.integers(1, 40))
            qs = rng.integers(1, 3000, size=n) * (rng.random(n) < 0.3) + 1
            seqs = [(int(q), int(q + rng.integers(0, 20000))) for q in qs]
            reference = 0.0  # the per-sequence floating-point sum the cost model is defined by
            for q, kv in seqs:
                reference += cost.attention_keys_processed(q, kv, causal=causal)
            whole = cost.attention_time_s(gpu, seqs, causal=causal, **kw)
            totals = cost.attention_time_from_totals_s(
                gpu, computed_keys=reference, query_tokens=sum(q for q, _ in seqs),
                key_tokens=sum(kv for _, kv in seqs), **kw,
            )
            assert whole == totals
    with pytest.raises(ValueError, match="queries"):
        cost.attention_time_from_totals_s(gpu, computed_keys=1.0, query_tokens=5, key_tokens=4, **kw)
