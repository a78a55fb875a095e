"""The V-store: sessions -> layers -> rows of K/V in a stored format.

``VStore`` is the store; ``mutations`` are the records every change is made of and
``Journal`` the hook through which they reach the WAL. Reading order: ``store.py``
(the store and its definitions), ``table.py`` (the table of sessions every operation
shares), ``session.py``, ``layer.py`` (rows held as sparse runs), ``reads.py``
(``V.FETCH`` in its forms), ``views.py`` (copy-on-write views and the membership
test), ``rollback.py`` (``V.SNAPSHOT``/``V.RESTORE``/``V.COMMIT``), ``lru.py``
(eviction order) and ``eviction.py`` (making room), ``mutations.py``, ``journal.py``.
Synchronous and pure: it imports only ``codecs``, ``errors``, ``config``, ``wire``
(the namespace of a session) and ``watch`` (WATCH's bookkeeping).
"""

from __future__ import annotations

from pion.vstore.journal import Journal
from pion.vstore.layer import GROWTH, Pieces
from pion.vstore.mutations import (
    CreateSession,
    DropSession,
    Mutation,
    ReleaseSnapshot,
    RestoreSnapshot,
    SetBlocks,
    SnapshotIds,
    StoreRows,
    TakeSnapshot,
)
from pion.vstore.rollback import MAX_SNAPSHOTS_PER_SESSION
from pion.vstore.session import (
    ENCODE_CHUNK_BYTES,
    MAX_SID_LEN,
    Encoded,
    FloatRows,
    encode_for,
    encode_rows,
)
from pion.vstore.store import MAX_REPLY_BYTES, MAX_RUNS, MAX_ZERO_FILL_BYTES, VStore
from pion.vstore.views import BlockTable, LayerInfo, SessionInfo, namespace_of

__all__ = [
    "ENCODE_CHUNK_BYTES",
    "GROWTH",
    "MAX_REPLY_BYTES",
    "MAX_RUNS",
    "MAX_SID_LEN",
    "MAX_SNAPSHOTS_PER_SESSION",
    "MAX_ZERO_FILL_BYTES",
    "BlockTable",
    "CreateSession",
    "DropSession",
    "Encoded",
    "FloatRows",
    "Journal",
    "LayerInfo",
    "Mutation",
    "Pieces",
    "ReleaseSnapshot",
    "RestoreSnapshot",
    "SessionInfo",
    "SetBlocks",
    "SnapshotIds",
    "StoreRows",
    "TakeSnapshot",
    "VStore",
    "encode_for",
    "encode_rows",
    "namespace_of",
]
