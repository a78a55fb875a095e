"""The fast lane: the small commands that dominate a cache's traffic, without the
general path's name decoding and encoder.

GET, SET, KV.PREFIX.LOOKUP, PING and the brackets of a transaction (MULTI, EXEC:
redis-py's default pipeline sends them) arrive by the dozen in one read. For them the
connection skips :func:`pion.server.dispatch.execute` (the name decoded and looked up,
the general encoder) and calls :func:`run`, which finds the row by the spelling that
arrived and runs the command through :func:`pion.server.dispatch.checked`: the same
checks in the same place (authentication, arity, loading, a failing log, whatever
:func:`~pion.server.dispatch.admit` checks), queued inside MULTI, the handler inside
the one boundary. Its reply is encoded as one chunk from its type.

The lane does not take a client's commands while its replies are switched off (the
general path drops them) or while a script runs (the general path makes them wait
for it): :func:`usable`, asked once per batch of commands and again after each command
the lane did not take. Spellings outside the table (mixed case) take the general path.
"""

from __future__ import annotations

from collections.abc import Sequence

from pion.commands.blocking import serve
from pion.commands.deferred import Deferred
from pion.commands.execution import DEFERRED, encode
from pion.commands.state import Command, CommandTable, Context
from pion.resp.encoder import NULL_BULK, SIMPLE_CACHE, SMALL_BULK, Chunks, encode_simple
from pion.resp.reply import Encoded, Reply, Simple
from pion.server.dispatch import checked

__all__ = ["LANE_COMMANDS", "Entry", "Lane", "append_reply", "lane_of", "run", "usable"]

LANE_COMMANDS = ("GET", "SET", "KV.PREFIX.LOOKUP", "PING", "MULTI", "EXEC")


class Entry:
    """A lane command's row, and whether the lane's states are asked again after it."""

    __slots__ = ("cmd", "runs_any")

    def __init__(self, cmd: Command) -> None:
        self.cmd = cmd
        # EXEC runs whatever was queued: the lane's states are asked again after it.
        self.runs_any = cmd.name == "EXEC"


# A command's spelling as it arrives (upper or lower case) -> its entry.
Lane = dict[bytes, Entry]


def lane_of(table: CommandTable) -> Lane:
    """The lane's rows of ``table``, under both spellings; a command the table does not
    hold is left out (it answers as unknown, on the general path)."""
    lane: Lane = {}
    for name in LANE_COMMANDS:
        cmd = table.get(name)
        if cmd is not None:
            lane[name.encode()] = lane[name.lower().encode()] = Entry(cmd)
    return lane


def usable(ctx: Context) -> bool:
    """Whether the lane may take this client's commands: its replies are on and no
    script holds the server (module docstring).

    Asked once per batch of commands, and again after each command the lane did not
    take and after EXEC (which runs any): only such a command changes these states
    (CLIENT REPLY; EVAL or FCALL start a script), or a callback of the loop (a script
    finishing), which does not run in the middle of a batch."""
    scripts = ctx.state.scripts
    return ctx.client.reply_mode == "on" and (scripts is None or scripts.busy is None)


def run(ctx: Context, entry: Entry, argv: Sequence[bytes], out: Chunks) -> int | Deferred:
    """Run ``argv`` (``entry``'s command) as :func:`~pion.server.dispatch.execute`
    would, appending its reply to ``out``: its size in bytes, or the handler's
    :data:`Deferred`. The caller asked :func:`usable` first."""
    state = ctx.state
    state.counters.total_commands_processed += 1
    result = append_reply(ctx, argv, checked(ctx, entry.cmd, argv), out)
    if state.databases.alarm:
        serve(state)  # clients blocked on keys it filled (dispatch.execute)
    return result


def append_reply(
    ctx: Context, argv: Sequence[bytes], reply: Reply | Deferred, out: Chunks
) -> int | Deferred:
    """Append ``reply`` to ``out`` as one chunk from its type (a lane command's usual
    replies), else through the general encoder: its size in bytes; a :data:`Deferred`
    is returned as it is, nothing appended, for the connection to run."""
    if type(reply) is Simple:
        chunk = SIMPLE_CACHE.get(reply) or encode_simple(reply)
    elif type(reply) is bytes and len(reply) <= SMALL_BULK:
        chunk = b"$%d\r\n%b\r\n" % (len(reply), reply)
    elif reply is None:
        chunk = NULL_BULK[ctx.client.proto]
    elif type(reply) is Encoded:  # EXEC's array, encoded as its commands ran
        chunk = reply
    elif isinstance(reply, DEFERRED):  # a wait (a tier fill): the connection runs it
        return reply
    else:
        return encode(ctx, argv, reply, out)
    out.append(chunk)
    return len(chunk)
