"""Large commands off the event loop: an offloaded V.STOREBATCH and a streamed V.FETCH
give exactly the replies, and leave exactly the state, of running them inline; a
client's commands still run one at a time and in order; reading stops one command
ahead; a streamed reply waits for a client that is behind; failures are contained.

A random pipeline over a real server (worker threads, TCP) is checked against the same
pipeline run inline, one command after the other (the sequential oracle)."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import re
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import hiredis
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pion.codecs import get_codec
from pion.commands import vstore as vstore_commands
from pion.commands.deferred import LazyBulk, Offload, Stream
from pion.config import ProtocolLimits, ServerConfig
from pion.server.run import ServerThread
from pion.vstore import layer as layer_module
from support.transport import FakeTransport, connect

# -- harness ---------------------------------------------------------------------------


class ManualOffload:
    """An offloader whose work runs when the test says so."""

    def __init__(self) -> None:
        self.queue: list[tuple[Callable[[], Any], Callable[[Any], None]]] = []

    def submit(self, work: Callable[[], Any], done: Callable[[Any], None]) -> None:
        self.queue.append((work, done))

    def run_one(self) -> None:
        work, done = self.queue.pop(0)
        try:
            result = work()
        except Exception as exc:
            result = exc
        done(result)

    def run_all(self) -> None:
        while self.queue:
            self.run_one()


def encode(*args: object) -> bytes:
    parts = [a if isinstance(a, bytes) else str(a).encode() for a in args]
    return b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)


def parse(wire: bytes) -> list[Any]:
    reader = hiredis.Reader()
    reader.feed(wire)
    out = []
    while (item := reader.gets()) is not False:
        out.append(("error", str(item)) if isinstance(item, hiredis.ReplyError) else item)
    return out


def rows(count: int, dim: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((count, dim)).astype("<f4")


@pytest.fixture
def small_offload(monkeypatch: pytest.MonkeyPatch) -> None:
    """Offload from 4 KiB and decode in 8 KiB pieces, so small tests take those paths."""
    monkeypatch.setattr(vstore_commands, "OFFLOAD_MIN_BYTES", 4096)
    monkeypatch.setattr(vstore_commands, "PART_BYTES", 1024)  # stores in several parts
    monkeypatch.setattr(layer_module, "DECODE_CHUNK_BYTES", 8192)


# -- one client, driven by hand --------------------------------------------------------


def test_offloaded_and_inline_give_the_same_bytes(tmp_path: Path, small_offload: None) -> None:
    wire = (
        encode("V.CREATE", "s", 64, "VQUANT", "int8")
        + encode("V.STOREBATCH", "s", 0, 0, 100, rows(100, 64, 1).tobytes())
        + encode("V.STOREBATCH", "s", 1, 10, 50, rows(50, 64, 2).tobytes())
        + encode("V.FETCH", "s", 0, "RANGE", 0, 120)
        + encode("V.FETCH", "s", "BATCH", 0, 80)
        + encode("PING")
    )

    async def run(offload: Any) -> bytes:
        conn, t = connect(tmp_path / str(id(offload)), offload=offload)
        conn.data_received(wire)
        if offload is not None:
            offload.run_all()
        return bytes(t.written)

    inline = asyncio.run(run(None))
    manual = ManualOffload()
    assert asyncio.run(run(manual)) == inline
    replies = parse(inline)
    assert replies[:3] == [0, b"OK", b"OK"]
    assert len(replies[3]) == 120 * 64 * 4
    assert [len(r) for r in replies[4]] == [80 * 64 * 4] * 2
    assert replies[5] == b"PONG"


def test_one_command_at_a_time_and_one_parsed_ahead(tmp_path: Path, small_offload: None) -> None:
    """While a store is quantized off the loop, the client's next command is parsed
    (received) but not run, and reading stops there; replies stay in order."""

    async def body() -> None:
        manual = ManualOffload()
        conn, t = connect(tmp_path, offload=manual)
        state = conn._state
        conn.data_received(encode("V.CREATE", "s", 64, "VQUANT", "turbo3"))
        ran = state.counters.total_commands_processed
        first = encode("V.STOREBATCH", "s", 0, 0, 100, rows(100, 64, 1).tobytes())
        second = encode("V.STOREBATCH", "s", 0, 0, 100, rows(100, 64, 2).tobytes())
        conn.data_received(first + second + encode("PING"))
        assert len(manual.queue) == 1  # the first store's quantization
        assert state.counters.total_commands_processed == ran + 1
        assert not t.reading  # the second store is parsed ahead: stop reading
        assert conn._next is not None
        manual.run_one()  # first store done: its +OK, then the second starts
        assert len(manual.queue) == 1
        assert conn._next == [b"PING"]  # now PING waits, parsed ahead
        assert not t.reading
        manual.run_one()
        assert parse(bytes(t.written)) == [0, b"OK", b"OK", b"PONG"]
        assert t.reading
        # The second store applied after the first: its rows are what is held.
        conn.data_received(encode("V.FETCH", "s", 0, "RANGE", 0, 100))
        manual.run_all()
        back = np.frombuffer(parse(bytes(t.written))[-1], "<f4").reshape(100, 64)
        turbo3 = get_codec("turbo3")
        assert np.array_equal(back, turbo3.decode(turbo3.encode(rows(100, 64, 2)), 64))

    asyncio.run(body())


def test_streamed_reply_waits_for_a_client_behind(tmp_path: Path, small_offload: None) -> None:
    """Pieces are computed two at a time and sent in order; no further piece starts
    while the client is behind on reading (the reply high-water mark)."""

    async def body() -> None:
        manual = ManualOffload()
        transport = FakeTransport(high=10_000)
        conn, t = connect(
            tmp_path, transport, offload=manual, protocol=ProtocolLimits(reply_high_water=10_000)
        )
        conn.data_received(encode("V.CREATE", "s", 64, "VQUANT", "fp16"))
        conn.data_received(encode("V.STOREBATCH", "s", 0, 0, 200, rows(200, 64, 3).tobytes()))
        manual.run_all()
        t.keep = True
        conn.data_received(encode("V.FETCH", "s", 0, "RANGE", 0, 200) + encode("PING"))
        # 200 x 64 x 4 = 51,200 bytes in 8 KiB pieces, STREAM_DEPTH (2) computed at once.
        assert len(manual.queue) == 2
        manual.run_one()  # piece 1 sent (8 KiB, under the 10,000-byte mark): piece 3 starts
        assert len(manual.queue) == 2
        manual.run_one()  # piece 2 takes the socket over the mark: nothing new starts
        assert len(manual.queue) == 1
        manual.run_one()  # piece 3 was computing already: it is sent too
        assert manual.queue == []
        assert conn._running.busy  # the rest waits for the client to read
        while conn._running.busy:
            t.drain()
            await asyncio.sleep(0)
            manual.run_all()
        t.drain()
        await asyncio.sleep(0)
        replies = parse(bytes(t.written))
        assert replies[-1] == b"PONG"
        fetched = np.frombuffer(replies[-2], "<f4").reshape(200, 64)
        assert np.array_equal(fetched, rows(200, 64, 3).astype("<f2").astype("<f4"))

    asyncio.run(body())


def test_offloaded_store_error_is_the_synchronous_one(tmp_path: Path, small_offload: None) -> None:
    bad = rows(100, 64, 1)
    bad[37, 5] = np.nan
    wire = encode("V.CREATE", "s", 64, "VQUANT", "int8") + encode(
        "V.STOREBATCH", "s", 0, 0, 100, bad.tobytes()
    )

    async def run(offload: Any) -> list[Any]:
        conn, t = connect(tmp_path / str(id(offload)), offload=offload)
        conn.data_received(wire + encode("V.INFO", "s"))
        if offload is not None:
            offload.run_all()
        return parse(bytes(t.written))

    inline = asyncio.run(run(None))
    assert asyncio.run(run(ManualOffload())) == inline
    assert inline[1] == ("error", "ERR layer 0 row 37: non-finite value")
    assert b"layer_0_tokens" not in inline[2]  # nothing was stored


def test_an_error_found_off_the_loop_is_returned_as_found(
    tmp_path: Path, small_offload: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 31: the store's arguments are parsed once (``StoreRequest``), and a
    non-finite value the worker found is the reply: the rows are not quantized again
    on the loop to find it a second time."""
    bad = rows(100, 64, 1)
    bad[37, 5] = np.nan

    async def body() -> None:
        manual = ManualOffload()
        conn, t = connect(tmp_path, offload=manual)
        conn.data_received(encode("V.CREATE", "s", 64, "VQUANT", "int8"))
        parsed: list[object] = []
        real_parse = vstore_commands._parse_storebatch
        monkeypatch.setattr(
            vstore_commands,
            "_parse_storebatch",
            lambda argv: parsed.append(argv) or real_parse(argv),
        )
        stores: list[object] = []
        real_store = conn._state.vstore.store
        monkeypatch.setattr(
            conn._state.vstore, "store", lambda *a, **k: stores.append(a) or real_store(*a, **k)
        )
        conn.data_received(encode("V.STOREBATCH", "s", 0, 0, 100, bad.tobytes()))
        manual.run_all()
        assert parse(bytes(t.written))[-1] == ("error", "ERR layer 0 row 37: non-finite value")
        assert len(parsed) == 1 and stores == []

    asyncio.run(body())


def test_layout_changed_while_encoding(tmp_path: Path, small_offload: None) -> None:
    """Another client drops and re-creates the session with another format while the
    rows are being quantized: the store happens as if it ran after that (the hint is
    discarded and the rows are quantized for the new format)."""

    async def body() -> None:
        manual = ManualOffload()
        conn, t = connect(tmp_path, offload=manual)
        state = conn._state
        conn.data_received(encode("KV.PREFIX.REGISTER", "ns", 64, "int8"))
        data = rows(100, 64, 4)
        conn.data_received(encode("V.STOREBATCH", "ns_pk", 0, 0, 100, data.tobytes()))
        assert len(manual.queue) == 1
        # Meanwhile, on the loop: the namespace is dropped and registered as fp16.
        state.registry.drop(b"ns")
        state.registry.register(b"ns", 64, "fp16", None, 0)
        manual.run_all()
        assert parse(bytes(t.written))[-1] == b"OK"
        stored = state.vstore.fetch_range(b"ns_pk", 0, 0, 100)
        assert stored is not None
        assert np.array_equal(stored, data.astype("<f2").astype("<f4"))

    asyncio.run(body())


def test_session_dropped_while_encoding(tmp_path: Path, small_offload: None) -> None:
    async def body() -> None:
        manual = ManualOffload()
        conn, t = connect(tmp_path, offload=manual)
        conn.data_received(encode("V.CREATE", "s", 64, "VQUANT", "int8"))
        conn.data_received(encode("V.STOREBATCH", "s", 0, 0, 100, rows(100, 64, 1).tobytes()))
        conn._state.vstore.drop(b"s")
        manual.run_all()
        assert parse(bytes(t.written))[-1] == ("error", "ERR session not found")

    asyncio.run(body())


def test_client_gone_while_encoding_the_store_still_applies(
    tmp_path: Path, small_offload: None
) -> None:
    """A command received whole runs to the end, as in Redis; only its reply is lost."""

    async def body() -> None:
        manual = ManualOffload()
        conn, t = connect(tmp_path, offload=manual)
        conn.data_received(encode("V.CREATE", "s", 64, "VQUANT", "int8"))
        written = len(t.written)
        conn.data_received(encode("V.STOREBATCH", "s", 0, 0, 100, rows(100, 64, 1).tobytes()))
        conn.connection_lost(None)
        manual.run_all()
        assert len(t.written) == written
        assert conn._state.vstore.describe(b"s").total_tokens == 100

    asyncio.run(body())


def test_a_failed_piece_drops_the_connection(tmp_path: Path) -> None:
    """The framing of a streamed reply is out when a piece fails: the reply cannot be
    finished, so the connection is dropped and the failure counted (a Pion bug)."""

    def boom() -> np.ndarray:
        raise RuntimeError("decoder bug")

    async def body() -> None:
        manual = ManualOffload()
        conn, t = connect(tmp_path, offload=manual)
        stream = Stream([LazyBulk(8, [lambda: np.zeros(1, "<f8"), boom])], array=False)
        conn._running.start([b"V.FETCH"], stream, silent=False)
        manual.run_one()
        manual.run_one()
        assert t.aborted
        assert conn._state.counters.internal_errors == 1
        assert not conn._running.busy

    asyncio.run(body())


def test_a_short_stream_drops_the_connection(tmp_path: Path) -> None:
    async def body() -> None:
        manual = ManualOffload()
        conn, t = connect(tmp_path, offload=manual)
        stream = Stream([LazyBulk(16, [lambda: np.zeros(1, "<f8")])], array=True)
        conn._running.start([b"V.FETCH"], stream, silent=False)
        manual.run_all()
        assert t.aborted

    asyncio.run(body())


def test_offload_finish_runs_inside_the_error_boundary(tmp_path: Path) -> None:
    """An exception in finish is a Pion bug: answered `-ERR internal error`, counted,
    and the connection goes on."""

    def finish(result: object) -> Any:
        raise KeyError("bug")

    async def body() -> None:
        manual = ManualOffload()
        conn, t = connect(tmp_path, offload=manual)
        conn._running.start([b"V.STOREBATCH"], Offload(work=lambda: 1, finish=finish), silent=False)
        manual.run_all()
        conn.data_received(encode("PING"))
        assert parse(bytes(t.written)) == [("error", "ERR internal error"), b"PONG"]
        assert conn._state.counters.internal_errors == 1

    asyncio.run(body())


# -- a real server: random pipelines against the sequential oracle ------------------------

FORMATS = ("fp16", "int8", "turbo3", "mlx4g32")
DIMS = (32, 160)


@st.composite
def programs(draw: st.DrawFn) -> list[tuple[object, ...]]:
    """Commands over two namespaces, in any order: registers (re-register after a drop
    changes the format), stores (fp32, fp16 verbatim, some with a non-finite value),
    fetches (RANGE past the rows, BATCH), V.INFO, drops, PING."""
    ops: list[tuple[object, ...]] = []
    layouts: dict[str, tuple[str, int]] = {}
    for _ in range(draw(st.integers(3, 18))):
        ns = draw(st.sampled_from(["a", "b"]))
        sid = f"{ns}_pk"
        kinds = ["register", "store", "store", "store", "fetch", "batch", "info", "drop", "ping"]
        kind = draw(st.sampled_from(kinds))
        if kind == "register" or (kind in ("store", "fetch", "batch") and ns not in layouts):
            fmt = draw(st.sampled_from(FORMATS))
            dim = draw(st.sampled_from(DIMS))
            ops.append(("KV.PREFIX.REGISTER", ns, dim, fmt))
            layouts.setdefault(ns, (fmt, dim))
            continue
        if kind == "drop":
            ops.append(("KV.PREFIX.DROP", ns))
            layouts.pop(ns, None)
        elif kind == "ping":
            ops.append(("PING",))
        elif kind == "info":
            ops.append(("V.INFO", sid))
        elif kind == "store":
            fmt, dim = layouts[ns]
            layer = draw(st.integers(0, 2))
            start = draw(st.integers(0, 60))
            count = draw(st.integers(1, 80))
            data = rows(count, dim, draw(st.integers(0, 10**6)))
            if draw(st.integers(0, 9)) == 0:
                data[count // 2, 0] = np.inf
            f16 = fmt == "fp16" and draw(st.booleans())
            blob = data.astype("<f2").tobytes() if f16 else data.tobytes()
            ops.append(("V.STOREBATCH", sid, layer, start, count, blob, *(["FMT", "F16"] * f16)))
        elif kind == "fetch":
            layer = draw(st.integers(0, 2))
            start = draw(st.integers(0, 100))
            end = start + draw(st.integers(1, 100))
            ops.append(("V.FETCH", sid, layer, "RANGE", start, end))
        else:
            start = draw(st.integers(0, 50))
            ops.append(("V.FETCH", sid, "BATCH", start, start + draw(st.integers(1, 100)), 3))
    return ops


_names = itertools.count()


def oracle(program: list[tuple[object, ...]], tmp_path: Path) -> list[Any]:
    """The program run inline, one command after the other, on a fresh server state."""

    async def body() -> bytes:
        conn, t = connect(tmp_path / f"oracle{next(_names)}")
        conn.data_received(b"".join(encode(*op) for op in program))
        return bytes(t.written)

    return parse(asyncio.run(body()))


def over_tcp(port: int, program: list[tuple[object, ...]]) -> list[Any]:
    """The program pipelined to a real server in one go, the replies read meanwhile."""
    wire = b"".join(encode(*op) for op in program)
    reader = hiredis.Reader()
    replies: list[Any] = []
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sender = threading.Thread(target=sock.sendall, args=(wire,))
        sender.start()
        while len(replies) < len(program):
            chunk = sock.recv(1 << 20)
            assert chunk, "server closed the connection"
            reader.feed(chunk)
            while (item := reader.gets()) is not False:
                replies.append(
                    ("error", str(item)) if isinstance(item, hiredis.ReplyError) else item
                )
        sender.join()
    return replies


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    config = dataclasses.replace(
        ServerConfig(), port=0, dir=tmp_path_factory.mktemp("live"), wal_enabled=False
    )
    server = ServerThread(config).start()
    yield server
    server.stop()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_pipelines_match_the_sequential_oracle(
    live_server: ServerThread, tmp_path_factory: pytest.TempPathFactory, program: Any
) -> None:
    """Offloaded stores and streamed fetches over TCP (worker threads, a pipeline sent
    in one go) answer exactly as the same commands run inline one by one."""
    saved = (
        vstore_commands.OFFLOAD_MIN_BYTES,
        vstore_commands.PART_BYTES,
        layer_module.DECODE_CHUNK_BYTES,
    )
    # Stores offload in row blocks of 1 KiB: several parts of each run at once.
    (
        vstore_commands.OFFLOAD_MIN_BYTES,
        vstore_commands.PART_BYTES,
        layer_module.DECODE_CHUNK_BYTES,
    ) = 4096, 1024, 8192
    try:
        # Fresh namespaces per example on the shared server.
        tag = f"t{next(_names)}"
        renamed = [_rename(op, tag) for op in program]
        got = over_tcp(live_server.port, renamed)
        expected = oracle(renamed, tmp_path_factory.mktemp("oracle"))
    finally:
        (
            vstore_commands.OFFLOAD_MIN_BYTES,
            vstore_commands.PART_BYTES,
            layer_module.DECODE_CHUNK_BYTES,
        ) = saved
    assert normalized(renamed, got) == normalized(renamed, expected)


def normalized(program: list[tuple[object, ...]], replies: list[Any]) -> list[Any]:
    """Replies with the one thing a shared server legitimately answers differently
    from a fresh one masked: the slot numbers sessions get (V.CREATE, V.INFO)."""
    out = []
    for op, reply in zip(program, replies, strict=True):
        if op[0] == "V.CREATE" and isinstance(reply, int):
            out.append("slot")
        elif op[0] == "V.INFO" and isinstance(reply, bytes):
            out.append(re.sub(rb"session_idx:\d+", b"session_idx:?", reply))
        else:
            out.append(reply)
    return out


def _rename(op: tuple[object, ...], tag: str) -> tuple[object, ...]:
    name = op[0]
    if name in ("KV.PREFIX.REGISTER", "KV.PREFIX.DROP"):
        return (name, f"{tag}{op[1]}", *op[2:])
    if name in ("V.STOREBATCH", "V.FETCH", "V.INFO"):
        return (name, f"{tag}{op[1]}", *op[2:])
    return op


def test_clients_in_parallel_each_see_their_own_order(
    live_server: ServerThread, small_offload: None
) -> None:
    """Four clients pipelining large stores and fetches at once, each on its own
    session: every client's replies are its own sequential answers."""
    programs_by_client = []
    for c in range(4):
        sid = f"par{c}_{next(_names)}"
        ops: list[tuple[object, ...]] = [("V.CREATE", sid, 160, "VQUANT", FORMATS[c])]
        for i in range(6):
            ops.append(("V.STOREBATCH", sid, i % 2, 0, 300, rows(300, 160, c * 10 + i).tobytes()))
            ops.append(("V.FETCH", sid, "BATCH", 0, 300))
        programs_by_client.append(ops)
    results: dict[int, list[Any]] = {}

    def client(c: int) -> None:
        results[c] = over_tcp(live_server.port, programs_by_client[c])

    before = live_server.state.counters.offloaded_commands
    threads = [threading.Thread(target=client, args=(c,)) for c in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for c in range(4):
        program = programs_by_client[c]
        expected = oracle(program, Path(live_server.config.dir) / f"o{c}")
        assert normalized(program, results[c]) == normalized(program, expected)
    # Every store (300 x 160 x 4 bytes) and every fetch went through a worker thread.
    assert live_server.state.counters.offloaded_commands - before == 4 * 12
