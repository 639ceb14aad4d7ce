"""One-line warnings on stderr for runs that are still meaningful but not what the user may think
(a key that does not apply, a length past the model's trained context, a substituted default).

Each warning is printed once as ``warning: ...`` and kept, so ``run.json`` can record it.
"""

from __future__ import annotations

import sys

_issued: list[str] = []


def warn(message: str) -> None:
    """Print ``warning: message`` on stderr (once per distinct message) and remember it."""
    if message in _issued:
        return
    _issued.append(message)
    print(f"warning: {message}", file=sys.stderr)


def issued() -> list[str]:
    """The warnings printed since the last ``reset``."""
    return list(_issued)


def reset() -> None:
    _issued.clear()
