"""The request decoder's batch fast path and its large-bulk buffer, in pure Python.

Both have a compiled twin in ``_speedups.c`` (built when a C compiler is present at
install time, optional otherwise); :data:`scan` and :data:`BulkWriter` name whichever
is in use, and :data:`COMPILED` says which. The two implementations have one contract,
written here, and the tests hold both to it.

``scan(buf, pos, max_args, max_bulk, max_frame, max_cmds) -> (commands, pos)``
    ``buf`` is any bytes-like object (the decoder scans a read where it landed, in
    the connection's scratch buffer, when nothing is pending). Parse complete,
    well-formed multibulk commands from ``buf[pos:]`` and stop at the first thing
    that is anything else: an incomplete frame, an inline command, a header
    that is malformed, signed, has a leading zero or exceeds a bound (``*N`` with
    ``N > max_args`` or ``N < 1``, ``$L`` with ``L > max_bulk``, a frame declaring more
    than ``max_frame`` payload bytes), a payload not followed by CRLF, or ``max_cmds``
    commands parsed. It never raises on input: it returns the commands before the stop
    and the offset of the stop (a frame boundary), where the decoder's exact parser
    takes over and reports any error in Redis's words. It can therefore only accept a
    subset of what the exact parser accepts.

``BulkWriter(size)``
    ``size`` bytes that a socket read fills in place (``writer.view()`` is a writable
    memoryview), :meth:`~BulkWriter.advance` counting what was written, then
    :meth:`~BulkWriter.take` hands over the filled ``bytes``. The compiled one fills the
    ``bytes`` object itself (no copy); this one fills a ``bytearray`` and copies once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["COMPILED", "BulkWriter", "PyBulkWriter", "py_scan", "scan"]

# A header longer than this many digits is never on the fast path (the compiled twin
# accumulates in a signed 64-bit integer).
_MAX_DIGITS = 18
_DIGITS = frozenset(b"0123456789")


def _read_len(buf: bytearray | bytes, p: int, e: int) -> tuple[int, int]:
    """The canonical decimal at ``p`` and the offset past its CRLF; ``(-1, -1)`` when
    the line is incomplete or not canonical."""
    end = buf.find(b"\r\n", p, min(e, p + _MAX_DIGITS + 2))
    if end <= p:
        return -1, -1
    digits = buf[p:end]
    if not digits.isdigit() or (digits[0] == 0x30 and len(digits) > 1):
        return -1, -1
    return int(digits), end + 2


def py_scan(  # noqa: PLR0917 - positional, as the compiled twin takes them
    buf: bytearray | bytes | memoryview,
    pos: int,
    max_args: int,
    max_bulk: int,
    max_frame: int,
    max_cmds: int,
) -> tuple[list[list[bytes]], int]:
    """The pure-Python :func:`scan` (see the module docstring)."""
    if isinstance(buf, memoryview):  # a read scanned where it landed: a copy here
        buf = buf.tobytes()
    out: list[list[bytes]] = []
    e = len(buf)
    p = pos
    while len(out) < max_cmds and p < e and buf[p] == 0x2A:  # '*'
        n, q = _read_len(buf, p + 1, e)
        if q < 0 or n < 1 or n > max_args:
            break
        cmd: list[bytes] = []
        r = q
        declared = 0
        for _ in range(n):
            if r >= e or buf[r] != 0x24:  # '$'
                break
            size, r = _read_len(buf, r + 1, e)
            if r < 0 or size > max_bulk:
                break
            declared += size
            stop = r + size
            if declared > max_frame or e < stop + 2 or buf[stop : stop + 2] != b"\r\n":
                break
            cmd.append(bytes(buf[r:stop]))
            r = stop + 2
        if len(cmd) < n:
            break
        out.append(cmd)
        p = r
    return out, p


class PyBulkWriter:
    """The pure-Python :class:`BulkWriter` (see the module docstring)."""

    __slots__ = ("_buf", "_taken", "filled")

    def __init__(self, size: int) -> None:
        if size < 0:
            raise ValueError("size must not be negative")
        self._buf: bytearray | None = bytearray(size)
        self.filled = 0

    def __len__(self) -> int:
        return 0 if self._buf is None else len(self._buf)

    def view(self) -> memoryview:
        """A writable view of the whole buffer."""
        if self._buf is None:
            raise BufferError("BulkWriter: already taken")
        return memoryview(self._buf)

    def advance(self, n: int) -> None:
        if self._buf is None or n < 0 or n > len(self._buf) - self.filled:
            raise ValueError("BulkWriter: advance past the end")
        self.filled += n

    def take(self) -> bytes:
        buf = self._buf
        if buf is None:
            raise RuntimeError("BulkWriter: already taken")
        if self.filled != len(buf):
            raise RuntimeError("BulkWriter: not filled yet")
        self._buf = None
        return bytes(buf)


if TYPE_CHECKING:
    scan = py_scan
    BulkWriter = PyBulkWriter
    COMPILED = False
else:
    try:
        from pion.resp._speedups import BulkWriter, scan
    except ImportError:  # no compiler at install time: the pure-Python twins
        scan = py_scan
        BulkWriter = PyBulkWriter
        COMPILED = False
    else:
        COMPILED = True
