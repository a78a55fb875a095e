"""Starting and stopping a worker: build its state, bind its sockets, recover its data
directory while already listening (commands answer ``-LOADING`` meanwhile), serve until
a signal or SHUTDOWN, then shut down gracefully.

:func:`run` is the blocking entry point the CLI calls. :class:`ServerThread` runs the
same server on an event loop in a background thread, for tests and embedding (bind
port 0 and read ``.port``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import logging
import signal
import socket
import sys
import threading
from collections.abc import Callable, Coroutine
from types import ModuleType
from typing import Any

from pion.commands import COMMAND_TABLE
from pion.commands.state import CommandTable, ServerState
from pion.config import ServerConfig
from pion.errors import PionError
from pion.export.cache import ExportCache
from pion.keyspace import SWEEP_INTERVAL_S, SWEEP_MAX_KEYS
from pion.persistence import Persistence, RecoveryAborted
from pion.persistence.functions_format import FunctionsDurable
from pion.persistence.keyspace_durable import KeyspaceDurable
from pion.persistence.ssm_durable import SsmDurable
from pion.prefix.receipt import Receipt
from pion.scripting.runtime import Scripts
from pion.server.app import PionServer
from pion.server.binary import BinaryLane
from pion.server.fdlimit import fit_maxclients
from pion.server.malloc import tune_allocator
from pion.server.metrics import MetricsEndpoint, WorkerMetrics
from pion.vstore import VStore

__all__ = [
    "ServerThread",
    "bind_socket",
    "bind_sockets",
    "build_state",
    "check_bind_safety",
    "check_password",
    "run",
    "serve",
]

log = logging.getLogger("pion.server")

_uvloop: ModuleType | None
try:
    import uvloop as _uvloop
except ImportError:  # pragma: no cover - uvloop is a dependency on Linux/macOS
    _uvloop = None


def build_state(config: ServerConfig) -> ServerState:
    """The worker's state. Its persistence takes the data directory (a second server on
    the same directory is refused here); the data itself is loaded by :func:`serve`.
    A configuration that is not safe to serve (:func:`check_password`) is refused
    before anything is opened."""
    check_password(config)
    vstore = VStore(
        config.vstore,
        max_sessions=config.vstore_max_sessions,
        maxmemory=config.maxmemory,
    )
    state = ServerState(config=config, vstore=vstore, receipt=Receipt(worker_id=config.worker_id))
    if config.export_enabled:
        exports = ExportCache(config.export_directory, config.export_max_bytes)
        vstore.change_listeners.append(exports.invalidate)
        state.exports = exports
    state.scripts = scripts = Scripts()  # its libraries are part of the dataset
    persistence = Persistence(
        config,
        vstore,
        SsmDurable(state.ssm),
        KeyspaceDurable(state.databases),
        FunctionsDurable(scripts.libraries),
    )
    persistence.open()
    state.persistence = persistence
    state.loading = True
    if config.tier is not None:
        from pion.tier import Tier

        state.tier = Tier(config.tier, vstore, config.vstore, config.vstore_max_sessions)
    return state


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_password(config: ServerConfig) -> None:
    """Refuse an empty password: it is no password, and a server started with one
    would look protected while ``AUTH ""`` opened it to anyone."""
    if config.requirepass is not None and not config.requirepass.strip():
        raise PionError(
            "the password is empty, and an empty password is no password: give a real "
            "one (--requirepass, --requirepass-file or PION_REQUIREPASS), or none at all"
        )


def check_bind_safety(config: ServerConfig) -> None:
    """Refuse to expose an unauthenticated server beyond loopback, and refuse an empty
    password anywhere."""
    check_password(config)
    if not _is_loopback(config.bind) and not config.auth_required and not config.unsafe_no_auth:
        raise PionError(
            f"refusing to bind {config.bind} without a password: set --requirepass "
            "(or --requirepass-file), or pass --unsafe-no-auth if the network is trusted"
        )


def bind_socket(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port and hasattr(socket, "SO_REUSEPORT"):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(1024)
    return sock


# Tries at finding two adjacent free ports when the RESP port is 0 (tests).
_PAIR_ATTEMPTS = 50


def bind_sockets(config: ServerConfig) -> tuple[socket.socket, socket.socket | None]:
    """The RESP socket and the binary lane's (None when the lane is off). The lane
    listens on ``--binary-port``, by default the RESP port + 1, where Pion's client
    looks for it; with RESP port 0 a pair of adjacent free ports is found."""
    if not config.binary_lane:
        return bind_socket(config.bind, config.port), None
    if config.binary_port is not None:
        return bind_socket(config.bind, config.port), bind_socket(config.bind, config.binary_port)
    for _ in range(_PAIR_ATTEMPTS if config.port == 0 else 1):
        sock = bind_socket(config.bind, config.port)
        port = sock.getsockname()[1]
        try:
            if port < 65535:
                return sock, bind_socket(config.bind, port + 1)
        except OSError as exc:
            if config.port != 0:
                sock.close()
                raise OSError(
                    exc.errno,
                    f"cannot listen on {config.bind}:{port + 1} for the binary lane "
                    f"({exc.strerror or exc}); set --binary-port, or --no-binary-lane",
                ) from None
        sock.close()
    raise PionError("no free port pair for the RESP port and its binary lane (port + 1)")


async def _closing(serving: Coroutine[Any, Any, None], endpoints: list[MetricsEndpoint]) -> None:
    """Run ``serving``, then close the metrics endpoints on the same loop."""
    try:
        await serving
    finally:
        for endpoint in endpoints:
            endpoint.close()


async def serve(
    state: ServerState,
    sockets: list[socket.socket],
    on_ready: Callable[[PionServer], None] | None = None,
    *,
    on_listening: Callable[[PionServer], None] | None = None,
    table: CommandTable = COMMAND_TABLE,
    binary_sockets: list[socket.socket] | None = None,
) -> None:
    """Serve on already-bound sockets until shutdown is requested.

    The sockets accept connections at once; while the data directory is recovered,
    commands answer ``-LOADING``. ``on_ready`` runs once recovery is done. A failed
    recovery (``RecoveryError``) closes everything and propagates: startup stops.
    ``binary_sockets`` serve the binary lane (docs/attention.md) until the same shutdown."""
    lane = BinaryLane(state)
    try:
        await _serve(
            state,
            sockets,
            table,
            lane,
            binary_sockets or [],
            on_ready=on_ready,
            on_listening=on_listening,
        )
    finally:
        lane.close()


async def _serve(
    state: ServerState,
    sockets: list[socket.socket],
    table: CommandTable,
    lane: BinaryLane,
    binary_sockets: list[socket.socket],
    *,
    on_ready: Callable[[PionServer], None] | None,
    on_listening: Callable[[PionServer], None] | None,
) -> None:
    server = PionServer(state, table)
    await server.start(sockets)
    await lane.start(binary_sockets, server)
    if on_listening is not None:
        on_listening(server)
    persistence = state.persistence
    if isinstance(persistence, Persistence) and persistence.loading:
        state.loading = True
        try:
            await persistence.recover()
        except RecoveryAborted:
            await server.wait_stopped()
            return
        except BaseException:
            await server.shutdown()
            raise
        state.loading = False
        persistence.start()
    if state.tier is not None:
        state.tier.start()
    state.loading = False
    sweeps = _Sweeps(state)
    if on_ready is not None:
        on_ready(server)
    try:
        await server.wait_stopped()
    finally:
        sweeps.cancel()


class _Sweeps:
    """The keyspace's active expiry on the loop: every SWEEP_INTERVAL_S, remove up to
    SWEEP_MAX_KEYS keys whose deadline passed (``pion.keyspace.expiry``)."""

    def __init__(self, state: ServerState) -> None:
        self.databases = state.databases
        self.loop = asyncio.get_running_loop()
        self.handle = self.loop.call_later(SWEEP_INTERVAL_S, self.tick)

    def tick(self) -> None:
        try:
            self.databases.sweep(SWEEP_MAX_KEYS)
        except Exception:  # a bug must not stop expiry for the rest of the run
            log.exception("keyspace expiry sweep failed")
        self.handle = self.loop.call_later(SWEEP_INTERVAL_S, self.tick)

    def cancel(self) -> None:
        self.handle.cancel()


def _install_uvloop() -> None:
    if _uvloop is not None:
        asyncio.set_event_loop_policy(_uvloop.EventLoopPolicy())


def _new_loop() -> asyncio.AbstractEventLoop:
    """The loop production uses (uvloop where available), so tests exercise it too."""
    if _uvloop is None:  # pragma: no cover
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = _uvloop.new_event_loop()
    return loop


def run(config: ServerConfig) -> int:
    """Run a worker in the foreground; returns the process exit code."""
    check_bind_safety(config)
    maxclients = fit_maxclients(config.maxclients)
    if maxclients != config.maxclients:
        config = dataclasses.replace(config, maxclients=maxclients)
    state = build_state(config)
    sock, binary = bind_sockets(config)
    port = sock.getsockname()[1]
    binary_port = binary.getsockname()[1] if binary is not None else 0
    _install_uvloop()
    tune_allocator()  # a server process's own setting: not for ServerThread's host
    # --metrics-port: commands counted and timed through a metered table.
    metrics = WorkerMetrics(state) if config.metrics_port is not None else None
    table = COMMAND_TABLE if metrics is None else metrics.meter(COMMAND_TABLE)
    endpoints: list[MetricsEndpoint] = []

    def ready(server: PionServer) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda: asyncio.ensure_future(server.shutdown()))
        log.info("pion-server ready on %s:%d (worker %d)", config.bind, port, config.worker_id)
        if binary is not None:
            log.info("binary lane on %s:%d", config.bind, binary_port)
        if metrics is not None:
            endpoints.append(metrics.serve(config))
            print(f"pion-server metrics port={endpoints[0].port}", flush=True)
        # A machine-readable line for scripts and tests that start us on port 0.
        print(f"pion-server ready port={port} binary_port={binary_port}", flush=True)

    def listening(server: PionServer) -> None:
        # Printed before recovery: a supervisor may connect and watch -LOADING.
        print(f"pion-server loading port={port}", flush=True)

    try:
        lanes = [binary] if binary is not None else []
        asyncio.run(
            _closing(
                serve(
                    state, [sock], ready, on_listening=listening, table=table, binary_sockets=lanes
                ),
                endpoints,
            )
        )
    except PionError as exc:
        log.critical("%s", exc.message)
        raise
    log.info("pion-server stopped")
    return 0


class ServerThread:
    """A server on its own event loop in a daemon thread (tests, embedding)."""

    def __init__(
        self,
        config: ServerConfig,
        state: ServerState | None = None,
        table: CommandTable = COMMAND_TABLE,
    ) -> None:
        self.config = config
        self.table = table
        # Sockets first: a port in use must not leave the data directory locked.
        self._sock, self._binary = bind_sockets(config)
        try:
            self.state = state if state is not None else build_state(config)
        except BaseException:
            for sock in (self._sock, self._binary):
                if sock is not None:
                    sock.close()
            raise
        self.host = config.bind
        self.port: int = self._sock.getsockname()[1]
        # The binary lane's port (0 when it is off).
        self.binary_port: int = self._binary.getsockname()[1] if self._binary is not None else 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: PionServer | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="pion-server", daemon=True)

    def start(self) -> ServerThread:
        self._thread.start()
        if not self._ready.wait(60):
            raise RuntimeError("pion-server thread did not start")
        if self._error is not None:
            raise self._error
        return self

    def _main(self) -> None:
        loop = _new_loop()
        self._loop = loop

        def ready(server: PionServer) -> None:
            self._server = server
            self._ready.set()

        try:
            lanes = [self._binary] if self._binary is not None else []
            loop.run_until_complete(
                serve(self.state, [self._sock], ready, table=self.table, binary_sockets=lanes)
            )
        except BaseException as exc:  # handed to start(): recovery refused to load
            self._error = exc
            self._ready.set()
        finally:
            loop.close()

    def stop(self, save: bool = False) -> None:
        loop, server = self._loop, self._server
        if loop is None or server is None or not self._thread.is_alive():
            return
        fut = asyncio.run_coroutine_threadsafe(server.shutdown(save), loop)
        fut.result(timeout=30)
        self._thread.join(timeout=30)


def configure_logging(level: str) -> None:
    logging.basicConfig(
        stream=sys.stderr,
        level="WARNING" if level == "notice" else level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
