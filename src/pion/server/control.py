"""The pipes between the supervisor of ``-w N`` and its workers: what each worker is
started with, and the few messages they exchange. Both ends are our own processes
(the supervisor spawned the worker), so the start-up spec travels as a pickle.

Supervisor -> worker, on the worker's stdin::

    [u32 LE length][pickled WorkerSpec]     once, first
    b"S"                                    serve: start accepting on the main port
    b"M"                                    send a metrics snapshot
    end of file                             the supervisor is gone: shut down

Worker -> supervisor, on the descriptor ``WorkerSpec.control_fd``, frames of
``[u32 LE payload length][u8 kind][payload]``:

    LISTENING  (no payload)  the affinity port accepts (recovery may still run)
    READY      (no payload)  recovered, directory rejoined
    METRICS    pickled list of prometheus_client Metric families
    SHUTDOWN   (no payload)  a client sent SHUTDOWN: the whole server should stop
"""

from __future__ import annotations

import os
import pickle
import socket
import struct
from dataclasses import dataclass

from pion.config import ServerConfig

__all__ = [
    "FRAME",
    "LISTENING",
    "MAX_FRAME",
    "METRICS",
    "READY",
    "REQUEST_METRICS",
    "SERVE",
    "SHUTDOWN",
    "WorkerSpec",
    "bind_shared",
    "encode_frame",
    "encode_spec",
    "read_spec",
]

FRAME = struct.Struct("<IB")
_LENGTH = struct.Struct("<I")
LISTENING, READY, METRICS, SHUTDOWN = 1, 2, 3, 4
SERVE, REQUEST_METRICS = b"S", b"M"
# A worker's metrics snapshot is tens of KB; anything near this is a bug, not data.
MAX_FRAME = 64 << 20


@dataclass(frozen=True)
class WorkerSpec:
    """What worker ``config.worker_id`` is started with. ``config.port`` is the main
    port the supervisor reserved (never 0)."""

    config: ServerConfig
    directory_fd: int
    control_fd: int
    supervisor_pid: int
    metrics: bool


def encode_spec(spec: WorkerSpec) -> bytes:
    data = pickle.dumps(spec)
    return _LENGTH.pack(len(data)) + data


def read_spec(fd: int) -> WorkerSpec:
    """The spec the supervisor wrote first on ``fd`` (read unbuffered, so nothing
    after it is consumed)."""
    (length,) = _LENGTH.unpack(_read_exactly(fd, _LENGTH.size))
    if length > MAX_FRAME:
        raise ValueError("worker spec too large")
    spec = pickle.loads(_read_exactly(fd, length))
    if not isinstance(spec, WorkerSpec):
        raise TypeError("not a WorkerSpec")
    return spec


def encode_frame(kind: int, payload: bytes = b"") -> bytes:
    return FRAME.pack(len(payload), kind) + payload


def bind_shared(host: str, port: int) -> socket.socket:
    """A socket bound to the main port with ``SO_REUSEPORT``, not listening yet. The
    supervisor holds one to reserve the port (a socket that never listens is never
    handed a connection); each worker binds its own and listens when told to serve,
    and the kernel spreads new connections over the listening ones."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def _read_exactly(fd: int, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = os.read(fd, n - len(out))
        if not chunk:
            raise EOFError("the supervisor closed the pipe")
        out += chunk
    return bytes(out)
