"""One worker's Lua scripting: the script cache (EVAL/EVALSHA/SCRIPT), the Lua state
(built on the first script, ``pion.scripting.sandbox``), and running a script with its
``redis.call``\\s going through the command table.

A script runs on the event loop thread from start to end, like a command handler, so
no other client's command runs in between (atomic, as in Redis). Each ``redis.call``
runs its command through the caller's :data:`Call` (``pion.commands.scripting``: the
checks, the error boundary, commandstats); its reply is encoded for the script's
protocol and converted (``pion.scripting.convert``).

The cache is not persisted and SCRIPT FLUSH empties it (Redis: the script cache is
not part of the dataset).
"""

from __future__ import annotations

import hashlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from pion.errors import PionError
from pion.resp.encoder import encode_reply
from pion.resp.reply import ErrorReply, Reply
from pion.scripting.convert import from_lua, resp_to_lua
from pion.scripting.functions import Libraries

__all__ = ["Busy", "Call", "ScriptThread", "Scripts", "sha1hex"]

log = logging.getLogger("pion.scripting")

_LOG_LEVELS = (logging.DEBUG, logging.INFO, logging.INFO, logging.WARNING)
VERSION = b"7.2.0"  # what INFO says (pion.commands.info)
VERSION_NUM = 0x070200


def sha1hex(body: bytes) -> str:
    return hashlib.sha1(body).hexdigest()


Call = Callable[[list[bytes], int], Reply]
"""How a script's ``redis.call`` runs a command: ``call(argv, resp)`` -> its reply
(raises PionError for a refusal); the command layer supplies it
(``pion.commands.scripting``)."""


@dataclass
class _Run:
    """One script's run: how its commands run, and its protocol (redis.setresp)."""

    call: Call
    resp: int = 2
    killed: bool = False


@dataclass
class Busy:
    """A script running off the loop (``pion.commands.scriptbusy``): whose, since
    when, whether it wrote (SCRIPT KILL then refuses), and the other clients'
    commands waiting for it to end."""

    client_id: int
    threshold_ms: int
    # FCALL's: the function's name and the command that called it (FUNCTION STATS,
    # FUNCTION KILL, and the BUSY reply's text); None for EVAL's
    function: str | None = None
    argv: list[bytes] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    wrote: bool = False
    waiters: list[Callable[[], None]] = field(default_factory=list)

    def left(self) -> float:
        """Seconds until the threshold (0 once past it)."""
        return max(0.0, self.started + self.threshold_ms / 1000 - time.monotonic())

    def wake(self) -> None:
        """The script ended: the waiting commands run, in the order they came."""
        waiters, self.waiters = self.waiters, []
        for go in waiters:
            go()


class ScriptThread:
    """The one thread a worker runs its scripts on (one script runs at a time: the
    gate holds the others), started with the first script."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Reply], Future[Reply]]] = (
            queue.SimpleQueue()
        )
        self._thread: threading.Thread | None = None

    def submit(self, job: Callable[[], Reply]) -> Future[Reply]:
        if self._thread is None:
            self._thread = threading.Thread(target=self._main, name="pion-script", daemon=True)
            self._thread.start()
        done: Future[Reply] = Future()
        self._jobs.put((job, done))
        return done

    def _main(self) -> None:
        while True:
            job, done = self._jobs.get()
            try:
                done.set_result(job())
            except BaseException as exc:  # handed to the loop thread
                done.set_exception(exc)


@dataclass
class Scripts:
    """The worker's script cache and Lua state."""

    cache: dict[str, bytes] = field(default_factory=dict)
    # busy-reply-threshold (alias lua-time-limit), in milliseconds
    busy_ms: int = 5000
    # the script running off the loop, while one does, and the thread scripts run on
    busy: Busy | None = None
    thread: ScriptThread = field(default_factory=ScriptThread)
    _lua: Any = None
    _compile: Any = None
    _run_lua: Any = None
    _load_lua: Any = None
    _run_function: Any = None
    _functions: dict[str, Any] = field(default_factory=dict)
    _current: _Run | None = None
    # FUNCTION LOAD's libraries (part of the dataset, unlike the cache above)
    libraries: Libraries = field(init=False)

    def __post_init__(self) -> None:
        self.libraries = Libraries(self)

    @property
    def running(self) -> bool:
        """Whether a script is running: while it does, the commands that run are its
        own (other clients wait), so a command may ask whether a script called it
        (SORT does, as Redis's does; XREAD BLOCK may not block)."""
        return self._current is not None

    # -- the Lua state -------------------------------------------------------------

    def _state(self) -> None:
        if self._lua is not None:
            return
        from pion.scripting.libs import Libraries
        from pion.scripting.sandbox import PRELUDE, new_runtime

        lua = new_runtime()
        libs = Libraries(lua)
        prelude = lua.execute(b"return loadstring(...)", PRELUDE, b"=prelude")
        self._compile, self._run_lua, self._load_lua, self._run_function = prelude(
            self._redis_call, _log, libs.sha1, libs.random, libs.seed, libs.json_encode,
            libs.json_decode, libs.struct, libs.bit, VERSION, VERSION_NUM, self._killed,
            time.monotonic,
        )  # fmt: skip
        # lupa hands Lua's -0.0 over as the integer 0: its sign is asked in Lua.
        self._negative_zero = lua.eval(
            "function(t) local d = rawget(t, 'double') return d == 0 and 1 / d < 0 end"
        )
        self._lua = lua

    def compile(self, body: bytes) -> tuple[str, Any]:
        """The script's id and its compiled function (cached); PionError for a script
        that does not compile, with Redis's text."""
        sha = sha1hex(body)
        fn = self._functions.get(sha)
        if fn is None:
            self._state()
            got = self._compile(body, b"@user_script")
            fn, message = got if isinstance(got, tuple) else (got, b"")
            if fn is None:
                text = message.decode("utf-8", "replace")
                raise PionError(f"Error compiling script (new function): {text}")
            self._functions[sha] = fn
            self.cache[sha] = body
        return sha, fn

    def load_library(self, code: bytes) -> list[tuple[str, Any, list[str], bytes | None]]:
        """Run a library's code in the load-time sandbox (``pion.scripting.functions``):
        the functions it registered as (name, callback, flags, description); PionError
        with Redis's text for code that does not compile or fails."""
        self._state()
        got = self._load_lua(code)
        if got[0] is not True:
            kind, message = got[1], got[2]
            text = message.decode("utf-8", "replace") if isinstance(message, bytes) else ""
            if kind == b"compile":
                raise PionError(f"Error compiling function: {text}")
            raise PionError(f"Error registering functions: {text}")
        out = []
        for entry in got[1].values():
            flags = [bytes(f).decode() for f in entry[3].values()]
            desc = entry[4]
            out.append((bytes(entry[1]).decode(), entry[2], flags, desc))
        return out

    def flush(self) -> None:
        """SCRIPT FLUSH: forget every script (the Lua state is rebuilt on next use,
        unless function libraries live in it: they are not the script cache's)."""
        self.cache.clear()
        self._functions.clear()
        if self._current is None and not self.libraries.libraries:
            self._lua = self._compile = self._run_lua = None
            self._load_lua = self._run_function = None

    # -- running -------------------------------------------------------------------

    def run(
        self,
        sha: str,
        fn: Any,
        keys: Sequence[bytes],
        argv: Sequence[bytes],
        call: Call,
        *,
        function: bool = False,
    ) -> Reply:
        """Run compiled ``fn`` with KEYS and ARGV (a function's callback: with them as
        its two arguments), its commands through ``call``; the reply it returns, or its
        error as Redis words it (``sha``: the function's name for a function)."""
        if self._current is not None:  # a script cannot run a script (noscript refuses)
            raise PionError("a script is already running")
        lua = self._lua
        run = self._current = _Run(call)
        try:
            runner = self._run_function if function else self._run_lua
            result = runner(fn, lua.table_from(list(keys)), lua.table_from(list(argv)))
        finally:
            self._current = None
        ok, value = (result[0], result[1]) if isinstance(result, tuple) else (result, None)
        if ok:
            return from_lua(value, run.resp, negative_zero=self._negative_zero)
        return _script_error(value, sha)

    def kill(self) -> None:
        """SCRIPT KILL: the running script raises at its next check (any thread)."""
        run = self._current
        if run is not None:
            run.killed = True

    def _killed(self) -> bool:
        run = self._current
        return run is not None and run.killed

    def _redis_call(self, argv_table: Any, n: int) -> tuple[bool, Any]:
        """``redis.call``/``pcall`` (and ``setresp`` when ``argv_table`` is nil):
        ``(True, value)`` or ``(False, {err=...})``; never raises into Lua."""
        run = self._current
        lua = self._lua
        if run is None:
            return False, lua.table_from({b"err": b"ERR not inside a script"})
        if argv_table is None:
            run.resp = int(n)
            return True, None
        argv = [bytes(argv_table[i + 1]) for i in range(int(n))]
        try:
            reply = run.call(argv, run.resp)
            out: list[Any] = []
            encode_reply(reply, run.resp, out)
            data = b"".join(bytes(c) for c in out)
        except PionError as exc:
            data = b"-" + exc.resp_line().encode() + b"\r\n"
        except Exception:
            log.exception("internal error in a script's call")
            data = b"-ERR internal error\r\n"
        return resp_to_lua(lua, data, run.resp)


def _script_error(err: Any, sha: str) -> ErrorReply:
    """The reply to a script that raised (Redis's luaCallFunction)."""
    from lupa.lua51 import lua_type

    if lua_type(err) != "table":
        text = err.decode("utf-8", "replace") if isinstance(err, bytes) else "execution failure"
        return ErrorReply(f"ERR Error running script {sha}, {text[:100]}")
    msg = err[b"err"]
    line = msg.decode("utf-8", "replace") if isinstance(msg, bytes) else ""
    source, where = err[b"source"], err[b"line"]
    if isinstance(source, bytes) and where is not None:
        line += f" script: {sha}, on {source.decode('utf-8', 'replace')}:{int(where)}."
    return ErrorReply(line.replace("\r", " ").replace("\n", " "))


def _log(level: float, message: bytes) -> None:
    log.log(_LOG_LEVELS[int(level)], "script: %s", message.decode("utf-8", "replace"))
