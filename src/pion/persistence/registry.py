"""Every record op code the persistence layer knows, grouped by the store that owns it.

The reader accepts exactly these op codes (plus END in snapshots): a record with any
other op code and an intact header is corruption, never skipped. ``pion check-wal``
names and counts records through :func:`describe`. A store that joins the log adds its
family here (op-code ranges: ``format.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from pion.persistence import keyspace_format
from pion.persistence.format import Buffer, FormatError
from pion.persistence.functions_format import (
    FUNCTIONS_OPS,
    FUNCTIONS_UNIT_OPS,
    describe_functions,
)
from pion.persistence.ssm_durable import SSM_OPS, SSM_UNIT_OPS, describe_ssm
from pion.persistence.txn_format import TXN_OPS, describe_txn
from pion.persistence.vstore_format import OPS as VSTORE_OPS
from pion.persistence.vstore_format import VSTORE_UNIT_OPS, decode_mutation
from pion.vstore import DropSession

__all__ = ["FAMILIES", "KNOWN_OPS", "UNIT_OPS", "RecordFamily", "describe", "family_of"]


@dataclass(frozen=True)
class RecordFamily:
    """The records of one store: its op codes (with names), the ops that open a unit
    in its snapshots, and how a record of it is decoded and named (raising
    FormatError when the payload does not decode)."""

    store: str
    ops: Mapping[int, str]
    unit_ops: frozenset[int]
    describe: Callable[[int, Buffer], str]


def _describe_vstore(op: int, payload: Buffer) -> str:
    m = decode_mutation(op, payload)
    if isinstance(m, DropSession):
        return f"{VSTORE_OPS[op]}({m.reason})"
    return VSTORE_OPS[op]


FAMILIES: tuple[RecordFamily, ...] = (
    RecordFamily("vstore", VSTORE_OPS, VSTORE_UNIT_OPS, _describe_vstore),
    RecordFamily("ssm", SSM_OPS, SSM_UNIT_OPS, describe_ssm),
    RecordFamily(
        "keyspace", keyspace_format.OPS, keyspace_format.UNIT_OPS, keyspace_format.describe
    ),
    RecordFamily("functions", FUNCTIONS_OPS, FUNCTIONS_UNIT_OPS, describe_functions),
    # Not a store: an EXEC's records as one (txn_format.py); recovery unpacks it.
    RecordFamily("txn", TXN_OPS, frozenset(), describe_txn),
)


def _known() -> Mapping[int, str]:
    out: dict[int, str] = {}
    for family in FAMILIES:
        for op, name in family.ops.items():
            if op in out:
                raise RuntimeError(f"op code {op} claimed twice ({out[op]}, {name})")
            out[op] = name
    return MappingProxyType(out)


KNOWN_OPS: Mapping[int, str] = _known()
# The ops that open a unit in any store's snapshot (ops of two stores never share a
# file, so counting them all counts the units of whichever store a file belongs to).
UNIT_OPS: frozenset[int] = frozenset().union(*(f.unit_ops for f in FAMILIES))
_BY_OP: Mapping[int, RecordFamily] = MappingProxyType(
    {op: family for family in FAMILIES for op in family.ops}
)


def family_of(op: int) -> RecordFamily:
    family = _BY_OP.get(op)
    if family is None:
        raise FormatError(f"unknown op code {op}")
    return family


def describe(op: int, payload: Buffer) -> str:
    """The record's name for ``pion check-wal`` (decoding it completely)."""
    return family_of(op).describe(op, payload)
