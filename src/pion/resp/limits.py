"""Bounds on what one client may make the server buffer, owned by the protocol layer.

The decoder checks every ``*``/``$`` header against these as soon as its line arrives,
before anything is allocated. Each default is Redis's, or says why it is not.
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
