"""The numbered databases: one :class:`~pion.keyspace.store.Keyspace` per index (16 by
default, Redis's ``databases``), and the changes that span two of them or all.

A client's SELECT picks the keyspace its commands act on (``pion.commands.state``);
everything here is what no single keyspace can do alone:

* MOVE and COPY ... DB are the source keyspace's (``Keyspace.move_to``,
  ``Keyspace.copy_to``), journaled there as one record naming the target index;
  :meth:`Databases.apply` replays them, and the other records spanning databases.
* SWAPDB (:meth:`Databases.swap`) exchanges two keyspaces' *contents*: each object
  keeps its index, journal, notifications, watchers and blocked clients, as Redis keeps
  ``blocking_keys`` and ``watched_keys`` with the index. Before the exchange the
  watched keys of both are touched as Redis 7.0's ``touchAllWatchedKeysInDb`` does;
  after it, a key a client blocks on that now holds a value is made ready (Redis's
  ``scanDatabaseForReadyKeys``), so the next :func:`pion.commands.blocking.serve`
  tries it.
* FLUSHALL (:meth:`Databases.flush_all`) empties all of them as one record.

The memory budget is shared: every keyspace asks the same ``budget`` and
:attr:`Databases.used_bytes` is their sum (what ``--maxmemory`` counts). The V-store
and everything else that is not a Redis key is not in any database.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from pion.keyspace.entries import Entry
from pion.keyspace.expiry import now_ms
from pion.keyspace.lookups import Budget
from pion.keyspace.mutations import CopyToDb, FlushAll, KeyMutation, MoveKey, SwapDbs
from pion.keyspace.store import Keyspace

__all__ = ["DEFAULT_DATABASES", "Databases"]

DEFAULT_DATABASES = 16


class Databases:
    """The keyspaces by index; see the module docstring."""

    def __init__(
        self,
        count: int = DEFAULT_DATABASES,
        clock: Callable[[], int] = now_ms,
        *,
        first: Keyspace | None = None,
    ) -> None:
        """``count`` empty databases, or ``first`` (a keyspace built elsewhere,
        database 0) and ``count - 1`` more."""
        if count < 1:
            raise ValueError("at least one database")
        self.all = [first if first is not None else Keyspace(clock, 0)]
        self.all += [Keyspace(clock, db) for db in range(1, count)]
        # The databases with keys ready for blocked clients (``ListSetTable.alarm``).
        self.alarm = self.all[0].alarm
        for ks in self.all:
            ks.alarm = self.alarm

    def __len__(self) -> int:
        return len(self.all)

    def __getitem__(self, db: int) -> Keyspace:
        return self.all[db]

    def __iter__(self) -> Iterator[Keyspace]:
        return iter(self.all)

    @property
    def used_bytes(self) -> int:
        return sum(ks.used_bytes for ks in self.all)

    def keys(self) -> int:
        """How many keys all the databases hold."""
        return sum(len(ks) for ks in self.all)

    def total(self, counter: str) -> int:
        """An INFO Stats counter (``expired_keys``, ``expired_fields``, ``hits``,
        ``misses``) summed over the databases."""
        return sum(int(getattr(ks, counter)) for ks in self.all)

    def reset_stats(self) -> None:
        for ks in self.all:
            ks.reset_stats()

    def set_budget(self, budget: Budget | None) -> None:
        for ks in self.all:
            ks.budget = budget

    def swap(self, a: int, b: int) -> None:
        """SWAPDB ``a`` ``b`` (valid indexes; the same one changes nothing)."""
        if a == b:
            return
        self.all[a]._journal(SwapDbs(a, b))
        self.apply_swap(a, b)

    def apply_swap(self, a: int, b: int) -> None:
        first, second = self.all[a], self.all[b]
        _touch_swapped(first, second)
        _touch_swapped(second, first)
        first.swap_contents(second)
        for ks in (first, second):
            for key in ks.waiting:
                if key in ks:
                    ks._signal(key)

    def flush_all(self) -> list[dict[bytes, Entry]]:
        """FLUSHALL: every database emptied; returns what they held, for the caller
        to free in steps."""
        self.all[0]._journal(FlushAll())
        return [ks._clear() for ks in self.all]

    def apply(self, db: int, m: KeyMutation) -> None:
        """Replay record ``m``, logged while database ``db`` was the current one."""
        ks = self.all[db]
        if isinstance(m, MoveKey):
            if m.key in ks:
                ks.apply_move(m.key, self.all[m.db])
        elif isinstance(m, CopyToDb):
            if m.source in ks:
                ks.apply_copy_to(m.source, m.destination, self.all[m.db])
        elif isinstance(m, SwapDbs):
            self.apply_swap(m.a, m.b)
        elif isinstance(m, FlushAll):
            for each in self.all:
                each._clear()
        else:
            ks.apply(m)

    def sweep(self, max_keys: int) -> int:
        """Active expiry over every database (``Keyspace.sweep``, at most ``max_keys``
        keys from each); returns how many keys went."""
        return sum(ks.sweep(max_keys) for ks in self.all)


def _touch_swapped(emptied: Keyspace, replaced: Keyspace) -> None:
    """Redis 7.0's ``touchAllWatchedKeysInDb(emptied, replaced)``: a watched key of
    ``emptied`` that exists there or in ``replaced`` changes, but for the expiry cases
    that are no logical change (a key already expired when watched that stays expired
    or goes; a missing key replaced by an expired one, which now counts as expired)."""
    watched = emptied.watchers.names
    if not watched:
        return
    for name, tokens in list(watched.items()):
        in_emptied = name in emptied
        in_replaced = name in replaced
        if not (in_emptied or in_replaced):
            continue
        slot = (emptied.db, name)
        for token in tokens:
            if token.keys.get(slot, False):
                if not in_replaced:
                    token.keys[slot] = False
                    continue
                if replaced.past_deadline(name):
                    continue
            elif not in_emptied and replaced.past_deadline(name):
                token.keys[slot] = True
                continue
            token.dirty = True
