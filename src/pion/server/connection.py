"""One client connection: bytes in through the sans-IO decoder, commands through the
dispatcher, reply chunks out through the server's :class:`ReplySink`.

Replies leave strictly in request order: every command of a read is dispatched in turn
on the event loop thread, and their chunks are handed to the sink (which writes them or
queues them behind a group commit). Small replies are gathered into one write; a reply
that makes the batch large is handed over at once; pieces are coalesced before the
transport (``replies.coalesce``).

A connection gets a slice of the loop per turn (``slices.py``): when its commands have
used it, its socket is paused and the next turn goes on where it stopped. A long
command (:class:`~pion.commands.deferred.Steps`) runs in steps of the same size
(``steps.py``), its client's later commands waiting as behind any deferred command.

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
below). Without a worker pool (``offload=None``) deferred commands run inline.

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
- past ``maxclients`` (RESP and binary-lane clients together, ``clients.py``) a new
  connection is answered ``-ERR max number of clients reached`` and closed.

A connection's collaborators are explicit: the worker's state, the command table, the
reply sink, the registry of live connections (for CLIENT KILL and shutdown) and the
client-memory accounting.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Sequence
from typing import Any, cast

from pion.commands.chunked import run_now
from pion.commands.deferred import Deferred, Offload, Steps
from pion.commands.state import ClientState, CommandTable, Context, ServerState
from pion.commands.transactions import forget_client
from pion.errors import PionError, ProtocolError
from pion.resp.decoder import SCRATCH_BYTES, RequestDecoder
from pion.resp.encoder import Chunks, encode_error, encode_reply
from pion.resp.reply import Reply
from pion.server.clientmem import ClientMemory
from pion.server.clients import (
    MAX_CLIENTS_REPLY,
    ClientConnection,
    admit_connection,
    peer_addresses,
)
from pion.server.dispatch import complete, error_reply, execute
from pion.server.offload import Offloader, piece_bytes, stream_parts
from pion.server.replies import ReplySink, coalesce
from pion.server.slices import CHECK_EVERY, SLICE_S, Turns
from pion.server.steps import StepRunner
from pion.server.streaming import StreamSender

__all__ = ["Connection"]

log = logging.getLogger("pion.server")

# Gather small replies into one write up to this many bytes or chunks; a deep pipeline
# of PINGs then costs one writelines per 64 KiB, not one per command.
_FLUSH_BYTES = 64 * 1024
_FLUSH_CHUNKS = 4096
# The most one socket read takes (large bulks are received in place, unaffected).
# Redis reads 16 KiB at a time; 64 KiB of small arguments is a few ms of parsing.
READ_BYTES = 64 * 1024
# What a reply piece held for the client costs beyond its payload (a bytes object's
# header and its slot in a list), counted in its unsent reply bytes.
PIECE_OVERHEAD = 64


class Connection(asyncio.BufferedProtocol):
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
        self._state = state
        self._sink = sink
        self._registry = registry
        self._memory = memory
        self._offload = offload
        self._scratch = scratch if scratch is not None else memoryview(bytearray(SCRATCH_BYTES))
        # Reads of at most READ_BYTES: what one read hands the decoder is parsed at once
        # (a huge command's arguments, in Python), so it is one slice's worth, roughly.
        self._read_view = self._scratch[:READ_BYTES]
        self._decoder = RequestDecoder(state.config.protocol)
        self._decoder.authenticated = not state.config.auth_required
        self._high_water = state.config.protocol.reply_high_water
        self._transport: asyncio.Transport | None = None
        # The transport asked us to stop writing (its buffer passed the mark).
        self._writing_paused = False
        # We stopped ourselves: unsent bytes over the mark, mostly held by the sink.
        self._backlogged = False
        self._reading_paused = False
        self._closed = False
        self._registered = False
        # Reply bytes handed to the sink and not yet written to the transport.
        self._held = 0
        # The deferred command in progress (module docstring), its arguments and their
        # size; then the next command, parsed ahead while it runs (or the protocol
        # error in its place), and that command's size.
        self._busy: Deferred | None = None
        self._busy_argv: Sequence[bytes] = ()
        self._busy_bytes = 0
        self._next: list[bytes] | None = None
        self._next_error: ProtocolError | None = None
        self._next_bytes = 0
        # The streamed reply being sent, while one is.
        self._streamer: StreamSender | StepRunner | None = None
        # This connection's share of the loop (pion.server.slices): the turn it last
        # ran in, the seconds of its slice left in that turn, and whether it stopped
        # for the turn (a callback of the next turn goes on). Without ``turns`` (a
        # connection driven alone, in unit tests) there is nobody to share with: no
        # slices.
        self._turns = turns
        self._slice_turn = -1
        self._slice_left = 0.0
        self._yielded = False
        self.client = ClientState(id=client_id, created=time.time())
        self._ctx = Context(state=state, client=self.client, table=table)

    # -- asyncio callbacks ------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        transport = cast(asyncio.Transport, transport)
        self._transport = transport
        if not admit_connection(self._state, transport, MAX_CLIENTS_REPLY):
            self._closed = True
            return
        peer_addresses(transport, self.client)
        transport.set_write_buffer_limits(high=self._high_water)
        self._state.counters.total_connections_received += 1
        self._state.clients[self.client.id] = self.client
        self._registry[self.client.id] = self
        self._registered = True

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None and not self._closed:
            # The socket failed under us (a read or a write): never silent.
            self._io_error("the connection failed", exc)
        self._closed = True
        self._decoder.clear()
        self._next = None
        self._next_error = None
        self._unregister()

    def _unregister(self) -> None:
        """Leave the registry and the memory accounting (at once on eviction: the
        transport's own teardown comes later)."""
        if self._registered:
            self._registered = False
            self._memory.forget(self)
            forget_client(self._state, self.client)  # its transaction and WATCHes
            self._state.clients.pop(self.client.id, None)
            self._registry.pop(self.client.id, None)

    def _io_error(self, what: str, exc: BaseException) -> None:
        self._state.counters.io_errors += 1
        peer_gone = isinstance(exc, (ConnectionResetError, BrokenPipeError))
        log.log(
            logging.INFO if peer_gone else logging.WARNING,
            "client id=%d addr=%s: %s: %r",
            self.client.id,
            self.client.addr,
            what,
            exc,
        )

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
        if self._busy is None:
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

    def _process(self) -> None:
        transport = self._transport
        if transport is None or self._yielded:
            return  # (yielded: the next turn's callback goes on)
        # The clock is first read when a second command is at hand, so a request of
        # one command pays nothing for the slices (the first command of a call is not
        # charged: a slice overshoots by at most one command, plus CHECK_EVERY).
        clock = time.perf_counter
        sliced = self._turns is not None
        if self._turns is not None:
            turn = self._turns.current()
            if turn != self._slice_turn:
                self._slice_turn = turn
                self._slice_left = SLICE_S
        started = 0.0
        deadline = math.inf
        ran = 0
        yielded = False
        decoder = self._decoder
        client = self.client
        out: Chunks = []
        out_bytes = 0
        close_after = False
        proto_error: ProtocolError | None = None
        # Unsent bytes change only when this loop sends: read once, and after a send.
        unsent = self._unsent()
        while not (
            self._closed or self._writing_paused or self._backlogged or self._busy is not None
        ):
            if transport.is_closing():
                # The peer hung up (a write failed) or we are closing: whatever it
                # still had pipelined would build replies nobody reads.
                out = []
                break
            if self._next_error is not None:
                proto_error, self._next_error = self._next_error, None
                break
            argv = self._next
            if argv is not None:
                self._next, self._next_bytes = None, 0
            else:
                try:
                    argv = decoder.get()
                except ProtocolError as exc:
                    proto_error = exc
                    break
                if argv is None:
                    break
            if sliced:
                if ran == 0:
                    yielded = self._slice_left <= 0
                elif ran == 1 or ran % CHECK_EVERY == 0:
                    now = clock()
                    if not started:
                        started, deadline = now, now + self._slice_left
                    yielded = now >= deadline
                if yielded:
                    # This turn's slice is used: the command waits for the next one.
                    self._next, self._next_bytes = argv, sum(len(a) for a in argv)
                    break
            ran += 1
            result = execute(self._ctx, argv, out)
            if not isinstance(result, int):
                if self._offload is not None or (
                    isinstance(result, Steps) and self._turns is not None
                ):
                    # Replies before it leave first; it runs off the loop.
                    if out:
                        self._send(out, out_bytes)
                        out, out_bytes = [], 0
                    self._start(argv, result)
                    break
                result = self._run_inline(argv, result, out)
            out_bytes += result
            if not decoder.authenticated and client.authenticated:
                decoder.authenticated = True  # AUTH/HELLO succeeded: full limits
            if client.closing:
                close_after = True
                break
            if (
                out_bytes >= _FLUSH_BYTES
                or len(out) >= _FLUSH_CHUNKS
                or out_bytes + unsent > self._high_water
            ):
                self._send(out, out_bytes)
                out, out_bytes = [], 0
                unsent = self._unsent()
                if unsent > self._high_water and not self._writing_paused:
                    # The sink holds them (group commit): wait for it to write them.
                    self._backlogged = True
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
        if self._busy is not None:
            self._parse_ahead()
        if started:
            self._slice_left -= clock() - started
        if yielded and not close_after:
            self._yielded = True
            self._state.counters.slices_yielded += 1
            asyncio.get_running_loop().call_soon(self._next_slice)
        self._update_reading()
        self._report()

    def _next_slice(self) -> None:
        """A turn after this connection used its slice: go on where it stopped."""
        self._yielded = False
        if not self._closed:
            self._process()

    # -- deferred commands (module docstring) -------------------------------------

    def _start(self, argv: Sequence[bytes], deferred: Deferred) -> None:
        self._busy = deferred
        self._busy_argv = argv
        self._busy_bytes = sum(len(arg) for arg in argv)
        if isinstance(deferred, Steps):
            self._streamer = StepRunner(
                deferred,
                send=self._send,
                encode=self._encode,
                fail=lambda exc: error_reply(self._ctx, argv, exc),
                behind=self._behind,
                alive=lambda: not self._closed,
                done=self._streamed,
            )
            self._streamer.pump()
            return
        offload = self._offload
        if offload is None:  # pragma: no cover - _process runs them inline then
            return
        self._state.counters.offloaded_commands += 1
        if isinstance(deferred, Offload):
            offload.submit(deferred.work, lambda result: self._finished(deferred, result))
            return
        self._streamer = StreamSender(
            deferred,
            self.client.proto,
            offload,
            send=self._send,
            behind=self._behind,
            alive=lambda: not self._closed,
            done=self._streamed,
        )
        self._streamer.pump()

    def _finished(self, offload: Offload[Any], result: object) -> None:
        """An offloaded command's work is done: finish it (its state change happens
        now, whether or not its client is still there) and send the reply."""
        out: Chunks = []
        nbytes = complete(self._ctx, self._busy_argv, offload, result, out)
        if not self._closed:
            self._send(out, nbytes)
        self._done()

    def _behind(self) -> bool:
        """The client is behind on reading: no further piece of a stream starts."""
        if self._writing_paused:
            return True
        if self._unsent() > self._high_water:
            self._backlogged = True  # the sink holds them: its write() resumes us
            return True
        return False

    def _streamed(self, error: str | None, exc: BaseException | None) -> None:
        """The streamed reply is sent, or its client gone, or (``error``) it broke
        after its framing went out: then the reply cannot be completed, so the
        connection is dropped. A :class:`PionError` (the cluster tier failing under a
        streamed fill) is the command's own failure, logged as such; anything else is a
        Pion bug, logged once with its traceback and counted."""
        if error is not None:
            name = self._busy_argv[0].decode("utf-8", "replace")[:64] if self._busy_argv else "?"
            if isinstance(exc, PionError):
                log.warning("%s failed after its reply began (%s): connection closed", name, error)
            else:
                self._state.counters.internal_errors += 1
                log.error("internal error streaming the reply of %s: %s", name, error, exc_info=exc)
            self.abort()
        self._streamer = None
        self._done()

    def _done(self) -> None:
        """The deferred command's reply has been handed on: the next one may start."""
        self._busy = None
        self._busy_argv = ()
        self._busy_bytes = 0
        client = self.client
        if not self._decoder.authenticated and client.authenticated:
            self._decoder.authenticated = True
        if client.closing:
            self._sink.close_after_send(self)
            return
        self._process()

    def _encode(self, value: Reply) -> Chunks:
        out: Chunks = []
        encode_reply(value, self.client.proto, out)
        return out

    def _run_inline(self, argv: Sequence[bytes], deferred: Deferred, out: Chunks) -> int:
        """A deferred command without a worker pool: run it here, append its reply."""
        mark = len(out)
        if isinstance(deferred, Steps):
            try:
                out += run_now(deferred, self.client.proto)
            except Exception as exc:  # the command's error boundary
                out += self._encode(error_reply(self._ctx, argv, exc))
            return sum(c.nbytes if isinstance(c, memoryview) else len(c) for c in out[mark:])
        if isinstance(deferred, Offload):
            try:
                result: object = deferred.work()
            except Exception as exc:
                result = exc
            return complete(self._ctx, argv, deferred, result, out)
        for part in stream_parts(deferred, self.client.proto):
            out.append(part if isinstance(part, bytes) else piece_bytes(part[1]))
        return sum(c.nbytes if isinstance(c, memoryview) else len(c) for c in out[mark:])

    # -- sending and flow control ---------------------------------------------------

    def _send(self, out: Chunks, nbytes: int) -> None:
        # Coalesced here, once: the sink may hold them (group commit), and the
        # transport must never be handed more pieces than it takes (replies.py).
        out = coalesce(out)
        nbytes += len(out) * PIECE_OVERHEAD
        self._held += nbytes
        self._sink.send(self, out, nbytes)

    def _unsent(self) -> int:
        transport = self._transport
        buffered = transport.get_write_buffer_size() if transport is not None else 0
        return buffered + self._held

    def _update_reading(self) -> None:
        """Read the socket unless the client is behind on reading its replies, or its
        next command already waits behind a deferred one."""
        transport = self._transport
        if transport is None or transport.is_closing() or self._closed:
            return
        waiting = self._busy is not None and (
            self._next is not None or self._next_error is not None
        )
        stop = self._writing_paused or self._backlogged or waiting or self._yielded
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
        if self._streamer is not None:
            self._update_reading()
            self._streamer.pump()
        elif self._busy is not None:
            self._update_reading()
        else:
            self._process()

    def _report(self) -> None:
        # Every time, even when unchanged: a report is also what enforces a
        # maxmemory-clients bound lowered at runtime (CONFIG SET).
        if self._registered and not self._closed:
            self._memory.update(self, self._query_bytes() + self._unsent())

    def _query_bytes(self) -> int:
        return self._decoder.held + self._next_bytes + self._busy_bytes

    # -- used by the sink, the accounting and the server ---------------------------

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
