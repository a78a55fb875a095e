"""The client's export lane: when the server runs on this machine, ``fetch`` asks it for
the prefix as a file (``V.EXPORT``) and maps that file instead of reading the rows
through the socket.

The lane is used only where it returns exactly what the socket would: every layer of
both halves fp16 (the file is F16, and fp16 layers hold fp16 values: the same values
``V.FETCH ... FMT NATIVE`` sends; other formats would come back rounded to fp16) and
holding rows, one ``kv_dim`` for all of them. The request asks for one head of width
``kv_dim`` (``n_kv_heads = 1``), so each tensor ``[1, 1, N, kv_dim]`` is already the
token-major ``[N, kv_dim]`` that ``fetch`` returns: the file is read with no transpose.

It turns itself off (for this client object) when the server cannot serve it: an
older server (unknown command), a refusal (``non-local client``, ``--no-export``), a
file this process may not read (another user's server) or cannot find (another mount
namespace, e.g. a container). Any other error falls back to the socket for that call.
``fetch`` is never worse off than without the lane but for one round trip.
"""

from __future__ import annotations

import contextlib
import ipaddress
import mmap
import os
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from pion.export.format import MAX_HEADER_BYTES, FormatError, read_header, tensor_name

__all__ = ["ExportLane", "is_loopback_host", "read_export"]

Arrays = list[npt.NDArray[np.float32]]

# Namespaces remembered as unsuitable (a bound on the memo, about 100 bytes each).
MAX_UNSUITABLE = 4096
# Error texts after which the lane stays off: the server will answer the same again.
_FOR_GOOD = ("unknown command", "non-local", "disabled")
# Linux maps the whole file up front with it (one call instead of a page fault per
# 4 KiB page, measured 2.5x faster here); elsewhere pages fault in on first touch.
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and literal loopback addresses: a server there is on this
    machine. A name is not resolved (the server checks the real peer address anyway)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass
class ExportLane:
    """Whether this client still tries ``V.EXPORT``, and what it saw."""

    enabled: bool
    used: int = 0  # fetches served from an export file
    fallbacks: int = 0  # fetches that tried the lane and went through the socket
    reason: str = field(default="")  # why the lane turned itself off
    # Namespaces whose layout the lane cannot serve exactly (a format other than fp16,
    # or several dims): their fetches skip it, and so keep their single round trip.
    # A layout rarely changes; when it does, the only cost is the socket's speed.
    unsuitable: set[str] = field(default_factory=set)

    def suitable(self, ns: str) -> bool:
        return self.enabled and ns not in self.unsuitable

    def mark_unsuitable(self, ns: str) -> None:
        if len(self.unsuitable) >= MAX_UNSUITABLE:
            self.unsuitable.clear()
        self.unsuitable.add(ns)

    def refused(self, message: str) -> None:
        """The server answered V.EXPORT with an error: fall back; for good when it
        will answer the same again."""
        self.fallbacks += 1
        lowered = message.lower()
        if any(word in lowered for word in _FOR_GOOD):
            self.turn_off(message)

    def turn_off(self, reason: str) -> None:
        self.enabled = False
        self.reason = reason


def read_export(path: str, layers: int, rows: int, dim: int) -> tuple[Arrays, Arrays]:
    """Keys and values of an export file made for ``(layers, rows, n_kv_heads=1,
    head_dim=dim)``: per layer fp32 ``[rows, dim]``. Raises ``OSError`` when the file
    cannot be read and :class:`~pion.export.format.FormatError` when it is not that
    file."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        size = os.fstat(fd).st_size
        if size < 8:
            raise FormatError(f"{path}: {size} bytes is no safetensors file")
        mapped = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    try:
        declared = int.from_bytes(mapped[:8], "little")
        data_start, tensors = read_header(mapped[: 8 + min(declared, MAX_HEADER_BYTES)], size)
        sides: tuple[Arrays, Arrays] = ([], [])
        for i in range(layers):
            for side, out in zip("kv", sides, strict=True):
                name = tensor_name(side, i)
                info = tensors.get(name)
                if info is None or info.dtype != "F16" or info.shape != (1, 1, rows, dim):
                    found = None if info is None else (info.dtype, list(info.shape))
                    raise FormatError(f"{path}: {name} is {found}, not F16 [1, 1, {rows}, {dim}]")
                half = np.frombuffer(
                    mapped, dtype="<f2", count=rows * dim, offset=data_start + info.begin
                )
                out.append(half.reshape(rows, dim).astype(np.float32))
                del half  # release the buffer so the map can close
        return sides
    finally:
        # An error may have left a view alive; the map then goes when it does.
        with contextlib.suppress(BufferError):
            mapped.close()
