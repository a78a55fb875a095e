"""Keyspace notifications (``notify-keyspace-events``): the flag letters, their
canonical text, and :func:`notify`, the one call a command makes after it changed a key.

A command that changed ``key`` calls ``notify(state, CLASS, "event", key)`` once per
event, after the change, with Redis's event name and class (``STRING``, ``GENERIC``,
``HASH``...). Nothing is published unless the class is enabled and ``K`` (a
``__keyspace@<db>__:<key>`` message carrying the event) or ``E`` (a
``__keyevent@<db>__:<event>`` message carrying the key) is: with notifications off (the
default) the call is one integer test. ``<db>`` is the database the command acts on
(``state.keyspace``), or the one named (MOVE's ``move_to``, a keyspace's own events).

Only the plain keyspace's keys notify. The V-store's sessions, the prefix registry's
namespaces, attention and SSM state are not Redis keys (no ``TYPE``, no ``DEL``), so
their changes publish nothing; a client that needs to follow them uses their own
commands (``KV.PREFIX.INFO``, ``V.INFO``).

SWAPDB publishes nothing, as in Redis 7.0.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from pion.errors import PionError

if TYPE_CHECKING:
    from pion.commands.state import ServerState

__all__ = [
    "EVICTED",
    "EXPIRED",
    "GENERIC",
    "HASH",
    "KEYEVENT",
    "KEYSPACE",
    "LIST",
    "NEW",
    "SET",
    "STRING",
    "ZSET",
    "configure",
    "flags_text",
    "notify",
    "parse_flags",
]

# Redis's bits (server.h), so the canonical text is computed exactly as Redis does.
KEYSPACE = 1 << 0  # K
KEYEVENT = 1 << 1  # E
GENERIC = 1 << 2  # g
STRING = 1 << 3  # $
LIST = 1 << 4  # l
SET = 1 << 5  # s
HASH = 1 << 6  # h
ZSET = 1 << 7  # z
EXPIRED = 1 << 8  # x
EVICTED = 1 << 9  # e
STREAM = 1 << 10  # t
KEY_MISS = 1 << 11  # m (not in A)
MODULE = 1 << 13  # d
NEW = 1 << 14  # n (not in A)
ALL = GENERIC | STRING | LIST | SET | HASH | ZSET | EXPIRED | EVICTED | STREAM | MODULE

_LETTERS = {
    "A": ALL,
    "g": GENERIC,
    "$": STRING,
    "l": LIST,
    "s": SET,
    "h": HASH,
    "z": ZSET,
    "x": EXPIRED,
    "e": EVICTED,
    "K": KEYSPACE,
    "E": KEYEVENT,
    "t": STREAM,
    "m": KEY_MISS,
    "d": MODULE,
    "n": NEW,
}
# The order Redis writes the classes in (keyspaceEventsFlagsToString).
_CLASS_ORDER = "g$lshzxetdn"


def parse_flags(text: str) -> int:
    """The flags a ``notify-keyspace-events`` value names; raises for any other letter."""
    flags = 0
    for letter in text:
        bit = _LETTERS.get(letter)
        if bit is None:
            raise PionError("Invalid event class character. Use 'Ag$lshzxeKEtmdn'.")
        flags |= bit
    return flags


def flags_text(flags: int) -> str:
    """What CONFIG GET answers: ``A`` for all the classes it covers (then, as in
    Redis, ``n`` is not written even when set), else each class; then K, E, m."""
    classes = "".join(c for c in _CLASS_ORDER if flags & _LETTERS[c])
    out = "A" if flags & ALL == ALL else classes
    for letter in "KEm":
        if flags & _LETTERS[letter]:
            out += letter
    return out


# The classes of the events the keyspace raises itself: ``new``, ``expired`` (a key),
# ``evicted`` (raised for it by the memory budget), and a hash's fields reclaimed
# past their deadline: ``hexpired``, then ``del`` when the hash went with them (Redis
# 7.4).
_STORE_EVENTS = {
    "new": NEW,
    "expired": EXPIRED,
    "hexpired": HASH,
    "del": GENERIC,
    "evicted": EVICTED,  # maxmemory-policy (pion.commands.budget)
}


def configure(state: ServerState, flags: int) -> None:
    """Apply ``notify-keyspace-events``: the flags, and the keyspace's own hook for
    ``new`` and ``expired`` (removed when nothing is enabled)."""
    state.notify_flags = flags
    for ks in state.databases:
        ks.events = _events(state, ks.db) if flags else None


def _events(state: ServerState, db: int) -> Callable[[str, bytes], None]:
    def events(event: str, key: bytes) -> None:
        notify(state, _STORE_EVENTS.get(event, EXPIRED), event, key, db)

    return events


def notify(state: ServerState, klass: int, event: str, key: bytes, db: int = -1) -> None:
    """Publish the keyspace and keyevent messages for ``event`` on ``key`` in database
    ``db`` (-1: the one the command acts on), as far as ``notify-keyspace-events``
    enables them."""
    flags = state.notify_flags
    if not flags & klass:
        return
    if db < 0:
        db = state.keyspace.db
    name = event.encode()
    pubsub = state.pubsub
    if flags & KEYSPACE:
        pubsub.publish(b"__keyspace@%d__:%b" % (db, key), name)
    if flags & KEYEVENT:
        pubsub.publish(b"__keyevent@%d__:%b" % (db, name), key)
