"""The command table: one row per command (name -> handler, arity, flags), assembled
from one module per command family. Dispatch, the WAL's write flag and ``COMMAND``
all read this table.

The table is built once and frozen; the server carries it on every handler's
:class:`~pion.commands.state.Context`, so ``COMMAND`` describes exactly the table that
dispatches. Tests that need an extra command build their own table with
:func:`build_table` instead of patching a global.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import MappingProxyType

from pion.commands import (
    attend,
    bits,
    export,
    generic,
    hashes,
    keys,
    keys_more,
    observe,
    persist,
    prefix,
    rollback,
    ssm,
    strings,
    transactions,
    vstore,
    zsets,
    zsets_algebra,
    zsets_more,
)
from pion.commands.state import Command, CommandTable

__all__ = ["COMMAND_TABLE", "build_table"]

_FAMILIES: tuple[Iterable[Command], ...] = (
    generic.COMMANDS,
    vstore.COMMANDS,
    rollback.COMMANDS,
    export.COMMANDS,
    prefix.COMMANDS,
    persist.COMMANDS,
    attend.COMMANDS,
    ssm.COMMANDS,
    keys.COMMANDS,
    keys_more.COMMANDS,
    observe.COMMANDS,
    strings.COMMANDS,
    hashes.COMMANDS,
    zsets.COMMANDS,
    zsets_more.COMMANDS,
    transactions.COMMANDS,
    zsets_algebra.COMMANDS,
    bits.COMMANDS,
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
