"""Who may be handed an export file: a client whose connection comes from this
machine's loopback interface.

The decision rests on the peer address the kernel reports for the connection, never on
anything the client says. A loopback peer (``127.0.0.0/8``, ``::1``, or ``127.x``
written as an IPv4-mapped IPv6 address) is on this machine, so a path on this machine
means something to it. Any other address is refused, including this machine's own
non-loopback addresses: a connection to them may have been forwarded from elsewhere
(NAT, a container's published port), and the rule stays one that can be checked.
"""

from __future__ import annotations

import ipaddress

__all__ = ["is_local_peer", "peer_host"]


def peer_host(addr: str) -> str:
    """The host part of a ``"host:port"`` peer address (as ``ClientState.addr`` holds
    it; IPv6 hosts are written without brackets, so the port follows the last colon)."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        return addr
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host


def is_local_peer(addr: str) -> bool:
    """True iff ``addr`` (``"host:port"``) is a loopback address of this machine."""
    try:
        ip = ipaddress.ip_address(peer_host(addr))
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        # ::ffff:127.0.0.1 is IPv4 loopback seen through a dual-stack socket; Python
        # before 3.13 does not call it loopback.
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback
