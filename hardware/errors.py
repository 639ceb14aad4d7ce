"""Domain errors of the hardware layer (bad catalog entries and unknown names)."""

from __future__ import annotations


class CatalogError(ValueError):
    """A catalog entry is unknown, duplicated or malformed; the message names the entry and the rule."""


class MissingPrecisionError(CatalogError, KeyError):
    """A GPU has no dense peak for the precision a run asks for; the message lists the ones it has."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""
