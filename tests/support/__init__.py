"""Helpers shared by the test packages: the one support package, on pytest's
``pythonpath`` (``from support import ...``). Beside the helpers below, its modules
``support.attend`` (a float64 attention reference), ``support.keyspace`` (a raw RESP
client and a redis-server oracle), ``support.rdb_streams`` (streams' DUMP payloads
built from the format's layout), ``support.transport`` (a fake asyncio transport) and
``support.workers`` (helpers for workers, TLS certificates and metrics).

- V-store: :func:`make_store`, :func:`rows`, :func:`durable_state` (everything durable
  about a store, comparable with ``==``), :func:`check_layers` (the sparse-run
  invariants of ``layer.py``), recording and failing journals; :func:`data_budget`
  (a ``maxmemory`` that leaves a server room for so many more bytes).
- Persistence: :func:`open_store` (a store recovered from a real data directory;
  :func:`open_stores_with_ssm` with the SSM store beside it),
  :func:`small_workload`, :class:`StateRecorder`, wire helpers for real servers.
- Real server processes: :class:`ServerProcess` / :func:`running_server` (the one
  wrapper of a ``pion-server`` process: its ports, log, RSS and workers; the
  ``spawn_server`` fixture makes them too), :func:`wait_until`, :func:`encode_command`,
  :func:`read_reply_line`, :func:`store_fetchable`.
- `pion llama`: chat requests and ``[prefix-cache]`` log reading; the fake llama-server
  (``support.fake_llama``) and the proxy in front of it (``support.fake_llama_proxy``).
- Network: :func:`non_loopback_address` (to connect from a peer that is not loopback).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
import psutil
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from pion.config import ServerConfig, VStoreLimits
from pion.errors import MisconfError
from pion.llama.timings import Timings
from pion.persistence import Persistence
from pion.persistence.ssm_durable import SsmDurable
from pion.ssm import SsmStore
from pion.vstore import Mutation, SetBlocks, StoreRows, VStore
from pion.wire import affinity_port

# -- V-store ---------------------------------------------------------------------------


class RecordingJournal:
    """Keeps a copy of every record (payloads are only valid during append)."""

    def __init__(self) -> None:
        self.records: list[Mutation] = []

    def append(self, mutation: Mutation) -> None:
        if isinstance(mutation, StoreRows):
            mutation = dataclasses.replace(mutation, data=bytes(mutation.data))
        elif isinstance(mutation, SetBlocks):
            mutation = dataclasses.replace(mutation, hashes=bytes(mutation.hashes))
        self.records.append(mutation)


class FailingJournal:
    """A WAL whose disk is failing: every append raises MISCONF."""

    def __init__(self) -> None:
        self.calls = 0

    def append(self, mutation: Mutation) -> None:
        self.calls += 1
        raise MisconfError("Errors writing to the WAL")


def rows(n: int, dim: int, seed: int = 0) -> npt.NDArray[np.float32]:
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)


def f16_rows(n: int, dim: int, seed: int) -> bytes:
    """fp16 bit patterns for V.STOREBATCH ... FMT F16 (stored verbatim: bit-exact)."""
    return rows(n, dim, seed).astype("<f2").tobytes()


def make_store(**kw: Any) -> VStore:
    limits = kw.pop("limits", VStoreLimits())
    return VStore(limits, **kw)


def durable_state(vs: VStore) -> list[tuple[Any, ...]]:
    """Everything durable about a store, comparable with ``==``: its records in a
    canonical order (not its LRU order: reads are not logged), then its totals."""
    out: list[tuple[Any, ...]] = []
    for m in vs.dump():
        if isinstance(m, StoreRows):
            out.append(
                ("rows", m.sid, m.layer, m.start, m.count, m.format_id, m.dim, bytes(m.data))
            )
        elif isinstance(m, SetBlocks):
            out.append(("blocks", m.sid, m.block_size, bytes(m.hashes)))
        else:
            out.append((type(m).__name__, *dataclasses.astuple(m)))
    out.sort()
    out.append(("totals", vs.vstore_bytes, vs.total_tokens, len(vs)))
    return out


def check_layers(vs: VStore) -> None:
    """The layer invariants of ``layer.py``: runs sorted with disjoint extents, live
    rows inside their extent, zero bytes outside them, and held/tpl as the runs say."""
    for s in vs._sessions.values():
        for lay in s.layers.values():
            top = 0
            for r in lay.runs:
                assert top <= r.base <= r.lo < r.hi <= r.top, (r.base, r.lo, r.hi, r.top)
                assert not r.buf[: r.lo - r.base].any() and not r.buf[r.hi - r.base :].any()
                top = r.top
            assert lay.held == sum(r.hi - r.lo for r in lay.runs)
            assert lay.tpl == max((r.hi for r in lay.runs), default=0)


def data_budget(r: redis.Redis, nbytes: int) -> int:
    """Set ``maxmemory`` so that ``nbytes`` more fit: ``used_memory`` now (the server's
    startup memory, its data and the clients' buffers: what the limit bounds) plus
    ``nbytes``. Returns the limit."""
    limit = int(r.info("memory")["used_memory"]) + nbytes
    r.config_set("maxmemory", limit)
    return limit


# -- persistence -----------------------------------------------------------------------


def open_store(data_dir: Path, **overrides: Any) -> tuple[VStore, Persistence]:
    """A store recovered from ``data_dir`` with a live Persistence as its journal."""
    overrides.setdefault("appendfsync", "no")
    config = dataclasses.replace(ServerConfig(), dir=data_dir, **overrides)
    vs = VStore(config.vstore, max_sessions=config.vstore_max_sessions, maxmemory=config.maxmemory)
    p = Persistence(config, vs)
    p.open()
    p.recover_now()
    return vs, p


def open_stores_with_ssm(data_dir: Path) -> tuple[VStore, SsmStore, Persistence]:
    """A V-store and an SSM store recovered from ``data_dir`` by one Persistence (the
    server's arrangement), which is then their journal."""
    config = dataclasses.replace(ServerConfig(), dir=data_dir, appendfsync="no")
    vs = VStore(config.vstore)
    ssm = SsmStore()
    p = Persistence(config, vs, SsmDurable(ssm))
    p.open()
    p.recover_now()
    return vs, ssm, p


def fresh_store() -> VStore:
    return VStore(ServerConfig().vstore)


class StateRecorder:
    """A journal wrapper: the canonical state before each record is appended, so
    ``states[k]`` is the state after the first k records."""

    def __init__(self, vs: VStore, inner: Any) -> None:
        self.vs = vs
        self.inner = inner
        self.states: list[list[tuple[Any, ...]]] = []

    def append(self, m: Mutation) -> None:
        self.states.append(durable_state(self.vs))
        self.inner.append(m)

    def finish(self) -> list[list[tuple[Any, ...]]]:
        return [*self.states, durable_state(self.vs)]


def small_workload(vs: VStore) -> None:
    """Every kind of record, a SCHEMA session, a drop and (with ``max_sessions`` 4) an
    LRU eviction of ``s``, in about 3 KB of log."""
    vs.create(b"a_pk", 16, "int8")
    vs.create(b"a_pv", 16, "fp16")
    vs.store(b"a_pk", 0, 0, rows(4, 16, 1))
    vs.store(b"a_pv", 1, 2, rows(3, 16, 2))
    vs.set_blocks(b"a_pk", 4, np.array([7, 3, 9], dtype=np.uint64))
    vs.create_schema(b"s", 0, [("fp8", 8), ("turbo4", 32)])
    vs.store(b"s", 1, 0, rows(2, 32, 3))
    vs.create(b"gone", 8, "mlx4g32")
    vs.store(b"gone", 0, 0, rows(2, 8, 4))
    vs.drop(b"gone")
    vs.store(b"a_pk", 0, 2, rows(3, 16, 5))  # overwrite and extend
    vs.create(b"e1", 8, "fp16")
    vs.store(b"e1", 0, 0, rows(1, 8, 6))
    vs.create(b"e2", 8, "int8")  # the fifth session: evicts s, the least recently used


def no_retry() -> Retry:
    """redis-py retries ConnectionError (and BusyLoadingError, its subclass) with
    backoff by default; tests that expect a dropped connection or -LOADING must see
    the first answer."""
    return Retry(NoBackoff(), 0)


def wait_loaded(r: redis.Redis, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if r.info("persistence").get("loading") == 0:
                return
        except redis.exceptions.BusyLoadingError:
            pass
        time.sleep(0.02)
    raise TimeoutError("server still loading")


# -- real server processes (hardening) ---------------------------------------------------
# A `pion-server` process whose memory is judged by its own resident set size (psutil)
# and whose log goes to a file (a pipe nobody drains would stall a server that logs a
# lot), and the raw-socket helpers the hostile clients of those tests share.

MiB = 1024 * 1024
# Lines a starting pion-server prints: its RESP port, and its metrics port (if any).
_READY = re.compile(rb"pion-server (ready|metrics) port=(\d+)")
_WITH_NOFILE = (
    "import resource, runpy, sys; "
    "resource.setrlimit(resource.RLIMIT_NOFILE, (%d, %d)); "
    "sys.argv[0] = 'pion'; runpy.run_module('pion', run_name='__main__', alter_sys=True)"
)


# Starts of a server whose ports were taken between its choice and its bind.
_START_ATTEMPTS = 3


class ServerProcess:
    """``python -m pion server --port 0 <args>``: the one wrapper of a real pion-server
    process (one process, or a supervisor of ``-w N``). Its log goes to a file in
    ``log_dir`` (a pipe nobody drains would stall a server that logs a lot); without
    ``--dir`` among ``args`` its data is ``log_dir/data``."""

    def __init__(
        self,
        log_dir: Path,
        args: Sequence[str],
        *,
        password: str | None = None,
        env: dict[str, str] | None = None,
        nofile: tuple[int, int] | None = None,
        timeout: float = 90,
    ) -> None:
        self.password = password
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"server-{time.monotonic_ns()}.log"
        argv = list(args)
        if "--dir" not in argv:
            argv += ["--dir", str(log_dir / "data")]
        if password is not None:
            argv += ["--requirepass", password]
        self.args = argv
        cmd = [sys.executable, "-m", "pion", "server", "--port", "0", *argv]
        if nofile is not None:
            # Start the server under this open-files limit (soft, hard), as `ulimit -n`.
            cmd[1:3] = ["-c", _WITH_NOFILE % nofile]
        # With --port 0 the server chooses its ports, and the ones it derives (the binary
        # lane's port + 1, the workers' affinity ports) can be taken by another process
        # between its check and its bind on a busy machine: such a start is tried again.
        chosen = "--port" not in argv
        for attempt in range(_START_ATTEMPTS if chosen else 1):
            if attempt:
                self.log_path = log_dir / f"server-{time.monotonic_ns()}.log"
            if self._start(cmd, env, timeout):
                return
            if "Address already in use" not in self.log():
                break
        raise RuntimeError(f"pion-server did not start:\n{self.log()}")

    def _start(self, cmd: list[str], env: dict[str, str] | None, timeout: float) -> bool:
        """Start the process and read its ready lines; False (stopped) when it never
        said it was ready."""
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=self._log, env={**os.environ, **(env or {})}
        )
        self.port = 0
        self.metrics_port: int | None = None
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            m = _READY.search(line)
            if m and m.group(1) == b"metrics":
                self.metrics_port = int(m.group(2))
            elif m:
                self.port = int(m.group(2))
                self._ps = psutil.Process(self.proc.pid)
                return True
        self.close()
        return False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def rss(self) -> int:
        """The server's resident set size in bytes, now."""
        return int(self._ps.memory_info().rss)

    def client(self, port: int | None = None, **kw: Any) -> redis.Redis:
        kw.setdefault("socket_timeout", 30)
        kw.setdefault("password", self.password)
        return redis.Redis(host="127.0.0.1", port=self.port if port is None else port, **kw)

    def worker(self, index: int, **kw: Any) -> redis.Redis:
        """A client of worker ``index``'s affinity port (``-w N``)."""
        return self.client(affinity_port(self.port, index), **kw)

    def worker_pids(self) -> list[int]:
        return [p.pid for p in psutil.Process(self.pid).children()]

    def connect(self, timeout: float = 10) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=timeout)

    def info(self, section: str) -> dict[str, Any]:
        with self.client() as r:
            return dict(r.info(section))

    def log(self) -> str:
        """What the server has logged so far (all of it, once it has exited)."""
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """kill -9, and wait for it."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        """Send ``sig`` (while it runs) and return its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout)

    def close(self) -> None:
        """Stop it (SIGTERM, then SIGKILL past 30 s) and release its streams."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log.close()


@contextmanager
def running_server(tmp_path: Path, *args: str, **kw: Any) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path, args, **kw)
    try:
        yield srv
    finally:
        srv.close()


def encode_command(*parts: bytes | str | int) -> bytes:
    """One request encoded as a RESP multibulk."""
    out = [b"*%d\r\n" % len(parts)]
    for p in parts:
        b = p if isinstance(p, bytes) else str(p).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


def read_reply_line(sock: socket.socket, timeout: float = 10) -> bytes:
    """Bytes up to the first CRLF (or what came before the peer closed)."""
    sock.settimeout(timeout)
    got = b""
    while b"\r\n" not in got:
        chunk = sock.recv(4096)
        if not chunk:
            break
        got += chunk
    return got


def store_fetchable(r: redis.Redis, sid: str, rows: int, dim: int) -> np.ndarray:
    """A one-layer fp16 session whose ``V.FETCH sid 0 RANGE 0 rows`` reply is
    ``rows * dim * 4`` bytes of fp32; returns what it holds."""
    r.execute_command("V.CREATE", sid, dim, "VQUANT", "fp16")
    values = (np.arange(rows * dim, dtype=np.float32) % 1024).reshape(rows, dim)
    r.execute_command("V.STOREBATCH", sid, 0, 0, rows, values.tobytes())
    return values


# -- pion llama ------------------------------------------------------------------------


def chat(base_url: str, body: dict[str, Any], **headers: str) -> tuple[dict[str, Any], Timings]:
    """Send a non-streamed chat request; return the JSON and its timings."""
    resp = httpx.post(base_url + "/v1/chat/completions", json=body, headers=headers, timeout=120)
    resp.raise_for_status()
    data = resp.json()
    timings = Timings.from_json(data)
    assert timings is not None, data
    return data, timings


def log_lines(path: Path | None) -> list[str]:
    """The ``[prefix-cache]`` messages of a log file, without the timestamps."""
    if path is None or not path.exists():
        return []
    return [line.split("[prefix-cache] ", 1)[1] for line in path.read_text().splitlines()]


def count(lines: list[str], needle: str) -> int:
    return sum(needle in line for line in lines)


def wait_log(path: Path | None, needle: str, n: int = 1, timeout: float = 10.0) -> list[str]:
    """Wait until ``needle`` occurs ``n`` times in the log; return its lines.

    The proxy logs the observed reuse after the last byte went to the client, so a client
    can read its answer a moment before that line is written.
    """
    deadline = time.monotonic() + timeout
    while True:
        lines = log_lines(path)
        if count(lines, needle) >= n or time.monotonic() > deadline:
            return lines
        time.sleep(0.02)


# -- raw sockets -----------------------------------------------------------------------


def raw_exchange(
    port: int,
    data: bytes,
    *,
    read_until_close: bool = True,
    timeout: float = 10,
    expect: bytes | None = None,
) -> bytes:
    """Send bytes on a fresh socket and collect what comes back until close/timeout
    (or, with ``expect``, until what came back ends with it)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        chunks = []
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
                if expect is not None:
                    if b"".join(chunks).endswith(expect):
                        break
                elif not read_until_close:
                    break
        except TimeoutError:
            pass
        return b"".join(chunks)


# -- cluster tier ----------------------------------------------------------------------


def wait_until(
    predicate: Any, timeout: float = 60.0, what: str = "condition", step: float = 0.05
) -> Any:
    """Poll ``predicate()`` until it returns something true, and return that; a
    connection error while the server comes up counts as not yet. Fails naming
    ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(step)


def store_prefix(
    r: redis.Redis, ns: str, *, fmt: str = "fp16", dim: int = 64, layers: int = 3,
    rows_per_layer: int = 600, seed: int = 0,
) -> None:  # fmt: skip
    """REGISTER ``ns`` and store every layer of both halves (600 rows: three 256-row
    tier chunks, the last one partial)."""
    assert r.execute_command("KV.PREFIX.REGISTER", ns, dim, fmt) == b"OK"
    for half, sid in enumerate((f"{ns}_pk", f"{ns}_pv")):
        for layer in range(layers):
            blob = rows(rows_per_layer, dim, seed + 100 * half + layer).tobytes()
            r.execute_command("V.STOREBATCH", sid, layer, 0, rows_per_layer, blob)


def fetch_prefix(r: redis.Redis, ns: str, rows_per_layer: int = 600) -> list[Any]:
    """Both halves as V.FETCH BATCH replies, fp32 and FMT NATIVE: what bit-exact means."""
    out = []
    for sid in (f"{ns}_pk", f"{ns}_pv"):
        out.append(r.execute_command("V.FETCH", sid, "BATCH", 0, rows_per_layer))
        out.append(r.execute_command("V.FETCH", sid, "BATCH", 0, rows_per_layer, "FMT", "NATIVE"))
    return out


def tier_info(r: redis.Redis) -> dict[str, Any]:
    return dict(r.info("tier"))


# -- network -------------------------------------------------------------------------


def non_loopback_address() -> str:
    """This machine's address on its first non-loopback interface."""
    candidates = []
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # a UDP connect only picks a route
        candidates.append(probe.getsockname()[0])
    with contextlib.suppress(OSError):
        candidates += socket.gethostbyname_ex(socket.gethostname())[2]
    for addr in candidates:
        if not addr.startswith("127.") and addr != "0.0.0.0":
            return addr
    raise RuntimeError("this test needs a non-loopback IPv4 address on the machine")
