"""WATCH's bookkeeping: which clients watch which names, and which of them saw a change.

A store that can be watched (the keyspace by key, the V-store by session id) owns one
:class:`Watchers` and calls :meth:`Watchers.touch` at its lowest mutation points:
every write, delete, expiry, eviction and flush of a name. So a command added later
that changes the store through those points is watched without knowing of WATCH.

Redis's model, kept here: each watching client has one :class:`WatchToken`; a change
to any name it watches marks the token dirty, and EXEC then answers nil. A store's
check costs one test of an empty dict while nobody watches.

Expiry follows Redis 7: a key already past its deadline when it was watched is no
change when it is then removed for that reason (``expiring``); a key that was live when
watched and whose deadline passes before EXEC makes EXEC fail even if nothing removed
it yet (the transaction layer checks that at EXEC, ``pion.commands.transactions``).

Synchronous and pure, like the stores that hold it.
"""

from __future__ import annotations

from collections.abc import Container

__all__ = ["WatchToken", "Watchers"]


class WatchToken:
    """One client's watches: the keys by (database, name), each with "was already
    expired when watched", and the V-store session ids it watches, and whether any
    changed since."""

    __slots__ = ("dirty", "keys", "sessions")

    def __init__(self) -> None:
        self.dirty = False
        self.keys: dict[tuple[int, bytes], bool] = {}
        self.sessions: set[bytes] = set()


class Watchers:
    """Name -> the tokens watching it, for one store (one database of the keyspace:
    ``db``, its index, is how a token's keys name it)."""

    __slots__ = ("db", "names")

    def __init__(self, db: int = 0) -> None:
        self.db = db
        # Empty while nobody watches: the stores test it before anything else.
        self.names: dict[bytes, list[WatchToken]] = {}

    def add(self, name: bytes, token: WatchToken) -> None:
        tokens = self.names.setdefault(name, [])
        if token not in tokens:
            tokens.append(token)

    def remove(self, name: bytes, token: WatchToken) -> None:
        tokens = self.names.get(name)
        if tokens is None:
            return
        if token in tokens:
            tokens.remove(token)
        if not tokens:
            del self.names[name]

    def touch(self, name: bytes, *, expiring: bool = False) -> None:
        """``name`` changed: every token watching it is dirty (but for an expiry of a
        key its token watched already expired: no logical change, as in Redis 7)."""
        tokens = self.names.get(name)
        if tokens is None:
            return
        for token in tokens:
            if expiring and token.keys.get((self.db, name), False):
                # Removed now for the reason it was already gone when watched.
                token.keys[self.db, name] = False
                continue
            token.dirty = True

    def touch_held(self, held: Container[bytes]) -> None:
        """A flush: every watched name the store ``held`` changed (a watched name it
        did not hold did not, as in Redis)."""
        for name in [n for n in self.names if n in held]:
            self.touch(name)
