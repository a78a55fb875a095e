"""Reply encoder for RESP2 and RESP3.

:func:`encode_reply` appends wire chunks to a list the connection later hands to
``transport.writelines``: headers are small ``bytes``, and big payloads (``bytes``,
``memoryview`` of a numpy buffer) are appended as they are, never copied or joined.
"""

from __future__ import annotations

import math
from typing import TypeAlias

from pion.resp.reply import (
    Encoded,
    ErrorReply,
    NoReply,
    NullArray,
    Reply,
    SetReply,
    Simple,
    Verbatim,
)

__all__ = [
    "NULL_BULK",
    "SIMPLE_CACHE",
    "SMALL_BULK",
    "Chunks",
    "encode_error",
    "encode_reply",
    "encode_simple",
]

# What a reply becomes: buffers for transport.writelines, never joined.
Chunks: TypeAlias = list[bytes | bytearray | memoryview]

_CRLF = b"\r\n"
_OK = b"+OK\r\n"
_NULL2 = b"$-1\r\n"
_NULL3 = b"_\r\n"
_NULL_ARRAY2 = b"*-1\r\n"
# Small integers are the most common reply after +OK; cache their encodings.
_INT_CACHE = [b":%d\r\n" % i for i in range(256)]
# Simple strings are few and fixed (OK, PONG, HIT, MISS, ...): their encodings are
# cached, up to a bound (a handler that made up simple strings could not grow it);
# the fast lane reads it inline.
SIMPLE_CACHE: dict[str, bytes] = {"OK": _OK}
_SIMPLE_CACHE_SIZE = 256
# Bulk replies up to this size are one chunk (header, value and CRLF joined); larger
# ones keep the value as its own chunk, never copied.
SMALL_BULK = 4096


def encode_error(line: str) -> bytes:
    """``line`` is ``"CODE message"``; CR/LF are replaced so an error never breaks
    the framing."""
    clean = line.replace("\r", " ").replace("\n", " ")
    return b"-" + clean.encode("utf-8", "replace") + _CRLF


# A null bulk string by protocol version (RESP2 ``$-1``, RESP3 ``_``).
NULL_BULK = {2: _NULL2, 3: _NULL3}


def encode_simple(value: Simple) -> bytes:
    """``+value``: cached, up to a bound (the fixed replies of small commands)."""
    encoded = SIMPLE_CACHE.get(value)
    if encoded is None:
        encoded = b"+" + value.encode() + _CRLF
        if len(SIMPLE_CACHE) < _SIMPLE_CACHE_SIZE:
            SIMPLE_CACHE[value] = encoded
    return encoded


def encode_reply(value: Reply, proto: int, out: Chunks) -> None:
    """Append the encoding of ``value`` to ``out``."""
    if type(value) is Simple:  # the reply of most small commands: first, and cached
        out.append(encode_simple(value))
    elif value is None:
        out.append(_NULL3 if proto == 3 else _NULL2)
    elif isinstance(value, bool):
        if proto == 3:
            out.append(b"#t\r\n" if value else b"#f\r\n")
        else:
            out.append(_INT_CACHE[int(value)])
    elif isinstance(value, int):
        out.append(_INT_CACHE[value] if 0 <= value < 256 else b":%d\r\n" % value)
    elif isinstance(value, Simple):
        out.append(_OK if value == "OK" else b"+" + value.encode() + _CRLF)
    elif isinstance(value, ErrorReply):
        out.append(encode_error(str(value)))
    elif type(value) is Encoded:
        out.append(value)
    elif isinstance(value, Verbatim):
        data = value.encode("utf-8")
        if proto == 3:
            out.append(b"=%d\r\ntxt:" % (len(data) + 4))
        else:
            out.append(b"$%d\r\n" % len(data))
        out.append(data)
        out.append(_CRLF)
    elif type(value) is bytes and len(value) <= SMALL_BULK:
        # One chunk: a copy of a small value costs less than two more chunks to
        # count and gather (GET of a 256-byte value, the keyspace's common reply).
        out.append(b"$%d\r\n%b\r\n" % (len(value), value))
    elif isinstance(value, (bytes, bytearray, memoryview)):
        size = value.nbytes if isinstance(value, memoryview) else len(value)
        out.append(b"$%d\r\n" % size)
        out.append(value)
        out.append(_CRLF)
    elif isinstance(value, str):
        data = value.encode("utf-8")
        out.append(b"$%d\r\n" % len(data))
        out.append(data)
        out.append(_CRLF)
    elif isinstance(value, float):
        if proto == 3:
            out.append(b"," + _format_double(value).encode() + _CRLF)
        else:
            text = _format_double(value).encode()
            out.append(b"$%d\r\n" % len(text))
            out.append(text)
            out.append(_CRLF)
    elif isinstance(value, (list, tuple)):
        mark = b"~" if proto == 3 and type(value) is SetReply else b"*"
        out.append(b"%b%d\r\n" % (mark, len(value)))
        for item in value:
            encode_reply(item, proto, out)
    elif isinstance(value, dict):
        if proto == 3:
            out.append(b"%%%d\r\n" % len(value))
        else:
            out.append(b"*%d\r\n" % (2 * len(value)))
        for key, item in value.items():
            encode_reply(key, proto, out)
            encode_reply(item, proto, out)
    elif isinstance(value, NullArray):
        out.append(_NULL3 if proto == 3 else _NULL_ARRAY2)
    elif isinstance(value, NoReply):
        pass
    else:  # pragma: no cover - a handler bug, caught by the dispatcher's tests
        raise TypeError(f"cannot encode reply of type {type(value).__name__}")


def _format_double(value: float) -> str:
    """Redis 7.0's ``addReplyDouble``: ``%.17g`` (round-trips every double exactly),
    ``inf``/``-inf`` spelled out."""
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if math.isnan(value):
        return "nan"
    return f"{value:.17g}"
