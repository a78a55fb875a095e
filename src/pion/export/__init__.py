"""Same-machine fetch without the socket: ``V.EXPORT`` writes a prefix's K/V once as a
safetensors file that a client on this machine maps (Pion 0.9.8's export lane).

Reading order:

- ``format.py``: the file layout, byte by byte (pure; the client reads files with it);
- ``writer.py``: a request's checks, and V-store rows turned into a file;
- ``files.py``: the private directory and every file-system call on it;
- ``cache.py``: when a file is reused or removed, and the bounds on all of them;
- ``peer.py``: who may be handed a path (loopback peers only).

The command is ``pion.commands.export``. This package file imports nothing, so the
client can use ``format.py`` without loading the server-side modules; the package
depends on ``errors`` and ``vstore`` (and ``pion.__version__``, in the files it
writes), never on the server.
"""

from __future__ import annotations

__all__: list[str] = []
