"""``/pion/status``'s files (``pion.llama.status.FilesView``): read from ``index.json`` in
a thread of the status's own, again only when the index changed."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from pion.llama import status
from pion.llama.client import AsyncLlamaClient
from pion.llama.config import WarmerConfig
from pion.llama.context import WarmerContext
from pion.llama.eventlog import EventLog
from pion.llama.index import IndexEntry, SlotIndex


def counted_view(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[status.FilesView, SlotIndex, WarmerContext, list[str]]:
    """A files view over an index in ``tmp_path``, and the names of the threads that read
    the slot dir (each ``files_status`` call)."""
    readers: list[str] = []
    read = status.files_status

    def files_status(ctx: WarmerContext) -> tuple[dict[str, Any], dict[str, Any]]:
        readers.append(threading.current_thread().name)
        return read(ctx)

    monkeypatch.setattr(status, "files_status", files_status)
    log = EventLog(None)
    index = SlotIndex(tmp_path, log)
    config = WarmerConfig(persist=True, slot_dir=tmp_path)
    ctx = WarmerContext(config, AsyncLlamaClient(config.base_url), log, index, None, None)
    return status.FilesView(ctx), index, ctx, readers


def test_files_are_read_again_only_when_the_index_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    view, index, ctx, readers = counted_view(tmp_path, monkeypatch)

    async def run() -> None:
        assert await view.get() == ({}, {})  # nothing saved yet
        index.put("pi-prefix-a.bin", IndexEntry("a" * 64, 10, 100, 1.0, 1.0))
        first = await view.get()
        assert list(first[0]) == ["pi-prefix-a.bin"]
        assert await view.get() is first  # unchanged: not read again
        index.put("pi-prefix-b.bin", IndexEntry("b" * 64, 20, 200, 2.0, 2.0))
        second = await view.get()
        assert sorted(second[0]) == ["pi-prefix-a.bin", "pi-prefix-b.bin"]
        await ctx.client.aclose()

    asyncio.run(run())
    view.close()
    # Two reads, both in the view's own thread: never on the loop, never queued behind the
    # requests' work in the loop's default executor.
    assert len(readers) == 2 and all(r.startswith("pion-llama-status") for r in readers)


def test_the_front_doors_read_shares_the_views_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``get_now`` (the proxy's front door) reads ``index.json`` in its caller's thread,
    again only when it changed, and what either reader read serves the other."""
    view, index, ctx, readers = counted_view(tmp_path, monkeypatch)
    assert view.get_now() == ({}, {}) and readers == []  # nothing saved yet
    index.put("pi-prefix-a.bin", IndexEntry("a" * 64, 10, 100, 1.0, 1.0))
    first = view.get_now()
    assert list(first[0]) == ["pi-prefix-a.bin"] and view.get_now() is first

    async def run() -> None:
        assert await view.get() is first  # read by get_now: not read again
        index.put("pi-prefix-b.bin", IndexEntry("b" * 64, 20, 200, 2.0, 2.0))
        second = await view.get()
        assert view.get_now() is second  # read by get: not read again
        await ctx.client.aclose()

    asyncio.run(run())
    view.close()
    here = threading.current_thread().name
    assert readers[0] == here and readers[1].startswith("pion-llama-status")
    assert len(readers) == 2
