"""Facts of the wire that the server and every client share, each defined once.

- A namespace ``ns`` is the V-store session pair ``<ns>_pk`` (keys) and ``<ns>_pv``
  (values): :func:`namespace_sids`, and :func:`namespace_for` for the way back.
- A namespace name is 1..:data:`MAX_NS_LEN` bytes.
- Worker ``i`` of a multi-worker server also listens on its affinity port
  ``port + 2 + i`` (``port + 1`` is the binary lane): :func:`affinity_port`.
- A tensor goes on the wire as its bytes, C order, without a copy when it is
  contiguous already: :func:`bytes_of`.

Like ``errors``, this module imports nothing else from the package (``resp`` and
``codecs`` import only ``errors``), so both sides can use it.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = [
    "K_SUFFIX",
    "MAX_NS_LEN",
    "V_SUFFIX",
    "affinity_port",
    "bytes_of",
    "namespace_for",
    "namespace_sids",
]

# Pion's bound on a namespace (ns_key); it also sizes the workers' directory slots.
MAX_NS_LEN = 200

K_SUFFIX = b"_pk"
V_SUFFIX = b"_pv"


def namespace_sids(ns: bytes) -> tuple[bytes, bytes]:
    """The V-store sessions holding namespace ``ns``'s keys and values."""
    return ns + K_SUFFIX, ns + V_SUFFIX


def namespace_for(sid: bytes) -> bytes | None:
    """The namespace a ``<ns>_pk``/``<ns>_pv`` sid belongs to, or None for any other
    sid."""
    if sid.endswith((K_SUFFIX, V_SUFFIX)):
        return sid[: -len(K_SUFFIX)]
    return None


def bytes_of(array: npt.NDArray[np.generic]) -> memoryview:
    """The bytes of ``array`` in C order, as a flat memoryview (a copy only when the
    array is not contiguous)."""
    return np.ascontiguousarray(array).data.cast("B")


def affinity_port(port: int, worker: int) -> int:
    """The port on which worker ``worker`` of a server on ``port`` can be reached."""
    return port + 2 + worker
