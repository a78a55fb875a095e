"""The exception tree of Pion, and the RESP error code each class answers with.

Every error a command can raise derives from :class:`PionError`. Each lane turns them
into replies at its one boundary: the dispatcher (``pion.server.dispatch``) into RESP
errors, ``-<code> <message>`` (:meth:`PionError.resp_line`), for commands and their
encoded replies, the connection for a streamed reply that fails midway, and the binary
lane (``pion.server.binary``) into a frame status with the same line. Anything that is
*not* a ``PionError`` is a bug: logged with its traceback, counted, and answered
``-ERR internal error``.

Tree::

    PionError                 code ERR   generic command error (bad argument, ...)
      ProtocolError           code ERR   malformed RESP; the connection is closed after it
        FrameError            code ERR   not binary-lane frames (bad magic, oversized
                                         or truncated frame); answered, then closed
      BodyError               code ERR   a binary-lane frame whose body does not parse
                                         (answered MISS; the connection goes on)
      NoAuthError             code NOAUTH
      NoProtoError            code NOPROTO  (HELLO with a protocol version other than 2|3)
      WrongPassError          code WRONGPASS
      LoadingError            code LOADING  (recovery in progress)
      MisconfError            code MISCONF  (persistence failing: writes refused)
      OOMError                code OOM      (a write larger than --maxmemory)
      ColdMissError           code COLDMISS (attention slot demoted to the cold tier)
      WrongTypeError          code WRONGTYPE (a keyspace command on a key of another type)
      ExecAbortError          code EXECABORT (EXEC refused: the transaction is discarded)
      NoGroupError            code NOGROUP  (a stream's consumer group that does not exist)
      BusyGroupError          code BUSYGROUP (XGROUP CREATE of a group that exists)
      CodecError              code ERR   a value a storage format cannot hold
      SessionNotFoundError    code ERR   unknown V-store session
      WrongWorkerError        code ERR   the session lives on another worker
      TierError               code ERR   a session not held locally that the cluster
                                         tier could not supply (unreachable, or its
                                         copy there is incomplete)

Not an error, and outside the tree: :class:`NotYet`, raised by a store a command
needs when what it needs is on its way (a tier fill reading): the command waits
without holding the loop and runs again once it has come
(``pion.commands.execution``).

Clients match a few messages by text (``blob size``, ``session lives on worker N``,
``already``/``exists``); those texts are part of the wire contract (docs/protocol.md,
"Wire conventions").
"""

from __future__ import annotations

import copy
from collections.abc import Callable

__all__ = [
    "BodyError",
    "BusyGroupError",
    "CodecError",
    "ColdMissError",
    "ExecAbortError",
    "FrameError",
    "LoadingError",
    "MisconfError",
    "NoAuthError",
    "NoGroupError",
    "NoProtoError",
    "NotYet",
    "OOMError",
    "PionError",
    "ProtocolError",
    "SessionNotFoundError",
    "TierError",
    "WrongPassError",
    "WrongTypeError",
    "WrongWorkerError",
]


class PionError(Exception):
    """Base class: a command failed with a message the client should see."""

    code = "ERR"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def resp_line(self) -> str:
        """The error line without the leading ``-`` and trailing CRLF."""
        return f"{self.code} {self.message}"

    def prefixed(self, prefix: str) -> PionError:
        """The same error (same class, so the same RESP code) with ``prefix`` put
        before its message: how a command names itself in an error from below."""
        clone = copy.copy(self)
        clone.message = f"{prefix}{self.message}"
        clone.args = (clone.message,)
        return clone


class ProtocolError(PionError):
    """The client sent bytes that are not valid RESP, or broke a limit."""

    def resp_line(self) -> str:
        return f"ERR Protocol error: {self.message}"


class FrameError(ProtocolError):
    """The binary lane's byte stream is not (or no longer) frames: answered with an
    ERROR frame, then the connection is closed."""


class BodyError(PionError):
    """A complete binary-lane frame whose body does not hold its declared fields:
    answered MISS, the connection goes on (the frame boundary is known)."""


class NoAuthError(PionError):
    code = "NOAUTH"

    def __init__(self, message: str = "Authentication required.") -> None:
        super().__init__(message)


class NoProtoError(PionError):
    code = "NOPROTO"

    def __init__(self, message: str = "unsupported protocol version") -> None:
        super().__init__(message)


class WrongPassError(PionError):
    code = "WRONGPASS"

    def __init__(
        self, message: str = "invalid username-password pair or user is disabled."
    ) -> None:
        super().__init__(message)


class LoadingError(PionError):
    code = "LOADING"

    def __init__(self, message: str = "Pion is loading the dataset in memory") -> None:
        super().__init__(message)


class MisconfError(PionError):
    code = "MISCONF"


class OOMError(PionError):
    code = "OOM"


class ExecAbortError(PionError):
    code = "EXECABORT"


class NoGroupError(PionError):
    code = "NOGROUP"


class BusyGroupError(PionError):
    code = "BUSYGROUP"


class ColdMissError(PionError):
    code = "COLDMISS"


class WrongTypeError(PionError):
    code = "WRONGTYPE"

    def __init__(
        self, message: str = "Operation against a key holding the wrong kind of value"
    ) -> None:
        super().__init__(message)


class CodecError(PionError):
    """A storage format refused its input (non-finite, overflow, bad buffer length)."""


class SessionNotFoundError(PionError):
    def __init__(self, message: str = "session not found") -> None:
        super().__init__(message)


class WrongWorkerError(PionError):
    """Raised when a session is owned by another worker (multi-worker mode)."""

    def __init__(self, message: str, owner: int) -> None:
        super().__init__(message)
        self.owner = owner


class TierError(PionError):
    """The shared second tier (``--tier``) could not supply a session this worker does
    not hold: the tier is unreachable or in backoff, or its copy is incomplete."""


class NotYet(Exception):
    """What a command needs is on its way (a tier fill is reading it): ``ready(go)``
    calls ``go()`` once it has come, on any thread, at once if it has. Raised only
    where the caller said it may wait (``Context.may_wait``) and before the command
    changed anything, so running the command again then is the same as running it
    once. Not a :class:`PionError`: nobody answers it; the command waits."""

    def __init__(self, ready: Callable[[Callable[[], None]], None]) -> None:
        super().__init__("waiting for data on its way")
        self.ready = ready
