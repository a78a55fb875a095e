"""The RESP lane's front door: where a request's arguments find their command, pass
the checks every command passes, and become reply bytes.

Checks run in Redis's order: unknown command, authentication, arity, loading, then
whether persistence still accepts writes (the commands that only free space always
pass: ``pion.persistence.stores.FREEING_COMMANDS``) and memory does (over
``--maxmemory``, evict by policy or ``-OOM``: ``pion.commands.budget``), then, for a
RESP2 client in subscribed mode, whether the command is one it may send
(``pion.commands.pubsub``);
one refused is counted as rejected. The handler then runs inside the one error boundary,
:func:`pion.commands.execution.call` (timed, counted, exceptions as replies), and its
reply is encoded inside it too (:func:`pion.commands.execution.encode`).

A handler may return a :data:`~pion.commands.deferred.Deferred` (work off the loop,
in steps, streamed, or a wait): :func:`execute` hands it back to the connection,
which runs it (``pion.server.running``).

While a script runs off the loop, another client's command first passes its gate
(``pion.commands.scriptbusy``: it waits for the script, or is answered -BUSY).
Inside MULTI a command that passed those checks is queued instead of run
(``pion.commands.transactions``); one refused by them fails the transaction. While
``CLIENT REPLY OFF|SKIP`` silences a client, :func:`execute` runs its commands as any
client's and appends nothing (``pion.commands.clientctl``); a deferred one comes back
:class:`Silenced`.

The small commands of a cache's traffic reach :func:`execute` only when replies are
switched off or a script runs: otherwise the connection runs them through the fast
lane (``pion.server.lane``), which skips the name decoding and the general encoder
and makes the same checks by calling :func:`checked`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

from pion.commands.blocking import serve
from pion.commands.budget import NO_GROWTH
from pion.commands.clientctl import begin_silent, silenced
from pion.commands.deferred import Deferred
from pion.commands.execution import DEFERRED, call, encode
from pion.commands.pubsub import refuse_subscribed
from pion.commands.scriptbusy import gate
from pion.commands.state import Command, Context
from pion.commands.transactions import IMMEDIATE, queue_command, refused_in_multi
from pion.errors import LoadingError, MisconfError, NoAuthError, PionError
from pion.persistence.stores import FREEING_COMMANDS
from pion.resp.encoder import Chunks
from pion.resp.reply import ErrorReply, Reply

__all__ = ["Silenced", "admit", "checked", "dispatch", "execute"]


# Command names as sent (any case) -> upper-case. Bounded, so a client sending random
# names cannot grow it without limit; past the bound names are just decoded each time.
_NAMES: dict[bytes, str] = {}
_NAME_CACHE_SIZE = 1024


def _unknown(ctx: Context, argv: Sequence[bytes]) -> ErrorReply:
    if ctx.client.queued is not None:
        ctx.client.queue_failed = True  # EXEC will answer -EXECABORT
    name = argv[0].decode("utf-8", "replace")[:128]
    # Redis's text: each argument quoted and followed by a space, while under 128
    # characters.
    shown = ""
    for arg in argv[1:]:
        if len(shown) >= 128:
            break
        shown += f"'{arg[: 128 - len(shown)].decode('utf-8', 'replace')}' "
    return ErrorReply(f"ERR unknown command '{name}', with args beginning with: {shown}")


def admit(
    ctx: Context, cmd: Command, nargs: int | None, argv: Sequence[bytes] | None = None
) -> None:
    """The checks every command passes before its handler runs, whichever lane it
    came by (RESP, or the binary lane's frames): authentication, arity (``nargs``
    arguments after the name; None when the lane's framing fixed them), loading, then
    whether persistence still accepts writes and, for a RESP command (``argv``),
    whether memory does. Raises the error to answer."""
    state = ctx.state
    if state.config.maxmemory:
        state.memory.reset()  # of the last command (budget.py)
    if state.config.auth_required and not ctx.client.authenticated and "noauth" not in cmd.flags:
        raise NoAuthError()
    if nargs is not None and not cmd.arity_ok(nargs):
        raise PionError(f"wrong number of arguments for '{cmd.name.lower()}' command")
    if state.loading and "loading" not in cmd.flags:
        raise LoadingError()
    # Commands that only free space pass a failing log (it writes their records when
    # it can): removing data is how an operator makes room.
    if "write" in cmd.flags and cmd.name not in FREEING_COMMANDS:
        if state.persistence is not None:
            failure = state.persistence.write_refusal()
            if failure is not None:
                raise MisconfError(failure)
        if argv is not None and state.config.maxmemory and cmd.name not in NO_GROWTH:
            # Evict by maxmemory-policy, or -OOM while used_memory is over maxmemory
            # (Redis's check before a write command; pion.commands.budget).
            state.memory.admit(argv)


def dispatch(ctx: Context, argv: Sequence[bytes]) -> Reply | Deferred:
    """Run one command; returns a reply value (errors as :class:`ErrorReply`), or the
    handler's :data:`Deferred`."""
    state = ctx.state
    state.counters.total_commands_processed += 1
    raw = argv[0]
    name = _NAMES.get(raw)
    if name is None:
        try:
            name = raw.decode("ascii").upper()
        except UnicodeDecodeError:
            return _unknown(ctx, argv)
        if len(_NAMES) < _NAME_CACHE_SIZE:
            _NAMES[raw] = name
    cmd = ctx.table.get(name)
    if cmd is None:
        return state.stats.unknown(_unknown(ctx, argv))
    return _run(ctx, cmd, argv)


def _run(ctx: Context, cmd: Command, argv: Sequence[bytes]) -> Reply | Deferred:
    """A known command: the gate of a running script, then :func:`checked`."""
    state = ctx.state
    if state.scripts is not None and state.scripts.busy is not None:
        held = gate(ctx, cmd, argv, partial(_run, ctx, cmd, argv))
        if held is not None:
            return held
    return checked(ctx, cmd, argv)


def checked(ctx: Context, cmd: Command, argv: Sequence[bytes]) -> Reply | Deferred:
    """A known command while no script holds the server: its checks (:func:`admit`, a
    RESP2 subscriber's), then queued (inside MULTI) or run, timed. The fast lane
    (``pion.server.lane``) calls it directly, so every check is made in this one
    place whichever way a command came."""
    state = ctx.state
    client = ctx.client
    client.last_command = cmd.name
    try:
        admit(ctx, cmd, len(argv) - 1, argv)
        if client.proto == 2 and ctx.state.pubsub.clients:  # (cheap: usually empty)
            refuse_subscribed(ctx, cmd, argv)
        if client.queued is not None and cmd.name not in IMMEDIATE:
            return queue_command(ctx, cmd, argv)
    except PionError as exc:
        if client.queued is not None:
            return state.stats.rejected(cmd.name, refused_in_multi(ctx, cmd.name, exc))
        return state.stats.rejected(cmd.name, ErrorReply(exc.resp_line()))
    return call(ctx, cmd, argv)


def execute(ctx: Context, argv: Sequence[bytes], out: Chunks) -> int | Deferred | Silenced:
    """Dispatch one command, append its encoded reply to ``out`` and return the
    reply's size in bytes (what the connection weighs against its high-water mark);
    a :data:`Deferred` is returned as it is, nothing appended, for the connection to
    run (``pion.server.running``), wrapped in :class:`Silenced` when its reply is
    to be dropped. Encoding is inside the boundary (:func:`execution.encode`).

    After the command (after a whole EXEC), clients blocked on keys it filled are
    served (``pion.commands.blocking``), as Redis does after each command."""
    result = _execute(ctx, argv, out)
    if ctx.state.databases.alarm:
        serve(ctx.state)
    return result


def _execute(ctx: Context, argv: Sequence[bytes], out: Chunks) -> int | Deferred | Silenced:
    client = ctx.client
    if client.reply_mode != "on":
        return _silent(ctx, argv, out)
    reply = dispatch(ctx, argv)
    if isinstance(reply, DEFERRED):
        return reply
    return encode(ctx, argv, reply, out)


@dataclass(frozen=True, slots=True)
class Silenced:
    """A silenced client's deferred command: run like any other, its reply dropped."""

    deferred: Deferred


def _silent(ctx: Context, argv: Sequence[bytes], out: Chunks) -> int | Deferred | Silenced:
    """CLIENT REPLY OFF or SKIP: run the command, send nothing, unless the command
    switched replies back on. A deferred part runs as any client's does (off the loop,
    in slices): a silenced client gets no more of the loop than another."""
    begin_silent(ctx.client)
    reply = dispatch(ctx, argv)
    quiet = silenced(ctx.client)
    if isinstance(reply, DEFERRED):
        return Silenced(reply) if quiet else reply
    if quiet:
        return 0
    return encode(ctx, argv, reply, out)
