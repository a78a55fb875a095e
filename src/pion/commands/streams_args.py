"""Stream ids as the stream commands read them, and the shape of entries in replies.

Redis 7.0's ``streamGenericParseIDOrReply``: ``<ms>-<seq>``, ``<ms>`` (the sequence is
the caller's default: 0 for a range's start, the maximum for its end), ``-`` and
``+`` where not strict, ``<ms>-*`` where XADD allows it. Each number is read by
``string2ull``: a canonical decimal, else C's ``strtoull`` (leading blanks, a sign,
leading zeros; ``-1`` refused but `` -1`` wrapping to 2^64-1, as there).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pion.errors import PionError
from pion.keyspace.streamops import StreamId
from pion.keyspace.streamtype import MAX_ID, MAX_U64, Stream, format_id
from pion.resp.reply import Reply

__all__ = [
    "INVALID_ID",
    "entries_reply",
    "parse_id",
    "parse_interval",
    "parse_strict_id",
    "parse_xadd_id",
]

INVALID_ID = "Invalid stream ID specified as stream command argument"
# Redis copies an id argument into a 128-byte buffer first: a longer one is invalid.
_MAX_ID_TEXT = 127
_CANONICAL = re.compile(rb"(0|-?[1-9][0-9]*)\Z")
_STRTOULL = re.compile(rb"[ \t\n\v\f\r]*([+-]?)([0-9]+)\Z")


def _u64(raw: bytes) -> int | None:
    if _CANONICAL.match(raw):
        # string2ll refuses a negative outright; past LLONG_MAX strtoull decides.
        value = int(raw)
        return value if 0 <= value <= MAX_U64 else None
    m = _STRTOULL.match(raw)
    if m is None:
        return None
    value = int(m.group(2))
    if value > MAX_U64:
        return None
    return (-value) % (1 << 64) if m.group(1) == b"-" else value


def _parse(raw: bytes, missing_seq: int, strict: bool, star: bool) -> tuple[StreamId, bool]:
    """The id and whether its sequence was given (False only for ``<ms>-*``)."""
    if len(raw) > _MAX_ID_TEXT:
        raise PionError(INVALID_ID)
    if raw in (b"-", b"+"):
        if strict:
            raise PionError(INVALID_ID)
        return ((0, 0) if raw == b"-" else MAX_ID), True
    head, dash, tail = raw.partition(b"-")
    ms = _u64(head)
    if ms is None:
        raise PionError(INVALID_ID)
    if not dash:
        return (ms, missing_seq), True
    if star and tail == b"*":
        return (ms, 0), False
    seq = _u64(tail)
    if seq is None:
        raise PionError(INVALID_ID)
    return (ms, seq), True


def parse_id(raw: bytes, missing_seq: int = 0) -> StreamId:
    """An id where ``-`` and ``+`` are allowed."""
    return _parse(raw, missing_seq, False, False)[0]


def parse_strict_id(raw: bytes, missing_seq: int = 0) -> StreamId:
    """An id where ``-`` and ``+`` are not."""
    return _parse(raw, missing_seq, True, False)[0]


def parse_xadd_id(raw: bytes) -> tuple[StreamId, bool]:
    """XADD's explicit id: ``<ms>-<seq>``, ``<ms>`` or ``<ms>-*``."""
    return _parse(raw, 0, True, True)


def parse_interval(raw: bytes, missing_seq: int) -> tuple[StreamId, bool]:
    """An XRANGE bound: the id and whether it is exclusive (``(`` before it)."""
    if len(raw) > 1 and raw[:1] == b"(":
        return parse_strict_id(raw[1:], missing_seq), True
    return parse_id(raw, missing_seq), False


def entry_reply(s: Stream, i: StreamId) -> Reply:
    return [format_id(i), list(s.entries[i])]


def entries_reply(s: Stream, ids: Sequence[StreamId]) -> list[Reply]:
    """Entries as Redis sends them: ``[id, [field, value, ...]]`` each."""
    return [[format_id(i), list(s.entries[i])] for i in ids]
