"""The command table: one row per command (name -> handler, arity, flags), assembled
from one module per command family. Dispatch, the WAL's write flag and ``COMMAND``
all read this table.

The table is built once and frozen; the server carries it on every handler's
:class:`~pion.commands.state.Context`, so ``COMMAND`` describes exactly the table that
dispatches. Tests that need an extra command build their own table with
:func:`build_table` instead of patching a global.

Reading order:

1. ``state.py`` (what every handler is handed, and the row type), ``args.py`` and
   ``scan_args.py`` (argument parsing every family shares).
2. How a command runs: ``execution.py`` (the one error boundary, and running a
   deferred result to its end where nothing may run in between), ``deferred.py`` (the
   results that are not ready when a handler returns: work off the loop, steps, a
   streamed reply, a wait), ``chunked.py`` (long replies and work cut into steps),
   ``stats.py`` (commandstats, errorstats, SLOWLOG), ``budget.py`` (``used_memory``,
   the ``--maxmemory`` check on it and ``maxmemory-policy``), ``plain.py`` (a run of
   plain GET and SET served in one call, compiled in ``_plain.c`` where a C compiler
   was present: a pipeline's, and EXEC's).
3. The families: ``generic.py`` (connection and server commands) with ``clientctl.py``,
   ``config_cmd.py``, ``info.py`` and ``observe.py``; the plain keyspace's
   ``strings.py``, ``keys.py``, ``keys_more.py``, ``databases.py`` (SELECT, MOVE,
   SWAPDB), ``dump.py`` (DUMP/RESTORE),
   ``hashes.py`` with ``hashttl.py`` (hash-field expiry), ``zsets.py``, ``zsets_more.py``,
   ``zsets_algebra.py``, ``zsets_store.py``
   (ZRANGESTORE), ``geo.py`` (GEO* on sorted sets), ``bits.py``, ``lists.py``, ``sets.py``
   and ``sort.py`` (SORT, SORT_RO);
   ``blocking.py`` (BLPOP and the other blocking pops); ``streams.py`` (XADD, XREAD
   and the other commands without groups, with ``streams_args.py``),
   ``streams_groups.py`` (consumer groups) and ``streams_info.py`` (XINFO);
   ``transactions.py``
   (MULTI/EXEC/WATCH); ``pubsub.py`` (SUBSCRIBE, PUBLISH and the rest); ``scripting.py``
   (EVAL, SCRIPT: the runtime is ``pion.scripting``) with ``scriptbusy.py`` (a long
   script: other clients wait, then -BUSY) and ``functions.py`` (FUNCTION, FCALL); the
   V-store's ``vstore.py`` (V.CREATE, V.STOREBATCH) and ``vstore_fetch.py`` (V.FETCH,
   V.INFO),
   ``tierfetch.py`` (fetches streamed from a tier fill), ``rollback.py`` and
   ``export.py``; ``prefix.py`` (KV.PREFIX.*),
   ``persist.py``, ``attend.py`` and ``ssm.py``. More of strings: ``bitfield.py``
   (BITFIELD), ``hll.py`` (HyperLogLog) and ``lcs.py`` (LCS).
4. ``workers.py``: what a command asks about other workers under ``-w N``.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import MappingProxyType

from pion.commands import (
    attend,
    bitfield,
    bits,
    blocking,
    databases,
    dump,
    export,
    functions,
    generic,
    geo,
    hashes,
    hashttl,
    hll,
    keys,
    keys_more,
    lcs,
    lists,
    observe,
    persist,
    prefix,
    pubsub,
    rollback,
    scripting,
    sets,
    sort,
    ssm,
    streams,
    streams_groups,
    streams_info,
    strings,
    transactions,
    vstore,
    vstore_fetch,
    zsets,
    zsets_algebra,
    zsets_more,
    zsets_store,
)
from pion.commands.state import Command, CommandTable

__all__ = ["COMMAND_TABLE", "build_table"]

_FAMILIES: tuple[Iterable[Command], ...] = (
    generic.COMMANDS,
    vstore.COMMANDS,
    vstore_fetch.COMMANDS,
    rollback.COMMANDS,
    export.COMMANDS,
    prefix.COMMANDS,
    persist.COMMANDS,
    attend.COMMANDS,
    ssm.COMMANDS,
    keys.COMMANDS,
    keys_more.COMMANDS,
    databases.COMMANDS,
    dump.COMMANDS,
    observe.COMMANDS,
    strings.COMMANDS,
    hashes.COMMANDS,
    hashttl.COMMANDS,
    zsets.COMMANDS,
    zsets_more.COMMANDS,
    transactions.COMMANDS,
    zsets_algebra.COMMANDS,
    bits.COMMANDS,
    hll.COMMANDS,
    bitfield.COMMANDS,
    lcs.COMMANDS,
    lists.COMMANDS,
    sets.COMMANDS,
    blocking.COMMANDS,
    streams.COMMANDS,
    streams_groups.COMMANDS,
    streams_info.COMMANDS,
    pubsub.COMMANDS,
    scripting.COMMANDS,
    functions.COMMANDS,
    zsets_store.COMMANDS,
    geo.COMMANDS,
    sort.COMMANDS,
)


def build_table(extra: Iterable[Command] = ()) -> CommandTable:
    """Every family's commands (plus ``extra``), keyed by upper-case name, frozen."""
    table: dict[str, Command] = {}
    for family in (*_FAMILIES, extra):
        for cmd in family:
            if cmd.name in table:
                raise ValueError(f"command {cmd.name} registered twice")
            table[cmd.name] = cmd
    return MappingProxyType(table)


COMMAND_TABLE: CommandTable = build_table()
