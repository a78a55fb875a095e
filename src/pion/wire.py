"""Facts of the wire that the server and every client share, each defined once.

- A namespace ``ns`` is the V-store session pair ``<ns>_pk`` (keys) and ``<ns>_pv``
  (values): :func:`namespace_sids`, and :func:`namespace_for` for the way back.
- Worker ``i`` of a multi-worker server also listens on its affinity port
  ``port + 2 + i`` (``port + 1`` is the binary lane): :func:`affinity_port`.

Like ``errors``, this module imports nothing else from the package (``resp`` and
``codecs`` import only ``errors``), so both sides can use it.
"""

from __future__ import annotations

__all__ = ["K_SUFFIX", "V_SUFFIX", "affinity_port", "namespace_for", "namespace_sids"]

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


def affinity_port(port: int, worker: int) -> int:
    """The port on which worker ``worker`` of a server on ``port`` can be reached."""
    return port + 2 + worker
