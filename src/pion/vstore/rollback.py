"""Rollback snapshots of a session: what ``V.SNAPSHOT``, ``V.RESTORE`` and ``V.COMMIT``
do to it (speculative decoding: a drafter such as EAGLE or DDTree writes candidate K/V,
then keeps it or rolls it back).

A snapshot is the length (``tpl``) of every layer the session has, under an id. That is
all a restore needs, because rows are self-contained in every format: each row carries
its own block scales (int8, fp8), scales and biases (mlx4g32) or group norms (turbo),
and no format keeps state shared between rows (Pion's int8 has session-wide scales and
must snapshot them; ours has none). Cutting a layer back to its recorded length
therefore leaves every row below it decoding exactly as before, and the rows above it
are no longer held (runs wholly above it are dropped, the run across it is cut and its
rows above zeroed; see ``Layer.truncate``), so a later STOREBATCH at those positions
writes fresh rows and nothing of the rejected branch can leak (rows never written read
as zeros).

Rules (Pion's, and what the tests pin):

* ids are positive and strictly increasing per server, never reused: not after a
  V.COMMIT, not after a restart (the log and snapshot files carry them, see
  ``persistence/format.py``);
* at most :data:`MAX_SNAPSHOTS_PER_SESSION` live snapshots per session;
* a restore never grows a layer (restoring an older snapshot after a newer one works;
  restoring the newer one afterwards changes nothing), and the snapshot stays live,
  so nested branches can restore it again;
* a uniform session's layers that did not exist when the snapshot was taken are
  removed on restore (they appeared with the rejected rows);
* a restore rolls back appends, not overwrites: rows below a recorded length that
  were overwritten after the snapshot keep their new contents (as in Pion; drafters
  only append past the accepted prefix). The same holds for a hole below a recorded
  length written after the snapshot: it is below the length, so it stays held.

Not here: journaling and accounting (``store.py`` calls these helpers).
"""

from __future__ import annotations

from pion.vstore.session import Session

__all__ = ["MAX_SNAPSHOTS_PER_SESSION", "cut_back", "lengths_of"]

# Pion's MAX_VS_SNAPSHOTS_PER_SESSION: live rollback snapshots per session. A drafter
# needs one per open branch; 16 bounds what a client can make a session hold.
MAX_SNAPSHOTS_PER_SESSION = 16


def lengths_of(s: Session) -> tuple[tuple[int, int], ...]:
    """``(layer, tpl)`` of every layer the session has, in layer order."""
    return tuple((index, lay.tpl) for index, lay in sorted(s.layers.items()))


def cut_back(s: Session, lengths: tuple[tuple[int, int], ...]) -> tuple[int, int]:
    """Cut the session's layers back to ``lengths`` (never growing one); returns the
    tokens (``tpl``, holes included) and the stored bytes (held rows) removed."""
    recorded = dict(lengths)
    tokens = nbytes = 0
    for index in sorted(s.layers):
        lay = s.layers[index]
        length = recorded.get(index)
        tpl = lay.tpl
        if length is None and s.schema is None:
            # A uniform session's layer created after the snapshot: it goes entirely.
            held = lay.held
            del s.layers[index]
            tokens += tpl
        else:
            held = lay.truncate(0 if length is None else length)
            tokens += tpl - lay.tpl
        nbytes += held * lay.row_bytes
    return tokens, nbytes
