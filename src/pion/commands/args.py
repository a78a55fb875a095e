"""The argument cursor every handler parses with, and the validators of the names and
sizes every command family shares.

One small helper instead of ad-hoc indexing: :class:`Args` walks a command's arguments
left to right, never reads past the command's own last argument (Pion's optional
argument scans do; we do not), and its errors name the argument that was wrong. The
bounds each reads against live with what they bound (a session id: the V-store's; a
namespace: ``pion.wire``; heads: the attention tier's); this module is the one place
that checks them, for every command module and the binary lane.
"""

from __future__ import annotations

from collections.abc import Sequence

from pion.attend.queries import check_heads
from pion.errors import PionError
from pion.keyspace.numbers import parse_int64
from pion.vstore import MAX_SID_LEN
from pion.wire import MAX_NS_LEN

__all__ = ["Args", "check_length", "parse_int"]

# Redis's text for a malformed integer; clients and people recognise it.
_NOT_AN_INTEGER = "value is not an integer or out of range"


def parse_int(raw: bytes, what: str | None = None) -> int:
    """Parse a RESP integer argument strictly, as Redis's string2ll does
    (:func:`~pion.keyspace.numbers.parse_int64`).

    The error is Redis's text, followed by the argument's name when ``what`` is given.
    """
    value = parse_int64(raw)
    if value is None:
        raise PionError(_NOT_AN_INTEGER if what is None else f"{_NOT_AN_INTEGER} ({what})")
    return value


def check_length(raw: bytes, limit: int, what: str) -> bytes:
    """``raw`` when it is 1..``limit`` bytes; else ``-ERR <what> length must be 1..N``."""
    if not 1 <= len(raw) <= limit:
        raise PionError(f"{what} length must be 1..{limit}")
    return raw


class Args:
    """A cursor over one command's arguments (without the command name)."""

    __slots__ = ("_args", "_pos", "command")

    def __init__(self, args: Sequence[bytes], command: str) -> None:
        self._args = args
        self._pos = 0
        self.command = command

    def __len__(self) -> int:
        """How many arguments are left."""
        return len(self._args) - self._pos

    @property
    def pos(self) -> int:
        return self._pos

    def done(self) -> bool:
        return self._pos >= len(self._args)

    def peek(self) -> bytes | None:
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

    def keyword(self) -> str:
        """Consume the next argument as an upper-cased option name ("" if not ASCII)."""
        word = self.peek_keyword()
        self.arg()
        return word or ""

    def arg(self, what: str = "argument") -> bytes:
        """Consume the next argument; a missing one is Redis's arity error."""
        if self._pos >= len(self._args):
            raise PionError(f"wrong number of arguments for '{self.command.lower()}' command")
        raw = self._args[self._pos]
        self._pos += 1
        return raw

    def text(self, what: str = "argument") -> str:
        """Consume the next argument as UTF-8 text."""
        raw = self.arg(what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise PionError(f"{self.command}: {what} is not valid UTF-8") from None

    def integer(
        self,
        what: str = "value",
        lo: int | None = None,
        hi: int | None = None,
        range_error: str | None = None,
    ) -> int:
        """Consume the next argument as a strict integer; out of [lo, hi] raises
        ``range_error`` (or a message naming ``what`` and the range)."""
        value = parse_int(self.arg(what), what)
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise PionError(range_error or f"{self.command}: {what} out of range ({lo}..{hi})")
        return value

    def session_id(self, what: str = "session_id") -> bytes:
        """Consume a V-store session id (1..``MAX_SID_LEN`` bytes)."""
        return check_length(self.arg(what), MAX_SID_LEN, f"{self.command}: {what}")

    def namespace(self, what: str = "ns_key") -> bytes:
        """Consume a namespace (1..``MAX_NS_LEN`` bytes)."""
        return check_length(self.arg(what), MAX_NS_LEN, f"{self.command}: {what}")

    def heads(self, what: str = "H") -> tuple[int, int]:
        """Consume a head count and a head dimension, bounded as every attention form
        bounds them (``-ERR <CMD>: invalid H/D (...)``)."""
        h, d = self.integer(what), self.integer("D")
        check_heads(self.command, h, d, what)
        return h, d

    def rest(self) -> Sequence[bytes]:
        """Consume every argument left."""
        out = self._args[self._pos :]
        self._pos = len(self._args)
        return out

    def expect_done(self) -> None:
        if not self.done():
            raise PionError(f"syntax error ({self.command}: unexpected argument)")
