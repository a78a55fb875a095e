"""Text helpers the section renderers share."""

from __future__ import annotations

__all__ = ["join"]


def join(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]
