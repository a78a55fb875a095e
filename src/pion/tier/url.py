"""``--tier`` addresses: ``redis://[user:password@]host:port[,host:port...]``.

One or more seed nodes of a Redis Cluster / Valkey cluster (the client discovers the
rest), or one standalone redis-server. ``rediss://`` turns TLS on. A trailing ``/`` or
``/0`` is accepted (cluster mode has only database 0); anything else after the nodes
is refused, never ignored, so a typo cannot silently point a deployment elsewhere.
IPv6 hosts are written in brackets: ``redis://[::1]:7000``.

Parsing is strict and bounded (:data:`MAX_URL_LEN`, :data:`MAX_NODES`): the URL comes
from an operator, but it is also echoed in errors and INFO.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote

from pion.errors import PionError

__all__ = ["MAX_NODES", "MAX_URL_LEN", "TierEndpoint", "parse_tier_url"]

# Far beyond any seed list an operator writes (a cluster needs one reachable seed).
MAX_URL_LEN = 4096
MAX_NODES = 64
_SCHEMES = {"redis": False, "rediss": True}


@dataclass(frozen=True)
class TierEndpoint:
    nodes: tuple[tuple[str, int], ...]
    tls: bool
    username: str | None
    password: str | None

    def describe(self) -> str:
        """The nodes as ``host:port,...`` (no credentials): for logs and INFO."""
        return ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self.nodes)


def parse_tier_url(url: str) -> TierEndpoint:
    """Parse and check a ``--tier`` URL; raises PionError naming what is wrong."""
    if len(url) > MAX_URL_LEN:
        raise PionError(f"--tier URL longer than {MAX_URL_LEN} characters")
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in url):
        raise PionError("--tier URL contains spaces or control characters")
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in _SCHEMES:
        raise PionError("--tier URL must start with redis:// or rediss://")
    tls = _SCHEMES[scheme.lower()]
    # Credentials end at the last '@' before the node list (a password may hold '@'
    # only percent-encoded, as in every URL).
    netloc, slash, path = rest.partition("/")
    if slash and path not in ("", "0"):
        raise PionError(f"--tier URL: unexpected path '/{path[:64]}' (only /0 is allowed)")
    username: str | None = None
    password: str | None = None
    if "@" in netloc:
        userinfo, _, netloc = netloc.rpartition("@")
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
        if colon and not password:
            raise PionError("--tier URL: empty password")
    if not netloc:
        raise PionError("--tier URL names no host")
    parts = netloc.split(",")
    if len(parts) > MAX_NODES:
        raise PionError(f"--tier URL names more than {MAX_NODES} nodes")
    nodes = tuple(_node(part) for part in parts)
    return TierEndpoint(tuple(dict.fromkeys(nodes)), tls, username, password)


def _node(text: str) -> tuple[str, int]:
    if text.startswith("["):
        host, bracket, tail = text[1:].partition("]")
        if not bracket or not tail.startswith(":"):
            raise PionError(f"--tier URL: bad node '{text[:80]}' (want [ipv6]:port)")
        port_text = tail[1:]
    else:
        host, colon, port_text = text.rpartition(":")
        if not colon:
            raise PionError(f"--tier URL: node '{text[:80]}' has no port (want host:port)")
        if ":" in host:
            raise PionError(f"--tier URL: write IPv6 hosts in brackets ('{text[:80]}')")
    if not host or len(host) > 253:
        raise PionError(f"--tier URL: bad host in '{text[:80]}'")
    if not port_text.isascii() or not port_text.isdigit() or len(port_text) > 5:
        raise PionError(f"--tier URL: bad port in '{text[:80]}'")
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise PionError(f"--tier URL: port out of range in '{text[:80]}'")
    return host, port
