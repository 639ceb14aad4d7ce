"""Where candidate batches are evaluated: in this process, on a local process pool, or on a
dask.distributed cluster (the ``cluster`` extra). Results come back in input order whatever the
executor and worker count, so a search gives the same answer byte for byte on any of them."""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from typing import Callable, Iterable, Iterator, Sequence, TypeVar

import numpy as np

from sim.errors import ConfigError

Item = TypeVar("Item")
Result = TypeVar("Result")


def default_workers() -> int:
    """All cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def batches(items: Sequence[Item], size: int) -> list[Sequence[Item]]:
    """``items`` cut into consecutive slices of at most ``size``."""
    return [items[i : i + size] for i in range(0, len(items), size)]


def map_batches(
    function: Callable[[Sequence[Item]], list[Result]],
    work: Sequence[Sequence[Item]],
    *,
    workers: int = 1,
    dask_address: str | None = None,
    on_done: Callable[[int], None] | None = None,
) -> list[list[Result]]:
    """``[function(batch) for batch in work]``, evaluated serially (``workers == 1``), on a process
    pool of ``workers`` processes, or on the dask scheduler at ``dask_address``; in input order.
    ``on_done(n)`` is called with each finished batch's length (a progress bar's update)."""
    with BatchPool(workers=min(workers, max(1, len(work))), dask_address=dask_address) as pool:
        return pool.map(function, work, on_done=on_done)


def huge_page_advice(enabled: bool) -> bool:
    """Set whether numpy advises the kernel to back this process's large arrays (4 MiB and more) with
    transparent huge pages (``madvise(MADV_HUGEPAGE)``, numpy's default on Linux; the runtime form of
    ``NUMPY_MADVISE_HUGEPAGE``, numpy.org/doc/stable/reference/global_state.html); returns the
    previous setting. A search allocates many short-lived arrays of tens of MiB (pipeline programs
    of up to 786k ops); each first touch of a huge page zeroes 2 MiB and, where the kernel's
    ``transparent_hugepage/defrag`` is ``madvise``, compacts memory to find one: measured on the 1T
    search's program builds and executions (2 cores, other processes running), 18.1 CPU-s of which
    5.0 system with the advice, 13.5 of which 2.2 without. A no-op where numpy has no such switch."""
    multiarray = getattr(getattr(np, "_core", None), "multiarray", None) or getattr(np.core, "multiarray", None)
    setter = getattr(multiarray, "_set_madvise_hugepage", None)
    return bool(setter(enabled)) if setter is not None else enabled


class BatchPool:
    """One executor for several ``map`` calls (``map_batches`` is one call on a fresh one): a search
    keeps its worker processes, and what they memoized, from screening to its last re-pricing. Each
    ``map`` returns in input order, so results never depend on which process ran a batch. While the
    pool is open, this process and its pool workers allocate without huge-page advice
    (``huge_page_advice``; a dask cluster's workers keep their own setting)."""

    def __init__(self, *, workers: int = 1, dask_address: str | None = None) -> None:
        if workers < 1:
            raise ConfigError(f"--workers {workers} must be a positive integer")
        self.workers, self.dask_address = workers, dask_address
        self._pool: ProcessPoolExecutor | None = None
        self._client = None
        self._advice: bool | None = None

    def __enter__(self) -> "BatchPool":
        self._advice = huge_page_advice(False)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._advice is not None:
            huge_page_advice(self._advice)
            self._advice = None

    def map(
        self,
        function: Callable[[Sequence[Item]], list[Result]],
        work: Sequence[Sequence[Item]],
        *,
        on_done: Callable[[int], None] | None = None,
    ) -> list[list[Result]]:
        """``[function(batch) for batch in work]`` on this pool, in input order."""
        if self.dask_address is not None:
            if self._client is None:
                self._client = _dask_client(self.dask_address)
            futures = self._client.map(function, list(work), pure=False)
            return list(_tracked((future.result() for future in futures), work, on_done))
        if self.workers == 1 or (self._pool is None and len(work) <= 1):
            return list(_tracked(map(function, work), work, on_done))
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=self.workers, initializer=huge_page_advice, initargs=(False,))
        return list(_tracked(self._pool.map(function, work), work, on_done))


def _tracked(
    results: Iterable[list[Result]], work: Sequence[Sequence[Item]], on_done: Callable[[int], None] | None
) -> Iterator[list[Result]]:
    for batch, result in zip(work, results):
        if on_done is not None:
            on_done(len(batch))
        yield result


def _dask_client(address: str):  # type: ignore[no-untyped-def]
    try:
        from dask.distributed import Client
    except ImportError:
        raise ConfigError(
            f"--dask {address}: dask.distributed is not installed; pip install 'llmsim[cluster]'"
        ) from None
    try:
        return Client(address, timeout="10s")
    except (OSError, TimeoutError) as exc:
        raise ConfigError(f"--dask {address}: cannot reach the dask scheduler ({exc})") from None
