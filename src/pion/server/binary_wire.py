"""The binary lane's wire format (docs/protocol.md, "Binary lane"), sans-IO: frames in, frames out.

Every frame, both directions, is a 7-byte header and a body::

    off  size  field
    0    2     u16 magic   0xCA5E
    2    1     u8  opcode (request) or status (reply)
    3    4     u32 body length
    7    len   body

Opcodes: ``0xFF`` PING (empty body), ``0x24`` ATTEND.PREFIX.QUERY_FUSED, ``0x37`` AUTH
(body = the password). Status: 0 OK, 1 MISS (also: unknown opcode, unparsable body),
2 ERROR, 3 COLDMISS. An error reply's body is the error line (``ERR ...``).

The QUERY_FUSED body, little-endian::

    u16 sid_len, sid, u16 layer, u16 H_q, u16 D, u16 H_kv, u32 M, u32 S_suf,
    Q (H_q*M*D fp32), K_suf (H_kv*S_suf*D fp32), V_suf (same), head_map (H_q u8),
    [i32 fa_window]

The optional ``fa_window`` is packed unsigned by Pion's client and read signed here,
so ``0xFFFFFFFF`` is -1 (the server default). The reply body is ``[H_q, M, D]`` fp32.

Errors are :class:`~pion.errors.FrameError` (a :class:`~pion.errors.ProtocolError`)
and :class:`~pion.errors.BodyError`, in the tree of ``pion.errors``.

Invariant of :class:`FrameParser`: whatever bytes are fed, :meth:`FrameParser.next`
returns a complete frame, None (need more bytes) or raises :class:`FrameError`; a
frame error is final (the connection answers it and closes). It is raised as soon as
the offending header bytes arrive: a bad magic after two bytes, an oversized length
after seven, never after buffering the promised body.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final, NoReturn

from pion.attend.queries import FusedQuery
from pion.errors import BodyError, FrameError
from pion.vstore import MAX_SID_LEN

__all__ = [
    "HEADER",
    "MAGIC",
    "OP_AUTH",
    "OP_PING",
    "OP_QUERY_FUSED",
    "STATUS_COLDMISS",
    "STATUS_ERROR",
    "STATUS_MISS",
    "STATUS_OK",
    "BodyError",
    "Frame",
    "FrameError",
    "FrameParser",
    "encode_frame",
    "parse_query_fused",
]

MAGIC: Final = 0xCA5E
HEADER: Final = struct.Struct("<HBI")
OP_QUERY_FUSED: Final = 0x24
OP_AUTH: Final = 0x37
OP_PING: Final = 0xFF
STATUS_OK: Final = 0
STATUS_MISS: Final = 1
STATUS_ERROR: Final = 2
STATUS_COLDMISS: Final = 3

_MAGIC_BYTES: Final = MAGIC.to_bytes(2, "little")
_SID_LEN: Final = struct.Struct("<H")
_FUSED_FIXED: Final = struct.Struct("<HHHHII")
_FA_WINDOW: Final = struct.Struct("<i")
# Compact the receive buffer once this much of it has been consumed.
_COMPACT_AT = 1 << 16


@dataclass(frozen=True, slots=True)
class Frame:
    opcode: int
    body: bytes | memoryview


def encode_frame(status: int, body: bytes | memoryview = b"") -> list[bytes | memoryview]:
    """A reply frame as buffers for ``writelines`` (the body is not copied)."""
    size = body.nbytes if isinstance(body, memoryview) else len(body)
    return [HEADER.pack(MAGIC, status, size), body] if size else [HEADER.pack(MAGIC, status, 0)]


class FrameParser:
    """Bytes in, :class:`Frame` out; see the module docstring.

    ``max_body`` is read when a header is parsed, so the caller may lower it (before
    authentication) or raise it between frames."""

    def __init__(self, max_body: int) -> None:
        self.max_body = max_body
        self._buf = bytearray()
        self._pos = 0
        self._error: FrameError | None = None

    def feed(self, data: bytes) -> None:
        if self._error is None:
            self._buf += data

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned as a frame."""
        return len(self._buf) - self._pos

    def truncated(self) -> str | None:
        """At end of input: what a partial frame lacks, or None when there is none."""
        left = self.buffered
        if left == 0 or self._error is not None:
            return None
        if left < HEADER.size:
            return f"truncated frame: {left} of {HEADER.size} header bytes"
        _, _, size = HEADER.unpack_from(self._buf, self._pos)
        return f"truncated frame: {left - HEADER.size} of {size} body bytes"

    def next(self) -> Frame | None:
        if self._error is not None:
            raise self._error
        left = self.buffered
        pos = self._pos
        if left >= 2 and self._buf[pos : pos + 2] != _MAGIC_BYTES:
            got = int.from_bytes(self._buf[pos : pos + 2], "little")
            self._fail(f"bad magic 0x{got:04X} (want 0x{MAGIC:04X})")
        if left < HEADER.size:
            return None
        _, opcode, size = HEADER.unpack_from(self._buf, pos)
        if size > self.max_body:
            self._fail(f"body length {size} exceeds the limit of {self.max_body} bytes")
        end = pos + HEADER.size + size
        if len(self._buf) < end:
            return None
        body: bytes | memoryview
        if pos == 0 and end == len(self._buf):
            # The buffer is exactly this frame: hand it over instead of copying it.
            body = memoryview(self._buf)[HEADER.size :]
            self._buf = bytearray()
            self._pos = 0
        else:
            body = bytes(self._buf[pos + HEADER.size : end])
            self._pos = end
            if self._pos >= _COMPACT_AT or self._pos == len(self._buf):
                del self._buf[: self._pos]
                self._pos = 0
        return Frame(opcode, body)

    def _fail(self, message: str) -> NoReturn:
        self._error = FrameError(message)
        self._buf = bytearray()
        self._pos = 0
        raise self._error


def parse_query_fused(body: bytes | memoryview) -> FusedQuery:
    """The QUERY_FUSED request in ``body`` (blobs are views of it); BodyError when the
    body does not hold what its own fields declare."""
    view = memoryview(body).cast("B")
    if len(view) < _SID_LEN.size:
        raise BodyError("unparsable body: shorter than its session id length")
    (sid_len,) = _SID_LEN.unpack_from(view, 0)
    if not 1 <= sid_len <= MAX_SID_LEN:
        raise BodyError(f"unparsable body: session id length {sid_len} (want 1..{MAX_SID_LEN})")
    fixed_at = _SID_LEN.size + sid_len
    data_at = fixed_at + _FUSED_FIXED.size
    if len(view) < data_at:
        raise BodyError("unparsable body: shorter than its fixed fields")
    sid = bytes(view[_SID_LEN.size : fixed_at])
    layer, h_q, d, h_kv, m, s_suf = _FUSED_FIXED.unpack_from(view, fixed_at)
    q_bytes = h_q * m * d * 4
    kv_bytes = h_kv * s_suf * d * 4
    need = data_at + q_bytes + 2 * kv_bytes + h_q
    extra = len(view) - need
    if extra not in (0, _FA_WINDOW.size):
        raise BodyError(
            f"unparsable body: {len(view)} bytes, but its fields declare {need} "
            f"(or {need + _FA_WINDOW.size} with fa_window)"
        )
    at = data_at
    q = view[at : at + q_bytes]
    at += q_bytes
    k_suf = view[at : at + kv_bytes]
    at += kv_bytes
    v_suf = view[at : at + kv_bytes]
    at += kv_bytes
    head_map = view[at : at + h_q]
    at += h_q
    fa_window = _FA_WINDOW.unpack_from(view, at)[0] if extra else -1
    return FusedQuery(sid, layer, h_q, d, s_suf, h_kv, q, k_suf, v_suf, head_map, fa_window, m)
