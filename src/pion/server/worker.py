"""One worker process of ``-w N --independent-workers`` (``python -m
pion.server.worker``, started by :mod:`pion.server.supervisor`; never by hand).

A worker is a whole single-process server (its own V-store, WAL, snapshot, receipt
and, when present, attention tier, all under its own worker id in the data
directory) plus three things:

- its sockets: the affinity port ``port + 2 + id`` (listening at once) and its own
  ``SO_REUSEPORT`` socket on the main port, which starts accepting only when the
  supervisor says ``serve``: after every worker listens at start-up, after recovery
  when a crashed worker comes back (so clients of the main port never see a restarting
  worker's ``-LOADING``);
- the directory: after recovery it rejoins (withdraws what it no longer holds,
  publishes what it does) and from then on withdraws a namespace as soon as the WAL
  accepted its drop or eviction;
- the supervisor's lifeline: ``PR_SET_PDEATHSIG`` on Linux turns the supervisor's
  death (even ``kill -9``) into a SIGTERM here, and end of file on stdin does the same
  everywhere. SIGTERM is a graceful shutdown: stop accepting, flush and fsync the WAL.
"""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import logging
import os
import pickle
import signal
import socket
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from pion.commands import COMMAND_TABLE
from pion.commands.state import CommandTable, ServerState
from pion.errors import PionError
from pion.prefix.registry import k_sid
from pion.server import control
from pion.server.app import PionServer
from pion.server.directory import Directory, DirectoryJournal, DirectoryTable
from pion.server.fdlimit import fit_maxclients
from pion.server.metrics import WorkerMetrics
from pion.server.run import bind_socket, build_state, configure_logging, serve
from pion.wire import affinity_port

__all__ = ["main", "rejoin", "run_worker"]

log = logging.getLogger("pion.server")

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _die_with_supervisor(supervisor_pid: int) -> None:
    """Ask the kernel for SIGTERM when the supervisor dies. The setting survives the
    exec that started us; if the supervisor died before it was made, exit now."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != supervisor_pid:
        sys.exit(0)


def _event_loop_runner() -> Callable[[Coroutine[Any, Any, None]], None]:
    """uvloop's ``run`` where available (the loop production uses), else asyncio's."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux/macOS
        return asyncio.run
    run: Callable[[Coroutine[Any, Any, None]], None] = uvloop.run
    return run


def rejoin(state: ServerState, directory: Directory) -> None:
    """Make the directory match what this worker holds after recovery, then keep it
    so: every drop or eviction the WAL accepts withdraws the namespace's entry."""
    registry = state.registry
    held = [
        (ns, 0, state.vstore.describe(k_sid(ns), touch=False).default_dim)
        for ns in registry.registered()
    ]
    for entry in directory.resync(held):
        log.warning(
            "namespace %r is held by worker %d and by worker %d; clients are sent to %d",
            entry.ns[:64],
            directory.worker,
            entry.owner,
            entry.owner,
        )
    state.vstore.journal = DirectoryJournal(state.vstore.journal, directory)


class _Worker:
    """The running worker: its server, its pipes and the main-port socket it starts
    serving on when told to."""

    def __init__(
        self,
        spec: control.WorkerSpec,
        state: ServerState,
        directory: Directory,
        main_sock: socket.socket,
        metrics: WorkerMetrics | None,
    ) -> None:
        self.spec = spec
        self.state = state
        self.directory = directory
        self.main_sock = main_sock
        self.metrics = metrics
        self.server: PionServer | None = None
        self.stopping = False
        self.serving = False
        self._out: asyncio.WriteTransport | None = None
        self._shutdown: asyncio.Future[None] | None = None

    async def open_pipes(self) -> None:
        loop = asyncio.get_running_loop()
        pipe = os.fdopen(self.spec.control_fd, "wb", buffering=0)
        self._out, _ = await loop.connect_write_pipe(asyncio.Protocol, pipe)

    def send(self, kind: int, payload: bytes = b"") -> None:
        if self._out is not None and not self._out.is_closing():
            self._out.write(control.encode_frame(kind, payload))

    def stop(self) -> None:
        """Shut down gracefully (once). Before the server exists, it is remembered and
        done as soon as the server listens."""
        if self._shutdown is not None:
            return
        self.stopping = True
        if self.server is not None:
            self._shutdown = asyncio.ensure_future(self.server.shutdown())

    def listening(self, server: PionServer) -> None:
        self.server = server
        # SHUTDOWN from a client stops the whole server: say so before stopping.
        request = self.state.request_shutdown

        def shutdown_requested(save: bool) -> None:
            self.send(control.SHUTDOWN)
            if request is not None:
                request(save)

        self.state.request_shutdown = shutdown_requested
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)
        self.send(control.LISTENING)
        if self.stopping:  # the supervisor went away while we were starting
            self.stop()

    def ready(self, server: PionServer) -> None:
        rejoin(self.state, self.directory)
        log.info(
            "worker %d ready (affinity port %d)",
            self.directory.worker,
            affinity_port(self.spec.config.port, self.directory.worker),
        )
        self.send(control.READY)

    async def commands(self) -> None:
        """The supervisor's commands on stdin, until end of file (it is gone)."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        stdin = os.fdopen(0, "rb", buffering=0)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), stdin)
        while True:
            byte = await reader.read(1)
            if not byte:
                log.warning(
                    "worker %d: the supervisor is gone; shutting down", self.spec.config.worker_id
                )
                self.stop()
                return
            if byte == control.SERVE:
                await self._serve_main_port()
            elif byte == control.REQUEST_METRICS:
                families = self.metrics.collect() if self.metrics is not None else []
                self.send(control.METRICS, pickle.dumps(families))

    async def _serve_main_port(self) -> None:
        if self.serving or self.stopping or self.server is None:
            return
        self.serving = True
        await self.server.start([self.main_sock])

    def close(self) -> None:
        if self._out is not None:
            self._out.close()


async def _run(worker: _Worker, affinity: socket.socket, table: CommandTable) -> None:
    await worker.open_pipes()
    commands = asyncio.ensure_future(worker.commands())
    try:
        await serve(
            worker.state,
            [affinity],
            worker.ready,
            on_listening=worker.listening,
            table=table,
        )
    finally:
        commands.cancel()
        worker.close()


def run_worker(spec: control.WorkerSpec) -> int:
    """Serve as worker ``spec.config.worker_id`` until shutdown; the exit code."""
    config = spec.config
    wid = config.worker_id
    # The open-files limit is per process: each worker fits --maxclients for itself.
    maxclients = fit_maxclients(config.maxclients)
    if maxclients != config.maxclients:
        config = dataclasses.replace(config, maxclients=maxclients)
    directory = Directory(DirectoryTable.attach(spec.directory_fd), wid)
    affinity = bind_socket(config.bind, affinity_port(config.port, wid))
    main_sock = control.bind_shared(config.bind, config.port)
    state = build_state(config)
    state.registry.directory = directory
    metrics = WorkerMetrics(state) if spec.metrics else None
    table = metrics.meter(COMMAND_TABLE) if metrics is not None else COMMAND_TABLE
    worker = _Worker(spec, state, directory, main_sock, metrics)
    _event_loop_runner()(_run(worker, affinity, table))
    log.info("worker %d stopped", wid)
    return 0


def main() -> None:
    """Entry point: read the spec from stdin, then serve."""
    try:
        spec = control.read_spec(0)
    except (EOFError, ValueError, TypeError, pickle.UnpicklingError) as exc:
        print(f"pion-server worker: no start-up spec from the supervisor ({exc})", file=sys.stderr)
        sys.exit(2)
    _die_with_supervisor(spec.supervisor_pid)
    configure_logging(spec.config.log_level)
    try:
        code = run_worker(spec)
    except PionError as exc:
        log.critical("worker %d: %s", spec.config.worker_id, exc.message)
        sys.exit(1)
    except OSError as exc:
        log.critical("worker %d: %s", spec.config.worker_id, exc)
        sys.exit(1)
    sys.exit(code)


if __name__ == "__main__":
    main()
