"""What every command module shares: the command record, the handler context and the
argument cursor.

A handler is a plain synchronous function ``handler(ctx, args) -> Reply``. ``args`` are
the command's arguments *without* its name. A handler validates everything before it
changes any state, and reports failures by raising a :class:`pion.errors.PionError`;
the dispatcher turns those into RESP errors.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pion.errors import PionError
from pion.resp.reply import Reply

if TYPE_CHECKING:
    from pion.commands.state import ServerState

__all__ = ["Args", "ClientState", "Command", "Context", "Handler", "parse_int"]


@dataclass
class ClientState:
    """Per-connection state the commands may read or change."""

    id: int
    addr: str = ""
    laddr: str = ""
    proto: int = 2
    authenticated: bool = False
    name: str = ""
    lib_name: str = ""
    lib_ver: str = ""
    created: float = 0.0
    last_command: str = ""
    closing: bool = False  # set by QUIT / CLIENT KILL: close after the reply


@dataclass
class Context:
    """What a handler sees: the server's shared state and the calling client."""

    state: ServerState
    client: ClientState


Handler = Callable[[Context, Sequence[bytes]], Reply]


@dataclass(frozen=True)
class Command:
    """One row of the command table.

    ``arity`` follows Redis: it counts the command name; a positive number is an exact
    count, a negative one a minimum (``-2`` = the name and at least one argument).
    Flags: ``write`` (changes state; refused while persistence is failing),
    ``readonly``, ``admin``, ``noauth`` (allowed before AUTH), ``loading`` (allowed
    while recovery runs), ``fast``.
    """

    name: str
    handler: Handler
    arity: int
    flags: frozenset[str] = field(default_factory=frozenset)
    summary: str = ""

    def arity_ok(self, nargs: int) -> bool:
        """``nargs`` excludes the command name."""
        total = nargs + 1
        return total == self.arity if self.arity >= 0 else total >= -self.arity


_DIGITS = frozenset(b"0123456789")


def parse_int(raw: bytes, what: str = "value") -> int:
    """Parse a RESP integer argument strictly, as Redis's string2ll does: optional
    ``-``, no ``+``, no spaces, no leading zeros, no ``-0``, within int64."""
    n = len(raw)
    ok = 0 < n <= 20
    if ok:
        neg = raw[0] == 0x2D
        digits = raw[1:] if neg else raw
        ok = (
            len(digits) > 0
            and all(c in _DIGITS for c in digits)
            and not (len(digits) > 1 and digits[0] == 0x30)
            and not (neg and digits == b"0")
        )
    if ok:
        value = int(raw)
        if -(2**63) <= value < 2**63:
            return value
    raise PionError("value is not an integer or out of range")


class Args:
    """A cursor over a command's arguments: one small helper instead of ad-hoc
    indexing. It never reads past the command's own arguments."""

    __slots__ = ("_args", "_pos", "command")

    def __init__(self, args: Sequence[bytes], command: str) -> None:
        self._args = args
        self._pos = 0
        self.command = command

    def __len__(self) -> int:
        return len(self._args) - self._pos

    @property
    def pos(self) -> int:
        return self._pos

    def done(self) -> bool:
        return self._pos >= len(self._args)

    def peek(self) -> builtins.bytes | None:
        return self._args[self._pos] if self._pos < len(self._args) else None

    def peek_keyword(self) -> str | None:
        """The next argument upper-cased as text (for option names), or None."""
        raw = self.peek()
        if raw is None:
            return None
        try:
            return raw.decode("ascii").upper()
        except UnicodeDecodeError:
            return None

    def bytes(self, what: str = "argument") -> builtins.bytes:
        if self._pos >= len(self._args):
            raise PionError(f"wrong number of arguments for '{self.command.lower()}' command")
        raw = self._args[self._pos]
        self._pos += 1
        return raw

    def text(self, what: str = "argument") -> str:
        raw = self.bytes(what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise PionError(f"{self.command}: {what} is not valid UTF-8") from None

    def int(
        self,
        what: str = "value",
        lo: int | None = None,
        hi: int | None = None,
        range_error: str | None = None,
    ) -> int:
        """Next argument as a strict integer; out of [lo, hi] raises ``range_error``
        (or a generic message naming ``what``)."""
        value = parse_int(self.bytes(what), what)
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise PionError(range_error or f"{self.command}: {what} out of range ({lo}..{hi})")
        return value

    def rest(self) -> Sequence[builtins.bytes]:
        out = self._args[self._pos :]
        self._pos = len(self._args)
        return out

    def expect_done(self) -> None:
        if not self.done():
            raise PionError("syntax error")
