"""Redis functions' commands: FUNCTION (LOAD, LIST, DELETE, FLUSH, STATS, KILL, DUMP,
RESTORE, HELP), FCALL and FCALL_RO, with redis-server 7.0's replies and error texts.

The libraries are ``pion.scripting.functions``; a function runs exactly as an EVAL
script does (``pion.commands.scripting``: atomic, its writes one unit in the log, the
same busy threshold, -BUSY for the others, FUNCTION KILL as SCRIPT KILL), with its
flags: a ``no-writes`` function runs read-only, and FCALL_RO runs only those.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from pion.commands.args import parse_int
from pion.commands.deferred import Offload
from pion.commands.scriptbusy import BUSY
from pion.commands.scripting import keys_args, run_script, scripts_of
from pion.commands.state import Command, Context
from pion.errors import PionError
from pion.keyspace.glob import stringmatch
from pion.resp.reply import ErrorReply, Reply, SetReply, Simple
from pion.scripting.functions import dump_libraries

__all__ = ["COMMANDS"]

_UNKILLABLE = (
    "UNKILLABLE Sorry the script already executed write commands against the dataset. "
    "You can either wait the script termination or kill the server in a hard way using "
    "the SHUTDOWN NOSAVE command."
)
_NOTBUSY = "NOTBUSY No scripts in execution right now."


def _fcall(
    ctx: Context, args: Sequence[bytes], *, readonly: bool = False
) -> Reply | Offload[Reply]:
    scripts = scripts_of(ctx)
    fn = scripts.libraries.functions.get(bytes(args[0]).decode("utf-8", "replace"))
    if fn is None:
        raise PionError("Function not found")
    try:
        parse_int(args[1])
    except PionError:
        raise PionError("Bad number of keys provided") from None
    keys, argv = keys_args(args)
    no_writes = "no-writes" in fn.flags
    if readonly and not no_writes:
        raise PionError("Can not execute a script with write flag using *_ro command.")
    command = [b"FCALL_RO" if readonly else b"FCALL", *(bytes(a) for a in args)]
    return run_script(ctx, scripts, fn.name, fn.callback, keys, argv, no_writes, function=command)


def _fcall_ro(ctx: Context, args: Sequence[bytes]) -> Reply | Offload[Reply]:
    return _fcall(ctx, args, readonly=True)


def _load(ctx: Context, args: Sequence[bytes]) -> Reply:
    replace = False
    for opt in args[1:-1]:
        if bytes(opt).upper() != b"REPLACE":
            raise PionError(f"Unknown option given: {bytes(opt).decode('utf-8', 'replace')}")
        replace = True
    return scripts_of(ctx).libraries.load(bytes(args[-1]), replace)


def _list(ctx: Context, args: Sequence[bytes]) -> Reply:
    with_code, pattern = False, None
    i = 1
    while i < len(args):
        word = bytes(args[i])
        if not with_code and word.upper() == b"WITHCODE":
            with_code = True
        elif pattern is None and word.upper() == b"LIBRARYNAME":
            if i >= len(args) - 1:
                raise PionError("library name argument was not given")
            i += 1
            pattern = bytes(args[i])
        else:
            raise PionError(f"Unknown argument {word.decode('utf-8', 'replace')}")
        i += 1
    out: list[Reply] = []
    for lib in scripts_of(ctx).libraries.libraries.values():
        if pattern is not None and not stringmatch(pattern, lib.name.encode()):
            continue
        functions: list[Reply] = [
            {
                "name": fn.name,
                "description": fn.description,
                "flags": SetReply(Simple(f) for f in fn.flags),
            }
            for fn in lib.functions.values()
        ]
        entry: dict[str | bytes, Reply] = {"library_name": lib.name, "engine": "LUA"}
        entry["functions"] = functions
        if with_code:
            entry["library_code"] = lib.code
        out.append(entry)
    return out


def _stats(ctx: Context) -> Reply:
    scripts = scripts_of(ctx)
    busy = scripts.busy
    running: Reply = None
    if busy is not None and busy.function is not None:
        running = {
            "name": busy.function,
            "command": list(busy.argv),
            "duration_ms": int((time.monotonic() - busy.started) * 1000),
        }
    libs = scripts.libraries
    counts: dict[str | bytes, Reply] = {
        "libraries_count": len(libs.libraries),
        "functions_count": len(libs.functions),
    }
    return {"running_script": running, "engines": {"LUA": counts}}


def _kill(ctx: Context) -> Reply:
    scripts = scripts_of(ctx)
    busy = scripts.busy
    if busy is None:
        return ErrorReply(_NOTBUSY)
    if busy.function is None:  # an EVAL script: SCRIPT KILL's to stop, as Redis answers
        return ErrorReply(BUSY)
    if busy.wrote:
        return ErrorReply(_UNKILLABLE)
    scripts.kill()
    return Simple("OK")


def _syntax(sub: bytes) -> PionError:
    """``addReplySubcommandSyntaxError``: the subcommand as the client typed it."""
    text = sub.decode("utf-8", "replace")[:128]
    return PionError(
        f"unknown subcommand or wrong number of arguments for '{text}'. Try FUNCTION HELP."
    )


def _restore(ctx: Context, args: Sequence[bytes]) -> Reply:
    if len(args) > 3:
        raise _syntax(bytes(args[0]))
    policy = bytes(args[2]).upper().decode("latin-1") if len(args) == 3 else "APPEND"
    if policy not in ("FLUSH", "APPEND", "REPLACE"):
        raise PionError(
            "Wrong restore policy given, value should be either FLUSH, APPEND or REPLACE."
        )
    scripts_of(ctx).libraries.restore(bytes(args[1]), policy)
    return Simple("OK")


def _flush(ctx: Context, args: Sequence[bytes]) -> Reply:
    if len(args) > 2:
        raise _syntax(bytes(args[0]))
    if len(args) == 2 and bytes(args[1]).upper() not in (b"ASYNC", b"SYNC"):
        raise PionError("FUNCTION FLUSH only supports SYNC|ASYNC option")
    scripts_of(ctx).libraries.flush()
    return Simple("OK")


# FUNCTION's subcommands: name -> Redis's arity (counting FUNCTION and the subcommand).
_SUBCOMMANDS = {
    "LOAD": -3, "DELETE": 3, "LIST": -2, "FLUSH": -2, "STATS": 2, "KILL": 2, "DUMP": 2,
    "RESTORE": -3, "HELP": 2,
}  # fmt: skip


def _function(ctx: Context, args: Sequence[bytes]) -> Reply:
    sub = bytes(args[0]).decode("utf-8", "replace")
    arity = _SUBCOMMANDS.get(sub.upper())
    if arity is None:
        raise PionError(f"unknown subcommand '{sub[:128]}'. Try FUNCTION HELP.")
    n = len(args) + 1
    if n != arity if arity > 0 else n < -arity:
        raise PionError(f"wrong number of arguments for 'function|{sub.lower()}' command")
    sub = sub.upper()
    if sub == "LOAD":
        return _load(ctx, args)
    if sub == "DELETE":
        scripts_of(ctx).libraries.delete(bytes(args[1]).decode("utf-8", "replace"))
        return Simple("OK")
    if sub == "LIST":
        return _list(ctx, args)
    if sub == "FLUSH":
        return _flush(ctx, args)
    if sub == "STATS":
        return _stats(ctx)
    if sub == "KILL":
        return _kill(ctx)
    if sub == "DUMP":
        return dump_libraries(scripts_of(ctx).libraries.codes())
    if sub == "RESTORE":
        return _restore(ctx, args)
    return [Simple(line) for line in _HELP]


_HELP = [
    "FUNCTION <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "LOAD [REPLACE] <FUNCTION CODE>",
    "    Create a new library with the given library name and code.",
    "DELETE <LIBRARY NAME>",
    "    Delete the given library.",
    "LIST [LIBRARYNAME PATTERN] [WITHCODE]",
    "    Return general information on all the libraries:",
    "    * Library name",
    "    * The engine used to run the Library",
    "    * Library description",
    "    * Functions list",
    "    * Library code (if WITHCODE is given)",
    "    It also possible to get only function that matches a pattern using LIBRARYNAME argument.",
    "STATS",
    "    Return information about the current function running:",
    "    * Function name",
    "    * Command used to run the function",
    "    * Duration in MS that the function is running",
    "    If no function is running, return nil",
    "    In addition, returns a list of available engines.",
    "KILL",
    "    Kill the current running function.",
    "FLUSH [ASYNC|SYNC]",
    "    Delete all the libraries.",
    "    When called without the optional mode argument, the behavior is determined by the",
    "    lazyfree-lazy-user-flush configuration directive. Valid modes are:",
    "    * ASYNC: Asynchronously flush the libraries.",
    "    * SYNC: Synchronously flush the libraries.",
    "DUMP",
    "    Return a serialized payload representing the current libraries, can be restored using FUNCTION RESTORE command",  # noqa: E501
    "RESTORE <PAYLOAD> [FLUSH|APPEND|REPLACE]",
    "    Restore the libraries represented by the given payload, it is possible to give a restore policy to",  # noqa: E501
    "    control how to handle existing libraries (default APPEND):",
    "    * FLUSH: delete all existing libraries.",
    "    * APPEND: appends the restored libraries to the existing libraries. On collision, abort.",
    "    * REPLACE: appends the restored libraries to the existing libraries, On collision, replace the old",  # noqa: E501
    "      libraries with the new libraries (notice that even on this option there is a chance of failure",  # noqa: E501
    "      in case of functions name collision with another library).",
    "HELP",
    "    Prints this help.",
]


COMMANDS = (
    Command("FUNCTION", _function, -2, frozenset({"noscript"}), "Manage function libraries"),
    Command("FCALL", _fcall, -3, frozenset({"noscript"}), "Run a function"),
    Command(
        "FCALL_RO", _fcall_ro, -3, frozenset({"readonly", "noscript"}), "Run a read-only function"
    ),
)
