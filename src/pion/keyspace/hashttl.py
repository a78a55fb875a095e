"""Hash-field expiry's semantics (Redis 7.4's ``t_hash.c``: ``hashTypeSetEx``,
``httlGenericCommand``, ``hpersistCommand``), as operations on a
:class:`~pion.keyspace.Keyspace`. ``fieldttl.py`` keeps the deadlines; a field past
its deadline is reclaimed whenever its hash is looked up, so these functions only ever
meet live fields.

Per-field reply codes, as Redis 7.4 numbers them:

* HEXPIRE and its family: -2 no such field (or no such key), 0 the NX/XX/GT/LT
  condition was not met, 1 the deadline was set, 2 the field was deleted because the
  deadline is not in the future. The conditions are checked first, so ``GT`` with a
  past time on a field without a deadline answers 0 (a field without one counts as
  never expiring: GT fails on it, LT succeeds).
* HTTL and its family: -2 no such field, -1 no deadline, else the time.
* HPERSIST: -2 no such field, -1 no deadline, 1 removed.

Fields named twice are answered in order, each seeing what the ones before it did.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pion.keyspace.store import Keyspace

__all__ = ["MAX_FIELD_DEADLINE_MS", "Condition", "hexpire", "hpersist", "httl"]

# Redis 7.4's EB_EXPIRE_TIME_MAX (HFE_MAX_ABS_TIME_MSEC): a field's deadline is kept
# in 48 bits of ms, so no deadline past this is accepted ("invalid expire time").
MAX_FIELD_DEADLINE_MS = (1 << 48) - 1

Condition = Literal["", "NX", "XX", "GT", "LT"]

_NO_FIELD = -2
_NOT_MET = 0
_SET = 1
_DELETED = 2


def _met(cond: Condition, current: int, deadline: int) -> bool:
    """NX/XX/GT/LT against a field's deadline (``current`` 0: none, i.e. infinite)."""
    if cond == "NX":
        return not current
    if cond == "XX":
        return bool(current)
    if cond == "GT":
        return bool(current) and deadline > current
    if cond == "LT":
        return not current or deadline < current
    return True


def hexpire(
    ks: Keyspace, key: bytes, deadline: int, cond: Condition, fields: Sequence[bytes]
) -> tuple[list[int], bool]:
    """HEXPIRE's per-field codes (see the module docstring) for an absolute
    ``deadline`` in ms, and whether the hash went with fields it deleted. Deadlines
    set are one ``SetFieldTTLs`` record; fields deleted one HDEL (as Redis 7.4
    propagates them: HPEXPIREAT of the fields set, HDEL of the ones deleted)."""
    h = ks.hash(key, read=False)
    if h is None:
        return [_NO_FIELD] * len(fields), False
    past = deadline <= ks.clock()
    current = dict(ks.field_ttls.of(key) or {})
    gone: dict[bytes, None] = {}
    setting: dict[bytes, int] = {}
    codes: list[int] = []
    for f in fields:
        if f not in h or f in gone:
            codes.append(_NO_FIELD)
        elif not _met(cond, current.get(f, 0), deadline):
            codes.append(_NOT_MET)
        elif past:
            gone[f] = None
            setting.pop(f, None)
            codes.append(_DELETED)
        else:
            current[f] = setting[f] = deadline
            codes.append(_SET)
    ks.hash_field_ttls(key, list(setting.items()))
    if gone:
        ks.hash_delete(key, gone)
    return codes, bool(gone) and key not in ks


def httl(ks: Keyspace, key: bytes, fields: Sequence[bytes]) -> list[int]:
    """Each field's absolute deadline in ms, -1 for none, -2 for no such field."""
    h = ks.hash(key)
    if h is None:
        return [_NO_FIELD] * len(fields)
    ttls = ks.field_ttls.of(key) or {}
    return [_NO_FIELD if f not in h else ttls.get(f, -1) for f in fields]


def hpersist(ks: Keyspace, key: bytes, fields: Sequence[bytes]) -> list[int]:
    """HPERSIST's per-field codes (see the module docstring)."""
    h = ks.hash(key, read=False)
    if h is None:
        return [_NO_FIELD] * len(fields)
    ttls = ks.field_ttls.of(key) or {}
    dropping: dict[bytes, int] = {}
    codes: list[int] = []
    for f in fields:
        if f not in h:
            codes.append(_NO_FIELD)
        elif f in ttls and f not in dropping:
            dropping[f] = 0
            codes.append(1)
        else:
            codes.append(-1)
    ks.hash_field_ttls(key, list(dropping.items()))
    return codes
