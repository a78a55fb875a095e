"""Sans-IO RESP: the request decoder, the reply encoder and the reply value types.

Reading order: ``limits.py`` (the bounds checked before allocating), ``decoder.py``
(the request decoder), ``scan.py`` (its batch fast path, with a compiled twin in
``_speedups.c``), ``inline.py`` (inline commands split as Redis does), ``reply.py``
(the reply value types) and ``encoder.py`` (RESP2 and RESP3).

Nothing here touches a socket or imports another part of Pion except the error tree.
"""

from __future__ import annotations

from pion.resp.decoder import RequestDecoder
from pion.resp.encoder import encode_reply
from pion.resp.reply import ErrorReply, NullArray, Reply, Simple, Verbatim

__all__ = [
    "ErrorReply",
    "NullArray",
    "Reply",
    "RequestDecoder",
    "Simple",
    "Verbatim",
    "encode_reply",
]
