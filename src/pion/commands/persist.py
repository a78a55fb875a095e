"""Persistence commands: KV.PREFIX.SAVE (a snapshot) and KV.PREFIX.COMMIT (a
durability barrier), docs/protocol.md; docs/persistence.md.

SAVE is not flagged ``write``: it changes no data, and while the log is failing
(``-MISCONF``) a successful SAVE is exactly what makes writes possible again.
"""

from __future__ import annotations

from collections.abc import Sequence

from pion.commands.args import Args
from pion.commands.state import Command, Context
from pion.errors import MisconfError, PionError
from pion.persistence.durability import NO_WAL
from pion.resp.reply import Reply, Simple

__all__ = ["COMMANDS", "check_save_path"]

_OK = Simple("OK")
_SAVE = "KV.PREFIX.SAVE"
_COMMIT = "KV.PREFIX.COMMIT"
# A path is a name inside the data directory, not a way out of it (docs/deployment.md).
_MAX_PATH = 1024


def _relative_error(reason: str) -> PionError:
    return PionError(f"{_SAVE}: path must be relative to the data directory ({reason})")


def check_save_path(raw: bytes) -> str:
    """The relative path SAVE may write, or the error of docs/protocol.md."""
    if not raw:
        raise _relative_error("empty path")
    if len(raw) > _MAX_PATH:
        raise _relative_error(f"longer than {_MAX_PATH} bytes")
    if any(b < 0x20 or b == 0x7F for b in raw):
        raise _relative_error("control byte")
    if raw.startswith(b"/"):
        raise _relative_error("absolute path")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _relative_error("not valid UTF-8") from None
    parts = text.split("/")
    if ".." in parts:
        raise _relative_error("'..' component")
    if parts[-1] in ("", "."):
        raise _relative_error("names a directory")
    return text


def _save(ctx: Context, args: Sequence[bytes]) -> Reply:
    cur = Args(args, _SAVE)
    path = None if cur.done() else check_save_path(cur.arg("path"))
    cur.expect_done()
    persistence = ctx.state.persistence
    if persistence is None:
        raise PionError(f"{_SAVE}: persistence is not configured (no data directory)")
    try:
        persistence.save(path)
    except PionError as exc:
        raise exc.prefixed(f"{_SAVE}: ") from None
    return _OK


def _commit(ctx: Context, args: Sequence[bytes]) -> Reply:
    persistence = ctx.state.persistence
    if persistence is None:
        raise PionError(f"{_COMMIT}: {NO_WAL}")
    try:
        persistence.commit()
    except MisconfError:
        raise  # -MISCONF <why>, as every refused write answers
    except PionError as exc:
        raise exc.prefixed(f"{_COMMIT}: ") from None
    return _OK


COMMANDS: list[Command] = [
    Command(_SAVE, _save, -1, frozenset({"admin"}), "Write an atomic snapshot"),
    Command(_COMMIT, _commit, 1, frozenset(), "Wait until every write is durable"),
]
