"""The attention tier (Stage 2): the client sends queries, the server attends over the
K/V of a cached prefix it holds (docs/attention.md).

Reading order: ``kernel.py`` (numpy SDPA with an online softmax, the sparse block
selector, the LSE merge), ``widen.py`` (fp16 key blocks widened as a query uses them),
``tables.py`` (the WARM table and COLD registry: which ``(sid, layer)`` can be
queried), ``queries.py`` (every query form, validated), ``warm.py``
(``KV.PREFIX.WARM``: slots built from V-store rows, fp16 held by reference);
the commands that drive them are ``pion.commands.attend``; the binary lane is
``pion.server.binary``. Recurrent state is not attention: it lives in ``pion.ssm``.

Depends on ``errors``, ``codecs`` (``widen.py``: the fp16 codec's compiled cast, when
built) and ``vstore`` (``warm.py`` only), and on numpy.
"""

from __future__ import annotations

from pion.attend.kernel import MAX_SCORE_BYTES, Attention, attend, merge, select_blocks
from pion.attend.tables import AttentionTables, ColdEntry, Slot

__all__ = [
    "MAX_SCORE_BYTES",
    "Attention",
    "AttentionTables",
    "ColdEntry",
    "Slot",
    "attend",
    "merge",
    "select_blocks",
]
