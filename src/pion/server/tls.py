"""TLS for the server's listeners, with the standard :mod:`ssl` module (docs/deployment.md,
"TLS").

``--tls-cert``/``--tls-key`` turn TLS on for the RESP port and, under ``-w N``, every
affinity port; ``--tls-ca`` also requires each client to present a certificate signed
by that CA. :func:`server_context` builds the one :class:`ssl.SSLContext` every
listener of a process shares; a listener hands it to ``loop.create_server(ssl=...)``
with :data:`HANDSHAKE_TIMEOUT_S` (the binary lane's listener does the same).

A plain-text client on a TLS port is refused: its first bytes are not a TLS
ClientHello, the handshake fails and the connection is closed before any command is
read. Nothing is answered in plain text and nothing of the failure reaches the
command layer.
"""

from __future__ import annotations

import ssl

from pion.config import ServerConfig
from pion.errors import PionError

__all__ = ["HANDSHAKE_TIMEOUT_S", "MIN_VERSION", "check_tls_config", "server_context"]

# A connection that has not finished its handshake by then is closed: asyncio's
# default is 60 s, long enough for idle half-open connections to pile up.
HANDSHAKE_TIMEOUT_S = 10.0
# TLS 1.0 and 1.1 are deprecated (RFC 8996); Redis's default is 1.2 and 1.3 too.
MIN_VERSION = ssl.TLSVersion.TLSv1_2


def check_tls_config(config: ServerConfig) -> None:
    """The TLS options make sense together (before anything is started)."""
    if (config.tls_cert is None) != (config.tls_key is None):
        raise PionError("TLS needs both --tls-cert and --tls-key")
    if config.tls_ca is not None and config.tls_cert is None:
        raise PionError("--tls-ca (client certificates) needs --tls-cert and --tls-key")


def server_context(config: ServerConfig) -> ssl.SSLContext | None:
    """The server-side context for ``config``, or None when TLS is off. Every file
    is read here, so a bad certificate, key or CA stops startup with its name."""
    check_tls_config(config)
    if config.tls_cert is None or config.tls_key is None:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = MIN_VERSION
    # No TLS 1.3 session tickets: they arrive just after the handshake, and a client
    # that sends nothing on connect (redis-py with RESP2 and no password) then finds
    # "data" on an idle pooled connection and drops it ("Connection not ready").
    # Clients pay a full handshake per new connection instead of a resumption.
    ctx.num_tickets = 0
    try:
        ctx.load_cert_chain(str(config.tls_cert), str(config.tls_key))
    except (OSError, ssl.SSLError) as exc:
        raise PionError(
            f"cannot load --tls-cert {config.tls_cert} / --tls-key {config.tls_key}: {exc}"
        ) from None
    if config.tls_ca is not None:
        try:
            ctx.load_verify_locations(cafile=str(config.tls_ca))
        except (OSError, ssl.SSLError) as exc:
            raise PionError(f"cannot load --tls-ca {config.tls_ca}: {exc}") from None
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx
