"""The Python client of a Pion server: push and pull per-layer K/V as numpy arrays.

:class:`PionPromptCache` (sync) and :class:`AsyncPionPromptCache` (asyncio) speak the
wire of docs/protocol.md over redis-py, with one set of methods written once in
:mod:`pion.client.base`; :mod:`pion.client.errors` holds the exceptions they raise;
:mod:`pion.client.hashing` the block-hash schemes routers use. Engine bridges
(``transformers``) live in :mod:`pion.integrations`.

Reading order: ``base.py`` (what the two clients share, written once) with
``operation.py`` (the descriptor that writes a method once for both shells),
``options.py`` (redis-py's connection options); ``plans.py`` (every operation as a
sans-IO plan) and ``wire.py`` (values to arguments, replies to values), ``attend.py``
(the attention tier's queries as plans); ``cache.py`` (the sync client) and ``aio.py``
(the asyncio one); ``export.py`` (same-machine fetch through an exported file);
``errors.py``; ``hashing.py``; ``cli.py`` (``pion stats``).

Imports only ``wire`` and ``export`` (its ``format.py``: the file layout) of the rest
of ``pion``: a client never imports ``pion.server``.
"""

from __future__ import annotations

from pion.client.aio import AsyncPionPromptCache
from pion.client.cache import PionPromptCache
from pion.client.errors import (
    PionClientError,
    PionColdMiss,
    PionConnectionError,
    PionLoading,
    PionMisconf,
    PionNoAuth,
    PionOOM,
    PionProtocolError,
    PionResponseError,
    PionWrongPass,
    PionWrongWorker,
)
from pion.client.plans import Warmed
from pion.client.wire import make_namespace

__all__ = [
    "AsyncPionPromptCache",
    "PionClientError",
    "PionColdMiss",
    "PionConnectionError",
    "PionLoading",
    "PionMisconf",
    "PionNoAuth",
    "PionOOM",
    "PionPromptCache",
    "PionProtocolError",
    "PionResponseError",
    "PionWrongPass",
    "PionWrongWorker",
    "Warmed",
    "make_namespace",
]
