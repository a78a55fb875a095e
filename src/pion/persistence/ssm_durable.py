"""The SSM state blobs (``SSM.PREFIX.*``) as a durable store: records of op codes 32..33
in the shared write-ahead log, a snapshot ``pion.ssm.<w>`` written by the same SAVE.

Op codes and payloads (the framing, header and END record are ``format.py``'s; ``sid``
is ``[u16 n][n bytes]``, n in 1..MAX_SID_LEN; all integers little-endian)::

    32  SSM_STORE  sid, u16 layer, u64 nbytes, then nbytes of the blob, verbatim
                   (nbytes must equal the rest of the payload; 0 is a stored empty
                   blob, which is not the same as no blob)
    33  SSM_DROP   sid, u8 scope (1: every layer of sid, 2: one layer), u16 layer
                   (0 when the scope is every layer)

34..46 are reserved for the attention tier's state (the WARM slots themselves are
memory only: their durable copy is the V-store's prefix rows); 47 went to Redis
functions' libraries (``functions_format.py``). A snapshot holds one SSM_STORE per
blob; its END record counts them.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Final

from pion.persistence.format import Buffer, FormatError
from pion.persistence.stores import Frame, FrameSink
from pion.ssm import MAX_SSM_LAYER, SsmDrop, SsmMutation, SsmStore, SsmWrite
from pion.vstore import MAX_SID_LEN

__all__ = [
    "OP_SSM_DROP",
    "OP_SSM_STORE",
    "SSM_OPS",
    "SSM_UNIT_OPS",
    "SsmDurable",
    "decode_ssm",
    "describe_ssm",
    "ssm_frame",
]

OP_SSM_STORE: Final = 32
OP_SSM_DROP: Final = 33
SSM_OPS: Final[Mapping[int, str]] = MappingProxyType(
    {OP_SSM_STORE: "SSM_STORE", OP_SSM_DROP: "SSM_DROP"}
)
SSM_UNIT_OPS: Final = frozenset({OP_SSM_STORE})

_SID: Final = struct.Struct("<H")
_STORE: Final = struct.Struct("<HQ")
_DROP: Final = struct.Struct("<BH")
_ALL, _ONE = 1, 2


def _sid(sid: bytes) -> bytes:
    if not 1 <= len(sid) <= MAX_SID_LEN:
        raise FormatError(f"session id of {len(sid)} bytes (want 1..{MAX_SID_LEN})")
    return _SID.pack(len(sid)) + sid


def ssm_frame(m: SsmMutation) -> Frame:
    """The record of one mutation; a blob is passed through, not copied."""
    if isinstance(m, SsmWrite):
        return Frame(OP_SSM_STORE, (_sid(m.sid) + _STORE.pack(m.layer, len(m.blob)), m.blob))
    scope, layer = (_ALL, 0) if m.layer is None else (_ONE, m.layer)
    # Every SSM drop is a client's SSM.PREFIX.DROP (nothing evicts SSM state).
    return Frame(OP_SSM_DROP, (_sid(m.sid) + _DROP.pack(scope, layer),), drop=True)


def decode_ssm(op: int, payload: Buffer) -> SsmMutation:
    """The mutation a record holds (the blob copied out of ``payload``)."""
    view = memoryview(payload).cast("B")
    if len(view) < _SID.size:
        raise FormatError("SSM payload is shorter than its session id")
    (n,) = _SID.unpack_from(view, 0)
    if not 1 <= n <= MAX_SID_LEN or len(view) < _SID.size + n:
        raise FormatError(f"SSM session id length {n} (want 1..{MAX_SID_LEN}, within the payload)")
    sid = bytes(view[_SID.size : _SID.size + n])
    at = _SID.size + n
    if op == OP_SSM_STORE:
        if len(view) < at + _STORE.size:
            raise FormatError("SSM_STORE payload is shorter than its fields")
        layer, nbytes = _STORE.unpack_from(view, at)
        at += _STORE.size
        if nbytes != len(view) - at:
            raise FormatError(f"SSM_STORE declares {nbytes} blob bytes, holds {len(view) - at}")
        return SsmWrite(sid, layer, bytes(view[at:]))
    if op == OP_SSM_DROP:
        if len(view) != at + _DROP.size:
            raise FormatError("SSM_DROP payload has the wrong length")
        scope, layer = _DROP.unpack_from(view, at)
        if scope not in (_ALL, _ONE) or layer > MAX_SSM_LAYER:
            raise FormatError(f"SSM_DROP scope {scope} layer {layer}")
        return SsmDrop(sid, None if scope == _ALL else layer)
    raise FormatError(f"unknown op code {op}")


def describe_ssm(op: int, payload: Buffer) -> str:
    """The record's name for ``pion check-wal`` (decoding it completely)."""
    decode_ssm(op, payload)
    return SSM_OPS[op]


class _Journal:
    """The SSM store's journal: each mutation as a record to the log."""

    __slots__ = ("sink",)

    def __init__(self, sink: FrameSink) -> None:
        self.sink = sink

    def append_ssm(self, mutation: SsmMutation) -> None:
        self.sink.append_frame(ssm_frame(mutation))


class SsmDurable:
    """Adapter from :class:`~pion.ssm.SsmStore` to the durable-store protocol."""

    name = "ssm"

    def __init__(self, store: SsmStore) -> None:
        self.store = store

    @property
    def ops(self) -> Mapping[int, str]:
        return SSM_OPS

    @property
    def unit_ops(self) -> frozenset[int]:
        return SSM_UNIT_OPS

    def frames(self) -> Iterator[Frame]:
        for m in self.store.dump():
            yield ssm_frame(m)

    def apply_frame(self, op: int, payload: Buffer) -> None:
        self.store.apply(decode_ssm(op, payload))

    def attach(self, sink: FrameSink | None) -> None:
        self.store.journal = None if sink is None else _Journal(sink)

    def held_bytes(self) -> int:
        return self.store.bytes

    def units(self) -> int:
        return len(self.store)
