"""Per-command statistics and the slow log: what INFO commandstats and errorstats report
and what SLOWLOG GET|LEN|RESET serve.

The dispatcher calls :meth:`CommandStats.record` once per command it ran, with the time
its handler took, and :meth:`CommandStats.rejected` / :meth:`CommandStats.unknown` for
commands refused before running (Redis's ``rejected_calls``: arity, authentication,
loading, MISCONF). An error reply from a handler counts as a ``failed_call``, and
so does one found after the handler returned (:meth:`CommandStats.failed_later`). Every
error reply counts in ``errorstats`` under its code (the first word: ``ERR``,
``WRONGTYPE``, ``OOM``...), as in Redis 7.

The time is the handler's own, measured on the event loop: for a command whose number
conversion runs on a worker thread (``deferred.py``) it is the part before the hand-off.

Slow log (Redis's ``slowlog.c``): a command whose handler took at least
``slowlog-log-slower-than`` microseconds (-1: never; 0: every command) is logged, newest
first, keeping ``slowlog-max-len`` entries. Each entry keeps at most 32 arguments (the
last saying how many more there were) of at most 128 bytes each (saying how many bytes
were cut), so a huge SET costs the log a few hundred bytes. AUTH and HELLO are never
logged: their arguments hold passwords.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from pion.resp.reply import ErrorReply

__all__ = [
    "SLOWLOG_DEFAULT_MAX_LEN",
    "SLOWLOG_DEFAULT_THRESHOLD_US",
    "SLOWLOG_MAX_ARGC",
    "SLOWLOG_MAX_STRING",
    "Client",
    "CommandStats",
    "SlowEntry",
]

# Redis's defaults and entry bounds (slowlog.h / redis.conf).
SLOWLOG_DEFAULT_THRESHOLD_US = 10_000
SLOWLOG_DEFAULT_MAX_LEN = 128
SLOWLOG_MAX_ARGC = 32
SLOWLOG_MAX_STRING = 128
_NEVER_LOGGED = frozenset({"AUTH", "HELLO"})
_now_ns = time.perf_counter_ns


class Client(Protocol):
    """What an entry records of the client (``ClientState`` has both)."""

    addr: str
    name: str


@dataclass(frozen=True, slots=True)
class SlowEntry:
    id: int
    timestamp: int  # Unix seconds
    duration_us: int
    args: tuple[bytes, ...]
    client_addr: str
    client_name: str


def _slow_args(argv: Sequence[bytes]) -> tuple[bytes, ...]:
    """Redis's ``slowlogCreateEntry`` trimming of the arguments."""
    shown = min(len(argv), SLOWLOG_MAX_ARGC)
    out: list[bytes] = []
    for i in range(shown):
        if shown != len(argv) and i == shown - 1:
            out.append(b"... (%d more arguments)" % (len(argv) - shown + 1))
            break
        a = argv[i]
        if len(a) > SLOWLOG_MAX_STRING:
            a = bytes(a[:SLOWLOG_MAX_STRING]) + b"... (%d more bytes)" % (
                len(a) - SLOWLOG_MAX_STRING
            )
        else:
            a = bytes(a)
        out.append(a)
    return tuple(out)


class CommandStats:
    """Counters per command and per error code, and the slow log; one per worker."""

    def __init__(self) -> None:
        # name -> [calls, usec, rejected_calls, failed_calls]
        self.commands: dict[str, list[int]] = {}
        self.errors: dict[str, int] = {}
        self.error_replies = 0
        self.slowlog: deque[SlowEntry] = deque(maxlen=SLOWLOG_DEFAULT_MAX_LEN)
        self.slowlog_threshold_us = SLOWLOG_DEFAULT_THRESHOLD_US
        self._next_id = 0

    def _row(self, name: str) -> list[int]:
        row = self.commands.get(name)
        if row is None:
            row = self.commands[name] = [0, 0, 0, 0]
        return row

    def _error(self, reply: ErrorReply) -> None:
        self.error_replies += 1
        code = str(reply).split(" ", 1)[0]
        self.errors[code] = self.errors.get(code, 0) + 1

    def unknown(self, reply: ErrorReply) -> ErrorReply:
        """An unknown command: only its error is counted."""
        self._error(reply)
        return reply

    def rejected(self, name: str, reply: ErrorReply) -> ErrorReply:
        """A command refused before it ran."""
        self._row(name)[2] += 1
        self._error(reply)
        return reply

    def failed_later(self, name: str, reply: ErrorReply) -> None:
        """A command that ran failed after its handler returned (an offloaded finish,
        a step, encoding its reply): its call is recorded already, its failure now."""
        self._row(name)[3] += 1
        self._error(reply)

    def record(
        self, name: str, argv: Sequence[bytes], reply: object, started_ns: int, client: Client
    ) -> None:
        """A command that ran: its handler started at ``started_ns`` (perf_counter_ns).
        On every command's path, so kept to a few dict and integer operations."""
        usec = (_now_ns() - started_ns) // 1000
        row = self.commands.get(name)
        if row is None:
            row = self.commands[name] = [0, 0, 0, 0]
        row[0] += 1
        row[1] += usec
        if isinstance(reply, ErrorReply):
            row[3] += 1
            self._error(reply)
        if usec >= self.slowlog_threshold_us >= 0 and name not in _NEVER_LOGGED:
            self.log_slow(argv, usec, client)

    def record_many(self, name: str, calls: int, usec: int) -> None:
        """``calls`` commands ``name`` that ran without an error, ``usec`` in all (a run
        of them in one call: ``pion.commands.plain``, ``prefix.serve_lookups``, which
        report each slow one to :meth:`log_slow` themselves)."""
        row = self._row(name)
        row[0] += calls
        row[1] += usec

    def log_slow(self, argv: Sequence[bytes], usec: int, client: Client) -> None:
        """Add a command that took ``usec`` to the slow log (the caller compared it
        with the threshold)."""
        if not self.slowlog.maxlen:
            return
        entry = SlowEntry(
            self._next_id, int(time.time()), usec, _slow_args(argv), client.addr, client.name
        )
        self.slowlog.appendleft(entry)
        self._next_id += 1

    def set_slowlog_max_len(self, n: int) -> None:
        self.slowlog = deque(self.slowlog, maxlen=n)

    def reset(self) -> None:
        """CONFIG RESETSTAT: command and error counters (the slow log stays)."""
        self.commands.clear()
        self.errors.clear()
        self.error_replies = 0

    def commandstats_lines(self) -> list[str]:
        lines = []
        for name, (calls, usec, rejected, failed) in self.commands.items():
            per_call = usec / calls if calls else 0.0
            lines.append(
                f"cmdstat_{name.lower()}:calls={calls},usec={usec},"
                f"usec_per_call={per_call:.2f},rejected_calls={rejected},failed_calls={failed}"
            )
        return lines

    def errorstats_lines(self) -> list[str]:
        return [f"errorstat_{code}:count={n}" for code, n in self.errors.items()]
