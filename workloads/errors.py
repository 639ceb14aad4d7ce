"""Domain errors of the workload layer."""

from __future__ import annotations


class ModelCatalogError(ValueError):
    """A model entry is unknown, duplicated, malformed or structurally inconsistent."""


class InvalidPlanError(ValueError):
    """A parallel or serving plan breaks a divisibility or range rule; the message names rule and values."""


class WorkloadError(ValueError):
    """A request-stream description ([workload]) or a trace file is invalid."""
