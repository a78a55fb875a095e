"""The warmer's state as JSON-ready data: ``GET /pion/status`` and ``pion llama status``.

Owns :func:`warmer_status` (which prefix is in which slot, least recently used first,
the last outcomes, counters, the files of the slot dir, the store and its counters, the
log tail), :class:`FilesView` (the slot dir's files as status shows them, read again only
when ``index.json`` changed, in a thread of its own) and :func:`redact_url` (a store URL
without its password, for logs and status).

``/pion/status`` answers promptly whatever the proxy is doing: the proxy's front door
(:mod:`pion.llama.frontdoor`) reads it in its own thread, off the event loop, from memory
and from :class:`FilesView` (``index.json`` read again only when it changed). On the loop
(:meth:`FilesView.get`), the file is read in a thread that never waits behind the
requests' work in the loop's default executor.
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeAlias
from urllib.parse import urlsplit, urlunsplit

from pion.llama.context import WarmerContext
from pion.llama.slots import SlotTable

__all__ = ["FilesView", "files_status", "redact_url", "warmer_status"]

_Seen: TypeAlias = tuple[int, int, int] | None
_Files: TypeAlias = tuple[dict[str, Any], dict[str, Any]]


def redact_url(url: str) -> str:
    """``redis://user:secret@host:1974`` → ``redis://user:***@host:1974``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def _slots(ctx: WarmerContext, table: SlotTable | None) -> dict[str, Any]:
    with ctx.guard:
        states = dict(ctx.slots)
    out: dict[str, Any] = {}
    for slot in table.slots if table is not None else sorted(states):
        state, claim = states.get(slot), table.holder(slot) if table is not None else None
        if state is None and claim is None:
            out[str(slot)] = None
            continue
        entry: dict[str, Any] = {
            "fingerprint": claim.fingerprint if claim else state.fingerprint if state else "",
            "label": claim.label if claim else state.label if state else "",
            "last_used": claim.last_used if claim else None,
            "warm": state is not None,
        }
        if state is not None:
            entry.update(
                tokens=state.tokens,
                source=state.source,
                since=state.since,
                saved=state.saved,
                file=state.file,
                prefill_ms=state.prefill_ms,
                verifying=state.pending is not None,
            )
        out[str(slot)] = entry
    return out


def files_status(ctx: WarmerContext) -> tuple[dict[str, Any], dict[str, Any]]:
    """The slot dir's files and the (build, model) pairs restores are off for. Reads
    ``index.json``: call it off the event loop."""
    if ctx.index is None:
        return {}, {}
    try:
        index = ctx.index.load()
    except OSError as exc:
        return {"error": str(exc)}, {}
    return {k: vars(v) for k, v in index.files.items()}, dict(index.no_restore)


class FilesView:
    """:func:`files_status`, read again only when ``index.json`` changed (its size,
    modification time or inode: every write replaces it): on the loop, in one thread of
    its own (:meth:`get`); in the proxy's front door, in the caller's thread
    (:meth:`get_now`)."""

    def __init__(self, ctx: WarmerContext) -> None:
        self._ctx = ctx
        # (what index.json looked like, its files) as one value: the loop and the front
        # door may both store one; a pair read after its stat is never older than it.
        self._cached: tuple[_Seen, _Files] = (None, ({}, {}))
        self._pool: ThreadPoolExecutor | None = None

    def _changed(self) -> tuple[bool, _Seen, _Files]:
        """(whether index.json must be read, what it looks like, the files to show)."""
        index = self._ctx.index
        if index is None:
            return False, None, ({}, {})
        try:
            st = os.stat(index.path)  # a stat on the loop: microseconds
            seen: _Seen = (st.st_size, st.st_mtime_ns, st.st_ino)
        except FileNotFoundError:
            return False, None, ({}, {})  # nothing saved yet
        except OSError:
            seen = None  # read it, to show why it cannot be
        cached_seen, cached = self._cached
        return seen is None or seen != cached_seen, seen, cached

    async def get(self) -> _Files:
        stale, seen, files = self._changed()
        if not stale:
            return files
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="pion-llama-status")
        loop = asyncio.get_running_loop()
        files = await loop.run_in_executor(self._pool, files_status, self._ctx)
        self._cached = (seen, files)
        return files

    def get_now(self) -> _Files:
        """:meth:`get` from a thread that may read a file (never the event loop)."""
        stale, seen, files = self._changed()
        if stale:
            files = files_status(self._ctx)
            self._cached = (seen, files)
        return files

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)


def warmer_status(
    ctx: WarmerContext,
    table: SlotTable | None,
    outcomes: list[dict[str, Any]],
    counts: dict[str, int],
    files: tuple[dict[str, Any], dict[str, Any]] = ({}, {}),
) -> dict[str, Any]:
    """Everything ``/pion/status`` shows (``files``: :func:`files_status`)."""
    cfg = ctx.config
    files_, no_restore = files
    with ctx.guard:
        events = dict(ctx.counts)
        failures = dict(ctx.failures)
        errors = dict(ctx.errors)
        model_kinds = dict(ctx.model_kinds)
    store: dict[str, Any] | None = None
    if ctx.store is not None:
        store = {
            "url": redact_url(ctx.store.config.url),
            "usable": ctx.store.usable(),
            "counts": dict(ctx.store.counts),
            "dropped_jobs": ctx.background.dropped if ctx.background else 0,
        }
    return {
        "upstream": cfg.base_url,
        "slot": cfg.slot,
        "multi_slot": cfg.multi_slot,
        "persist": ctx.index is not None,
        "slot_dir": str(cfg.slot_dir) if cfg.slot_dir else None,
        "verify": cfg.verify,
        "log": str(cfg.log_path) if cfg.log_path else None,
        "slots": _slots(ctx, table),
        "lru": table.lru_order() if table is not None else [],
        "counts": counts,
        "events": events,
        "failures": failures,
        "errors": errors,
        "outcomes": outcomes,
        "files": files_,
        "no_restore": no_restore,
        "model_kinds": model_kinds,
        "store": store,
        "log_tail": ctx.log.recent()[-30:],
    }
