"""The server's processes: the only package on the server side that holds sockets.

Reading order, from a request's bytes to its reply:

1. ``dispatch.py``: where a request's arguments find their command and pass the checks
   every command passes (unknown command, authentication, arity, loading), then run
   inside the one error boundary, ``pion.commands.execution``.
2. ``connection.py``: one client's bytes in through the sans-IO decoder
   (``pion.resp``), commands through the dispatcher or ``lane.py`` (the fast lane:
   GET, SET, LOOKUP, PING, MULTI and EXEC with the same checks made inline) and
   ``batch.py`` (a pipeline's run of plain GET and SET in one call, compiled in
   ``_batch.c`` where a C compiler was present), its
   states named (``Phase``); ``outbound.py`` (its writing half: replies out, flow
   control, pub/sub pushes); ``slices.py`` (its share of the loop, the same for both lanes);
   ``clients.py`` (what both lanes' connections share: admission, the registry);
   ``clientmem.py`` bounds what all clients together make the server hold
   (``maxmemory-clients``).
3. ``running.py``: the one place a connection's deferred command runs (work off the
   loop, steps, a streamed reply, a wait), through ``offload.py`` (worker threads for
   large number conversions), ``steps.py`` (a long command a slice at a time) and
   ``streaming.py`` (a streamed reply, piece by piece in wire order); ``replies.py``
   (where reply chunks go: the transport, or behind a group commit).
4. ``app.py``: the listeners, the connection registry and graceful shutdown around
   already-bound sockets; ``run.py`` builds a worker's state, recovers its data
   directory while listening, and serves until a signal or SHUTDOWN.
5. The binary lane on port + 1: ``binary_wire.py`` (sans-IO frames) and ``binary.py``.
6. Around them: ``tls.py`` (the TLS context), ``metrics.py`` and ``scrapes.py``
   (Prometheus), ``fdlimit.py`` (room for ``maxclients`` descriptors), ``malloc.py``
   (allocator tuning).
7. ``-w N``: ``supervisor.py`` starts and restarts the workers (``worker.py``), talks to
   them over the pipes of ``control.py``, and shares ``directory.py``, the memory table
   of which worker owns each namespace.

Commands themselves live in ``pion.commands``; the stores they change know nothing of
sockets.
"""
