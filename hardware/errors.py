"""Domain errors of the hardware layer (bad catalog entries and unknown names)."""

from __future__ import annotations


class CatalogError(ValueError):
    """A catalog entry is unknown, duplicated or malformed; the message names the entry and the rule."""
