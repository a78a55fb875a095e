"""Values across the Lua boundary, as Redis 7 converts them (``script_lua.c``).

A command's reply reaches Lua through its RESP bytes (encoded for the script's
protocol, ``redis.setresp``), so what a script sees is exactly what a client speaking
that protocol would: RESP2 integer -> number, bulk -> string, null -> false, array ->
table, status -> ``{ok=...}``, error -> ``{err=...}``; RESP3 adds null -> nil,
booleans, ``{double=n}``, ``{map={...}}``, ``{set={...}}``, ``{big_number=s}`` and
``{verbatim_string={format=f, string=s}}``.

A script's return value becomes the reply: a number is truncated to an integer, a
string is a bulk string, a table is an array that stops at its first nil, unless it
carries ``err`` (an error), ``ok`` (a status) or, for RESP3 shapes, ``double``,
``map``, ``set`` or ``big_number``; true is 1 and false a null under RESP2 scripts
(booleans under RESP3); nil is a null.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pion.resp.reply import Encoded, ErrorReply, Reply, Simple

__all__ = ["from_lua", "resp_to_lua"]

_MAX_DEPTH = 1000


def resp_to_lua(lua: Any, data: bytes, proto: int) -> tuple[bool, Any]:
    """The Lua value of one complete RESP reply ``data``; ``(False, {err=...})`` when
    the reply is an error."""
    value, _ = _parse(lua, data, 0, proto)
    if data[:1] == b"-":
        return False, value
    return True, value


def _line(data: bytes, pos: int) -> tuple[bytes, int]:
    end = data.index(b"\r\n", pos)
    return data[pos + 1 : end], end + 2


def _parse(lua: Any, data: bytes, pos: int, proto: int) -> tuple[Any, int]:
    kind = data[pos : pos + 1]
    body, pos = _line(data, pos)
    if kind == b"+":
        return lua.table_from({b"ok": body}), pos
    if kind == b"-":
        return lua.table_from({b"err": body}), pos
    if kind == b":":
        return int(body), pos
    if kind in (b"$", b"="):
        n = int(body)
        if n < 0:
            return False, pos
        text, pos = data[pos : pos + n], pos + n + 2
        if kind == b"=":
            inner = {b"format": text[:3], b"string": text[4:]}
            return lua.table_from({b"verbatim_string": lua.table_from(inner)}), pos
        return text, pos
    if kind == b"_":
        return None, pos
    if kind == b"#":
        return body == b"t", pos
    if kind == b",":
        return lua.table_from({b"double": float(body)}), pos
    if kind == b"(":
        return lua.table_from({b"big_number": body}), pos
    n = int(body)
    if kind == b"*" and n < 0:
        return False, pos
    if kind == b"%":
        items: dict[Any, Any] = {}
        for _ in range(n):
            k, pos = _parse(lua, data, pos, proto)
            v, pos = _parse(lua, data, pos, proto)
            items[k] = v
        return lua.table_from({b"map": lua.table_from(items)}), pos
    elems: dict[Any, Any] = {}
    for i in range(n):
        v, pos = _parse(lua, data, pos, proto)
        elems[v if kind == b"~" else i + 1] = True if kind == b"~" else v
    table = lua.table_from(elems)
    if kind == b"~":
        return lua.table_from({b"set": table}), pos
    return table, pos


def from_lua(
    value: Any,
    resp: int,
    depth: int = 0,
    negative_zero: Callable[[Any], bool] | None = None,
) -> Reply:
    """A script's return value (or an element of it) as the reply to send; ``resp``
    is the script's protocol (``redis.setresp``). ``negative_zero(t)``: whether the
    table ``t``'s ``double`` is -0.0 (lupa gives Lua's -0.0 as the integer 0; Redis
    writes it ``-0``)."""
    from lupa.lua51 import lua_type

    if value is True or value is False:
        if resp == 2:
            return 1 if value else None
        return value
    if isinstance(value, (int, float)):
        return _truncate(value)
    if isinstance(value, bytes):
        return value
    if value is None or lua_type(value) != "table" or depth > _MAX_DEPTH:
        return None
    err = value[b"err"]
    if isinstance(err, bytes):
        return ErrorReply(err.decode("utf-8", "replace").replace("\r", " ").replace("\n", " "))
    ok = value[b"ok"]
    if isinstance(ok, bytes):
        return Simple(ok.decode("utf-8", "replace").replace("\r", " ").replace("\n", " "))
    double = value[b"double"]
    if isinstance(double, (int, float)):
        if double == 0 and negative_zero is not None and negative_zero(value):
            return -0.0
        return float(double)
    big = value[b"big_number"]
    if isinstance(big, bytes):
        return Encoded(b"(" + big + b"\r\n") if resp == 3 else big
    shape = value[b"map"]
    if shape is not None and lua_type(shape) == "table":
        return {_key(k): from_lua(v, resp, depth + 1, negative_zero) for k, v in shape.items()}
    out: list[Reply] = []
    i = 1
    while True:
        item = value[i]
        if item is None:
            break
        out.append(from_lua(item, resp, depth + 1, negative_zero))
        i += 1
    return out


def _truncate(value: float) -> int:
    """C's (long long) cast of a Lua number, as on x86-64."""
    if not -(2.0**63) <= value < 2.0**63:  # NaN too: x86's cvttsd2si gives INT64_MIN
        return -(2**63)
    return int(value)


def _key(k: Any) -> str | bytes:
    return k if isinstance(k, bytes) else str(from_lua(k, 3))
