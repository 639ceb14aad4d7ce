"""A progress bar on stderr when stderr is a terminal; silent otherwise (pipes, CI, tests)."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Callable, Iterator


@contextmanager
def progress(total: int, description: str) -> Iterator[Callable[[int], None]]:
    """Yield ``update(n)``: advances a tqdm bar of ``total`` on a terminal, does nothing otherwise."""
    if not sys.stderr.isatty():
        yield lambda n: None
        return
    from tqdm import tqdm

    with tqdm(total=total, desc=description, unit="cand", file=sys.stderr, leave=False) as bar:
        yield bar.update
