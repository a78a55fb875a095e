"""HSCAN and ZSCAN's arguments: the cursor and ``[MATCH pattern] [COUNT n]``, read as
Redis 7.0's ``parseScanCursorOrReply`` and ``scanGenericCommand`` read them (SCAN
itself parses in ``keys.py``, where it also takes TYPE)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pion.errors import PionError
from pion.keyspace.glob import matches_all
from pion.keyspace.numbers import parse_cursor, parse_int64

__all__ = ["DEFAULT_COUNT", "ScanOptions", "scan_cursor", "scan_options"]

# Redis's default COUNT.
DEFAULT_COUNT = 10


@dataclass(frozen=True, slots=True)
class ScanOptions:
    count: int = DEFAULT_COUNT
    pattern: bytes | None = None  # None: every name matches


def scan_cursor(raw: bytes) -> int:
    cursor = parse_cursor(raw)
    if cursor is None:
        raise PionError("invalid cursor")
    return cursor


def scan_options(args: Sequence[bytes]) -> ScanOptions:
    count = DEFAULT_COUNT
    pattern: bytes | None = None
    i = 0
    while i < len(args):
        word = args[i].upper()
        if word == b"COUNT" and i + 1 < len(args):
            value = parse_int64(args[i + 1])
            if value is None:
                raise PionError("value is not an integer or out of range")
            if value < 1:
                raise PionError("syntax error")
            count = value
        elif word == b"MATCH" and i + 1 < len(args):
            pattern = None if matches_all(args[i + 1]) else args[i + 1]
        else:
            raise PionError("syntax error")
        i += 2
    return ScanOptions(count, pattern)
