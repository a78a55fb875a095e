"""The exceptions :mod:`pion.client` raises, and the one function that maps a server
error reply to them.

An error reply is ``-<CODE> <message>``; the class is chosen by ``CODE`` (the first
word), never by the message text. The single documented exception is the multi-worker
redirect: Pion answers ``-ERR session lives on worker N ...`` (and
``-ERR KV.PREFIX.<CMD> session lives on worker N``) with the generic code ``ERR``, and
docs/protocol.md ("Wire conventions") makes that text part of the wire contract, so
it alone is recognised by its text.

Tree::

    PionClientError                 anything this client raises
      PionConnectionError           cannot reach the server / connection lost
                                    (also a builtin ConnectionError)
      PionProtocolError             a reply of an unexpected shape or size
      PionResponseError             the server answered an error; .code, .message
        PionNoAuth        NOAUTH    a password is required (pass password=)
        PionWrongPass     WRONGPASS the password was refused
        PionMisconf       MISCONF   persistence is failing; writes are refused
        PionOOM           OOM       the write does not fit --maxmemory
        PionLoading       LOADING   the server is replaying its log; retry later
        PionColdMiss      COLDMISS  an attention slot was demoted to the cold tier
        PionWrongWorker   ERR       the namespace lives on worker .worker

redis-py strips the code of the errors it knows and keeps it in ``status_code``; for
the codes it does not know (``COLDMISS``, ``MISCONF``) the code is still the first word
of the text. :func:`error_from_redis` handles both.
"""

from __future__ import annotations

import re

import redis

__all__ = [
    "PionClientError",
    "PionColdMiss",
    "PionConnectionError",
    "PionLoading",
    "PionMisconf",
    "PionNoAuth",
    "PionOOM",
    "PionProtocolError",
    "PionResponseError",
    "PionWrongPass",
    "PionWrongWorker",
    "error_from_redis",
    "response_error",
]


class PionClientError(Exception):
    """Base class of every error :mod:`pion.client` raises."""


class PionConnectionError(PionClientError, ConnectionError):
    """The server could not be reached, or the connection broke mid-command."""


class PionProtocolError(PionClientError):
    """A reply had a type or size the command does not allow."""


class PionResponseError(PionClientError):
    """The server answered ``-<code> <message>``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code} {message}")
        self.code = code
        self.message = message


class PionNoAuth(PionResponseError):
    """``NOAUTH``: the server wants a password."""


class PionWrongPass(PionResponseError):
    """``WRONGPASS``: the password (or user) was refused."""


class PionMisconf(PionResponseError):
    """``MISCONF``: the server cannot persist and refuses writes until it can."""


class PionOOM(PionResponseError):
    """``OOM``: a single write larger than the server's memory budget."""


class PionLoading(PionResponseError):
    """``LOADING``: recovery is in progress; the command may be retried later."""


class PionColdMiss(PionResponseError):
    """``COLDMISS``: the attention slot was demoted; ``KV.PREFIX.WARM`` restores it."""


class PionWrongWorker(PionResponseError):
    """The namespace is owned by another worker; reconnect to ``port + 2 + worker``."""

    def __init__(self, code: str, message: str, worker: int) -> None:
        super().__init__(code, message)
        self.worker = worker


_BY_CODE: dict[str, type[PionResponseError]] = {
    "NOAUTH": PionNoAuth,
    "WRONGPASS": PionWrongPass,
    "MISCONF": PionMisconf,
    "OOM": PionOOM,
    "LOADING": PionLoading,
    "COLDMISS": PionColdMiss,
}
# A Redis error code is an upper-case word; an error line without one (some servers
# send bare text) is treated as the generic ERR.
_CODE = re.compile(r"[A-Z][A-Z0-9_]*")
# The one message text clients match (docs/protocol.md, "Wire conventions").
_REDIRECT = re.compile(r"session lives on worker (\d+)")


def response_error(code: str, message: str) -> PionResponseError:
    """The exception for an error reply with this code and message."""
    if code == "ERR":
        moved = _REDIRECT.search(message)
        if moved is not None:
            return PionWrongWorker(code, message, int(moved.group(1)))
    return _BY_CODE.get(code, PionResponseError)(code, message)


def error_from_redis(exc: redis.RedisError) -> PionClientError:
    """Translate a redis-py exception: error replies by code, the rest by kind."""
    text = str(exc)
    code = exc.status_code
    if code is not None:
        return response_error(code, text)
    if isinstance(exc, redis.ResponseError):
        first, _, rest = text.partition(" ")
        if _CODE.fullmatch(first):
            return response_error(first, rest)
        return response_error("ERR", text)
    if isinstance(exc, redis.ConnectionError | redis.TimeoutError):
        return PionConnectionError(text or type(exc).__name__)
    return PionProtocolError(text or type(exc).__name__)
