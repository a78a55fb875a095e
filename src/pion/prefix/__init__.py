"""The KV.PREFIX registry (namespaces over V-store session pairs, block-hash tables,
membership) and the value receipt.

Reading order: ``registry.py`` (a namespace is a V-store session pair, plus its
block-hash table and registered PREFILL_MS), ``receipt.py`` (what a worker's prefix
hits are worth, for ``PION.STATS``). The commands are ``pion.commands.prefix``.

Depends on ``vstore``, ``wire`` and ``errors`` only."""

from __future__ import annotations

from pion.prefix.receipt import Receipt
from pion.prefix.registry import PrefixRegistry, k_sid, v_sid

__all__ = ["PrefixRegistry", "Receipt", "k_sid", "v_sid"]
