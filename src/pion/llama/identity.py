"""Which process serves the upstream: a local llama-server known by its listening socket.

A hit is trusted without ``GET /slots`` while the llama-server process that confirmed
the slot still serves (docs/llama.md, "What a hit costs"): a restarted server is another
process, so a restart is still noticed before the request, at the price of one
``readlink`` instead of a round trip.

:func:`find` looks the process up once, from ``/proc`` (Linux): the socket listening on
the upstream's port in this network namespace, and the ``llama-*`` process holding it.
:meth:`ServerProcess.serves` then asks only whether that descriptor of that process is
still that socket: a restarted server (even under the same process id) holds a new
socket, and one that died holds none. Anything else is *unknown* (None), and every hit is
checked as before: a remote upstream, another operating system, a process of another
user, and a port held by something that is not llama-server (a container's port
forwarder, a reverse proxy) — such a process outlives the llama-server behind it, so it
proves nothing.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

__all__ = ["ServerProcess", "find", "listening_inodes"]

_PROC = Path("/proc")
# /proc/net/tcp's state column: 0A is LISTEN.
_LISTEN = "0A"
# The process names this trusts (llama-server, llama-server's other spellings).
_NAME_PREFIX = "llama"


@dataclass(frozen=True, slots=True)
class ServerProcess:
    """The llama-server process behind an upstream: its id, and the descriptor that
    holds its listening socket (by inode)."""

    pid: int
    fd: int
    inode: int

    def serves(self) -> bool:
        """Whether this process still holds its listening socket (one system call)."""
        try:
            return os.readlink(f"/proc/{self.pid}/fd/{self.fd}") == f"socket:[{self.inode}]"
        except OSError:
            return False


def find(base_url: str, proc: Path = _PROC) -> ServerProcess | None:
    """The local llama-server serving ``base_url``, or None when it cannot be known
    (module docstring). Reads ``/proc``: call it off the event loop."""
    port = _loopback_port(base_url)
    if port is None:
        return None
    inodes = listening_inodes(port, proc)
    if not inodes:
        return None
    try:
        pids = [int(p.name) for p in proc.iterdir() if p.name.isdigit()]
    except OSError:
        return None
    for pid in pids:
        found = _holder(proc / str(pid), pid, inodes)
        if found is not None:
            return found
    return None


def listening_inodes(port: int, proc: Path = _PROC) -> set[int]:
    """The inodes of the TCP sockets listening on ``port`` (any address, IPv4 or 6)."""
    inodes: set[int] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _LISTEN:
                continue
            local_port = fields[1].rpartition(":")[2]
            try:
                if int(local_port, 16) == port:
                    inodes.add(int(fields[9]))
            except ValueError:
                continue
    return inodes


def _holder(pid_dir: Path, pid: int, inodes: set[int]) -> ServerProcess | None:
    try:
        if not (pid_dir / "comm").read_text().startswith(_NAME_PREFIX):
            return None
        fds = os.listdir(pid_dir / "fd")
    except OSError:  # gone, or another user's
        return None
    for name in fds:
        try:
            link = os.readlink(pid_dir / "fd" / name)
        except OSError:
            continue
        if link.startswith("socket:["):
            inode = int(link[8:-1])
            if inode in inodes:
                return ServerProcess(pid, int(name), inode)
    return None


def _loopback_port(base_url: str) -> int | None:
    parts = urlsplit(base_url)
    host = parts.hostname
    if host is None:
        return None
    if host != "localhost":
        try:
            if not ipaddress.ip_address(host).is_loopback:
                return None
        except ValueError:
            return None
    try:
        port = parts.port
    except ValueError:
        return None
    if port is None:
        port = 443 if parts.scheme == "https" else 80
    return port
