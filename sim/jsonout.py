"""Strict JSON for every file and stdout object llmsim writes (RFC 8259: no NaN, no Infinity)."""

from __future__ import annotations

import json
import math
from typing import Any, Mapping


def finite(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None (strict JSON has no NaN / Infinity)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def dumps(value: Any, **kwargs: Any) -> str:
    """Strict JSON: non-finite numbers become null, and ``allow_nan=False`` guards the rest."""
    return json.dumps(finite(value), allow_nan=False, **kwargs)
