"""The command table: one row per command (name -> handler, arity, flags), assembled
from one module per command family. Dispatch, the WAL's write flag and ``COMMAND``
all read this table.
"""

from __future__ import annotations

from pion.commands import generic, persist, prefix, vstore
from pion.commands.base import Command

__all__ = ["COMMAND_TABLE"]


def _build() -> dict[str, Command]:
    table: dict[str, Command] = {}
    for module in (generic, vstore, prefix, persist):
        for cmd in module.COMMANDS:
            if cmd.name in table:
                raise RuntimeError(f"command {cmd.name} registered twice")
            table[cmd.name] = cmd
    return table


COMMAND_TABLE: dict[str, Command] = _build()
