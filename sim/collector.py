"""CPython's cyclic garbage collector paused around a long, allocation-heavy computation.

The generational collector runs a young collection every 700 net allocations of container objects
and a full one whenever the objects promoted since the last full collection reach a quarter of the
long-lived ones; each full collection walks every long-lived object. A computation that allocates
millions of short-lived containers next to a large long-lived set pays that walk again and again
although it creates (almost) no reference cycles. Results never depend on the collector: it only
frees unreachable cycles, later.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off for the block, then as it was (nested blocks leave it off
    until the outermost one ends)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
