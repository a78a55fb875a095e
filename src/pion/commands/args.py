"""The argument cursor every handler parses with, and the strict integer parser.

One small helper instead of ad-hoc indexing: :class:`Args` walks a command's arguments
left to right, never reads past the command's own last argument (Pion's optional
argument scans do; we do not), and its errors name the argument that was wrong.
"""

from __future__ import annotations

from collections.abc import Sequence

from pion.errors import PionError

__all__ = ["Args", "parse_int"]

_DIGITS = frozenset(b"0123456789")
# Redis's text for a malformed integer; clients and people recognise it.
_NOT_AN_INTEGER = "value is not an integer or out of range"


def parse_int(raw: bytes, what: str | None = None) -> int:
    """Parse a RESP integer argument strictly, as Redis's string2ll does: optional
    ``-``, no ``+``, no spaces, no leading zeros, no ``-0``, within int64.

    The error is Redis's text, followed by the argument's name when ``what`` is given.
    """
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
    raise PionError(_NOT_AN_INTEGER if what is None else f"{_NOT_AN_INTEGER} ({what})")


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

    def rest(self) -> Sequence[bytes]:
        """Consume every argument left."""
        out = self._args[self._pos :]
        self._pos = len(self._args)
        return out

    def expect_done(self) -> None:
        if not self.done():
            raise PionError(f"syntax error ({self.command}: unexpected argument)")
