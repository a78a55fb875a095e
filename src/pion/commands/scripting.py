"""Lua scripting's commands: EVAL, EVALSHA, EVAL_RO, EVALSHA_RO and SCRIPT
(LOAD, EXISTS, FLUSH, KILL, HELP), with Redis 7's replies and error texts. The
runtime (cache, sandbox, conversions) is ``pion.scripting``; what a script's
``redis.call`` does is here (:func:`_script_call`).

A ``redis.call`` passes the checks a client's command passes (arity, MISCONF) and
those Redis adds for scripts (no ``noscript`` command, no write from a read-only
script), then runs through the one error boundary (``execution.call``: counted in
commandstats as its own command). What it would wait for it does not: a deferred
result is settled where it stands, and a blocking command answers as if its time ran
out, as in Redis. The writes a script makes reach the log by their effects, as the
stores' mutations record them, written as one unit (all or none after a crash), as
EXEC's are.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Sequence
from functools import partial
from typing import Any

from pion.commands.args import parse_int
from pion.commands.deferred import Offload
from pion.commands.execution import DEFERRED, call, settle
from pion.commands.scriptbusy import FUNCTION_BUSY, Channel
from pion.commands.state import ClientState, Command, Context
from pion.errors import LoadingError, MisconfError, PionError
from pion.persistence.stores import FREEING_COMMANDS
from pion.resp.reply import ErrorReply, Reply, Simple
from pion.scripting.runtime import Busy, Scripts

__all__ = ["COMMANDS", "keys_args", "run_script", "scripts_of"]

_NOSCRIPT = "NOSCRIPT No matching script. Please use EVAL."
_UNKILLABLE = (
    "UNKILLABLE Sorry the script already executed write commands against the dataset. "
    "You can either wait the script termination or kill the server in a hard way using "
    "the SHUTDOWN NOSAVE command."
)
# Redis's `noscript` commands: refused inside a script.
NOT_IN_SCRIPTS = frozenset(
    {
        "MULTI", "EXEC", "DISCARD", "WATCH", "UNWATCH", "EVAL", "EVALSHA", "EVAL_RO",
        "EVALSHA_RO", "SCRIPT", "FUNCTION", "FCALL", "FCALL_RO", "AUTH", "HELLO",
        "CLIENT", "QUIT", "RESET", "SUBSCRIBE", "PSUBSCRIBE", "SSUBSCRIBE",
        "UNSUBSCRIBE", "PUNSUBSCRIBE", "SUNSUBSCRIBE", "SHUTDOWN", "MONITOR",
        "KV.PREFIX.SAVE", "KV.PREFIX.COMMIT",
    }
)  # fmt: skip


def scripts_of(ctx: Context) -> Scripts:
    state = ctx.state
    if state.scripts is None:
        state.scripts = Scripts()
    return state.scripts


def keys_args(args: Sequence[bytes]) -> tuple[list[bytes], list[bytes]]:
    try:
        numkeys = parse_int(args[1])
    except PionError:
        raise PionError("value is not an integer or out of range") from None
    if numkeys > len(args) - 2:
        raise PionError("Number of keys can't be greater than number of args")
    if numkeys < 0:
        raise PionError("Number of keys can't be negative")
    return [bytes(a) for a in args[2 : 2 + numkeys]], [bytes(a) for a in args[2 + numkeys :]]


def _eval(ctx: Context, args: Sequence[bytes], *, readonly: bool = False) -> Reply | Offload[Reply]:
    keys, argv = keys_args(args)
    scripts = scripts_of(ctx)
    sha, fn = scripts.compile(bytes(args[0]))
    return run_script(ctx, scripts, sha, fn, keys, argv, readonly)


def _evalsha(
    ctx: Context, args: Sequence[bytes], *, readonly: bool = False
) -> Reply | Offload[Reply]:
    scripts = scripts_of(ctx)
    sha = bytes(args[0]).decode("latin-1").lower()
    body = scripts.cache.get(sha)
    if body is None:
        return ErrorReply(_NOSCRIPT)
    keys, argv = keys_args(args)
    sha, fn = scripts.compile(body)
    return run_script(ctx, scripts, sha, fn, keys, argv, readonly)


def run_script(  # noqa: PLR0917 - the parts of one script run, all required
    ctx: Context,
    scripts: Scripts,
    sha: str,
    fn: Any,
    keys: list[bytes],
    argv: list[bytes],
    readonly: bool,
    function: list[bytes] | None = None,
) -> Reply | Offload[Reply]:
    """Run the script with its calls as a client of its own (the caller's id and name,
    RESP2 until redis.setresp), its writes one unit in the log: on a live connection
    off the loop (``scriptbusy``), else here. ``function``: FCALL's command, when
    ``fn`` is a function's callback (``sha`` its name)."""
    caller = ctx.client
    # Its own database too: a SELECT in the script changes the script's, not the
    # caller's (Redis 7).
    inner = ClientState(id=caller.id, proto=2, authenticated=True, name=caller.name, db=caller.db)
    script_ctx = Context(ctx.state, inner, ctx.table)
    state = ctx.state
    loop = _running_loop() if ctx.may_wait else None
    busy = None
    if loop is not None:
        busy = Busy(caller.id, scripts.busy_ms, sha if function else None, function or [])
    run_call = partial(_script_call, script_ctx, readonly, busy)
    persistence = state.persistence if not state.in_unit else None
    if persistence is not None:
        persistence.begin_unit()
        state.in_unit = True

    def end() -> None:
        if persistence is not None:
            state.in_unit = False
            persistence.end_unit()

    if loop is None or busy is None:
        try:
            return scripts.run(sha, fn, keys, argv, run_call, function=function is not None)
        finally:
            end()
    scripts.busy = busy
    channel = Channel(loop, run_call)
    script = scripts.thread.submit(
        partial(scripts.run, sha, fn, keys, argv, channel.call, function=function is not None)
    )

    def finish(result: Reply | BaseException) -> Reply:
        scripts.busy = None
        try:
            end()
        finally:
            busy.wake()
        if isinstance(result, BaseException):
            raise result
        return result

    if channel.serve_until(script, busy.left()):
        exc = script.exception()
        return finish(exc if exc is not None else script.result())

    def work() -> Reply:
        if threading.get_ident() == loop_thread:  # settled here: serve it to its end
            while not script.done():
                channel.drain()
                concurrent.futures.wait([script], timeout=0.001)
        return script.result()

    loop_thread = threading.get_ident()
    return Offload(work, finish)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _script_call(
    ctx: Context, readonly: bool, busy: Busy | None, argv: list[bytes], resp: int
) -> Reply:
    """One ``redis.call`` (module docstring); raises PionError for a refusal."""
    name = argv[0].decode("utf-8", "replace").upper()
    cmd = ctx.table.get(name)
    if cmd is None:
        raise PionError("Unknown Redis command called from script")
    if name in NOT_IN_SCRIPTS:
        raise PionError("This Redis command is not allowed from script")
    if not cmd.arity_ok(len(argv) - 1):
        raise PionError("Wrong number of args calling Redis command from script")
    state = ctx.state
    if "write" in cmd.flags:
        if readonly:
            raise PionError("Write commands are not allowed from read-only scripts.")
        if state.persistence is not None and name not in FREEING_COMMANDS:
            refusal = state.persistence.write_refusal()
            if refusal is not None:
                raise MisconfError(refusal)
    if state.loading:
        raise LoadingError()
    ctx.client.proto = resp
    state.counters.total_commands_processed += 1
    result = call(ctx, cmd, argv)
    if isinstance(result, DEFERRED):
        result = settle(ctx, argv, result)
    if busy is not None and "write" in cmd.flags and not isinstance(result, ErrorReply):
        busy.wrote = True  # SCRIPT KILL now refuses (-UNKILLABLE)
    return result


def _eval_ro(ctx: Context, args: Sequence[bytes]) -> Reply | Offload[Reply]:
    return _eval(ctx, args, readonly=True)


def _evalsha_ro(ctx: Context, args: Sequence[bytes]) -> Reply | Offload[Reply]:
    return _evalsha(ctx, args, readonly=True)


_HELP = [
    "SCRIPT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "DEBUG (YES|SYNC|NO)",
    "    Set the debug mode for subsequent scripts executed.",
    "EXISTS <sha1> [<sha1> ...]",
    "    Return information about the existence of the scripts in the script cache.",
    "FLUSH [ASYNC|SYNC]",
    "    Flush the Lua scripts cache. Very dangerous on replicas.",
    "    When called without the optional mode argument, the behavior is determined by the",
    "    lazyfree-lazy-user-flush configuration directive. Valid modes are:",
    "    * ASYNC: Asynchronously flush the scripts cache.",
    "    * SYNC: Synchronously flush the scripts cache.",
    "KILL",
    "    Kill the currently executing Lua script.",
    "LOAD <script>",
    "    Load a script into the scripts cache without executing it.",
    "HELP",
    "    Prints this help.",
]


# SCRIPT's subcommands: name -> Redis's arity (counting SCRIPT and the subcommand).
_SUBCOMMANDS = {"LOAD": 3, "EXISTS": -3, "FLUSH": -2, "KILL": 2, "HELP": 2}


def _script(ctx: Context, args: Sequence[bytes]) -> Reply:
    sub = bytes(args[0]).decode("utf-8", "replace")
    arity = _SUBCOMMANDS.get(sub.upper())
    if arity is None:
        raise PionError(f"unknown subcommand '{sub[:128]}'. Try SCRIPT HELP.")
    n = len(args) + 1
    if n != arity if arity > 0 else n < -arity:
        raise PionError(f"wrong number of arguments for 'script|{sub.lower()}' command")
    scripts = scripts_of(ctx)
    sub = sub.upper()
    if sub == "LOAD":
        sha, _ = scripts.compile(bytes(args[1]))
        return sha
    if sub == "EXISTS":
        return [int(bytes(a).decode("latin-1").lower() in scripts.cache) for a in args[1:]]
    if sub == "FLUSH":
        if len(args) > 2 or (len(args) == 2 and bytes(args[1]).upper() not in (b"ASYNC", b"SYNC")):
            raise PionError("SCRIPT FLUSH only support SYNC|ASYNC option")
        scripts.flush()
        return Simple("OK")
    if sub == "KILL":
        busy = scripts.busy
        if busy is None:
            return ErrorReply("NOTBUSY No scripts in execution right now.")
        if busy.function is not None:  # FUNCTION KILL's to stop, as Redis answers
            return ErrorReply(FUNCTION_BUSY)
        if busy.wrote:
            return ErrorReply(_UNKILLABLE)
        scripts.kill()
        return Simple("OK")
    return [Simple(line) for line in _HELP]


COMMANDS = (
    Command("EVAL", _eval, -3, frozenset({"noscript"}), "Run a Lua script"),
    Command("EVALSHA", _evalsha, -3, frozenset({"noscript"}), "Run a cached Lua script"),
    Command("EVAL_RO", _eval_ro, -3, frozenset({"readonly", "noscript"}), "Run a read-only script"),
    Command(
        "EVALSHA_RO",
        _evalsha_ro,
        -3,
        frozenset({"readonly", "noscript"}),
        "Run a cached read-only script",
    ),
    Command("SCRIPT", _script, -2, frozenset({"noscript"}), "Manage the script cache"),
)
