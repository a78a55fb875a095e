"""The values a command handler may return, and how each maps onto RESP2 and RESP3.

==========================  ======================  =====================
Python value                RESP2                   RESP3
==========================  ======================  =====================
``Simple("OK")``            ``+OK``                 ``+OK``
``ErrorReply("ERR x")``     ``-ERR x``              ``-ERR x``
``int``                     ``:n``                  ``:n``
``bool``                    ``:1`` / ``:0``         ``#t`` / ``#f``
``float``                   bulk string             ``,<double>``
``bytes`` / ``memoryview``  bulk string             bulk string
``str``                     bulk string (UTF-8)     bulk string (UTF-8)
``None``                    ``$-1``                 ``_``
``NullArray()``             ``*-1``                 ``_``
``list`` / ``tuple``        array                   array
``SetReply([...])``         array                   set ``~n``
``dict``                    flat array k1 v1 ...    map ``%n``
``Verbatim("txt")``         bulk string             ``=n txt:...``
``Encoded(b"...")``         as it is                as it is
==========================  ======================  =====================

Handlers never build wire bytes themselves: the encoder owns the format, so the same
handler serves both protocol versions.
"""

from __future__ import annotations

from typing import TypeAlias, Union

__all__ = [
    "NO_REPLY",
    "Encoded",
    "ErrorReply",
    "NoReply",
    "NullArray",
    "Reply",
    "SetReply",
    "Simple",
    "Verbatim",
]


class Simple(str):
    """A RESP simple string (``+...``); must not contain CR or LF."""

    __slots__ = ()


class ErrorReply(str):
    """An error reply given as a value, e.g. an element of an array; the text includes
    its code (``"ERR something"``)."""

    __slots__ = ()


class Verbatim(str):
    """Human-readable text (INFO): a verbatim string in RESP3, a bulk string in RESP2."""

    __slots__ = ()


class Encoded(bytes):
    """A reply already encoded, for the protocol of the client it goes to: what the
    steps of a long reply sent (``pion.commands.deferred.Steps``), collected when the
    command ran inside EXEC or with replies switched off."""

    __slots__ = ()


class SetReply(list):  # type: ignore[type-arg]
    """A set of replies (SMEMBERS, SINTER...): an array in RESP2, a ``~`` set in RESP3."""

    __slots__ = ()


class NullArray:
    """The null array (``*-1`` in RESP2)."""

    __slots__ = ()


class NoReply:
    """Send nothing (SHUTDOWN: the client learns of success by the connection closing)."""

    __slots__ = ()


NO_REPLY = NoReply()

Reply: TypeAlias = Union[
    int,
    float,
    str,
    bytes,
    bytearray,
    memoryview,
    NullArray,
    NoReply,
    "list[Reply]",
    "tuple[Reply, ...]",
    "dict[str | bytes, Reply]",
    None,
]
