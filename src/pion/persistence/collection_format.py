"""Ops 30 (LIST) and 31 (SET_OF) of the keyspace's records: a key, a change byte, then
the change's fields (``keyspace_format.py`` specifies them byte by byte, the changes of
a stream are ``stream_format.py``'s).
"""

from __future__ import annotations

from typing import Final

from pion.keyspace import (
    CopyToDb,
    KeyMutation,
    ListInsert,
    ListMove,
    ListPop,
    ListPush,
    ListRemove,
    ListReplace,
    ListSet,
    ListTrim,
    MoveKey,
    SelectDb,
    SetAdd,
    SetFieldTTLs,
    SetMove,
    SetRemove,
    SetReplace,
    StreamChange,
    SwapDbs,
)
from pion.keyspace.mutations import Payload
from pion.persistence.format import FormatError
from pion.persistence.keyspace_fields import I64, U8, U32, U64, Parts, Reader, names
from pion.persistence.stream_format import FIRST_CHANGE, decode_stream, encode_stream

__all__ = ["decode_collection", "encode_collection"]

_SET_CHANGES: Final = {SetAdd: 1, SetRemove: 2, SetReplace: 3}
_HFIELDTTL: Final = 5


def encode_collection(m: KeyMutation, p: Parts) -> None:
    """Ops 30 (LIST) and 31 (SET_OF): the key, the change, its fields."""
    if isinstance(m, ListMove):
        p.blob(m.source)
        p.raw(U8.pack(9 + (0 if m.from_left else 2) + (0 if m.to_left else 1)))
        p.blob(m.destination)
    elif isinstance(m, SetMove):
        p.blob(m.source)
        p.raw(U8.pack(4))
        p.blob(m.destination)
        p.blob(m.member)
    elif isinstance(m, (ListPush, ListReplace, SetAdd, SetRemove, SetReplace)):
        p.blob(m.key)
        names: tuple[Payload, ...]
        if isinstance(m, ListPush):
            p.raw(U8.pack(1 if m.left else 2))
            names = m.items
        elif isinstance(m, ListReplace):
            p.raw(U8.pack(13))
            names = m.items
        else:
            p.raw(U8.pack(_SET_CHANGES[type(m)]))
            names = m.members
        p.raw(U32.pack(len(names)))
        for name in names:
            p.blob(name)
    elif isinstance(m, ListPop):
        p.blob(m.key)
        p.raw(U8.pack(3 if m.left else 4) + U32.pack(m.count))
    elif isinstance(m, (ListSet, ListInsert)):
        p.blob(m.key)
        p.raw(U8.pack(5 if isinstance(m, ListSet) else 6) + U64.pack(m.index))
        p.blob(m.value)
    elif isinstance(m, ListTrim):
        p.blob(m.key)
        p.raw(U8.pack(7) + U64.pack(m.start) + U64.pack(m.stop))
    elif isinstance(m, ListRemove):
        p.blob(m.key)
        p.raw(U8.pack(8) + I64.pack(m.count))
        p.blob(m.element)
    elif isinstance(m, SetFieldTTLs):
        p.blob(m.key)
        p.raw(U8.pack(_HFIELDTTL) + U32.pack(len(m.items)))
        for field, deadline in m.items:
            p.blob(field)
            p.raw(I64.pack(deadline))
        p.raw(U32.pack(len(m.values)))
        for field, value in m.values:
            p.blob(field)
            p.blob(value)
    elif isinstance(m, (SelectDb, MoveKey, SwapDbs, CopyToDb)):
        _encode_db_change(m, p)
    elif isinstance(m, StreamChange):
        change, body = encode_stream(m.change)
        p.blob(m.key)
        p.raw(U8.pack(change))
        p.tail(body, len(body))


def _field_ttls(key: bytes, r: Reader) -> SetFieldTTLs:
    """Change 5 of op 31 (its counts may be 0, each checked against the bytes left)."""
    n = r.u32()
    if n * 12 > r.left():
        raise FormatError(f"count {n} does not fit the {r.left()} bytes left")
    items = tuple((r.key(), r.deadline()) for _ in range(n))
    m = r.u32()
    if m * 8 > r.left():
        raise FormatError(f"count {m} does not fit the {r.left()} bytes left")
    return SetFieldTTLs(key, items, tuple((r.key(), r.blob()) for _ in range(m)))


def decode_collection(of_set: bool, r: Reader) -> KeyMutation:
    """The record of op 31 (``of_set``) or 30 (see the module docstring)."""
    key = r.key()
    change = int(r.unpack(U8))
    if of_set:
        if change >= FIRST_CHANGE:
            return StreamChange(key, decode_stream(change, r.rest()))
        if change == 1:
            return SetAdd(key, names(r))
        if change == 2:
            return SetRemove(key, names(r))
        if change == 3:
            return SetReplace(key, names(r))
        if change == 4:
            destination = r.key()
            return SetMove(key, destination, r.key())
        if change == _HFIELDTTL:
            return _field_ttls(key, r)
        if change in _DB_CHANGES:
            return _decode_db_change(key, change, r)
        raise FormatError(f"unknown SET_OF change {change}")
    if change in (1, 2):
        return ListPush(key, change == 1, tuple(r.blob() for _ in range(r.count(4))))
    if change in (3, 4):
        return ListPop(key, change == 3, r.u32())
    if change in (5, 6):
        index = int(r.unpack(U64))
        value = r.blob()
        return ListSet(key, index, value) if change == 5 else ListInsert(key, index, value)
    if change == 7:
        start = int(r.unpack(U64))
        return ListTrim(key, start, int(r.unpack(U64)))
    if change == 8:
        count = int(r.unpack(I64))
        return ListRemove(key, count, r.key())
    if 9 <= change <= 12:
        k = change - 9
        return ListMove(key, r.key(), k < 2, k % 2 == 0)
    if change == 13:
        return ListReplace(key, tuple(r.blob() for _ in range(r.count(4))))
    raise FormatError(f"unknown LIST change {change}")


# Changes 6..9 of op 31: the records of the numbered databases (SELECT, MOVE, SWAPDB,
# COPY ... DB). SELECT and SWAPDB name no key: their key blob is empty.
_SELECT: Final = 6
_MOVE: Final = 7
_SWAPDB: Final = 8
_COPYDB: Final = 9
_DB_CHANGES: Final = frozenset({_SELECT, _MOVE, _SWAPDB, _COPYDB})


def _encode_db_change(m: SelectDb | MoveKey | SwapDbs | CopyToDb, p: Parts) -> None:
    if isinstance(m, SelectDb):
        p.blob(b"")
        p.raw(U8.pack(_SELECT) + U32.pack(m.db))
    elif isinstance(m, MoveKey):
        p.blob(m.key)
        p.raw(U8.pack(_MOVE) + U32.pack(m.db))
    elif isinstance(m, SwapDbs):
        p.blob(b"")
        p.raw(U8.pack(_SWAPDB) + U32.pack(m.a) + U32.pack(m.b))
    else:
        p.blob(m.source)
        p.raw(U8.pack(_COPYDB) + U32.pack(m.db))
        p.blob(m.destination)


def _decode_db_change(key: bytes, change: int, r: Reader) -> KeyMutation:
    if change == _SELECT:
        return SelectDb(r.u32())
    if change == _MOVE:
        return MoveKey(key, r.u32())
    if change == _SWAPDB:
        a = r.u32()
        return SwapDbs(a, r.u32())
    db = r.u32()
    return CopyToDb(key, r.key(), db)
