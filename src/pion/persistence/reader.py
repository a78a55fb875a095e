"""Reading records back: one sequential reader shared by recovery, snapshot loading
and ``pion check-wal``, and the rule that tells a torn write from corruption.

A crash can only damage the end of the log, and only by leaving it *incomplete*:
records are appended in order, so what a killed process or a power cut leaves is a
last record cut short or, after power loss, trailing blocks of zeros or stale bytes.
Such a record was never wholly fsynced, so under ``appendfsync always`` its reply was
never sent. A record that is *complete* (all its bytes are there) but fails its
checksum is different: it was written whole, may have been fsynced and acknowledged,
and damaged since; cutting it would silently drop an acknowledged write. So is damage
followed by a valid record. Both are corruption. At the first bad record:

* header CRC intact (the length is then trustworthy): *torn* if it runs past the end of
  the file; a payload CRC mismatch is corruption, last record or not;
* header CRC bad (the length is unknown): corruption if a valid record header with a
  plausible sequence number starts somewhere after it (found with ``mmap.find`` on the
  sequence number bytes, so the look-ahead costs little even in a large file), or if
  the bytes to the end of the file form a complete record whose payload CRC holds (the
  last record, complete, with a damaged header); otherwise torn.

Large payloads are read into one reused buffer and checksummed where they lie; the
store copies them once into its layer buffers (``bench/persistence.py`` compares the
load with a plain read of the same file).
"""

from __future__ import annotations

import io
import mmap
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np

from pion.persistence.format import END, MAX_PAYLOAD, RECORD_HEAD, RECORD_OVERHEAD, Buffer, crc32c
from pion.persistence.registry import KNOWN_OPS

__all__ = ["Damage", "LogDamage", "Record", "find_valid_record", "read_records"]

# Payloads up to this size are read as bytes; larger ones into a reused buffer.
_SMALL = 64 << 10

_U32 = struct.Struct("<I")
_HEAD = RECORD_HEAD.size + 4
# How far ahead (in sequence numbers) the look-ahead searches for a surviving record,
# and how many candidate positions it checks before giving up on a pathological file.
_LOOKAHEAD_SEQS = 16
_LOOKAHEAD_CANDIDATES = 100_000


@dataclass(frozen=True, slots=True)
class Record:
    offset: int
    op: int
    seq: int
    # Small payloads are bytes; large ones a view of the reader's reused buffer,
    # valid until the next record is read (apply or copy it before that).
    payload: Buffer

    @property
    def end(self) -> int:
        return self.offset + RECORD_OVERHEAD + len(self.payload)


@dataclass(frozen=True, slots=True)
class Damage:
    """Where reading stopped and why. ``torn``: nothing valid follows (a crash's cut);
    else corruption, and ``next_valid`` is the offset of a valid record after it."""

    offset: int
    reason: str
    torn: bool
    next_valid: int = -1


class LogDamage(Exception):
    """Raised by :func:`read_records` at the first record it cannot trust."""

    def __init__(self, damage: Damage) -> None:
        super().__init__(damage.reason)
        self.damage = damage


def _valid_ops(snapshot: bool) -> frozenset[int]:
    return frozenset(KNOWN_OPS) | ({END} if snapshot else frozenset())


def read_records(
    f: BinaryIO, offset: int, size: int, first_seq: int, *, snapshot: bool = False
) -> Iterator[Record]:
    """Yield the records of ``f`` from ``offset`` to ``size``, whose sequence numbers
    must run ``first_seq, first_seq + 1, ...``. Raises :class:`LogDamage` at the first
    bad one (nothing of it is yielded)."""
    f.seek(offset)
    ops = _valid_ops(snapshot)
    scratch = np.empty(0, dtype=np.uint8)
    seq = first_seq
    while offset < size:
        head = f.read(_HEAD)
        if len(head) < _HEAD:
            raise _damage(
                f,
                offset,
                size,
                seq,
                f"incomplete final record: {size - offset} bytes, less than a header",
            )
        length, op, rseq = RECORD_HEAD.unpack_from(head)
        if crc32c(head[: RECORD_HEAD.size]) != _U32.unpack_from(head, RECORD_HEAD.size)[0]:
            raise _damage(f, offset, size, seq, "record header checksum mismatch")
        # A header that passed its CRC was written as it is: anything odd in it is not
        # a torn write but a bug or tampering, so it is corruption wherever it sits.
        if op not in ops:
            raise LogDamage(Damage(offset, f"unknown op code {op}", torn=False))
        if rseq != seq:
            raise LogDamage(Damage(offset, f"sequence {rseq} where {seq} was due", torn=False))
        if length > MAX_PAYLOAD:
            raise LogDamage(Damage(offset, f"record length {length} over the cap", torn=False))
        end = offset + RECORD_OVERHEAD + length
        if end > size:
            raise LogDamage(
                Damage(
                    offset,
                    f"incomplete final record: {size - offset} of its "
                    f"{RECORD_OVERHEAD + length} bytes",
                    torn=True,
                )
            )
        payload: Buffer
        if length <= _SMALL:
            payload = f.read(length)
            got = len(payload)
        else:
            # Large payloads land in one reused numpy buffer: no fresh memory to fault
            # in per record (numpy also asks for huge pages), so the only new memory a
            # load touches is the store's own layers.
            if len(scratch) < length:
                scratch = np.empty(length, dtype=np.uint8)
            payload = scratch[:length].data
            got = f.readinto(payload)  # type: ignore[attr-defined]
        tail = f.read(4)
        if got != length or len(tail) != 4:
            raise LogDamage(Damage(offset, "file shrank while being read", torn=True))
        if crc32c(payload) != _U32.unpack(tail)[0]:
            if end == size:
                reason = "payload checksum mismatch in the last record, complete,"
                raise LogDamage(Damage(offset, reason, torn=False))
            nxt = find_valid_record(f, end, size, seq + 1)
            reason = "payload checksum mismatch in a complete record"
            raise LogDamage(Damage(offset, reason, torn=False, next_valid=nxt))
        yield Record(offset, op, rseq, payload)
        offset = end
        seq += 1


def _complete_tail(f: BinaryIO, offset: int, size: int) -> bool:
    """Whether the bytes from ``offset`` to the end of the file are a complete record
    whose payload CRC holds (its header aside): a torn write cannot produce that."""
    length = size - offset - RECORD_OVERHEAD
    if not 0 <= length <= MAX_PAYLOAD:
        return False
    f.seek(offset + _HEAD)
    crc = 0
    left = length
    while left:
        chunk = f.read(min(left, 1 << 20))
        if not chunk:
            return False
        crc = crc32c(chunk, crc)
        left -= len(chunk)
    tail = f.read(4)
    return len(tail) == 4 and crc == _U32.unpack(tail)[0]


def _damage(f: BinaryIO, offset: int, size: int, seq: int, reason: str) -> LogDamage:
    """Damage where the length is unknown: corruption if a valid record follows or the
    rest of the file is one complete record, else a torn write."""
    nxt = find_valid_record(f, offset + 1, size, seq)
    if nxt < 0 and _complete_tail(f, offset, size):
        reason += " in the last record, whose payload is complete and intact"
        return LogDamage(Damage(offset, reason, torn=False))
    return LogDamage(Damage(offset, reason, torn=nxt < 0, next_valid=nxt))


def find_valid_record(f: BinaryIO, start: int, size: int, seq: int) -> int:
    """Offset of a record with an intact header and a sequence number in ``seq ..
    seq + 16`` starting at or after ``start``, else -1."""
    if size - start < _HEAD:
        return -1
    try:
        with mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as mm:
            return _search(mm, start, size, seq)
    except (OSError, ValueError, io.UnsupportedOperation):
        # Not a mappable file (an in-memory buffer in tests and tools): read it.
        f.seek(0)
        return _search(f.read(size), start, size, seq)


def _search(buf: bytes | mmap.mmap, start: int, size: int, seq: int) -> int:
    checked = 0
    for candidate in range(seq, seq + _LOOKAHEAD_SEQS):
        pattern = struct.pack("<Q", candidate)
        hit = buf.find(pattern, start + 5)
        while hit >= 0 and checked < _LOOKAHEAD_CANDIDATES:
            checked += 1
            pos = hit - 5
            if pos + _HEAD <= size and _plausible(bytes(buf[pos : pos + _HEAD]), pos, size):
                return pos
            hit = buf.find(pattern, hit + 1)
    return -1


def _plausible(head: bytes, pos: int, size: int) -> bool:
    length, op, _ = RECORD_HEAD.unpack_from(head)
    if crc32c(head[: RECORD_HEAD.size]) != _U32.unpack_from(head, RECORD_HEAD.size)[0]:
        return False
    return op in KNOWN_OPS and length <= MAX_PAYLOAD and pos + RECORD_OVERHEAD + length <= size
