"""Exact memoization for plan search: a small object that owns bounded caches of pure results.

Every cached value is a pure function of its key, so a cache changes speed, never a number. A
search creates one ``PricingCache`` and passes it to every evaluation (``build_iteration``,
``estimate_training``); without one each call makes its own, which still prices equal gradient
buckets and identical pipeline stages once. Specs that cannot be hashed (``GpuSpec`` holds a
mapping proxy) are reduced to a hashable fingerprint of every field; large keys are interned to
small integers so repeated lookups do not rehash nested dataclasses.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Hashable, Mapping, NamedTuple, Sequence

from hardware.collectives import Collective, GroupLinks, collective_time_s
from hardware.specs import GpuSpec
from hardware.topology import Cluster

# Entries per namespace before it is emptied (bounded memory for long searches; results never
# depend on it). 2**16 entries of small tuples and floats stay in the tens of MB.
DEFAULT_MAX_ENTRIES = 1 << 16


def gpu_fingerprint(gpu: GpuSpec) -> tuple[Any, ...]:
    """Every field of ``gpu`` in a hashable tuple (mappings as sorted items; the calibration profile
    by identity, one object per profile file). Built from the dataclass fields, so a field added to
    ``GpuSpec`` (``l2_bandwidth_Bps``, ``architecture`` were once missing here) can never be left out
    of the key and two GPUs differing only in it can never share cached prices."""
    return tuple(_hashable(getattr(gpu, f.name)) for f in dataclasses.fields(gpu))


def _hashable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple(sorted(value.items()))
    return value


class SpecIds(NamedTuple):
    """Interned ids of one evaluation's model, cluster and GPU (``PricingCache.spec_ids``)."""

    model: int
    cluster: int
    gpu: int


class PricingCache:
    """Bounded memo tables, one per namespace, plus interning of large keys to integers."""

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries = {max_entries} must be >= 1")
        self.max_entries = max_entries
        self._tables: dict[str, dict[Hashable, Any]] = {}
        self._ids: dict[Hashable, int] = {}
        self._next_id = 0  # never reused, so a key holding a stale id can only miss, never hit wrongly
        # id(object) -> (object, interned id): the strong reference keeps the id from being reused
        self._by_identity: dict[int, tuple[Any, int]] = {}
        # (model, cluster, their SpecIds) of the last spec_ids call: a search evaluates many plans of one pair
        self._last_specs: tuple[Any, Cluster, SpecIds] | None = None

    def memo(self, namespace: str, key: Hashable, compute: Callable[[], Any]) -> Any:
        """``compute()`` once per ``key`` in ``namespace``."""
        table = self._tables.get(namespace)
        if table is None:
            table = self._tables[namespace] = {}
        try:
            return table[key]
        except KeyError:
            pass
        value = compute()
        if len(table) >= self.max_entries:
            table.clear()
        table[key] = value
        return value

    def get(self, namespace: str, key: Hashable) -> Any:
        """The value ``memo`` holds for ``key`` in ``namespace``, or None."""
        table = self._tables.get(namespace)
        return None if table is None else table.get(key)

    def intern(self, key: Hashable) -> int:
        """A small integer standing for ``key`` (equal keys, equal ids) for the cache's lifetime."""
        found = self._ids.get(key)
        if found is None:
            if len(self._ids) >= self.max_entries:
                self._ids.clear()
                self._by_identity.clear()
                self._last_specs = None
            found = self._ids[key] = self._next_id
            self._next_id += 1
        return found

    def _identity_id(self, obj: Any, fingerprint: Callable[[Any], Hashable]) -> int:
        entry = self._by_identity.get(id(obj))
        if entry is not None and entry[0] is obj:
            return entry[1]
        interned = self.intern(fingerprint(obj))
        if len(self._by_identity) >= self.max_entries:
            self._by_identity.clear()
            self._last_specs = None
        self._by_identity[id(obj)] = (obj, interned)
        return interned

    def gpu_id(self, gpu: GpuSpec) -> int:
        return self._identity_id(gpu, lambda g: ("gpu", gpu_fingerprint(g)))

    def cluster_id(self, cluster: Cluster) -> int:
        return self._identity_id(
            cluster, lambda c: ("cluster", self.gpu_id(c.gpu), c.node, c.network, c.num_gpus)
        )

    def model_id(self, model: Hashable) -> int:
        """Interned id of a ``ModelSpec`` (by identity first, so a search's one model hashes once)."""
        return self._identity_id(model, lambda m: ("model", m))

    def spec_ids(self, model: Hashable, cluster: Cluster) -> SpecIds:
        """``model_id``, ``cluster_id`` and ``gpu_id`` of one evaluation, looked up once (by identity,
        the previous pair first)."""
        last = self._last_specs
        if last is not None and last[0] is model and last[1] is cluster:
            return last[2]
        ids = SpecIds(model=self.model_id(model), cluster=self.cluster_id(cluster), gpu=self.gpu_id(cluster.gpu))
        self._last_specs = (model, cluster, ids)
        return ids

    def links_id(self, links: GroupLinks) -> int:
        return self._identity_id(links, lambda g: ("links", g))

    def group_links(self, cluster: Cluster, start: int, stride: int, count: int) -> GroupLinks:
        """``cluster.group_links`` of the ranks start, start + stride, ... (``count`` of them)."""
        return self.memo(
            "group_links",
            (self.cluster_id(cluster), start, stride, count),
            lambda: cluster.group_links(range(start, start + stride * count, stride)),
        )

    def rank_links(self, cluster: Cluster, ranks: Sequence[int]) -> GroupLinks:
        """``cluster.group_links`` of an arbitrary rank list."""
        ranks = tuple(ranks)
        return self.memo("rank_links", (self.cluster_id(cluster), ranks), lambda: cluster.group_links(ranks))

    def collective_s(self, kind: Collective, message_bytes: float, links: GroupLinks) -> float:
        """``hardware.collectives.collective_time_s`` with the default algorithm, memoized."""
        return self.memo(
            "collective",
            (kind, message_bytes, self.links_id(links)),
            lambda: collective_time_s(kind, message_bytes, links),
        )
