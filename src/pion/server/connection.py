"""One client connection: bytes in through the sans-IO decoder, commands through the
fast lane (``lane.py``) or the dispatcher, reply chunks out through its writing half
(``outbound.py``) to the server's :class:`ReplySink`.

Replies leave strictly in request order: every command of a read is dispatched in turn
on the event loop thread, and their chunks are handed to the sink (which writes them or
queues them behind a group commit). Small replies are gathered into one write; a reply
that makes the batch large is handed over at once; pieces are coalesced before the
transport (``replies.coalesce``).

A connection gets a slice of the loop per turn (``slices.py``): when its commands have
used it, its socket is paused and the next turn goes on where it stopped. A long
command (:class:`~pion.commands.deferred.Steps`) runs in steps of the same size
(``steps.py``), its client's later commands waiting as behind any deferred command.

Its states, named in :class:`Phase`: ``READY`` (reading and running commands),
``YIELDED`` (its slice of this turn is used), ``BUSY`` (a deferred command is
running: ``running.py``), ``HELD`` (its unsent replies are over the high-water mark:
nothing more runs until they drain) and ``CLOSED``. Only ``READY`` runs commands;
the socket is read in ``READY``, and in ``BUSY`` until one next command is parsed.

Bytes arrive through ``asyncio.BufferedProtocol``: a read goes into a scratch buffer
the server shares between its connections (the decoder copies it out at once), or,
while a large bulk is being received, straight into the argument it becomes.

A command whose handler defers its number conversion (``pion.commands.deferred``)
is the only one of its client in progress until its reply has been handed on: no
later command of that client starts meanwhile, so a pipeline's writes apply in order
and its replies leave in order. While it runs on a worker thread the socket is still
read, up to one complete next command (receiving layer i+1 while layer i is being
quantized); a streamed reply is sent piece by piece while the next piece is decoded,
and its next piece waits while the client is behind on reading (the high-water mark
below). Without a worker pool (``offload=None``) deferred commands run inline, as
inside EXEC (``pion.commands.execution.settle``), except steps and waits, which need
the loop. A silenced client's (``CLIENT REPLY OFF``) run the same way.

What a connection may make the server hold is bounded, and checked after every
command, not once per read:

- its unsent reply bytes (the socket's write buffer plus replies the sink is holding
  for a group commit): above the high-water mark its further commands wait, and its
  socket is not read, until they drain. A client that pipelines large fetches and
  never reads costs one high-water mark plus one reply, not its pipeline's depth;
- once its socket is closing (the peer hung up, or we closed it), no further command
  of its is run: nobody would read the reply;
- while one of its commands runs off the loop, the next command it sent (parsed
  ahead, at most one) and the one running are counted as its query buffer;
- before it authenticates to a server with a password, the decoder's unauthenticated
  limits apply (10 arguments, 16 KB bulks);
- all connections together report to :class:`ClientMemory` (``maxmemory-clients``);
- a pub/sub message for it (``client.push``, installed here) is appended to its output
  at once, and past ``client-output-buffer-limit pubsub`` it is disconnected
  (``outbound.py``);
- past ``maxclients`` (RESP and binary-lane clients together, ``clients.py``) a new
  connection is answered ``-ERR max number of clients reached`` and closed.

A connection's collaborators are explicit: the worker's state, the command table, the
reply sink, the registry of live connections (for CLIENT KILL and shutdown) and the
client-memory accounting.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Sequence
from typing import cast

from pion.commands.deferred import Deferred, Steps, Wait
from pion.commands.execution import encode, settle
from pion.commands.state import ClientState, CommandTable, Context, ServerState
from pion.commands.transactions import forget_client
from pion.errors import ProtocolError
from pion.resp.decoder import SCRATCH_BYTES, RequestDecoder
from pion.resp.encoder import Chunks, encode_error
from pion.server.batch import HEADS, NO_RUNS, NO_WRITES, READS
from pion.server.batch import serve as serve_batch
from pion.server.clientmem import ClientMemory
from pion.server.clients import MAX_CLIENTS_REPLY, ClientConnection, io_error, join, leave
from pion.server.dispatch import Silenced, execute
from pion.server.lane import Lane, lane_of
from pion.server.lane import run as run_lane
from pion.server.lane import usable as lane_usable
from pion.server.offload import Offloader
from pion.server.outbound import Outbound
from pion.server.replies import ReplySink
from pion.server.running import Running
from pion.server.slices import CHECK_EVERY, Share, Turns

__all__ = ["Connection", "Phase"]

log = logging.getLogger("pion.server")

# Gather small replies into one write up to this many bytes or chunks; a deep pipeline
# of PINGs then costs one writelines per 64 KiB, not one per command.
_FLUSH_BYTES = 64 * 1024
_FLUSH_CHUNKS = 4096
# The lane while it may not take this client's commands (pion.server.lane.usable).
_NO_LANE: Lane = {}
_NO_HEADS: frozenset[bytes] = frozenset()
# The most one socket read takes (large bulks are received in place, unaffected).
# Redis reads 16 KiB at a time; 64 KiB of small arguments is a few ms of parsing.
READ_BYTES = 64 * 1024


class Phase(enum.Enum):
    """A connection's state (module docstring)."""

    READY = "ready"
    YIELDED = "yielded"
    BUSY = "busy"
    HELD = "held"
    CLOSED = "closed"


class Connection(Outbound):
    def __init__(
        self,
        state: ServerState,
        table: CommandTable,
        sink: ReplySink,
        client_id: int,
        registry: dict[int, ClientConnection],
        *,
        memory: ClientMemory,
        offload: Offloader | None = None,
        scratch: memoryview | None = None,
        turns: Turns | None = None,
    ) -> None:
        super().__init__(state, sink)
        self._registry = registry
        self._memory = memory
        self._offload = offload
        self._scratch = scratch if scratch is not None else memoryview(bytearray(SCRATCH_BYTES))
        # Reads of at most READ_BYTES: what one read hands the decoder is parsed at once
        # (a huge command's arguments, in Python), so it is one slice's worth, roughly.
        self._read_view = self._scratch[:READ_BYTES]
        self._decoder = RequestDecoder(state.config.protocol)
        self._decoder.authenticated = not state.config.auth_required
        self._reading_paused = False
        self._registered = False
        # The next command, parsed ahead while a deferred one runs (or the protocol
        # error in its place), and that command's size.
        self._next: list[bytes] | None = None
        self._next_error: ProtocolError | None = None
        self._next_bytes = 0
        # This connection's share of the loop (pion.server.slices).
        self._share = Share(turns)
        self._share_turns = turns is not None
        self._steps_async = turns is not None
        self.client = ClientState(id=client_id, created=time.time())
        self.client.push = self._push  # pub/sub messages for it (outbound.py)
        self._ctx = Context(state=state, client=self.client, table=table, may_wait=True)
        self._lane = lane_of(table)
        # The deferred command in progress (module docstring).
        self._running = Running(
            self._ctx,
            offload,
            send=self._send,
            behind=self._behind,
            alive=lambda: not self._closed,
            finished=self._done,
            broken=self.abort,
        )

    @property
    def phase(self) -> Phase:
        """The connection's state (module docstring), from the conditions behind it."""
        if self._closed:
            return Phase.CLOSED
        if self._writing_paused or self._backlogged:
            return Phase.HELD
        if self._running.busy:
            return Phase.BUSY
        if self._share.yielded:
            return Phase.YIELDED
        return Phase.READY

    # -- asyncio callbacks ------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        transport = cast(asyncio.Transport, transport)
        self._transport = transport
        self._loop = asyncio.get_running_loop()
        self._registered = join(self._state, self._registry, self, transport, MAX_CLIENTS_REPLY)
        self._closed = not self._registered

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None and not self._closed:
            # The socket failed under us (a read or a write): never silent.
            self._io_error("the connection failed", exc)
        self._closed = True
        self._decoder.clear()
        self._next = None
        self._next_error = None
        self._running.drop()
        self._unregister()

    def _unregister(self) -> None:
        """Leave the registry and the memory accounting (at once on eviction: the
        transport's own teardown comes later)."""
        if self._registered:
            self._registered = False
            self._memory.forget(self)
            self._state.pubsub.forget(self.client.id)  # its subscriptions
            forget_client(self._state, self.client)  # its transaction and WATCHes
            leave(self._state, self._registry, self.client)

    def _io_error(self, what: str, exc: BaseException) -> None:
        io_error(self._state, self.client, what, exc)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._decoder.get_buffer(self._read_view)

    def buffer_updated(self, nbytes: int) -> None:
        if self._closed:
            return
        self._decoder.buffer_updated(self._read_view, nbytes)
        self._received()

    def data_received(self, data: bytes) -> None:
        """The plain-Protocol path (tests drive the connection through it)."""
        if self._closed:
            return
        self._decoder.feed(data)
        self._received()

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._resume()

    # -- processing -------------------------------------------------------------

    def _received(self) -> None:
        if not self._running.busy:
            self._process()
            return
        self._parse_ahead()
        self._update_reading()
        self._report()

    def _parse_ahead(self) -> None:
        """A deferred command runs: parse its successor (one), so that the socket is
        read until that command is here and no further (``_update_reading``)."""
        if self._next is None and self._next_error is None and not self._closed:
            try:
                self._next = self._decoder.get()
            except ProtocolError as exc:
                self._next_error = exc
            if self._next is not None:
                self._next_bytes = sum(len(arg) for arg in self._next)

    def _take(self) -> list[bytes] | None:
        """The next command: parsed ahead, or the decoder's (None: none yet)."""
        if self._next_error is not None:
            exc, self._next_error = self._next_error, None
            raise exc
        argv = self._next
        if argv is not None:
            self._next, self._next_bytes = None, 0
            return argv
        return self._decoder.get()

    def _process(self) -> None:
        """Run the commands at hand while the connection is READY, a slice's worth."""
        transport = self._transport
        if transport is None or self._share.yielded:
            return  # (yielded: the next turn's callback goes on)
        share = self._share
        share.begin()
        sliced = self._share_turns
        decoder = self._decoder
        running = self._running
        client = self.client
        ctx = self._ctx
        # The fast lane's rows while it may take this client's commands (lane.usable).
        lane = self._lane if lane_usable(ctx) else _NO_LANE
        heads = HEADS  # what may start a run (batch.py), asked again with the lane
        ran = 0
        yielded = close_after = False
        out: Chunks = []
        self._out = out
        out_bytes = 0
        proto_error: ProtocolError | None = None
        flush_over = self._flush_bound(self._unsent())
        # READY (``phase``), tested inline: this loop runs once per command.
        while not (self._closed or self._writing_paused or self._backlogged or running.busy):
            if transport.is_closing():
                # The peer hung up (a write failed) or we are closing: whatever it
                # still had pipelined would build replies nobody reads.
                out = self._out = []
                self._pushed = 0
                break
            # Runs of what was parsed ahead (batch.py); one command alone is the lane's.
            ready = decoder.ready
            if lane and len(ready) > 1 and ready[-1][0] in heads:
                served = self._batch(ran, out, flush_over - out_bytes)
                if served is None:
                    yielded = True  # this turn's slice is used: the run waits for the next
                    break
                if served is NO_WRITES or served is NO_RUNS:
                    heads = READS if served is NO_WRITES else _NO_HEADS  # until re-asked
                elif served[0]:
                    ran += served[0]
                    out_bytes += served[1]
                    if out_bytes > flush_over or len(out) >= _FLUSH_CHUNKS:
                        out, out_bytes, flush_over = self._flush(out, out_bytes)
                    continue
            try:
                if self._next is None and self._next_error is None:
                    argv = decoder.get()
                else:
                    argv = self._take()
            except ProtocolError as exc:
                proto_error = exc
                break
            if argv is None:
                break
            # The clock is read only every CHECK_EVERY commands (Share.spent).
            if sliced and (ran < 2 or not ran % CHECK_EVERY) and share.spent(ran):
                # This turn's slice is used: the command waits for the next one.
                self._next, self._next_bytes = argv, sum(len(a) for a in argv)
                yielded = True
                break
            ran += 1
            entry = lane.get(argv[0])
            result = execute(ctx, argv, out) if entry is None else run_lane(ctx, entry, argv, out)
            if entry is None or entry.runs_any:  # it may change what the lane, runs take
                lane = self._lane if lane_usable(ctx) else _NO_LANE
                heads = HEADS
            if not isinstance(result, int):
                result = self._deferred(argv, result, out, out_bytes)
                if result < 0:
                    out, out_bytes = [], 0
                    self._out = out
                    break  # it runs off the loop; the replies before it went out first
            out_bytes += result
            if not decoder.authenticated and client.authenticated:
                decoder.authenticated = True  # AUTH/HELLO succeeded: full limits
            if client.closing:
                close_after = True
                break
            if out_bytes > flush_over or len(out) >= _FLUSH_CHUNKS:
                out, out_bytes, flush_over = self._flush(out, out_bytes)
        self._after_run(out, out_bytes, proto_error, close_after, yielded)

    def _flush_bound(self, unsent: int) -> int:
        """The size past which a batch of replies goes out: the flush size, or what
        keeps the ``unsent`` bytes (read once, and after each send) under the mark."""
        return min(_FLUSH_BYTES - 1, self._high_water - unsent)

    def _flush(self, out: Chunks, out_bytes: int) -> tuple[Chunks, int, int]:
        """Send the replies gathered in ``out``: a fresh batch, its size, and its
        :meth:`_flush_bound`."""
        self._send(out, out_bytes)
        fresh: Chunks = []
        self._out = fresh
        return fresh, 0, self._flush_bound(self._check_backlog())

    def _batch(self, ran: int, out: Chunks, room: int) -> tuple[int, int] | None:
        """A run of plain GET and SET from the commands the decoder parsed ahead
        (``batch.py``): ``(commands, reply bytes)``, ``(0, 0)`` when the next command
        is not one it takes, None when this turn's slice is used first."""
        if self._next is not None or self._next_error is not None:
            return 0, 0
        if self._share_turns and self._share.due(ran):
            return None
        return serve_batch(self._ctx, self._decoder.ready, out, room)

    def _after_run(
        self,
        out: Chunks,
        out_bytes: int,
        proto_error: ProtocolError | None,
        close_after: bool,
        yielded: bool,
    ) -> None:
        client = self.client
        self._out = None
        if proto_error is not None:
            self._state.counters.protocol_errors += 1
            log.info("protocol error from %s: %s", client.addr, proto_error.message)
            err = encode_error(proto_error.resp_line())
            out.append(err)
            out_bytes += len(err)
            close_after = True
        if out:
            self._send(out, out_bytes)
        if close_after:
            self._sink.close_after_send(self)
        if self._running.busy:
            self._parse_ahead()
        self._share.end()
        if yielded and not close_after:
            self._state.counters.slices_yielded += 1
            self._share.pause(self._resume)  # the next turn goes on where it stopped
        self._update_reading()
        self._report()

    # -- deferred commands (module docstring) -------------------------------------

    def _deferred(
        self, argv: Sequence[bytes], result: Deferred | Silenced, out: Chunks, out_bytes: int
    ) -> int:
        """A command's deferred result: settled here and appended to ``out`` (its size
        returned) where nothing may run off the loop; else started (-1), after the
        replies in ``out`` are sent."""
        silent = isinstance(result, Silenced)
        deferred = result.deferred if isinstance(result, Silenced) else result
        inline = self._offload is None and not isinstance(deferred, Wait)
        if inline and not (isinstance(deferred, Steps) and self._steps_async):
            reply = settle(self._ctx, argv, deferred)
            return 0 if silent else encode(self._ctx, argv, reply, out)
        if out:
            self._send(out, out_bytes)
        self._running.start(argv, deferred, silent=silent)
        return -1

    def _done(self) -> None:
        """The deferred command's reply has been handed on: the next one may start."""
        client = self.client
        if not self._decoder.authenticated and client.authenticated:
            self._decoder.authenticated = True
        if self._parked:
            self._send([], 0)  # pushes parked while it ran (_send puts them first)
        if client.closing:
            self._sink.close_after_send(self)
            return
        if not self._closed:
            self._process()

    # -- sending and flow control ---------------------------------------------------

    def _update_reading(self) -> None:
        """Read the socket unless the client is behind on reading its replies, or its
        next command already waits behind a deferred one."""
        transport = self._transport
        if transport is None or transport.is_closing() or self._closed:
            return
        waiting = self._running.busy and (self._next is not None or self._next_error is not None)
        stop = self._writing_paused or self._backlogged or waiting or self._share.yielded
        if stop and not self._reading_paused:
            self._reading_paused = True
            transport.pause_reading()
        elif not stop and self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()

    def _resume(self) -> None:
        if self._closed or self._writing_paused or self._backlogged:
            return
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if self._running.busy:
            self._update_reading()
            self._running.pump()
        else:
            self._process()

    def _report(self) -> None:
        # Every time, even when unchanged: a report is also what enforces a
        # maxmemory-clients bound lowered at runtime (CONFIG SET).
        if self._registered and not self._closed:
            self._memory.update(self, self._query_bytes() + self._unsent())

    def _query_bytes(self) -> int:
        return self._decoder.held + self._next_bytes + self._running.nbytes

    # -- used by the sink, the accounting and the server ---------------------------

    def buffer_usage(self) -> tuple[int, int]:
        return self._query_bytes(), self._unsent()

    def evict(self) -> None:
        self.abort()
        self._unregister()

    def close(self) -> None:
        self._closed = True
        if self._transport is not None:
            self._transport.close()

    def abort(self) -> None:
        self._closed = True
        if self._transport is not None:
            self._transport.abort()

    @property
    def transport(self) -> asyncio.Transport | None:
        return self._transport
