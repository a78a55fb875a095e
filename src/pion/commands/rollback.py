"""Rollback commands for speculative decoding: ``V.SNAPSHOT``, ``V.RESTORE``,
``V.COMMIT`` (the V-store side is ``pion.vstore.rollback``).

A drafter (EAGLE, DDTree, ...) takes a snapshot, writes candidate K/V with
V.STOREBATCH, then either releases the snapshot (V.COMMIT: the candidates stay) or
restores it (V.RESTORE: every layer is cut back, the candidates are gone)::

    V.SNAPSHOT <sid>            -> :<snap_id>   positive, strictly increasing per server
    V.RESTORE <sid> <snap_id>   -> +OK          never grows a layer; the snapshot stays
    V.COMMIT <sid> <snap_id>    -> :1, then :0  the snapshot is released

Errors keep Pion's words, which clients match: ``session not found`` (all three, an
unknown sid), ``no free snapshot slot`` (a 17th live snapshot), ``unknown snap_id``
(V.RESTORE of an id this session does not hold; 0 and negative ids for both). Every
argument is parsed before the store is touched, and all three are logged in the WAL,
so a restore survives a crash and a restart.

Where Pion is silent we follow it: V.COMMIT of a positive id that is not live answers
``:0`` (so a repeated COMMIT is idempotent), and V.RESTORE keeps the snapshot.
"""

from __future__ import annotations

from collections.abc import Sequence

from pion.commands.args import Args
from pion.commands.state import Command, Context
from pion.errors import PionError, SessionNotFoundError
from pion.resp.reply import Reply, Simple

__all__ = ["COMMANDS"]

_OK = Simple("OK")


def _sid_and_id(argv: Sequence[bytes], command: str) -> tuple[bytes, int]:
    a = Args(argv, command)
    sid = a.arg("session_id")
    snap_id = a.integer("snap_id")
    a.expect_done()
    return sid, snap_id


def _unknown(command: str, snap_id: int) -> PionError:
    why = " (snap ids are positive)" if snap_id < 1 else " for this session"
    return PionError(f"{command}: unknown snap_id {snap_id}{why}")


def _named(command: str, exc: PionError) -> PionError:
    """The store's error with the command's name in front; ``session not found``
    stays as every V-store command answers it."""
    return exc if isinstance(exc, SessionNotFoundError) else exc.prefixed(f"{command}: ")


def v_snapshot(ctx: Context, argv: Sequence[bytes]) -> Reply:
    """``V.SNAPSHOT sid`` -> ``:<snap_id>``"""
    a = Args(argv, "V.SNAPSHOT")
    sid = a.arg("session_id")
    a.expect_done()
    try:
        return ctx.state.vstore.snapshot(sid)
    except PionError as exc:
        raise _named("V.SNAPSHOT", exc) from None


def v_restore(ctx: Context, argv: Sequence[bytes]) -> Reply:
    """``V.RESTORE sid snap_id`` -> ``+OK``"""
    sid, snap_id = _sid_and_id(argv, "V.RESTORE")
    vs = ctx.state.vstore
    held = vs.snapshot_ids(sid)  # session not found first, as in Pion
    if snap_id not in held:
        raise _unknown("V.RESTORE", snap_id)
    try:
        vs.restore(sid, snap_id)
    except PionError as exc:
        raise _named("V.RESTORE", exc) from None
    return _OK


def v_commit(ctx: Context, argv: Sequence[bytes]) -> Reply:
    """``V.COMMIT sid snap_id`` -> ``:1`` released, ``:0`` not live"""
    sid, snap_id = _sid_and_id(argv, "V.COMMIT")
    vs = ctx.state.vstore
    vs.snapshot_ids(sid)  # session not found first, as in Pion
    if snap_id < 1:
        raise _unknown("V.COMMIT", snap_id)
    try:
        return int(vs.release(sid, snap_id))
    except PionError as exc:
        raise _named("V.COMMIT", exc) from None


COMMANDS: list[Command] = [
    Command(
        "V.SNAPSHOT",
        v_snapshot,
        2,
        frozenset({"write"}),
        "Record every layer's length for a later V.RESTORE; replies the snapshot id",
    ),
    Command(
        "V.RESTORE",
        v_restore,
        3,
        frozenset({"write"}),
        "Cut every layer of a session back to a snapshot (never grows a layer)",
    ),
    Command(
        "V.COMMIT",
        v_commit,
        3,
        frozenset({"write"}),
        "Release a snapshot: 1 when it was live, 0 when not",
    ),
]
