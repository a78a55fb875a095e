"""Transactions (docs/protocol.md, "Transactions"): MULTI, EXEC, DISCARD, WATCH,
UNWATCH, with Redis 7's semantics and error texts.

After MULTI the dispatcher (``pion.server.dispatch``) hands every command to
:func:`queue_command` instead of running it, once the checks that run before any
command passed (unknown command, authentication, arity, loading, MISCONF): a command
refused by one of those, or one that cannot be queued, makes the transaction fail, and
EXEC then answers ``-EXECABORT`` and runs nothing. The commands in :data:`IMMEDIATE`
run at once even inside MULTI (MULTI, EXEC, DISCARD, WATCH and QUIT, as in Redis).

What can be queued: every keyspace, ``V.*``, ``KV.PREFIX.*``, ``SSM.*``, ``ATTEND.*``
and server command, except those in :data:`NOT_QUEUED`: the connection-state commands
(AUTH, HELLO, CLIENT), SHUTDOWN, and KV.PREFIX.SAVE and KV.PREFIX.COMMIT, which
act on the log the transaction is being written to. Those answer
``-ERR Command not allowed inside a transaction`` and fail the transaction.

A SELECT queued inside MULTI switches the database of the queued commands after it (and
the client's, as in Redis). EXEC runs the queued commands one after the other on the
event loop thread, with no other client's command in between (the loop does not yield
inside a handler), so nobody sees the transaction half-applied. Each runs through the
one error boundary (``pion.commands.execution``); a command whose work is normally
deferred (offloaded, in steps, streamed) runs inline, and one that would wait answers as
if its time had run out, as a blocking command does inside Redis's MULTI. Steps that
only encode what their command took (a large KEYS, a large reply) are kept, and EXEC's
reply is sent in steps (``chunked.encoded_array``), so a large transaction's reply does
not hold the loop. A runtime error fails that command only: its reply is the error and
the others run. Their log records become one unit (``begin_unit``/``end_unit`` of the
persistence layer; ``pion.persistence.txn_format``): a crash leaves all of an EXEC's
writes in the log or none, and under ``appendfsync always`` the EXEC reply waits for the
fsync of that one record like any write's reply.

Refused before anything runs, the transaction discarded: a log that is failing while
the transaction holds a write command (``-EXECABORT Transaction discarded because of:
MISCONF ...``, as Redis), and under ``-w N`` a command on a session or namespace
another worker owns (``-EXECABORT Transaction discarded because of: ERR ... session
lives on worker N``; that command's queuing already answered the redirect).

WATCH is bookkeeping in the stores (:mod:`pion.watch`): a name is watched as a key of
the client's selected database, as a V-store session id, and as a registry namespace
(its two sessions ``<name>_pk`` and ``<name>_pv``). Any change through the stores'
mutation primitives (write, delete, expiry, eviction, flush) by anyone, this client
included, makes EXEC answer nil (``*-1`` in RESP2, ``_`` in RESP3); so does a watched
key's deadline passing before EXEC. EXEC, DISCARD, UNWATCH and disconnecting forget the
client's watches.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from functools import partial
from time import perf_counter_ns
from typing import TypeVar, cast

from pion.commands.chunked import encoded_array
from pion.commands.deferred import Steps
from pion.commands.execution import DEFERRED, call, encode, failed, settle
from pion.commands.plain import allowed, plain_argv
from pion.commands.plain import serve as serve_plain
from pion.commands.state import ClientState, Command, Context, ServerState
from pion.commands.workers import redirect_namespace, redirect_session
from pion.errors import ExecAbortError, MisconfError, PionError
from pion.resp.encoder import Chunks, encode_simple
from pion.resp.reply import ErrorReply, NullArray, Reply, Simple
from pion.watch import WatchToken
from pion.wire import namespace_sids

T = TypeVar("T")

__all__ = [
    "COMMANDS",
    "IMMEDIATE",
    "NOT_QUEUED",
    "WHOLE_MAX",
    "forget_client",
    "queue_command",
    "refused_in_multi",
    "serve_whole",
]

# Run at once inside MULTI (Redis: exec, discard, multi, watch, quit, reset).
IMMEDIATE = frozenset({"MULTI", "EXEC", "DISCARD", "WATCH", "QUIT"})
# Refused inside MULTI, failing the transaction (module docstring).
NOT_QUEUED = frozenset(
    {"AUTH", "HELLO", "CLIENT", "SHUTDOWN", "KV.PREFIX.SAVE", "KV.PREFIX.COMMIT"}
)
# What one client's open transaction may hold: a bound, so MULTI followed by an endless
# stream of commands cannot grow the server without limit.
MAX_QUEUED = 100_000
MAX_QUEUED_BYTES = 512 << 20

_QUEUED = Simple("QUEUED")
_OK = Simple("OK")
_PLAIN_NAMES = frozenset({"GET", "SET"})
_OK_BYTES = b"+OK\r\n"
_QUEUED_BYTES = b"+QUEUED\r\n"
_NOT_ALLOWED = "Command not allowed inside a transaction"
_ABORTED = "Transaction discarded because of previous errors."
# KV.PREFIX commands whose arguments from the first on are namespaces (DROP: all of
# them; the others: the first), refused under -w N when another worker owns one.
_NAMESPACE_COMMANDS = {
    "KV.PREFIX.REGISTER": 1,
    "KV.PREFIX.BLOCKS": 1,
    "KV.PREFIX.MEMBERSHIP": 1,
    "KV.PREFIX.WARM": 1,
    "KV.PREFIX.DROP": -1,
}


# -- queuing (called by the dispatcher) --------------------------------------------------


def queue_command(ctx: Context, cmd: Command, argv: Sequence[bytes]) -> Reply:
    """Queue ``cmd`` in the client's open transaction; raises (and the transaction then
    fails) for a command that cannot be queued."""
    queued = ctx.client.queued
    if queued is None:  # the dispatcher calls this only inside MULTI
        raise PionError("EXEC without MULTI")
    if cmd.name in NOT_QUEUED:
        raise PionError(_NOT_ALLOWED)
    if ctx.state.registry.directory is not None:  # under -w N
        _check_local(ctx, cmd, argv)
    size = sum(map(len, argv))
    client = ctx.client
    if len(queued) >= MAX_QUEUED or client.queued_bytes + size > MAX_QUEUED_BYTES:
        raise PionError(
            f"a transaction holds at most {MAX_QUEUED} commands and {MAX_QUEUED_BYTES} "
            "bytes of arguments; EXEC it in smaller parts"
        )
    queued.append((cmd, argv))
    client.queued_bytes += size
    return _QUEUED


def refused_in_multi(ctx: Context, name: str, exc: PionError) -> ErrorReply:
    """Inside MULTI, a command refused before it ran (or before it was queued): the
    transaction fails, and a refused EXEC discards it at once, as Redis does (its
    message then drops a plain ``ERR`` code: ``because of: wrong number of arguments
    for 'exec' command``)."""
    client = ctx.client
    if name == "EXEC":
        forget_client(ctx.state, client)
        why = exc.message if exc.code == "ERR" else exc.resp_line()
        return ErrorReply(f"EXECABORT Transaction discarded because of: {why}")
    client.queue_failed = True
    return ErrorReply(exc.resp_line())


def _check_local(ctx: Context, cmd: Command, argv: Sequence[bytes]) -> None:
    """Under -w N: raise the redirect when ``cmd`` acts on a session or namespace
    another worker owns (callers skip it on a single-process server)."""
    if len(argv) < 2:
        return
    name = cmd.name
    if name.startswith("V."):
        redirect_session(ctx, argv[1], name)
        return
    first = _NAMESPACE_COMMANDS.get(name)
    if first is not None:
        for ns in argv[1:] if first < 0 else argv[1:2]:
            redirect_namespace(ctx, ns, name)


def forget_client(state: ServerState, client: ClientState) -> None:
    """The client disconnected: drop its transaction and its watches."""
    client.queued = None
    client.queue_failed = False
    client.queued_bytes = 0
    _unwatch(state, client)


# -- the commands --------------------------------------------------------------------------


def _multi(ctx: Context, args: Sequence[bytes]) -> Reply:
    client = ctx.client
    if client.queued is not None:
        raise PionError("MULTI calls can not be nested")
    client.queued = []
    client.queue_failed = False
    client.queued_bytes = 0
    return _OK


def _discard(ctx: Context, args: Sequence[bytes]) -> Reply:
    client = ctx.client
    if client.queued is None:
        raise PionError("DISCARD without MULTI")
    forget_client(ctx.state, client)
    return Simple("OK")


def _watch(ctx: Context, args: Sequence[bytes]) -> Reply:
    client = ctx.client
    if client.queued is not None:
        raise PionError("WATCH inside MULTI is not allowed")
    state = ctx.state
    token = client.watch
    if token is None:
        token = client.watch = WatchToken()
    keyspace, vstore = state.keyspace, state.vstore
    for raw in args:
        name = bytes(raw)
        if (keyspace.db, name) not in token.keys:
            token.keys[keyspace.db, name] = keyspace.past_deadline(name)
            keyspace.watchers.add(name, token)
        for sid in (name, *namespace_sids(name)):
            if sid not in token.sessions:
                token.sessions.add(sid)
                vstore.watchers.add(sid, token)
    return Simple("OK")


def _unwatch_cmd(ctx: Context, args: Sequence[bytes]) -> Reply:
    _unwatch(ctx.state, ctx.client)
    return Simple("OK")


def _unwatch(state: ServerState, client: ClientState) -> None:
    token = client.watch
    if token is None:
        return
    client.watch = None
    for db, key in token.keys:
        state.databases[db].watchers.remove(key, token)
    for sid in token.sessions:
        state.vstore.watchers.remove(sid, token)


def _changed(state: ServerState, token: WatchToken | None) -> bool:
    """A watched name changed, or a watched key live at WATCH is past its deadline."""
    if token is None:
        return False
    if token.dirty:
        return True
    dbs = state.databases
    return any(not was and dbs[db].past_deadline(k) for (db, k), was in token.keys.items())


def _exec(ctx: Context, args: Sequence[bytes]) -> Reply | Steps:
    client, state = ctx.client, ctx.state
    queued = client.queued
    if queued is None:
        raise PionError("EXEC without MULTI")
    failed = client.queue_failed
    changed = _changed(state, client.watch)
    forget_client(state, client)
    if failed:
        raise ExecAbortError(_ABORTED)
    if changed:
        return NullArray()
    persistence = state.persistence
    try:
        if persistence is not None:
            refusal = persistence.write_refusal()
            if refusal is not None and any("write" in c.flags for c, _ in queued):
                raise MisconfError(refusal)
        if state.registry.directory is not None:
            for cmd, argv in queued:
                _check_local(ctx, cmd, argv)
    except PionError as exc:
        raise ExecAbortError(f"Transaction discarded because of: {exc.resp_line()}") from None
    return _as_unit(state, partial(_run_queued, ctx, queued))


def _as_unit(state: ServerState, run: Callable[[], T]) -> T:
    """``run()`` with its log records made one unit (module docstring)."""
    persistence = state.persistence
    if persistence is None:
        return run()
    persistence.begin_unit()
    state.in_unit = True
    try:
        return run()
    finally:
        state.in_unit = False
        persistence.end_unit()


def _run_queued(ctx: Context, queued: Sequence[tuple[Command, Sequence[bytes]]]) -> Reply | Steps:
    """Run the queued commands in order, each through the one boundary, its reply
    encoded into EXEC's there too (a reply that cannot be encoded is that command's
    error, not EXEC's). Runs of plain GET and SET are served many at a time
    (``plain.py``): a transaction of them, the usual one, all at once here."""
    # Runs inside EXEC only where a SET may run in them (no log record to build, the
    # usual transaction being writes): else each command as before.
    runs = ctx.state.databases.all[ctx.client.db].journal is None and all(allowed(ctx))
    out: Chunks = []
    if runs and queued and plain_argv(queued[0][1], True):
        served = _run_from(ctx, queued, 0, out)
        if served == len(queued):
            return encoded_array(len(queued), [out], ctx.client.proto)
        return _run_rest(ctx, queued, served, out, runs)
    return _run_rest(ctx, queued, 0, out, runs)


def _run_from(
    ctx: Context, queued: Sequence[tuple[Command, Sequence[bytes]]], start: int, out: Chunks
) -> int:
    """A run of the queued commands from ``start``: how many it served."""
    # (The queued arguments are the decoder's lists; a run leaves any other kind.)
    pending = cast("list[list[bytes]]", [argv for _, argv in reversed(queued[start:])])
    left = len(pending)
    serve_plain(ctx, pending, out, may_set=True, max_cmds=left, max_bytes=sys.maxsize)
    return start + left - len(pending)


def _run_rest(
    ctx: Context,
    queued: Sequence[tuple[Command, Sequence[bytes]]],
    start: int,
    out: Chunks,
    runs: bool,
) -> Reply | Steps:
    """EXEC's array from ``queued[start]`` on (``out`` holds the replies before it: a
    run left that command, or none was tried), ``runs`` whether runs may serve. A
    deferred part runs here (``execution.settle``), except steps that only encode what
    their command took (``Steps.taken``), which become steps of EXEC's own reply."""
    counters = ctx.state.counters
    parts: list[Chunks | Steps] = []
    may_wait, ctx.may_wait = ctx.may_wait, False  # nothing runs in between: no waits
    # A pub/sub message for this client from one of its own commands (a PUBLISH, a
    # keyspace notification) lands inside EXEC's array, before that command's reply,
    # where Redis writes it.
    client = ctx.client
    push = client.push

    def into_exec(data: bytes) -> None:
        out.append(data)  # the list of the moment (a Steps part starts a new one)

    if push is not None:
        client.push = into_exec
    i, n = start, len(queued)
    try:
        while i < n:
            cmd, argv = queued[i]
            if runs and i > start and plain_argv(argv, True):
                served = _run_from(ctx, queued, i, out)
                if served > i:
                    i = served
                    continue
            i += 1
            counters.total_commands_processed += 1
            result = call(ctx, cmd, argv)
            if runs and cmd.name not in _PLAIN_NAMES:  # it may change what runs may take
                runs = all(allowed(ctx))
            if type(result) is Simple:  # +OK, the usual reply of a queued write: cached
                out.append(encode_simple(result))
                continue
            if isinstance(result, DEFERRED):
                if isinstance(result, Steps) and result.taken:
                    parts += [out, result]
                    out = []
                    continue
                result = settle(ctx, argv, result)
            encode(ctx, argv, result, out)
    finally:
        ctx.may_wait = may_wait
        client.push = push
    parts.append(out)
    return encoded_array(n, [p for p in parts if p], ctx.client.proto)


# -- a transaction that arrived whole (pion.server.batch) ---------------------------------

# The most commands such a transaction may hold.
WHOLE_MAX = 64
_EXECS = ([b"EXEC"], [b"exec"])


def serve_whole(
    ctx: Context, ready: list[list[bytes]], out: Chunks, may_set: bool
) -> tuple[int, int]:
    """MULTI, then only plain GET and SET (a SET while ``may_set``), then EXEC, all
    parsed already (``ready``, next last), from a client with no transaction open
    and nothing WATCHed: answered and counted as they are one by one (``+OK``,
    ``+QUEUED`` each, EXEC's array), without building the queue, since nothing can run
    in between. The caller made the checks every command passes and asked
    ``plain.allowed`` (``pion.server.batch``). Returns ``(commands served, reply
    bytes)``; ``(0, 0)`` when ``ready`` does not start with such a transaction."""
    client = ctx.client
    if client.queued is not None or client.watch is not None:
        return 0, 0
    n = len(ready)
    i = n - 2
    stop = max(-1, n - 2 - WHOLE_MAX)
    while i > stop and plain_argv(ready[i], may_set):
        i -= 1
    if i < 0 or ready[i] not in _EXECS:
        return 0, 0
    state, stats = ctx.state, ctx.state.stats
    count = n - 2 - i
    multi = ready.pop()
    stats.record("MULTI", multi, _OK, perf_counter_ns(), client)
    inner = ready[i + 1 :]
    del ready[i + 1 :]
    exec_argv = ready.pop()
    state.counters.total_commands_processed += 2 + count
    client.last_command = "EXEC"
    started = perf_counter_ns()
    reply: Reply | Steps
    try:  # the boundary's conversion, as EXEC's handler has it (execution.call)
        reply = _as_unit(state, partial(_run_whole, ctx, count, inner, may_set))
    except Exception as exc:
        reply = failed(ctx, "EXEC", exc)
    if isinstance(reply, Steps):  # (only a huge reply is: not of these)
        reply = settle(ctx, exec_argv, reply)
    stats.record("EXEC", exec_argv, reply, started, client)
    head = [_OK_BYTES, *[_QUEUED_BYTES] * count]
    out += head
    return count + 2, sum(map(len, head)) + encode(ctx, exec_argv, reply, out)


def _run_whole(ctx: Context, count: int, inner: list[list[bytes]], may_set: bool) -> Reply | Steps:
    """EXEC's part of :func:`serve_whole`: ``inner`` (next last) as one run, and what
    the run leaves as :func:`_run_rest` runs it."""
    order = inner[::-1]  # the transaction's commands in order (the run pops ``inner``)
    out: Chunks = []
    serve_plain(ctx, inner, out, may_set=may_set, max_cmds=count, max_bytes=sys.maxsize)
    if not inner:
        return encoded_array(count, [out], ctx.client.proto)
    get, set_ = ctx.table["GET"], ctx.table["SET"]
    queued = [(get if len(argv) == 2 else set_, argv) for argv in order]
    return _run_rest(ctx, queued, count - len(inner), out, may_set)


COMMANDS = (
    Command("MULTI", _multi, 1, frozenset({"fast", "loading"}), "Start a transaction"),
    Command("EXEC", _exec, 1, frozenset({"loading"}), "Run the queued commands"),
    Command("DISCARD", _discard, 1, frozenset({"fast", "loading"}), "Drop the transaction"),
    Command("WATCH", _watch, -2, frozenset({"fast", "loading"}), "Watch keys and sessions"),
    Command("UNWATCH", _unwatch_cmd, 1, frozenset({"fast", "loading"}), "Forget watches"),
)
