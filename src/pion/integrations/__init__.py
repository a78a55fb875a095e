"""Bridges between inference engines and a Pion server.

Reading order: one bridge so far, :mod:`pion.integrations.transformers` (extra
``pion[transformers]``), which stores and restores Hugging Face ``DynamicCache``
prefixes through the client. Each bridge imports its engine only when the
bridge itself is imported, so this package costs nothing without the extras. Imports
only ``client`` of the rest of ``pion``.
"""

from __future__ import annotations

__all__: list[str] = []
