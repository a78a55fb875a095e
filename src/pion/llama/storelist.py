"""``pion llama status --store``: what a shared store holds.

Owns :func:`store_listing` (the store's prefixes as JSON-ready rows: fingerprint, file
size, tokens, age, time to expiry, the machine that built it, llama-server build and
model) and :func:`print_store_listing` (the table). Reads only: a ``SCAN`` over the
manifest keys, then one ``GET`` and ``TTL`` per manifest (:meth:`SlotStore.listing`). A
store that cannot be reached is an ``error`` entry, never an exception.
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.table import Table

from pion.llama.config import WarmerConfig
from pion.llama.fingerprint import file_name
from pion.llama.status import redact_url
from pion.llama.store import SlotStore, StoreError

__all__ = ["print_store_listing", "store_listing"]


def store_listing(config: WarmerConfig) -> dict[str, Any]:
    """``{"url", "prefixes": [...]}`` or ``{"url", "error"}``."""
    store_config = config.store_config()
    if store_config is None:
        return {"url": None, "error": "no store: give --store URL or PI_PREFIX_CACHE_STORE"}
    url = redact_url(store_config.url)
    try:
        store = SlotStore(store_config, lambda _m: None)
    except StoreError as exc:
        return {"url": url, "error": str(exc)}
    try:
        rows = store.listing()
    except StoreError as exc:
        return {"url": url, "error": str(exc)}
    finally:
        store.close()
    now = time.time()
    prefixes: list[dict[str, Any]] = []
    for fp, manifest, ttl in rows:
        if isinstance(manifest, str):
            prefixes.append({"fingerprint": fp, "file": file_name(fp), "error": manifest})
            continue
        prefixes.append(
            {
                "fingerprint": fp,
                "file": file_name(fp),
                "bytes": manifest.size,
                "tokens": manifest.tokens,
                "age_s": max(0.0, now - manifest.created) if manifest.created else None,
                "expires_in_s": ttl if ttl >= 0 else None,
                "origin": manifest.origin,
                "build": manifest.build,
                "model": manifest.model.get("id", ""),
                "prefill_ms": manifest.prefill_ms,
            }
        )
    return {"url": url, "prefixes": prefixes}


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s >= 86400:
        return f"{s // 86400}d{s % 86400 // 3600:02d}h"
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s}s"


def print_store_listing(console: Console, data: dict[str, Any]) -> None:
    if "error" in data:
        console.print(f"[red]store {data.get('url') or ''}: {data['error']}[/red]")
        return
    table = Table(title=f"prefixes in the store ({data['url']})")
    table.add_column("file", no_wrap=True)
    for col in ("tokens", "bytes", "age", "expires in", "built on", "model"):
        table.add_column(col, overflow="fold")
    for row in data["prefixes"]:
        if "error" in row:
            table.add_row(row["file"], "-", "-", "-", "-", "-", f"[red]{row['error']}[/red]")
            continue
        table.add_row(
            row["file"],
            str(row["tokens"]),
            str(row["bytes"]),
            _duration(row["age_s"]),
            _duration(row["expires_in_s"]),
            row["origin"],
            str(row["model"]),
        )
    console.print(table)
    console.print(f"{len(data['prefixes'])} prefix(es)")
