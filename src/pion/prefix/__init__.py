"""The KV.PREFIX registry (namespaces over V-store session pairs, block-hash tables,
membership) and the value receipt."""

from __future__ import annotations

from pion.prefix.receipt import Receipt
from pion.prefix.registry import PrefixRegistry, k_sid, v_sid

__all__ = ["PrefixRegistry", "Receipt", "k_sid", "v_sid"]
