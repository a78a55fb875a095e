"""Where reply chunks go after a command ran: straight to the connection's transport,
or held behind a group commit.

Group commit (``--appendfsync always``): a reply to a write may leave only once the
write-ahead log record behind it is on stable storage. Replies produced while records
are unsynced are queued; one callback at the end of the loop iteration fsyncs once for
all of them and then writes them out, in order. If the fsync fails the queued replies
are withheld and their connections dropped: the client never saw an acknowledgement.
Once anything is queued, later replies queue behind it, so order holds across
connections too.

Before chunks reach a transport they are coalesced (:func:`coalesce`): runs of small
pieces are joined into one buffer, large ones are passed as they are. A reply of a
million elements is otherwise a few million pieces, and uvloop's ``writelines`` refuses
more than 2^20 buffers in one call (``OSError`` 22, the connection dropped).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from pion.commands.state import Durability
from pion.resp.encoder import Chunks

__all__ = ["COALESCE_BELOW", "ReplySink", "ReplyTarget", "coalesce"]

log = logging.getLogger("pion.server")

# Pieces smaller than this are joined with their small neighbours; larger ones (K/V
# payloads, big bulks) are handed over without a copy. Every piece left alone is at
# least this big, so a write holds at most one piece per 16 KiB plus one joined run
# between each two of them: far below uvloop's 2^20 whatever the reply.
COALESCE_BELOW = 16 * 1024


def coalesce(chunks: Chunks) -> Chunks:
    """``chunks`` with every run of small pieces joined into one ``bytes``."""
    if len(chunks) <= 1:
        return chunks
    out: Chunks = []
    run: list[bytes | bytearray | memoryview] = []
    for chunk in chunks:
        size = chunk.nbytes if isinstance(chunk, memoryview) else len(chunk)
        if size < COALESCE_BELOW:
            run.append(chunk)
            continue
        if run:
            out.append(run[0] if len(run) == 1 else b"".join(run))
            run = []
        out.append(chunk)
    if run:
        out.append(run[0] if len(run) == 1 else b"".join(run))
    return out


class ReplyTarget(Protocol):
    """What the sink needs of a connection."""

    def write(self, chunks: Chunks, nbytes: int) -> None:
        """Write ``chunks`` (``nbytes`` in all) to the client now."""

    def close(self) -> None: ...

    def abort(self) -> None: ...


class ReplySink:
    """One per server; every connection hands its replies here."""

    def __init__(self, persistence: Durability | None) -> None:
        self._persistence = persistence
        self._pending: list[tuple[ReplyTarget, Chunks, int]] = []
        self._close_after: list[ReplyTarget] = []
        self._scheduled = False

    def send(self, target: ReplyTarget, chunks: Chunks, nbytes: int) -> None:
        """Write ``chunks`` (``nbytes`` in all) now, or queue them until the log is
        synced. The target counts queued bytes as its own unsent replies."""
        persistence = self._persistence
        if self._pending or (persistence is not None and persistence.needs_sync()):
            self._pending.append((target, chunks, nbytes))
            if not self._scheduled:
                self._scheduled = True
                asyncio.get_running_loop().call_soon(self.commit)
        else:
            target.write(chunks, nbytes)

    def close_after_send(self, target: ReplyTarget) -> None:
        """Close ``target`` once what was sent to it so far has left."""
        if self._scheduled:
            self._close_after.append(target)
        else:
            target.close()

    def commit(self) -> None:
        """fsync once for every queued reply, then release them in order. Safe to call
        when nothing is queued (shutdown does)."""
        self._scheduled = False
        pending, self._pending = self._pending, []
        closing, self._close_after = self._close_after, []
        persistence = self._persistence
        try:
            if persistence is not None and persistence.needs_sync():
                persistence.sync()
        except Exception:
            log.exception(
                "fsync of the write-ahead log failed; withholding %d replies", len(pending)
            )
            for target, _, _ in pending:
                target.abort()
            return
        for target, chunks, nbytes in pending:
            target.write(chunks, nbytes)
        for target in closing:
            target.close()
