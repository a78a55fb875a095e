"""The Python client of a Pion server: push and pull per-layer K/V as numpy arrays.

:class:`PionPromptCache` (sync) and :class:`AsyncPionPromptCache` (asyncio) speak the
wire of docs/protocol.md over redis-py, with one set of methods written once in
:mod:`pion.client.base`; :mod:`pion.client.errors` holds the exceptions they raise;
:mod:`pion.client.hashing` the block-hash schemes routers use. Engine bridges
(``transformers``) live in :mod:`pion.integrations`.
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
