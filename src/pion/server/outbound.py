"""A connection's way out: reply chunks to the server's :class:`ReplySink`, flow control
against the client's reading, and pub/sub pushes.

:class:`Outbound` is the half of :class:`~pion.server.connection.Connection` that
writes; the connection reads, runs commands and owns the socket's life. They share one
object (this is its base class) because both sides read the same few flags on every
command: whether the transport asked us to stop writing, whether we are backlogged,
whether the connection is closed.

Sending: a batch of replies is coalesced once (``replies.coalesce``: runs of small
pieces joined, large payloads passed as they are) and handed to the sink, which writes
it or holds it behind a group commit. Until the transport has it, it counts in the
client's unsent bytes (:meth:`Outbound._unsent`), together with the transport's own
buffer and a small overhead per piece (:data:`PIECE_OVERHEAD`).

Flow control: above the high-water mark (``reply_high_water``) the connection is
*backlogged*: its further commands wait, and its socket is not read, until the sink
has written what it held (:meth:`Outbound.write` releases it), or the transport's
``resume_writing`` says its buffer drained. A streamed reply's next piece waits the
same way (:meth:`Outbound._behind`).

Pushes (``client.push``): a pub/sub message for this client is appended to its output
at once: into the replies being built while its own commands run (so a message it
published to itself precedes that command's reply, as in Redis), after a deferred
command's reply while one runs, else at the end of the loop's iteration, in one write
with any others (a burst of publishes costs one write per subscriber). Past
``client-output-buffer-limit pubsub`` the client is disconnected (``pion.pubsub``).
"""

from __future__ import annotations

import asyncio
import logging
import time

from pion.commands.state import ClientState, ServerState
from pion.resp.encoder import Chunks
from pion.server.replies import COALESCE_BELOW, ReplySink, coalesce
from pion.server.running import Running

__all__ = ["PIECE_OVERHEAD", "Outbound"]

log = logging.getLogger("pion.server")

# What a reply piece held for the client costs beyond its payload (a bytes object's
# header and its slot in a list), counted in its unsent reply bytes.
PIECE_OVERHEAD = 64


class Outbound(asyncio.BufferedProtocol):
    """The writing half of a connection (module docstring); its reading half, the
    subclass, provides the hooks at the end."""

    client: ClientState
    _running: Running

    def __init__(self, state: ServerState, sink: ReplySink) -> None:
        self._state = state
        self._sink = sink
        self._high_water = state.config.protocol.reply_high_water
        self._transport: asyncio.Transport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # The transport asked us to stop writing (its buffer passed the mark).
        self._writing_paused = False
        # We stopped ourselves: unsent bytes over the mark, mostly held by the sink.
        self._backlogged = False
        self._closed = False
        # Reply bytes handed to the sink and not yet written to the transport.
        self._held = 0
        # Pub/sub pushes (``_push``): the batch of replies being built while commands
        # run (a push to this client lands in it, in order), the bytes pushed into it,
        # pushes parked until the end of this loop iteration (one write for all a
        # burst of publishes sends it) or of a deferred command, and since when the
        # client has been over the pubsub soft output limit.
        self._out: Chunks | None = None
        self._pushed = 0
        self._parked: Chunks = []
        self._parked_bytes = 0
        self._flush_due = False
        self._soft_since: float | None = None

    # -- sending ------------------------------------------------------------------------

    def _send(self, out: Chunks, nbytes: int) -> None:
        # Coalesced here, once: the sink may hold them (group commit), and the
        # transport must never be handed more pieces than it takes (replies.py).
        if self._parked and not self._running.busy:
            # Parked pushes came first: they leave ahead (never inside a stream).
            out = self._parked + out
            nbytes += self._parked_bytes
            self._parked, self._parked_bytes = [], 0
        if nbytes + self._pushed < COALESCE_BELOW:
            # Every piece is small (a batch of small replies): what coalesce() makes of
            # them, one buffer, without weighing each.
            if len(out) > 1:
                out = [b"".join(out)]
        else:
            out = coalesce(out)
        # Pushes that landed in this batch (``_push``) count with its replies.
        nbytes += len(out) * PIECE_OVERHEAD + self._pushed
        self._pushed = 0
        self._held += nbytes
        self._sink.send(self, out, nbytes)

    def _unsent(self) -> int:
        transport = self._transport
        buffered = transport.get_write_buffer_size() if transport is not None else 0
        return buffered + self._held

    def _check_backlog(self) -> int:
        unsent = self._unsent()
        if unsent > self._high_water and not self._writing_paused:
            # The sink holds them (group commit): wait for it to write them.
            self._backlogged = True
        return unsent

    def _behind(self) -> bool:
        """The client is behind on reading: no further piece of a stream starts."""
        if self._writing_paused:
            return True
        if self._unsent() > self._high_water:
            self._backlogged = True  # the sink holds them: its write() resumes us
            return True
        return False

    # -- used by the sink -----------------------------------------------------------------

    def write(self, chunks: Chunks, nbytes: int) -> None:
        self._held -= nbytes
        transport = self._transport
        if transport is not None and not transport.is_closing():
            try:
                transport.writelines(chunks)
            except (OSError, RuntimeError) as exc:
                # A reply that cannot be written is never dropped silently.
                self._io_error("writing a reply failed", exc)
                self.abort()
                return
        if self._backlogged and (self._writing_paused or self._unsent() <= self._high_water):
            # Released by the sink. If the transport is now over the mark itself, its
            # resume_writing() takes over; else run the commands that waited, after
            # this callback (never inside the sink's loop over its queue).
            self._backlogged = False
            if not self._writing_paused:
                asyncio.get_running_loop().call_soon(self._resume)
        self._report()

    # -- pub/sub pushes -------------------------------------------------------------------

    def _push(self, data: bytes) -> None:
        """A pub/sub message for this client: appended to its output now, behind the
        replies before it, never waiting for the client to read."""
        if self._closed:
            return
        if self._out is not None:
            self._out.append(data)  # its commands are running: into their batch
            self._pushed += len(data)
        else:
            # Sent at the end of this iteration of the loop, or after the deferred
            # command's reply (_done), or ahead of the next replies (_send).
            self._parked.append(data)
            self._parked_bytes += len(data)
            if not self._flush_due and not self._running.busy and self._loop is not None:
                self._flush_due = True
                try:
                    asyncio.get_running_loop().call_soon(self._flush_pushes)
                except RuntimeError:
                    # Published by a script on its own thread (its PUBLISH, a keyspace
                    # notification of its writes) while the loop thread is parked.
                    self._loop.call_soon_threadsafe(self._flush_pushes)
        if self._over_output_limit():
            self._state.pubsub.limit_disconnects += 1
            log.warning(
                "client %d (%s) closed for overcoming of output buffer limits (pubsub)",
                self.client.id,
                self.client.addr,
            )
            self.evict()

    def _flush_pushes(self) -> None:
        self._flush_due = False
        if self._parked and not self._closed and not self._running.busy:
            self._send([], 0)  # the parked pushes (_send puts them first)
            self._report()

    def _over_output_limit(self) -> bool:
        """``client-output-buffer-limit pubsub`` (``pion.pubsub.OutputLimit``)."""
        used = self._unsent() + self._pushed + self._parked_bytes
        limit = self._state.pubsub.limits["pubsub"]
        over, self._soft_since = limit.exceeded(used, self._soft_since, time.monotonic)
        return over

    # -- the reading half's hooks -------------------------------------------------------

    def _resume(self) -> None:
        """The backlog drained: run the commands that waited."""
        raise NotImplementedError

    def _report(self) -> None:
        """Report what the client holds to the memory accounting."""
        raise NotImplementedError

    def _io_error(self, what: str, exc: BaseException) -> None:
        raise NotImplementedError

    def evict(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def abort(self) -> None:
        raise NotImplementedError
