"""Sans-IO decoder of client requests: RESP multibulk arrays and inline commands.

Invariant: whatever bytes are fed, :meth:`RequestDecoder.get` returns a complete
command (a list of ``bytes`` arguments), ``None`` for "need more data", or raises
:class:`pion.errors.ProtocolError`. It never raises anything else, never touches a
socket, and never buffers more than the limits allow: every ``*<n>`` and ``$<n>``
header is checked the moment its line is complete, before the promised payload is
waited for (as Redis's processMultibulkBuffer does). ``hiredis.Reader`` cannot refuse
a header before buffering its payload, which is why this decoder is our own; it is
checked against hiredis in a differential test.

Two paths, one grammar. At a frame boundary, :func:`pion.resp.scan.scan` (compiled
when a C compiler was present at install, else its pure-Python twin) parses a batch of
complete, well-formed, small commands in one call, and :meth:`RequestDecoder.get`
hands them out one by one; it stops at anything else (a partial frame, an inline
command, any header that is not canonical or is over a bound), and the exact parser
below takes over there, checking each header as it arrives and raising
``ProtocolError`` in Redis's words. The scanner accepts a subset of what the exact
parser accepts, and the bounds it is given are the decoder's own (the unauthenticated
ones before AUTH), so it can neither admit nor buffer anything the exact parser would
refuse. This is what makes small pipelined commands cost about what hiredis costs.

Large bulks (:data:`DIRECT_BULK_MIN` and up) are received in place: once the exact
parser has read their header, the payload's remaining bytes go straight into a buffer
of exactly their size (:meth:`RequestDecoder.get_buffer`, for an
``asyncio.BufferedProtocol``), which becomes the argument; nothing is grown, joined or
copied out of a receive buffer. The last :data:`_DIRECT_TAIL` bytes of such a payload
arrive through the caller's scratch buffer instead, so that no view the transport was
handed is alive when the argument is taken (a transport holds the buffer it filled until
``buffer_updated`` returns).

Lengths are read as Redis's string2ll reads them: digits only, no ``+``, no spaces and
no leading zeros (``$04`` and ``*01`` are protocol errors, as in Redis).

Until the connection has authenticated to a server with a password, the caller sets
:attr:`RequestDecoder.authenticated` to False and the tighter ``max_unauth_*`` limits
apply (Redis 7: ``unauthenticated multibulk length`` / ``unauthenticated bulk
length``). The flag is read when a header is checked, so setting it between two
:meth:`~RequestDecoder.get` calls governs the next command: an ``AUTH`` followed by a
big command in the same packet works.

Error texts follow Redis (``invalid multibulk length``, ``invalid bulk length``,
``expected '$', got 'x'``, ``too big inline request``, ``unbalanced quotes in
request``); the caller sends ``-ERR Protocol error: <text>`` and closes.
"""

from __future__ import annotations

from pion.errors import ProtocolError
from pion.resp.inline import split_inline
from pion.resp.limits import ProtocolLimits
from pion.resp.scan import BulkWriter, scan

__all__ = ["DIRECT_BULK_MIN", "SCRATCH_BYTES", "RequestDecoder", "split_inline"]

_CRLF = b"\r\n"
# A header line holds at most "*" + 20 digits; Redis refuses longer ones as too big.
_MAX_HEADER_LINE = 32
# Compact the buffer once this much has been consumed and it is over half dead.
_COMPACT_AT = 64 * 1024
# Bulks at least this big are received in place (module docstring). Redis's
# PROTO_MBULK_BIG_ARG, the size from which it reads an argument into a buffer of its
# own, is 32 KB; below 64 KiB the copy out of the receive buffer costs less than a
# buffer of its own.
DIRECT_BULK_MIN = 64 * 1024
# The last bytes of an in-place payload come through the scratch buffer (module
# docstring); any small number works, it only has to be at least 1.
_DIRECT_TAIL = 64
# The scratch buffer a caller of get_buffer should offer (one per event loop is
# enough: it is copied out at once): asyncio's own read size for stream transports
# (max_size of _SelectorSocketTransport), 256 KiB.
SCRATCH_BYTES = 256 * 1024
# Commands the scanner parses per call. Below ~700 live lists a batch never triggers a
# young-generation garbage collection; 256 keeps the per-call overhead negligible.
_SCAN_BATCH = 256


def _parse_len(line: bytes | bytearray | memoryview) -> int | None:
    """Parse a header's decimal length (after the type byte) as Redis's string2ll
    does; None if malformed (empty, a sign other than a leading ``-``, a leading
    zero, ``-0``, more than 19 digits)."""
    raw = bytes(line)
    body = raw[1:] if raw[:1] == b"-" else raw
    if not body.isdigit() or len(body) > 19 or (body[0] == 0x30 and (len(body) > 1 or raw != body)):
        return None
    return int(raw)


class RequestDecoder:
    """Incremental request parser. Feed bytes, then call :meth:`get` until None."""

    __slots__ = (
        "_args",
        "_args_bytes",
        "_buf",
        "_bulk_len",
        "_crlf_due",
        "_declared",
        "_direct",
        "_limits",
        "_pos",
        "_ready_bytes",
        "_remaining",
        "_to_direct",
        "authenticated",
        "ready",
    )

    def __init__(self, limits: ProtocolLimits | None = None) -> None:
        self._limits = limits or ProtocolLimits()
        self._buf = bytearray()
        self._pos = 0
        # State of a multibulk command being read across feeds.
        self._args: list[bytes] | None = None
        self._args_bytes = 0  # payload bytes already copied into _args
        self._remaining = 0
        self._bulk_len = -1  # -1: waiting for the next "$<n>" header
        self._declared = 0  # bytes promised so far by this command's bulk headers
        # A large bulk being received in place, and whether its CRLF is still due.
        self._direct: BulkWriter | None = None
        self._crlf_due = False
        # Whether the buffer get_buffer() handed out last was the in-place bulk's.
        self._to_direct = False
        # Commands the scanner parsed and get() has not handed out yet, last first,
        # and the wire bytes they came from (for ``held``). A caller may take the
        # next ones from its end (``pop()``), as get() does: the connection's runs
        # of plain commands (``pion.server.batch``).
        self.ready: list[list[bytes]] = []
        self._ready_bytes = 0
        # False while the connection owes a password: the max_unauth_* limits apply.
        self.authenticated = True

    @property
    def buffered(self) -> int:
        """Bytes received and not yet handed out as part of a command."""
        direct = self._direct.filled if self._direct is not None else 0
        return len(self._buf) - self._pos + direct + (self._ready_bytes if self.ready else 0)

    @property
    def held(self) -> int:
        """Bytes of memory this decoder holds for its client: the receive buffer, the
        arguments of a command still being read (an in-place bulk at its full size)
        and the parsed commands not yet handed out (the client's query buffer)."""
        ready = self._ready_bytes if self.ready else 0
        return len(self._buf) + self._args_bytes + ready

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Take received bytes (copied; the caller may reuse ``data``)."""
        direct = self._direct
        if direct is not None and direct.filled < len(direct):
            view = memoryview(data).cast("B")
            take = min(len(view), len(direct) - direct.filled)
            with direct.view() as target:
                target[direct.filled : direct.filled + take] = view[:take]
            direct.advance(take)
            data = view[take:]
        self._buf += data

    def get_buffer(self, scratch: memoryview) -> memoryview:
        """Where the next received bytes should be written (``asyncio.BufferedProtocol``):
        the rest of a large bulk being received in place, else ``scratch``, a buffer
        the caller owns (it may be shared; :meth:`buffer_updated` copies out of it)."""
        direct = self._direct
        if direct is not None and direct.filled < len(direct) - _DIRECT_TAIL:
            self._to_direct = True
            with direct.view() as whole:
                return whole[direct.filled : len(direct) - _DIRECT_TAIL]
        self._to_direct = False
        return scratch

    def buffer_updated(self, scratch: memoryview, nbytes: int) -> None:
        """``nbytes`` were written into the buffer :meth:`get_buffer` returned last."""
        if self._to_direct and self._direct is not None:
            self._direct.advance(nbytes)
            return
        view = scratch[:nbytes]
        if (
            nbytes
            and view[0] == 0x2A  # '*'
            and not self._buf
            and self._args is None
            and not self.ready
        ):
            # Nothing pending: scan the read where it landed, and keep only what the
            # scanner left (usually nothing) instead of copying the whole read first.
            max_args, max_bulk = self._scan_limits()
            limit = self._limits.max_query_buffer
            cmds, pos = scan(view, 0, max_args, max_bulk, limit, _SCAN_BATCH)
            if cmds:
                if pos < nbytes:
                    self._buf += view[pos:]
                cmds.reverse()
                self.ready = cmds
                self._ready_bytes = pos
                return
        self.feed(view)

    def clear(self) -> None:
        """Drop everything held (the connection is gone)."""
        self._buf = bytearray()
        self._pos = 0
        self._args = None
        self._args_bytes = 0
        self._remaining = 0
        self._bulk_len = -1
        self._declared = 0
        self._direct = None
        self._crlf_due = False
        self.ready = []
        self._ready_bytes = 0

    def _too_many(self, count: int) -> str | None:
        """The error for a ``*<count>`` header, or None if it is allowed."""
        limits = self._limits
        if count > limits.max_array_len:
            return "invalid multibulk length"
        if count > limits.max_unauth_array_len and not self.authenticated:
            return "unauthenticated multibulk length"
        return None

    def _max_bulk(self) -> int:
        limits = self._limits
        if self.authenticated:
            return limits.max_bulk_len
        return min(limits.max_bulk_len, limits.max_unauth_bulk_len)

    def _bulk_error(self, n: int) -> str:
        if n > self._limits.max_bulk_len:
            return "invalid bulk length"
        return "unauthenticated bulk length"

    def get(self) -> list[bytes] | None:
        """The next complete command, or None when more bytes are needed."""
        ready = self.ready
        if ready:
            return ready.pop()
        if self._args is None and self._pos >= len(self._buf):
            # Everything handed out (the common case after a batch): nothing to parse.
            if self._pos:
                self._compact()
            return None
        return self._parse()

    def _parse(self) -> list[bytes] | None:
        while True:
            if self._args is not None:
                cmd = self._continue_multibulk()
                if cmd is None:
                    self._compact()
                    return None
                if cmd:
                    return cmd
                continue  # an empty multibulk (*0): skipped, as Redis does
            if self._pos >= len(self._buf):
                self._compact()
                return None
            if self._buf[self._pos] == 0x2A:  # '*'
                batch = self._scan()
                if batch is not None:
                    return batch
                if not self._start_multibulk():
                    self._compact()
                    return None
                continue
            inline = self._read_inline()
            if inline is None:
                self._compact()
                return None
            if inline:
                return inline

    # -- multibulk --------------------------------------------------------------

    def _scan(self) -> list[bytes] | None:
        """Run the batch fast path at a frame boundary: the first command it parsed
        (the rest wait in ``ready``), or None when it parsed none."""
        max_args, max_bulk = self._scan_limits()
        start = self._pos
        cmds, self._pos = scan(
            self._buf, start, max_args, max_bulk, self._limits.max_query_buffer, _SCAN_BATCH
        )
        if not cmds:
            return None
        if len(cmds) > 1:
            cmds.reverse()
            self.ready = cmds
            self._ready_bytes = self._pos - start
            return cmds.pop()
        return cmds[0]

    def _scan_limits(self) -> tuple[int, int]:
        """The scanner's ``(max_args, max_bulk)``: the decoder's bounds (the
        unauthenticated ones before AUTH), and bulks small enough not to be received
        in place."""
        limits = self._limits
        max_args = limits.max_array_len
        max_bulk = min(limits.max_bulk_len, DIRECT_BULK_MIN - 1)
        if not self.authenticated:
            max_args = min(max_args, limits.max_unauth_array_len)
            max_bulk = min(max_bulk, limits.max_unauth_bulk_len)
        return max_args, max_bulk

    def _start_multibulk(self) -> bool:
        buf, pos = self._buf, self._pos
        end = buf.find(_CRLF, pos, pos + _MAX_HEADER_LINE + 2)
        if end < 0:
            if len(buf) - pos > _MAX_HEADER_LINE + 1:
                raise ProtocolError("too big mbulk count string")
            return False
        digits = buf[pos + 1 : end]
        # The common case inline (this runs once per request); signs, leading zeros
        # and junk below.
        if digits.isdigit() and len(digits) <= 19 and (digits[0] != 0x30 or len(digits) == 1):
            count: int | None = int(digits)
        else:
            count = _parse_len(digits)
        if count is None:
            raise ProtocolError("invalid multibulk length")
        refusal = self._too_many(count)
        if refusal is not None:
            raise ProtocolError(refusal)
        self._pos = end + 2
        self._args = []
        # *0 and *-1 are empty commands, skipped as Redis does.
        self._remaining = max(count, 0)
        self._bulk_len = -1
        self._declared = 0
        return True

    def _continue_multibulk(self) -> list[bytes] | None:
        """Read as many arguments as the buffer holds. This is the hot path of every
        request, so it works on locals and checks each header inline."""
        args = self._args
        if args is None:  # pragma: no cover - the caller checks
            return None
        if (self._direct is not None or self._crlf_due) and not self._finish_direct(args):
            return None
        buf = self._buf
        size = len(buf)
        pos = self._pos
        remaining = self._remaining
        n = self._bulk_len
        max_bulk = self._max_bulk()
        try:
            while remaining > 0:
                if n < 0:
                    if pos >= size:
                        return None
                    if buf[pos] != 0x24:  # '$'
                        raise ProtocolError(f"expected '$', got '{chr(buf[pos])}'")
                    end = buf.find(_CRLF, pos, pos + _MAX_HEADER_LINE + 2)
                    if end < 0:
                        if size - pos > _MAX_HEADER_LINE + 1:
                            raise ProtocolError("too big bulk count string")
                        return None
                    digits = buf[pos + 1 : end]
                    # Strict: digits only (no sign, space or '_', which int() takes),
                    # and no leading zero, as Redis's string2ll.
                    if (
                        not digits.isdigit()
                        or len(digits) > 19
                        or (digits[0] == 0x30 and len(digits) > 1)
                    ):
                        raise ProtocolError("invalid bulk length")
                    n = int(digits)
                    if n > max_bulk:
                        raise ProtocolError(self._bulk_error(n))
                    self._declared += n
                    if self._declared > self._limits.max_query_buffer:
                        raise ProtocolError("command exceeds the query buffer limit")
                    pos = end + 2
                stop = pos + n
                if size < stop + 2:
                    if n >= DIRECT_BULK_MIN and size - pos < n:
                        # Receive the rest in place (module docstring).
                        self._start_direct(pos, size, n)
                        pos = size
                        n = -1
                        remaining -= 1
                    return None
                if buf[stop] != 0x0D or buf[stop + 1] != 0x0A:
                    raise ProtocolError("bulk payload not terminated by CRLF")
                if n < 4096:
                    args.append(bytes(buf[pos:stop]))
                else:
                    # One copy out of the receive buffer; the view is released at once
                    # so the buffer can still be resized.
                    with memoryview(buf) as view:
                        args.append(bytes(view[pos:stop]))
                self._args_bytes += n
                pos = stop + 2
                n = -1
                remaining -= 1
        finally:
            self._pos = pos
            self._remaining = remaining
            self._bulk_len = n
        self._args = None
        self._args_bytes = 0
        return args

    def _start_direct(self, pos: int, size: int, n: int) -> None:
        """Move the payload bytes already here into a buffer of the bulk's size; the
        rest will be received into it (``get_buffer``) or copied in (``feed``)."""
        direct = BulkWriter(n)
        with direct.view() as target, memoryview(self._buf) as source:
            target[: size - pos] = source[pos:size]
        direct.advance(size - pos)
        self._direct = direct
        self._args_bytes += n

    def _finish_direct(self, args: list[bytes]) -> bool:
        """Complete the in-place bulk if all of it is here, then its CRLF; False while
        more bytes are needed. The bulk was counted in ``_remaining`` already."""
        direct = self._direct
        if direct is not None:
            if direct.filled < len(direct):
                return False
            args.append(direct.take())
            self._direct = None
            self._crlf_due = True
        pos = self._pos
        if len(self._buf) - pos < 2:
            return False
        if self._buf[pos] != 0x0D or self._buf[pos + 1] != 0x0A:
            raise ProtocolError("bulk payload not terminated by CRLF")
        self._pos = pos + 2
        self._crlf_due = False
        return True

    # -- inline -----------------------------------------------------------------

    def _read_inline(self) -> list[bytes] | None:
        buf, pos = self._buf, self._pos
        limit = self._limits.max_inline_len
        end = buf.find(b"\n", pos, pos + limit + 1)
        if end < 0:
            if len(buf) - pos > limit:
                raise ProtocolError("too big inline request")
            return None
        line = bytes(buf[pos:end])
        self._pos = end + 1
        if line.endswith(b"\r"):
            line = line[:-1]
        return split_inline(line)

    def _compact(self) -> None:
        if self._pos and (self._pos >= len(self._buf) or self._pos > _COMPACT_AT):
            del self._buf[: self._pos]
            self._pos = 0
