"""BITCOUNT, BITPOS and BITOP over strings longer than one step
(``pion.keyspace.bits.STEP_BYTES``), which run in steps of the event loop: their
replies are redis-server's byte for byte, a BITOP whose source changes between its
steps stores the result of one instant, and another client's PING is answered while
they run.

The oracle cases shrink STEP_BYTES (the server runs in this process) so that strings of
a few dozen bytes cross many step boundaries; one case keeps the real step size on
strings of several MB.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pion.config import ServerConfig
from pion.keyspace import Keyspace, bits
from pion.server.run import ServerThread
from support import ServerProcess, encode_command, running_server
from support.keyspace import RawClient, RedisServer


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RawClient, RawClient]]:
    work = tmp_path_factory.mktemp("bits")
    oracle = RedisServer(work)
    pion = ServerThread(ServerConfig(port=0, dir=work / "pion", appendfsync="no")).start()
    pair = RawClient(oracle.port), RawClient(pion.port)
    yield pair
    for c in pair:
        c.close()
    pion.stop()
    oracle.stop()


def _check(pair: tuple[RawClient, RawClient], *cmd: bytes | str) -> None:
    want, got = (c.call(*cmd) for c in pair)
    assert want.raw == got.raw, (cmd, want.raw, got.raw)


# Strings whose set and clear bits are runs, so BITPOS has something to look for past
# the first step, for both bits.
_runs = st.lists(
    st.tuples(st.sampled_from([0x00, 0xFF, 0x01, 0x80, 0x5A]), st.integers(1, 24)),
    max_size=6,
)
_index = st.integers(-70, 70).map(lambda i: str(i).encode())
_unit = st.sampled_from([[], [b"BYTE"], [b"BIT"], [b"bit"]])


def _string(runs: list[tuple[int, int]]) -> bytes:
    return b"".join(bytes((byte,)) * n for byte, n in runs)


@settings(
    max_examples=200,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    value=_runs,
    other=_runs,
    start=_index,
    end=_index,
    unit=_unit,
    bit=st.sampled_from([b"0", b"1"]),
    op=st.sampled_from([b"AND", b"OR", b"XOR", b"NOT"]),
)
def test_stepped_replies_match_redis(
    servers: tuple[RawClient, RawClient],
    monkeypatch: pytest.MonkeyPatch,
    *,
    value: list[tuple[int, int]],
    other: list[tuple[int, int]],
    start: bytes,
    end: bytes,
    unit: list[bytes],
    bit: bytes,
    op: bytes,
) -> None:
    monkeypatch.setattr(bits, "STEP_BYTES", 3)
    for c in servers:
        c.call("FLUSHALL")
        for key, runs in ((b"a", value), (b"b", other)):
            if runs:
                c.call("SET", key, _string(runs))
    _check(servers, "BITCOUNT", "a")
    _check(servers, "BITCOUNT", "a", start, end, *unit)
    _check(servers, "BITPOS", "a", bit)
    _check(servers, "BITPOS", "a", bit, start)
    _check(servers, "BITPOS", "a", bit, start, end, *unit)
    sources = [b"a"] if op == b"NOT" else [b"a", b"b", b"missing"]
    _check(servers, "BITOP", op, "d", *sources)
    _check(servers, "GET", "d")
    _check(servers, "BITOP", op, "a", *sources)  # the destination is a source
    _check(servers, "GET", "a")


def test_multi_megabyte_strings_match_redis(servers: tuple[RawClient, RawClient]) -> None:
    size = 5 * bits.STEP_BYTES + 123
    sparse = bytearray(size)
    sparse[3 * bits.STEP_BYTES + 17] = 0x10
    sparse[-1] = 0x01
    dense = bytearray(b"\xff" * size)
    dense[4 * bits.STEP_BYTES + 5] = 0xFB
    for c in servers:
        c.call("FLUSHALL")
        c.call("SET", "sparse", bytes(sparse))
        c.call("SET", "dense", bytes(dense))
        c.call("SET", "short", b"\x0f" * 1000)
    for key in ("sparse", "dense"):
        _check(servers, "BITCOUNT", key)
        _check(servers, "BITCOUNT", key, "7", "-9")
        _check(servers, "BITCOUNT", key, "12345", "-77777", "BIT")
        for bit in ("0", "1"):
            _check(servers, "BITPOS", key, bit)
            _check(servers, "BITPOS", key, bit, "1000")
            _check(servers, "BITPOS", key, bit, "8000", "-8", "BIT")
            _check(servers, "BITPOS", key, bit, "-2", "-1")
    for op in ("AND", "OR", "XOR"):
        _check(servers, "BITOP", op, "d", "sparse", "dense", "short")
        _check(servers, "GET", "d")
    _check(servers, "BITOP", "NOT", "d", "dense")
    _check(servers, "GET", "d")


def test_a_source_changed_between_steps_gives_the_result_of_one_instant(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bits, "STEP_BYTES", 2)
    ks = Keyspace()
    ks.set_string(b"a", b"\x0f" * 8)
    ks.set_string(b"b", b"\xf0" * 8)
    work = bits.bitop(ks, "OR", b"d", [b"a", b"b"])
    next(work)  # the first piece, the sources as they were
    assert ks.string(b"d") is None  # stored only at the end
    ks.set_string(b"b", b"\x01" * 4)
    assert bits.run_at_once(work) == 8
    # a OR b as b is now; a OR b as it was would be all ones.
    assert ks.string(b"d") == b"\x0f" * 8


def test_an_unchanged_source_is_not_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # The destination's change between steps is not a source's: the result stands.
    monkeypatch.setattr(bits, "STEP_BYTES", 2)
    ks = Keyspace()
    ks.set_string(b"a", b"\x0f" * 8)
    work = bits.bitop(ks, "NOT", b"d", [b"a"])
    next(work)
    ks.set_string(b"d", b"meanwhile")
    hits = ks.hits
    assert bits.run_at_once(work) == 8
    assert ks.string(b"d") == b"\xf0" * 8
    assert ks.hits == hits + 1  # the GET above: the source was not looked up again


# --- another client during a long bit operation ------------------------------------


# Long enough on any machine (a fast core counts 256 MB in tens of ms) that a probe
# answered only between commands would be seen waiting for most of it.
_BIG = 256 * 1024 * 1024


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server holding a 256 MB string whose only set bit is its last."""
    with running_server(tmp_path_factory.mktemp("bigbits"), "--no-wal", "--no-binary-lane") as s:
        with s.client(socket_timeout=120) as r:
            r.set("bits", bytes(_BIG - 1) + b"\x01")
        yield s


def _ping(sock: socket.socket) -> None:
    sock.sendall(encode_command("PING"))
    got = b""
    while not got.endswith(b"\r\n"):
        chunk = sock.recv(64)
        assert chunk, "server closed the probe"
        got += chunk
    assert got == b"+PONG\r\n"


@pytest.mark.parametrize(
    ("command", "reply"),
    [
        (("BITPOS", "bits", "1"), b":%d\r\n" % (_BIG * 8 - 1)),
        (("BITCOUNT", "bits"), b":1\r\n"),
        (("BITOP", "NOT", "notbits", "bits"), b":%d\r\n" % _BIG),
    ],
)
def test_another_client_is_answered_during_a_long_bit_operation(
    srv: ServerProcess, command: tuple[str, ...], reply: bytes
) -> None:
    done = threading.Event()
    answered_during: list[int] = []
    waits: list[float] = []

    def probe() -> None:
        with srv.connect(timeout=60) as p:
            while not done.is_set():
                t0 = time.monotonic()
                _ping(p)
                waits.append(time.monotonic() - t0)

    with srv.connect(timeout=60) as long:
        t = threading.Thread(target=probe, daemon=True)
        t.start()
        while not waits:  # the probe is connected and answered
            time.sleep(0.001)
        before = len(waits)
        start = time.monotonic()
        long.sendall(encode_command(*command))
        got = long.recv(64)
        while not got.endswith(b"\r\n"):
            got += long.recv(64)
        took = time.monotonic() - start
        answered_during.append(len(waits) - before)
        done.set()
        t.join(timeout=30)
    assert got == reply, got
    # In steps, the probe's PINGs were answered while the command ran, none of them
    # waiting for the whole of it; done at once, at most one would have been.
    assert answered_during[0] >= 5, (answered_during, took)
    assert max(waits) < took / 2, (max(waits), took)
