"""Inline commands (a request line without RESP framing, as ``telnet`` or
``redis-cli`` in inline mode sends): splitting the line into arguments with Redis's
``sdssplitargs`` rules. The decoder (``decoder.py``) finds the line; this module only
splits it.
"""

from __future__ import annotations

from pion.errors import ProtocolError

__all__ = ["split_inline"]

_ESCAPES = {
    ord("n"): b"\n",
    ord("r"): b"\r",
    ord("t"): b"\t",
    ord("b"): b"\b",
    ord("a"): b"\a",
}
_HEX = b"0123456789abcdefABCDEF"
_SPACE = b" \t\n\r\v\f"


def split_inline(line: bytes) -> list[bytes]:
    """Split an inline command line into arguments with Redis's sdssplitargs rules:
    whitespace separates; "double quotes" support \\n \\r \\t \\b \\a \\xHH and
    backslash escapes; 'single quotes' support \\'; a closing quote must be followed
    by whitespace or the end."""
    out: list[bytes] = []
    i, n = 0, len(line)
    while True:
        while i < n and line[i] in _SPACE:
            i += 1
        if i >= n:
            return out
        cur = bytearray()
        quote = 0
        while True:
            if i >= n:
                if quote:
                    raise ProtocolError("unbalanced quotes in request")
                break
            c = line[i]
            if quote == 0x22:  # inside "..."
                if (
                    c == 0x5C
                    and i + 3 < n
                    and line[i + 1] == 0x78
                    and (line[i + 2] in _HEX and line[i + 3] in _HEX)
                ):
                    cur.append(int(line[i + 2 : i + 4], 16))
                    i += 4
                    continue
                if c == 0x5C and i + 1 < n:
                    nxt = line[i + 1]
                    cur += _ESCAPES.get(nxt, bytes([nxt]))
                    i += 2
                    continue
                if c == 0x22:
                    if i + 1 < n and line[i + 1] not in _SPACE:
                        raise ProtocolError("unbalanced quotes in request")
                    i += 1
                    break
                cur.append(c)
                i += 1
            elif quote == 0x27:  # inside '...'
                if c == 0x5C and i + 1 < n and line[i + 1] == 0x27:
                    cur.append(0x27)
                    i += 2
                    continue
                if c == 0x27:
                    if i + 1 < n and line[i + 1] not in _SPACE:
                        raise ProtocolError("unbalanced quotes in request")
                    i += 1
                    break
                cur.append(c)
                i += 1
            else:
                if c in _SPACE:
                    break
                if c in (0x22, 0x27):
                    quote = c
                    i += 1
                    continue
                cur.append(c)
                i += 1
        out.append(bytes(cur))
