"""Redis functions' libraries as a durable store: records of op code 47 in the shared
write-ahead log, a snapshot ``pion.functions.<w>`` written by the same SAVE.

Op code and payload (the framing, header and END record are ``format.py``'s; all
integers little-endian)::

    47  LIBRARIES  u32 count, count x ([u32 n][n bytes] a library's code, its first
                   line ``#!lua name=<lib>``): the whole set of libraries after a
                   FUNCTION LOAD, DELETE, FLUSH or RESTORE (count 0: none)

Why one record of the whole set: a change is rare and small next to the keyspace's,
and replaying "the set is now this" is the same for every command that changes it
(a RESTORE with REPLACE, a FLUSH), so recovery needs no per-command logic and a
record can never meet a set it does not fit. Recovery compiles the codes again
(``pion.scripting.functions``), in log order among the other stores' records, so the
libraries are back before the keyspace's replay completes.

Why a new op code, and why 47: the libraries are not keys (the keyspace's ops 16..31,
and the sub-codes under ops 30 and 31, each name a key and are applied by the keyspace
store, into the keyspace's own snapshot), so they need a store of their own with its
own snapshot file, and a store owns its op codes. 47 is the top of the range 32..47
(SSM and attention state, none of it used above 33; the attention tier keeps
34..46), so a FUNCTION LOAD inside EXEC can be one of a TXN's inner records (ops
1..47, ``txn_format.py``). Ops are only
added: a log without op 47 reads as before, and a build that predates it meets one as
the named error ``unknown op code 47``. A snapshot holds one LIBRARIES record when any
library exists; its END record counts it.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Final

from pion.persistence.format import Buffer, FormatError
from pion.persistence.stores import Frame, FrameSink
from pion.scripting.functions import Libraries

__all__ = [
    "FUNCTIONS_OPS",
    "FUNCTIONS_UNIT_OPS",
    "OP_LIBRARIES",
    "FunctionsDurable",
    "decode_libraries",
    "describe_functions",
    "encode_libraries",
]

OP_LIBRARIES: Final = 47
FUNCTIONS_OPS: Final[Mapping[int, str]] = MappingProxyType({OP_LIBRARIES: "LIBRARIES"})
FUNCTIONS_UNIT_OPS: Final = frozenset({OP_LIBRARIES})

_U32: Final = struct.Struct("<I")


def encode_libraries(codes: list[bytes]) -> list[Buffer]:
    parts: list[Buffer] = [_U32.pack(len(codes))]
    for code in codes:
        parts += [_U32.pack(len(code)), code]
    return parts


def decode_libraries(op: int, payload: Buffer) -> list[bytes]:
    """The library codes a record holds; FormatError for anything else."""
    if op != OP_LIBRARIES:
        raise FormatError(f"unknown op code {op}")
    view = memoryview(payload).cast("B")
    if len(view) < _U32.size:
        raise FormatError("LIBRARIES payload is shorter than its count")
    (count,) = _U32.unpack_from(view, 0)
    at = _U32.size
    if count > (len(view) - at) // _U32.size:  # each code is at least its length
        raise FormatError(f"LIBRARIES count {count} exceeds the payload")
    codes = []
    for _ in range(count):
        if len(view) < at + _U32.size:
            raise FormatError("LIBRARIES payload ends inside a length")
        (n,) = _U32.unpack_from(view, at)
        at += _U32.size
        if n > len(view) - at:
            raise FormatError(f"LIBRARIES code of {n} bytes runs past the payload")
        codes.append(bytes(view[at : at + n]))
        at += n
    if at != len(view):
        raise FormatError("LIBRARIES payload has bytes after its codes")
    return codes


def describe_functions(op: int, payload: Buffer) -> str:
    """The record's name for ``pion check-wal`` (decoding it completely)."""
    return f"LIBRARIES({len(decode_libraries(op, payload))})"


class FunctionsDurable:
    """Adapter from :class:`~pion.scripting.functions.Libraries` to the durable-store
    protocol."""

    name = "functions"

    def __init__(self, libraries: Libraries) -> None:
        self.libraries = libraries

    @property
    def ops(self) -> Mapping[int, str]:
        return FUNCTIONS_OPS

    @property
    def unit_ops(self) -> frozenset[int]:
        return FUNCTIONS_UNIT_OPS

    def frames(self) -> Iterator[Frame]:
        codes = self.libraries.codes()
        if codes:
            yield Frame(OP_LIBRARIES, encode_libraries(codes))

    def apply_frame(self, op: int, payload: Buffer) -> None:
        self.libraries.apply(decode_libraries(op, payload))

    def attach(self, sink: FrameSink | None) -> None:
        if sink is None:
            self.libraries.journal = None
            return

        def journal(codes: list[bytes]) -> None:
            # A FLUSH to no libraries only removes: a log refusing writes still takes it.
            sink.append_frame(Frame(OP_LIBRARIES, encode_libraries(codes), drop=not codes))

        self.libraries.journal = journal

    def held_bytes(self) -> int:
        return sum(len(code) for code in self.libraries.codes())

    def units(self) -> int:
        return 1 if self.libraries.libraries else 0
