"""Bridges between inference engines and a Pion server.

:mod:`pion.integrations.transformers` (extra ``pion[transformers]``) stores and restores
Hugging Face ``DynamicCache`` prefixes. Each bridge imports its engine only when the
bridge itself is imported, so this package costs nothing without the extras.
"""

from __future__ import annotations

__all__: list[str] = []
