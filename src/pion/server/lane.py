"""The fast lane: the small commands that dominate a cache's traffic, run with the
dispatcher's checks made inline.

GET, SET, a plain KV.PREFIX.LOOKUP, PING and the brackets of a transaction (MULTI,
EXEC: redis-py's default pipeline sends them) arrive by the dozen in one read. For them
the connection skips the general path of :func:`pion.server.dispatch.execute` (name
decoding, five nested calls of checks) and calls :func:`run`, which makes the same
checks in the same order and then runs the handler through the same boundary
(:func:`pion.commands.execution.call`), or queues the command inside MULTI. Its reply is
encoded as one chunk from its type.

What a command does is the same on either path: the lane takes a command only when
none of the rarer conditions applies, and the general path handles every one of them.
Those of the client and the server (a script running, a server still loading, a client
that has not authenticated to a server with a password, a RESP2 client while someone is
subscribed, replies switched off) are asked once per batch (:func:`usable`); those of
the command (a wrong number of arguments, a write while persistence refuses writes)
by :func:`run`, which then does nothing and answers None. Spellings outside the table
(mixed case) take the general path too.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from pion.commands.blocking import serve
from pion.commands.deferred import Deferred
from pion.commands.execution import DEFERRED, call, encode
from pion.commands.state import Command, CommandTable, Context
from pion.commands.transactions import IMMEDIATE, queue_command, refused_in_multi
from pion.errors import PionError
from pion.resp.encoder import NULL_BULK, SIMPLE_CACHE, SMALL_BULK, Chunks, encode_simple
from pion.resp.reply import Encoded, Reply, Simple

__all__ = ["LANE_COMMANDS", "Entry", "Lane", "lane_of", "run", "usable"]

LANE_COMMANDS = ("GET", "SET", "KV.PREFIX.LOOKUP", "PING", "MULTI", "EXEC")


class Entry:
    """A lane command's row, with what :func:`run` checks of it worked out once: the
    argument counts its arity allows and whether it writes."""

    __slots__ = ("cmd", "max_args", "min_args", "name", "runs_any", "writes")

    def __init__(self, cmd: Command) -> None:
        self.cmd = cmd
        self.name = cmd.name
        nargs = abs(cmd.arity) - 1  # arguments after the name
        self.min_args = nargs
        self.max_args = nargs if cmd.arity >= 0 else sys.maxsize
        self.writes = "write" in cmd.flags
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
    """Whether the lane may take this client's commands at all: none of the rarer states
    of the module docstring holds (replies switched off, a server still loading, a
    script running, a password owed, a RESP2 client while anyone is subscribed).

    Asked once per batch of commands, and again after each command the lane did not
    take and after EXEC (which runs any): only such a command changes these states (a
    script starts from EVAL or FCALL, a client authenticates with AUTH or HELLO,
    subscribes with SUBSCRIBE, switches replies with CLIENT REPLY), or a callback of
    the loop (recovery ending, a script finishing), which does not run in the middle of
    a batch."""
    state = ctx.state
    client = ctx.client
    scripts = state.scripts
    return not (
        client.reply_mode != "on"
        or state.loading
        or (scripts is not None and scripts.busy is not None)
        or (state.config.requirepass and not client.authenticated)
        or (client.proto == 2 and state.pubsub.clients)
    )


def run(ctx: Context, entry: Entry, argv: Sequence[bytes], out: Chunks) -> int | Deferred | None:
    """Run ``argv`` (``entry``'s command) as :func:`~pion.server.dispatch.execute`
    would, appending its reply to ``out``: its size in bytes, the handler's
    :data:`Deferred`, or None, with nothing done, where the general path must take it
    (a wrong number of arguments, a write while persistence refuses writes). The caller
    asked :func:`usable` first."""
    state = ctx.state
    client = ctx.client
    persistence = state.persistence
    if not entry.min_args <= len(argv) - 1 <= entry.max_args or (
        entry.writes and persistence is not None and persistence.write_refusal() is not None
    ):
        return None
    state.counters.total_commands_processed += 1
    name = entry.name
    client.last_command = name
    reply: Reply | Deferred
    if client.queued is not None and name not in IMMEDIATE:
        try:
            reply = queue_command(ctx, entry.cmd, argv)
        except PionError as exc:
            reply = state.stats.rejected(name, refused_in_multi(ctx, name, exc))
    else:
        reply = call(ctx, entry.cmd, argv)
    result: int | Deferred
    if type(reply) is Simple:
        chunk = SIMPLE_CACHE.get(reply) or encode_simple(reply)
        out.append(chunk)
        result = len(chunk)
    elif type(reply) is bytes and len(reply) <= SMALL_BULK:
        chunk = b"$%d\r\n%b\r\n" % (len(reply), reply)
        out.append(chunk)
        result = len(chunk)
    elif reply is None:
        chunk = NULL_BULK[client.proto]
        out.append(chunk)
        result = len(chunk)
    elif type(reply) is Encoded:  # EXEC's array, encoded as its commands ran
        out.append(reply)
        result = len(reply)
    elif isinstance(reply, DEFERRED):  # a wait (a tier fill): the connection runs it
        result = reply
    else:
        result = encode(ctx, argv, reply, out)
    if state.keyspace.ready:
        serve(state.keyspace)  # clients blocked on keys it filled (dispatch.execute)
    return result
