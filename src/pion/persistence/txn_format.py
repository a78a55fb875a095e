"""The TXN record: the writes of one EXEC as a single log record, so that recovery
applies all of them or none.

A transaction's records are not written one by one: the log keeps them while EXEC
runs and then writes one record of op 48 (``TXN``) whose payload holds them all
(``wal.py``, :meth:`~pion.persistence.wal.WriteAheadLog.end_unit`). One record has one
header CRC, one payload CRC and one sequence number, so the reader's rules
(``reader.py``) make the unit atomic with nothing added: a TXN cut by a crash is a
torn last record and is dropped at recovery (the transaction is wholly absent, as
Redis drops a MULTI block its AOF lost the EXEC of); a whole one is applied inner
record by inner record, in order, under its one sequence number. A unit of a single
record is written as that plain record: it is atomic already.

Payload of op 48 (little-endian, like every record)::

    off  size  field
    0    1     u8  layout  1 (the layout of this payload; a reader refuses another)
    1    4     u32 count   inner records, >= 2
    5    ...   count x inner record:
                 0    1    u8  op    a store's op code (1..47; never TXN or END)
                 1    4    u32 len   the inner payload's length
                 5    len  the payload, exactly as a plain record of ``op`` holds it

The inner records carry no CRC of their own: the outer payload CRC covers them. The
whole payload is bounded by the record limit (``MAX_PAYLOAD``); a transaction whose
writes would pass it has the write that crosses the limit refused (that command fails
inside EXEC, as any runtime error does).

Op 48 opens the range 48..63 of log-only framing records (no store owns them; they
never appear in a snapshot). The log's header version stays 1: ops are only ever
added, and a reader without TXN stops at it with ``unknown op code 48``, never
misreading it.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import Final

from pion.persistence.format import Buffer, FormatError

__all__ = [
    "OP_TXN",
    "TXN_LAYOUT",
    "TXN_OPS",
    "decode_txn",
    "describe_txn",
    "encode_txn",
    "inner_head",
    "txn_head",
]

OP_TXN: Final = 48
TXN_LAYOUT: Final = 1
TXN_OPS: Final = {OP_TXN: "TXN"}
# Inner records belong to a store: ops 1..47 (format.py's ranges).
_MAX_INNER_OP: Final = 47

_HEAD: Final = struct.Struct("<BI")  # layout, count
_INNER: Final = struct.Struct("<BI")  # op, len


def inner_overhead() -> int:
    """Bytes an inner record adds to its payload."""
    return _INNER.size


def txn_head(count: int) -> bytes:
    """The first bytes of a TXN payload holding ``count`` inner records."""
    return _HEAD.pack(TXN_LAYOUT, count)


def inner_head(op: int, size: int) -> bytes:
    """The header of one inner record: its ``op`` and its payload's ``size``."""
    if not 1 <= op <= _MAX_INNER_OP:
        raise ValueError(f"op {op} cannot be inside a TXN")
    return _INNER.pack(op, size)


def encode_txn(records: Sequence[tuple[int, Sequence[Buffer]]]) -> list[Buffer]:
    """The payload buffers of a TXN holding ``records`` (op, payload parts), in order.
    The parts are passed through as they are (the caller owns copies). The log builds
    the same bytes record by record as EXEC runs (``txn_head``, ``inner_head``)."""
    if len(records) < 2:
        raise ValueError("a TXN holds two records or more")
    parts: list[Buffer] = [txn_head(len(records))]
    for op, payload in records:
        size = sum(len(p) if type(p) is bytes else memoryview(p).nbytes for p in payload)
        parts.append(inner_head(op, size))
        parts.extend(payload)
    return parts


def decode_txn(payload: Buffer) -> Iterator[tuple[int, memoryview]]:
    """The inner records of a TXN payload, (op, payload view) in order. Every inner
    header is checked against the bytes left before the first is yielded, so a
    malformed TXN applies nothing."""
    view = memoryview(payload).cast("B")
    if view.nbytes < _HEAD.size:
        raise FormatError(f"TXN payload of {view.nbytes} bytes is shorter than its header")
    layout, count = _HEAD.unpack_from(view, 0)
    if layout != TXN_LAYOUT:
        raise FormatError(f"TXN layout {layout} is not supported (this build reads 1)")
    if count < 2:
        raise FormatError(f"TXN of {count} records (a TXN holds two or more)")
    spans: list[tuple[int, int, int]] = []
    pos = _HEAD.size
    for i in range(count):
        if pos + _INNER.size > view.nbytes:
            raise FormatError(f"TXN inner record {i} of {count} runs past the payload")
        op, size = _INNER.unpack_from(view, pos)
        pos += _INNER.size
        if not 1 <= op <= _MAX_INNER_OP:
            raise FormatError(f"TXN inner record {i} has op code {op}")
        if pos + size > view.nbytes:
            raise FormatError(f"TXN inner record {i} of {size} bytes runs past the payload")
        spans.append((op, pos, size))
        pos += size
    if pos != view.nbytes:
        raise FormatError(f"TXN payload has {view.nbytes - pos} bytes after its records")
    for op, start, size in spans:
        yield op, view[start : start + size]


def describe_txn(op: int, payload: Buffer) -> str:
    """``TXN(n)`` for ``pion check-wal`` (decoding the framing completely)."""
    return f"TXN({sum(1 for _ in decode_txn(payload))})"
