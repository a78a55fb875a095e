"""The libraries Redis ships into its Lua state, written in Python for the sandbox's
prelude (``pion.scripting.sandbox``): ``cjson`` (encode, decode), ``struct`` (pack,
unpack, size: Roberto Ierusalimschy's struct library's formats), ``bit`` (LuaBitOp's
32-bit operations), the 48-bit generator behind ``math.random``, and ``sha1hex``.

Each function takes Lua strings (bytes), numbers and tables, and returns only those
(tables built through the runtime), or ``(False, message)`` for the prelude to raise
as the Lua error: no Python exception crosses into Lua.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import struct as pystruct
from collections.abc import Callable
from typing import Any

from lupa.lua51 import lua_type

__all__ = ["Libraries"]

_ESCAPES = {0x22: b'\\"', 0x5C: b"\\\\", 0x2F: b"\\/", 8: b"\\b", 12: b"\\f", 10: b"\\n"}
_ESCAPES |= {13: b"\\r", 9: b"\\t"}
_ESCAPE_TABLE = [
    _ESCAPES.get(i, b"\\u%04x" % i if i < 0x20 or i == 0x7F else bytes([i])) for i in range(256)
]


def fmt_number(value: float) -> bytes:
    """Lua 5.1's ``%.14g`` (what tostring and cjson print)."""
    return (b"%.14g" % value).replace(b"inf", b"inf")


class Libraries:
    """The Python halves of the libraries, bound to one Lua runtime."""

    def __init__(self, lua: Any) -> None:
        self.lua = lua
        self.is_null: Any = None
        self.null: Any = None
        self._seed(0)

    # -- math.random: rand48 as Redis's redisLrand48 -------------------------------

    def _seed(self, seed: int) -> None:
        self._x = ((int(seed) & 0xFFFFFFFF) << 16) | 0x330E

    def random(self) -> float:
        self._x = (0x5DEECE66D * self._x + 0xB) & 0xFFFFFFFFFFFF
        return ((self._x >> 17) % 2147483647) / 2147483647

    def seed(self, value: float) -> None:
        self._seed(int(value))

    # -- sha1hex ---------------------------------------------------------------------

    @staticmethod
    def sha1(data: bytes) -> bytes:
        return hashlib.sha1(data).hexdigest().encode()

    # -- cjson -----------------------------------------------------------------------

    def json_encode(self, value: Any, is_null: Any = None, null: Any = None) -> tuple[bool, Any]:
        if is_null is not None:  # the prelude hands cjson.null and its test over once
            self.is_null, self.null = is_null, null
            return True, None
        out: list[bytes] = []
        try:
            self._enc(value, out, 0)
        except ValueError as exc:
            return False, str(exc).encode()
        return True, b"".join(out)

    def _enc(self, v: Any, out: list[bytes], depth: int) -> None:
        if depth > 1000:
            raise ValueError("Cannot serialise, excessive nesting (1001)")
        if v is None or (lua_type(v) == "table" and self.is_null(v)):
            out.append(b"null")
        elif v is True or v is False:
            out.append(b"true" if v else b"false")
        elif isinstance(v, (int, float)):
            if math.isnan(v) or math.isinf(v):
                raise ValueError("Cannot serialise number: must not be NaN or Inf")
            out.append(fmt_number(v))
        elif isinstance(v, bytes):
            out.append(b'"' + b"".join(_ESCAPE_TABLE[c] for c in v) + b'"')
        elif lua_type(v) == "table":
            items = list(v.items())
            keys = [k for k, _ in items]
            if items and all(isinstance(k, (int, float)) and k >= 1 and k == int(k) for k in keys):
                top = int(max(keys))
                if top > 10 and top > 2 * len(items):
                    raise ValueError("Cannot serialise table: excessively sparse array")
                out.append(b"[")
                for i in range(1, top + 1):
                    if i > 1:
                        out.append(b",")
                    self._enc(v[i], out, depth + 1)
                out.append(b"]")
                return
            out.append(b"{")
            for n, (k, item) in enumerate(items):
                if n:
                    out.append(b",")
                if isinstance(k, bytes):
                    self._enc(k, out, depth + 1)
                elif isinstance(k, (int, float)):
                    out.append(b'"' + fmt_number(k) + b'"')
                else:
                    raise ValueError("Cannot serialise table: table key must be a number or string")
                out.append(b":")
                self._enc(item, out, depth + 1)
            out.append(b"}")
        else:
            raise ValueError(f"Cannot serialise {lua_type(v) or 'userdata'}: type not supported")

    def json_decode(self, text: bytes) -> tuple[bool, Any]:
        try:
            parsed = json.loads(text.decode("utf-8", "surrogateescape"))
        except (ValueError, RecursionError):
            return False, b"Expected value but found invalid token"
        return True, self._to_lua(parsed)

    def _to_lua(self, v: Any) -> Any:
        if v is None:
            return self.null
        if isinstance(v, str):
            return v.encode("utf-8", "surrogateescape")
        if isinstance(v, list):
            return self.lua.table_from({i + 1: self._to_lua(x) for i, x in enumerate(v)})
        if isinstance(v, dict):
            return self.lua.table_from({k.encode(): self._to_lua(x) for k, x in v.items()})
        return v

    # -- struct ----------------------------------------------------------------------

    def struct(self, name: bytes, args: Any, n: int) -> tuple[Any, ...]:
        values = [args[i + 1] for i in range(int(n))]
        try:
            if name == b"size":
                return (True, _struct_size(values[0]))
            if name == b"pack":
                return (True, _struct_pack(values[0], values[1:]))
            return (True, *_struct_unpack(values[0], values[1], values[2] if n > 2 else 1))
        except (pystruct.error, ValueError, TypeError, IndexError, OverflowError) as exc:
            return (False, f"bad argument to 'struct.{name.decode()}' ({exc})".encode())

    # -- bit -------------------------------------------------------------------------

    def bit(self, name: bytes, args: Any, n: int) -> tuple[bool, Any]:
        try:
            values = [_tobit(args[i + 1]) for i in range(int(n))]
            op = _BIT_OPS[name.decode()]
            result = op(values)
        except (TypeError, ValueError, IndexError, KeyError):
            return False, b"bad argument to bit operation (number expected)"
        return True, result


def _tobit(v: Any) -> int:
    if isinstance(v, bytes):
        v = float(v)
    if not isinstance(v, (int, float)):
        raise TypeError("number expected")
    x = int(math.fmod(v, 2**32)) & 0xFFFFFFFF if not float(v).is_integer() else int(v) & 0xFFFFFFFF
    return x - (1 << 32) if x & 0x80000000 else x


def _s32(x: int) -> int:
    x &= 0xFFFFFFFF
    return x - (1 << 32) if x & 0x80000000 else x


def _tohex(v: list[int]) -> bytes:
    n = v[1] if len(v) > 1 else 8
    digits = "0123456789ABCDEF" if n < 0 else "0123456789abcdef"
    n = min(abs(n), 8)
    x = v[0] & 0xFFFFFFFF
    return "".join(digits[(x >> (4 * i)) & 15] for i in reversed(range(n))).encode()


def _fold(f: Callable[[int, int], int]) -> Callable[[list[int]], int]:
    def run(v: list[int]) -> int:
        acc = v[0]
        for x in v[1:]:
            acc = f(acc, x)
        return _s32(acc)

    return run


_BIT_OPS: dict[str, Callable[[list[int]], Any]] = {
    "tobit": lambda v: v[0],
    "tohex": _tohex,
    "bnot": lambda v: _s32(~v[0]),
    "band": _fold(lambda a, b: a & b),
    "bor": _fold(lambda a, b: a | b),
    "bxor": _fold(lambda a, b: a ^ b),
    "lshift": lambda v: _s32(v[0] << (v[1] & 31)),
    "rshift": lambda v: _s32((v[0] & 0xFFFFFFFF) >> (v[1] & 31)),
    "arshift": lambda v: _s32(v[0] >> (v[1] & 31)),
    "rol": lambda v: _s32(
        ((v[0] & 0xFFFFFFFF) << (v[1] & 31)) | ((v[0] & 0xFFFFFFFF) >> (32 - (v[1] & 31)))
    ),
    "ror": lambda v: _s32(
        ((v[0] & 0xFFFFFFFF) >> (v[1] & 31)) | ((v[0] & 0xFFFFFFFF) << (32 - (v[1] & 31)))
    ),
    "bswap": lambda v: _s32(int.from_bytes((v[0] & 0xFFFFFFFF).to_bytes(4, "little"), "big")),
}

# -- struct formats -------------------------------------------------------------------

_TOKEN = re.compile(rb"([<>!=])(\d*)|([bBhHlLTiIfdcs])(\d*)|(x)|( )")
_FIXED = {b"b": "b", b"B": "B", b"h": "h", b"H": "H", b"l": "q", b"L": "Q", b"T": "Q"}
_FIXED |= {b"f": "f", b"d": "d"}


def _tokens(fmt: bytes) -> list[tuple[str, bytes, int]]:
    pos, out = 0, []
    while pos < len(fmt):
        m = _TOKEN.match(fmt, pos)
        if m is None:
            raise ValueError(f"invalid format option '{chr(fmt[pos])}'")
        pos = m.end()
        if m.group(1):
            out.append(("endian", m.group(1), 0))
        elif m.group(3):
            out.append(("item", m.group(3), int(m.group(4)) if m.group(4) else -1))
        elif m.group(5):
            out.append(("pad", b"x", 1))
    return out


def _spec(endian: str, code: bytes, size: int) -> str:
    if code in (b"i", b"I"):
        n = 4 if size < 0 else size
        letter = {1: "b", 2: "h", 4: "i", 8: "q"}.get(n)
        if letter is None:
            raise ValueError(f"integral size {n} is not supported")
        return endian + (letter.upper() if code == b"I" else letter)
    return endian + _FIXED[code]


def _struct_size(fmt: bytes) -> int:
    total, endian = 0, "<"
    for kind, code, size in _tokens(fmt):
        if kind == "endian":
            endian = ">" if code == b">" else "<"
        elif kind == "pad":
            total += 1
        elif code in (b"s",):
            raise ValueError("options 's' has no fixed size")
        elif code == b"c":
            total += max(size, 0)
        else:
            total += pystruct.calcsize(_spec(endian, code, size))
    return total


def _struct_pack(fmt: bytes, values: list[Any]) -> bytes:
    out, endian, it = [], "<", iter(values)
    for kind, code, size in _tokens(fmt):
        if kind == "endian":
            endian = ">" if code == b">" else "<"
        elif kind == "pad":
            out.append(b"\0")
        elif code == b"s":
            out.append(bytes(next(it)) + b"\0")
        elif code == b"c":
            data = bytes(next(it))
            out.append(data if size < 0 else data[:size].ljust(size, b"\0"))
        else:
            spec = _spec(endian, code, size)
            v = next(it)
            out.append(pystruct.pack(spec, v if code in (b"f", b"d") else int(v)))
    return b"".join(out)


def _struct_unpack(fmt: bytes, data: bytes, start: Any) -> list[Any]:
    pos, endian = int(start) - 1, "<"
    out: list[Any] = []
    for kind, code, size in _tokens(fmt):
        if kind == "endian":
            endian = ">" if code == b">" else "<"
        elif kind == "pad":
            pos += 1
        elif code == b"s":
            end = data.index(b"\0", pos)
            out.append(data[pos:end])
            pos = end + 1
        elif code == b"c":
            n = len(data) - pos if size < 0 else size
            if pos + n > len(data):
                raise ValueError("data string too short")
            out.append(data[pos : pos + n])
            pos += n
        else:
            spec = _spec(endian, code, size)
            (v,) = pystruct.unpack_from(spec, data, pos)
            out.append(v)
            pos += pystruct.calcsize(spec)
    out.append(pos + 1)
    return out
