"""Plain GET and SET served many at a time: a run of them in one call.

A cache's traffic is pipelines of ``GET key`` and ``SET key value`` by the dozen per
read, and transactions of them. Each through the lane (``pion.server.lane``) or
EXEC's loop costs a few microseconds of Python (the checks, the boundary's timing and
counters, the keyspace's layers, the reply); redis-server spends well under one. So
the connection (``pion.server.batch``) and EXEC (``transactions.py``) hand a run of
them to :func:`serve`, which makes the checks that cannot change within the run once
(:func:`allowed`) and serves the run in one call of :data:`run`: compiled
(``_plain.c``) where a C compiler was present at install time, else :func:`py_run`,
its pure-Python twin. Both keep one contract, below, and the tests hold both to it.

What a run takes, and what it leaves to its caller (the command stays in ``ready``, to
run as before, checks, boundary and all):

- ``GET key`` (two arguments, the name as ``GET`` or ``get``): a missing key is a miss
  (the null reply); a key holding a string of at most ``SMALL_BULK`` bytes with no
  deadline is a hit, its entry touched. Anything else (a deadline to check, another
  type's WRONGTYPE, a large value sent without a copy) is left.
- ``SET key value`` (three arguments), while :func:`allowed` says writes may run
  here: a key that holds a string with no deadline gets the new value and size, as
  :meth:`pion.keyspace.primitives.KeyTable._store` would store it. A new key (it
  takes a SCAN slot), a deadline to clear or another type replaced are left.

:func:`allowed` is what makes these the whole of the command: with the replies on, no
script running, the client authenticated (or none needed), no recovery in progress,
no RESP2 subscription, no metrics counting every handler (``--metrics-port``), and
neither ``maxmemory`` (whose checks run per write) nor a hash field deadline (which
GET's lookup must reclaim) anywhere, a GET is its lookup.
A SET also needs no log or keyspace notification to record it (no record to build:
it is counted for ``rdb_changes_since_last_save``), persistence accepting writes, and
nobody WATCHing keys. Every command of the run is timed as the boundary
(``execution.call``) times a handler, for INFO commandstats and SLOWLOG, and counted;
:func:`serve` records the totals when the run ends, before any other command runs.
Nothing in a run can fail but an allocation.

``run(ready, data, out, null, lru_clock, may_set, max_cmds, max_bytes, slow_us, slow)``
    Serve commands from the end of ``ready`` (last first: ``ready.pop()`` is the next
    command) while each is one the run takes, at most ``max_cmds`` of them, and not
    after the replies appended to ``out`` passed ``max_bytes``. ``data`` is the
    keyspace's key table (key -> ``Entry``), ``null`` the client's null bulk,
    ``lru_clock`` what a touched entry records. A command whose handler time in
    microseconds reaches ``slow_us`` (when ``slow_us >= 0``) is appended to ``slow`` as
    ``(argv, usec)``. Returns ``(ran, nbytes, gets, hits, sets, grow, get_usec,
    set_usec, last)``: commands served (popped), reply bytes appended, GETs and their
    hits, SETs and the bytes they added to ``used_bytes`` (negative when values
    shrank), the microseconds each kind took, and the last command's kind (0 none, 1
    GET, 2 SET). It changes nothing for a command it leaves, and raises only
    ``MemoryError`` (before changing anything for the command it was on).

``queue(ready, queued, get, set, may_set, max_cmds, room)``
    Inside MULTI: move commands from the end of ``ready`` to the transaction's
    ``queued`` list as ``(command row, argv)`` (``get`` and ``set`` are the table's
    rows) while each is a plain GET, or a plain SET when ``may_set``, at most
    ``max_cmds``, and while their argument bytes stay within ``room``. Returns
    ``(queued, argument bytes, last kind)``; the caller answers each ``+QUEUED``.
"""

from __future__ import annotations

from collections.abc import Sequence
from time import perf_counter_ns
from typing import TYPE_CHECKING

from pion.commands.state import Command, Context
from pion.keyspace.entries import KEY_OVERHEAD, Entry
from pion.resp.encoder import NULL_BULK, SMALL_BULK, Chunks

__all__ = [
    "COMPILED",
    "GETS",
    "KINDS",
    "PLAIN",
    "SETS",
    "allowed",
    "plain_argv",
    "py_queue",
    "py_run",
    "queue",
    "run",
    "serve",
]

_OK = b"+OK\r\n"
# The names a run may take, as they arrive.
GETS = (b"GET", b"get")
SETS = (b"SET", b"set")
PLAIN = frozenset(GETS + SETS)
# A run's last command by its kind (0 none, 1 GET, 2 SET): ``client.last_command``.
KINDS = ("", "GET", "SET")

Result = tuple[int, int, int, int, int, int, int, int, int]


def py_run(  # noqa: PLR0917 - positional, as the compiled twin takes them
    ready: list[list[bytes]],
    data: dict[bytes, Entry],
    out: Chunks,
    null: bytes,
    lru_clock: int,
    may_set: bool,
    max_cmds: int,
    max_bytes: int,
    slow_us: int,
    slow: list[tuple[Sequence[bytes], int]],
) -> Result:
    """The pure-Python twin of the compiled ``run`` (module docstring)."""
    ran = nbytes = gets = hits = sets = grow = get_usec = set_usec = last = 0
    while ready and ran < max_cmds and nbytes <= max_bytes:
        argv = ready[-1]
        n = len(argv)
        if n == 2 and argv[0] in GETS:
            started = perf_counter_ns()
            e = data.get(argv[1])
            if e is None:
                reply = null
            else:
                value = e.value
                if e.deadline or type(value) is not bytes or len(value) > SMALL_BULK:
                    break
                reply = b"$%d\r\n%b\r\n" % (len(value), value)
                e.touched = lru_clock
                hits += 1
            usec = (perf_counter_ns() - started) // 1000
            gets += 1
            get_usec += usec
            last = 1
        elif n == 3 and may_set and argv[0] in SETS:
            started = perf_counter_ns()
            key, value = argv[1], argv[2]
            e = data.get(key)
            if e is None or e.deadline or type(e.value) is not bytes:
                break
            size = len(key) + len(value) + KEY_OVERHEAD
            grow += size - e.size
            e.value, e.size = value, size
            reply = _OK
            usec = (perf_counter_ns() - started) // 1000
            sets += 1
            set_usec += usec
            last = 2
        else:
            break
        ready.pop()
        out.append(reply)
        nbytes += len(reply)
        ran += 1
        if usec >= slow_us >= 0:
            slow.append((argv, usec))
    return ran, nbytes, gets, hits, sets, grow, get_usec, set_usec, last


def plain_argv(argv: Sequence[bytes], may_set: bool) -> bool:
    """Whether ``argv`` is a GET or (``may_set``) a SET of the shape a run takes (it
    may still leave it, by what the key holds)."""
    n = len(argv)
    return (n == 2 and argv[0] in GETS) or (may_set and n == 3 and argv[0] in SETS)


def py_queue(  # noqa: PLR0917 - positional, as the compiled twin takes them
    ready: list[list[bytes]],
    queued: list[tuple[Command, Sequence[bytes]]],
    get: Command,
    set_: Command,
    may_set: bool,
    max_cmds: int,
    room: int,
) -> tuple[int, int, int]:
    """The pure-Python twin of the compiled ``queue`` (module docstring)."""
    done = nbytes = last = 0
    while ready and done < max_cmds and plain_argv(ready[-1], may_set):
        argv = ready[-1]
        cmd, kind = (get, 1) if len(argv) == 2 else (set_, 2)
        size = sum(map(len, argv))
        if nbytes + size > room:
            break
        queued.append((cmd, argv))
        ready.pop()
        nbytes += size
        done += 1
        last = kind
    return done, nbytes, last


if TYPE_CHECKING:
    run = py_run
    queue = py_queue
    COMPILED = False
else:
    try:
        from pion.commands._plain import queue, run
    except ImportError:  # no compiler at install time: the pure-Python twins
        run = py_run
        queue = py_queue
        COMPILED = False
    else:
        COMPILED = True


def allowed(ctx: Context) -> tuple[bool, bool]:
    """``(gets, sets)``: whether a run may serve GET, and SET, for this client now (the
    module docstring's conditions; whether its transaction is open is the caller's).
    Asked before every run."""
    state = ctx.state
    client = ctx.client
    config = state.config
    scripts = state.scripts
    ks = state.databases.all[client.db]
    if (
        client.reply_mode != "on"
        or (scripts is not None and scripts.busy is not None)
        or (config.auth_required and not client.authenticated)
        or state.loading
        or state.metered
        or config.maxmemory
        or state.vstore.maxmemory
        or ks.field_ttls.by_key
        or (client.proto == 2 and state.pubsub.clients and state.pubsub.subscribed(client.id))
    ):
        return False, False
    persistence = state.persistence
    sets = (
        ks.journal is None
        and ks.events is None
        and not state.notify_flags
        and not ks.watchers.names
        and (persistence is None or persistence.write_refusal() is None)
    )
    return True, sets


def serve(
    ctx: Context,
    ready: list[list[bytes]],
    out: Chunks,
    *,
    may_set: bool,
    max_cmds: int,
    max_bytes: int,
) -> tuple[int, int]:
    """Serve a run from the end of ``ready`` in the client's database, its replies
    appended to ``out`` (:data:`run`'s arguments; the caller asked :func:`allowed`):
    ``(commands served, reply bytes)``. Records what the run did (module docstring)."""
    state = ctx.state
    client = ctx.client
    ks = state.databases.all[client.db]
    stats = state.stats
    slow: list[tuple[Sequence[bytes], int]] = []
    ran, nbytes, gets, hits, sets, grow, get_usec, set_usec, last = run(
        ready,
        ks.entries,
        out,
        NULL_BULK[client.proto],
        ks.lru_clock,
        may_set,
        max_cmds,
        max_bytes,
        stats.slowlog_threshold_us,
        slow,
    )
    if not ran:
        return 0, 0
    state.keyspace = ks
    state.counters.total_commands_processed += ran
    client.last_command = KINDS[last]
    if gets:
        stats.record_many("GET", gets, get_usec)
        ks.hits += hits
        ks.misses += gets - hits
    if sets:
        stats.record_many("SET", sets, set_usec)
        ks.used_bytes += grow
        if ks.changed is not None:
            ks.changed(sets)
    for argv, usec in slow:
        stats.log_slow(argv, usec, client)
    return ran, nbytes
