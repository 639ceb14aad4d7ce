"""Domain errors of the simulation layer."""

from __future__ import annotations


class ConfigError(ValueError):
    """A config file or --set override is invalid; the message names the field, value and what is allowed."""


class CapacityExceededError(RuntimeError):
    """An allocation was attempted beyond a memory pool's exact capacity (an internal invariant)."""
