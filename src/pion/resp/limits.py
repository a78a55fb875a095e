"""Bounds on what one client may make the server buffer, owned by the protocol layer.

The decoder checks every ``*``/``$`` header against these as soon as its line arrives,
before anything is allocated. Each default is Redis's, or says why it is not. The
``max_unauth_*`` pair applies instead while the connection has not authenticated to a
server that has a password.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MB", "ProtocolLimits"]

MB = 1024 * 1024


@dataclass(frozen=True)
class ProtocolLimits:
    """Per-connection protocol limits (a field of ``ServerConfig``)."""

    # Redis's proto-max-bulk-len default.
    max_bulk_len: int = 512 * MB
    # Redis's client-query-buffer-limit default; here it bounds the declared size
    # of one pending command, checked as each header arrives.
    max_query_buffer: int = 1024 * MB
    # Redis's PROTO_INLINE_MAX_SIZE.
    max_inline_len: int = 64 * 1024
    # Redis accepts up to 1024*1024*1024 elements; we cap a command at 1M arguments.
    max_array_len: int = 1024 * 1024
    # Before a connection has authenticated (only when a password is set), Redis 7
    # allows at most 10 arguments and 16 KB bulks (networking.c, authRequired()):
    # enough for AUTH and HELLO ... AUTH ... SETNAME, too little to make the server
    # buffer anything for a client that does not know the password.
    max_unauth_array_len: int = 10
    max_unauth_bulk_len: int = 16 * 1024
    # Unsent reply bytes (socket write buffer plus replies waiting for a group commit)
    # above which a connection's further commands wait until they drain. Ours, not
    # Redis's (Redis only disconnects, via client-output-buffer-limit): a client that
    # pipelines faster than it reads is slowed down, not dropped. 64 MiB holds a few
    # large K/V replies in flight, which is what keeps a reading client's pipe full.
    reply_high_water: int = 64 * MB
    # The binary lane's frame body (docs/attention.md): the same bound as one RESP bulk,
    # so the fast lane can never be made to buffer more than the RESP port.
    max_binary_body: int = 512 * MB
