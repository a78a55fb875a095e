"""Durable stores: what the persistence layer needs of a store to keep it.

A worker holds several stores: the V-store, the plain keyspace, and next the attention
tier's SSM states. One :class:`~pion.persistence.Persistence` keeps all of them, with
three rules:

* **One log, one sequence.** Every store's records go through the same write-ahead log
  and are numbered by the same counter, so the log's order is the order in which the
  worker applied them, across stores, and one fsync (one ``KV.PREFIX.COMMIT``, one
  group commit) covers them all.
* **One snapshot file per store**, ``pion.<name>.<w>``, all written by the same SAVE
  with the same ``covered`` sequence number. Each store's file carries its own
  ``covered``, and recovery skips a log record for a store only when that store's
  snapshot covers it; so a crash between two of SAVE's renames (one file new, the other
  old) replays exactly what each file lacks.
* **Frozen op-code ranges.** Each store owns a range of record op codes
  (``format.py`` lists them): 1..15 the V-store, 16..31 the keyspace, 32..46 SSM and
  attention state, 47 the function libraries. A record's op code alone says which
  store it belongs to.

A store joins by implementing :class:`DurableStore` (``vstore_durable.py``,
``keyspace_durable.py``, ``ssm_durable.py`` and ``functions_format.py``'s
``FunctionsDurable`` are the ones there are) and being handed
to ``Persistence``. The protocol is small on purpose: a store turns its state into
:class:`Frame` records (a snapshot), applies one record (replay), and sends the records
of its own mutations to a :class:`FrameSink` (the log) before applying them. A store
that wants to size its buffers before loading a snapshot (the V-store, whose long runs
of rows arrive in pieces, highest first) also implements :class:`SizesSnapshots`;
recovery asks for it, so other stores need nothing more.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import BinaryIO, NamedTuple, Protocol, runtime_checkable

from pion.persistence.format import Buffer

__all__ = [
    "FREEING_COMMANDS",
    "DurableStore",
    "FollowsLog",
    "Frame",
    "FrameSink",
    "SizesSnapshots",
]

# The commands that only free space: accepted while persistence refuses writes
# (-MISCONF), since removing data is how an operator makes room. Their records are
# marked ``drop`` (``Frame.drop``) by each store; the dispatcher lets these names past
# a failed log, and the log writes their records when it can (``wal.py``).
FREEING_COMMANDS = frozenset(
    {
        "DEL",
        "UNLINK",
        "HDEL",
        "ZREM",
        "FLUSHDB",
        "FLUSHALL",
        "KV.PREFIX.DROP",
        "SSM.PREFIX.DROP",
    }
)


class Frame(NamedTuple):
    """One record before framing: its op code and its payload as a sequence of buffers
    (written with one ``writev`` and checksummed in place, never joined). Buffers that
    are views of a store's live data are valid until the store next changes. A named
    tuple, not a dataclass: one is built for every write command, and a tuple is the
    cheapest immutable record Python builds."""

    op: int
    parts: Sequence[Buffer]
    # A record that only removes data (a client's drop or delete, a flush, an expiry):
    # accepted while the log refuses writes, since removing data is how an operator
    # makes room; written when the log can take it (``wal.py``).
    drop: bool = False

    @property
    def size(self) -> int:
        return sum(memoryview(p).nbytes for p in self.parts)


class FrameSink(Protocol):
    """Where a store sends the records of its mutations: the write-ahead log.

    ``append_frame`` returns once the record is accepted (written, or queued for the
    next group commit); it raises (``MisconfError`` while persistence is failing) when
    it is not, and the store must then apply nothing of that mutation.

    ``logging`` is False when records go nowhere (no log: ``--no-wal``): a store may
    then skip building the record and call ``note_change`` instead, which counts the
    mutation for the snapshot schedule as ``append_frame`` would have."""

    @property
    def logging(self) -> bool: ...

    def append_frame(self, frame: Frame) -> None: ...

    def note_change(self, count: int = 1) -> None: ...


class DurableStore(Protocol):
    """A store the persistence layer keeps (see the module docstring)."""

    @property
    def name(self) -> str:
        """The file name part: the snapshot is ``pion.<name>.<w>``. Frozen."""
        ...

    @property
    def ops(self) -> Mapping[int, str]:
        """The record op codes this store writes and applies, with their names."""
        ...

    @property
    def unit_ops(self) -> frozenset[int]:
        """The ops that open one unit (a session, a key) in a snapshot: the snapshot's
        END record counts them, and loading checks the count."""
        ...

    def frames(self) -> Iterator[Frame]:
        """The records that rebuild the current state from an empty store (a snapshot).
        Each frame's buffers are consumed before the next one is asked for."""
        ...

    def apply_frame(self, op: int, payload: Buffer) -> None:
        """Apply one record read back from the log or a snapshot, without journaling
        it and without re-checking limits that only bound new writes. Raises
        ``PionError`` (``FormatError`` for a payload that does not decode) when the
        record cannot be applied."""
        ...

    def attach(self, sink: FrameSink | None) -> None:
        """From now on send every mutation's record to ``sink`` before applying it
        (None: stop journaling)."""
        ...

    def held_bytes(self) -> int:
        """About what a snapshot of the store writes (the disk-space probe's estimate)."""
        ...

    def units(self) -> int:
        """How many units (sessions, keys) the store holds."""
        ...


@runtime_checkable
class SizesSnapshots(Protocol):
    """Optional beside :class:`DurableStore`: a store that looks over a snapshot before
    its records are applied, to allocate each buffer once at its final size."""

    def snapshot_applier(self, f: BinaryIO, size: int) -> Callable[[int, Buffer], None]:
        """Read what sizing needs from the open snapshot ``f`` of ``size`` bytes (it
        may move the file position, and must stop quietly at anything it cannot
        trust: loading reports damage), and return the function that applies the
        snapshot's records in place of ``apply_frame``."""
        ...


@runtime_checkable
class FollowsLog(Protocol):
    """Optional beside :class:`DurableStore`: a store whose records depend on the ones
    before them in the same file (the keyspace's SELECT records say which database the
    records after them are of; ``keyspace_durable.py``)."""

    def skip_frame(self, op: int, payload: Buffer) -> None:
        """A log record of this store that its snapshot already covers: not applied,
        but read for the context it sets for the records after it."""

    def log_reset(self) -> None:
        """The log was replaced by an empty one: the next record starts a new file."""
