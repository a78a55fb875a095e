"""Make room in the open-files limit for ``maxclients`` connections, as Redis does
(``adjustOpenFilesLimit`` in server.c).

Each client is a descriptor; the server also needs some for itself (listening sockets,
the event loop, the write-ahead log, snapshots, the interpreter's own). If the soft
``RLIMIT_NOFILE`` is below ``maxclients`` plus that reserve, it is raised, up to the
hard limit. If even the hard limit is too low, ``maxclients`` is lowered to fit and a
warning says so. Either way the descriptor limit is never what stops a connection:
the client past ``maxclients`` is accepted and answered
``-ERR max number of clients reached``, instead of waiting unanswered in the accept
queue while the server fails to accept with EMFILE.
"""

from __future__ import annotations

import logging

from pion.errors import PionError

__all__ = ["RESERVED_FDS", "fit_maxclients"]

log = logging.getLogger("pion.server")

# Redis's CONFIG_MIN_RESERVED_FDS: descriptors kept for the server's own use.
RESERVED_FDS = 32

try:
    import resource as _resource
except ImportError:  # pragma: no cover - not POSIX: nothing to adjust
    _resource = None  # type: ignore[assignment]


def fit_maxclients(maxclients: int) -> int:
    """Raise the soft open-files limit to hold ``maxclients`` clients; return the
    ``maxclients`` the limit allows (the requested one, or fewer with a warning)."""
    if _resource is None:  # pragma: no cover
        return maxclients
    need = maxclients + RESERVED_FDS
    soft, hard = _resource.getrlimit(_resource.RLIMIT_NOFILE)
    if soft == _resource.RLIM_INFINITY or soft >= need:
        return maxclients
    target = need if hard == _resource.RLIM_INFINITY else min(need, hard)
    error = ""
    if target > soft:
        try:
            _resource.setrlimit(_resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (OSError, ValueError) as exc:
            error = f" because of OS error: {exc}"
    if soft >= need:
        log.info("raised the open files limit to %d for maxclients %d", soft, maxclients)
        return maxclients
    allowed = soft - RESERVED_FDS
    if allowed < 1:
        raise PionError(
            f"the open files limit ({soft}) is too low to serve any client: "
            f"raise it (ulimit -n) to at least {need}"
        )
    log.warning(
        "You requested maxclients of %d requiring at least %d max file descriptors. "
        "Server can't set maximum open files to %d%s. Current maximum open files is %d. "
        "maxclients has been reduced to %d to compensate for low ulimit. "
        "If you need higher maxclients increase 'ulimit -n'.",
        maxclients,
        need,
        need,
        error or " (the hard limit is lower)",
        soft,
        allowed,
    )
    return allowed
