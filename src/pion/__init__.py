"""Pion: a prompt-prefix K/V cache for LLM serving.

The server (``pion-server``) speaks the Redis protocol and stores per-layer K/V rows in
eight quantized formats; the client (:mod:`pion.client`) pushes and pulls numpy arrays;
:mod:`pion.llama` keeps an agent's stable prefix warm in a llama.cpp ``llama-server``.

Reading order, the server from its bytes inward, then what runs beside it:

- ``errors.py`` (the exception tree and each class's RESP error code), ``config.py``
  (every limit, with its provenance), ``wire.py`` (facts of the wire the server and
  the clients share), ``watch.py`` (WATCH's bookkeeping, which the stores call),
  ``pubsub.py`` (pub/sub's subscriptions and delivery) and ``notify.py`` (keyspace
  notifications, which the commands call);
- ``resp/`` (sans-IO RESP), ``server/`` (sockets, connections, workers), ``commands/``
  (the command table and its handlers);
- the stores: ``vstore/`` (K/V rows per session and layer), ``codecs/`` (their stored
  formats), ``prefix/`` (the KV.PREFIX registry), ``keyspace/`` (plain Redis keys),
  ``ssm/`` (recurrent state), ``attend/`` (attention over held prefixes),
  ``scripting/`` (Lua scripts over the keyspace);
- around them: ``persistence/`` (the write-ahead log, snapshots, recovery), ``tier/``
  (the shared second tier), ``export/`` (prefixes as files for same-machine clients);
- beside the server: ``client/`` (the Python client), ``integrations/`` (engine
  bridges), ``llama/`` (``pion llama``), and ``cli.py`` (``pion`` and ``pion-server``;
  ``__main__`` runs it).
"""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
