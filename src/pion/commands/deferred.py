"""Replies that are not ready when a handler returns: the part of a command that only
converts numbers runs on a worker thread, off the event loop.

A handler stays a plain synchronous function. When its payload is large it may return
one of these instead of a reply, after it has parsed and checked every argument:

- :class:`Offload`: ``work()`` runs on a worker thread and must not read or change
  shared state (it quantizes a request blob it was handed, say; as a :class:`Split`
  its row blocks run on several threads at once); then ``finish(r)``
  runs on the event loop thread with work's result ``r`` (or the exception it raised)
  and returns the reply. ``finish`` is where state changes, so it must check again
  anything that may have changed meanwhile: other connections ran commands in between.
- :class:`Stream`: a bulk, or an array of bulks, whose sizes are known now and whose
  bytes are produced later, piece by piece, on a worker thread (decoding a stored
  layer to fp32). Each piece must read only what the handler captured (copy-on-write
  views of the V-store, ``pion.vstore.layer``), never live state. A piece that needs
  something still arriving (rows a tier fill is reading) is an :class:`Awaiting`: it
  is handed to a worker only once that has arrived.
- :class:`Steps`: a long command cut into steps run on the event loop, a slice of
  the loop at a time, other clients' commands in between (``pion.server.steps``).
  Each ``next()`` of its generator does a bounded piece of work and yields reply
  chunks ready to send (possibly none); what it returns is the rest of the reply.
  Atomicity is the command's to keep: a step that reads live state must not rely on
  it across a yield, so a command reads or changes the state in one step and only
  encodes (or frees) what it took in the later ones.
- :class:`Wait`: the command waits for something outside it (a key written, an
  event), its client's later commands behind it, every other client going on; then
  its ``then()`` runs on the loop and returns the reply (or another of these). The
  mechanism blocking commands and pub/sub build on.

Where they run: ``pion.server.running`` on a live connection (the RESP lane's and,
through it, a silenced client's), :func:`pion.commands.execution.settle` where nothing
may run in between (EXEC, a connection without a worker pool). The connection
(``pion.server.connection``) runs them: it starts no further command of
that client until the reply has been handed on, so a pipeline's commands still run and
reply in order; receiving the client's next command and sending the previous reply
continue meanwhile, which is the overlap the offload exists for. Without a worker
pool (``Connection(offload=None)``, the unit tests) both run inline, with the same
results.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeAlias, TypeVar

from pion.resp.encoder import Chunks
from pion.resp.reply import Reply

__all__ = [
    "Awaiting",
    "Deferred",
    "LazyBulk",
    "Offload",
    "Piece",
    "Split",
    "Steps",
    "Stream",
    "Wait",
]

T = TypeVar("T")

# A piece of a lazy bulk: a C-contiguous buffer (a numpy array or a memoryview of one).
Piece: TypeAlias = Any


@dataclass(frozen=True, slots=True)
class Offload(Generic[T]):
    """``work`` on a worker thread, then ``finish(result or exception)`` on the loop."""

    work: Callable[[], T]
    finish: Callable[[T | BaseException], Reply]


@dataclass(frozen=True, slots=True)
class Split(Generic[T]):
    """An :class:`Offload`'s ``work`` in independent ``parts`` (row blocks of one store,
    each writing its own rows of a shared output) that a worker pool may run at once,
    on several threads; the work's result is ``result()``, taken once every part has
    run. The first part in order that raised gives the work's exception. Called directly (no pool),
    the parts run in order on the calling thread."""

    parts: Sequence[Callable[[], object]]
    result: Callable[[], T]

    def __call__(self) -> T:
        for part in self.parts:
            part()
        return self.result()


@dataclass(frozen=True, slots=True)
class Awaiting:
    """A piece that can be computed only once something outside arrives (rows a tier
    fill is still reading): ``ready(go)`` calls ``go()`` once it can, on any thread,
    maybe at once; ``compute`` then runs on a worker thread like any piece, so no
    worker waits meanwhile. Called directly (the inline paths) it waits itself."""

    ready: Callable[[Callable[[], None]], None]
    compute: Callable[[], Piece]

    def __call__(self) -> Piece:
        arrived = threading.Event()
        self.ready(arrived.set)
        arrived.wait()
        return self.compute()


@dataclass(frozen=True, slots=True)
class LazyBulk:
    """A bulk string of ``nbytes`` whose payload is ``pieces`` in order, each computed
    on a worker thread; their sizes add up to ``nbytes``."""

    nbytes: int
    pieces: Sequence[Callable[[], Piece]]


@dataclass(frozen=True, slots=True)
class Stream:
    """``items[0]`` as a bulk (``array`` False), or an array of ``items``; ``None`` is a
    null element (``$-1``, or ``_`` in RESP3)."""

    items: Sequence[LazyBulk | None]
    array: bool


@dataclass(frozen=True, slots=True)
class Steps:
    """Work in steps on the event loop: each ``next(run)`` yields encoded chunks to
    send now; the generator's return value is encoded and sent last (None: nothing
    more). A PionError raised before any chunk was yielded is the command's reply.

    ``taken``: every step works only on what the handler took from the state (encoding
    it, freeing it), never on live state, so the steps may run after later commands
    (a transaction's EXEC runs its other commands first and encodes these in its own
    reply's steps); steps that change state (a long ZADD) may not, and run in place."""

    run: Generator[Chunks, None, Reply]
    taken: bool = False


def _nothing() -> None:
    return None


@dataclass(frozen=True, slots=True)
class Wait:
    """The command waits: ``ready(go)`` arranges for ``go()`` to be called once what it
    waits for has come (on any thread; at once if it is there already); ``then()``
    runs then, on the loop, and returns the reply or another deferred result. After
    ``timeout`` seconds (None: no limit), or where nothing may wait (inside EXEC),
    ``expired()`` is the reply instead. ``cancel()`` is called when the wait ends
    without ``go()`` (timed out, its client gone), so a waiter can be forgotten; a
    ``go()`` after that is ignored."""

    ready: Callable[[Callable[[], None]], None]
    then: Callable[[], Reply | Deferred]
    expired: Callable[[], Reply | Deferred]
    timeout: float | None = None
    cancel: Callable[[], None] = _nothing


Deferred: TypeAlias = Offload[Any] | Stream | Steps | Wait
