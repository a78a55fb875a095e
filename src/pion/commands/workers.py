"""What a command asks about other workers under ``-w N --independent-workers``
(docs/protocol.md, "Multi-worker mode"): the redirects, ``KV.PREFIX.OWNER`` and the
directory fields of ``KV.PREFIX.INFO``. Not a command family: helpers the families call
in one line.

A worker answers from its own V-store first. Only when it does not hold the session
(or namespace) does it consult the directory, and when another worker owns it the
command is refused with the redirect clients match:

- ``V.STOREBATCH``/``V.FETCH``/``V.INFO <sid>``: ``session lives on worker N (this
  is worker M); reconnect for <CMD>``;
- ``KV.PREFIX.BLOCKS``/``MEMBERSHIP``/``WARM``/``DROP``/``REGISTER``:
  ``<CMD> session lives on worker N``.

The client reconnects to the owner's affinity port ``port + 2 + N``
(:func:`pion.wire.affinity_port`). On a single-process server every helper is a no-op.
"""

from __future__ import annotations

from collections.abc import Iterable

from pion.commands.state import Context, ServerState
from pion.errors import WrongWorkerError
from pion.wire import namespace_for

__all__ = [
    "directory_fields",
    "owner_of",
    "redirect_namespace",
    "redirect_namespaces",
    "redirect_session",
]


def redirect_session(ctx: Context, sid: bytes, cmd: str) -> None:
    """Raise the V-store redirect when ``sid`` is not held here and its namespace is
    owned by another worker."""
    directory = ctx.state.registry.directory
    if directory is None or sid in ctx.state.vstore:
        return
    ns = namespace_for(sid)
    entry = directory.remote(ns) if ns is not None else None
    if entry is not None:
        raise WrongWorkerError(
            f"session lives on worker {entry.owner} (this is worker {directory.worker}); "
            f"reconnect for {cmd}",
            entry.owner,
        )


def redirect_namespace(ctx: Context, ns: bytes, cmd: str) -> None:
    """Raise ``<cmd> session lives on worker N`` when no half of ``ns`` is held here
    and another worker owns it."""
    registry = ctx.state.registry
    directory = registry.directory
    if directory is None or registry.holds_any(ns):
        return
    entry = directory.remote(ns)
    if entry is not None:
        raise WrongWorkerError(f"{cmd} session lives on worker {entry.owner}", entry.owner)


def redirect_namespaces(ctx: Context, namespaces: Iterable[bytes], cmd: str) -> None:
    """:func:`redirect_namespace` for each, before anything is changed."""
    for ns in namespaces:
        redirect_namespace(ctx, ns, cmd)


def owner_of(ctx: Context, ns: bytes) -> int:
    """``KV.PREFIX.OWNER``: this worker when it holds a half of ``ns``, else the
    directory's owner, else -1."""
    state = ctx.state
    if state.registry.holds_any(ns):
        return state.config.worker_id
    directory = state.registry.directory
    return -1 if directory is None else directory.owner(ns)


def directory_fields(state: ServerState) -> list[tuple[str, int | str]]:
    """``directory_enabled``, ``my_worker_id``, ``directory_entries`` of
    ``KV.PREFIX.INFO`` (entries of every worker together)."""
    directory = state.registry.directory
    return [
        ("directory_enabled", int(directory is not None)),
        ("my_worker_id", state.config.worker_id),
        ("directory_entries", 0 if directory is None else directory.entries()),
    ]
