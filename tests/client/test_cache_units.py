"""Units of the client without our server: error mapping by code, reply parsers, the
``-COLDMISS`` retry (the attention tier does not exist in our server yet, so its plan
is driven with scripted replies), and worker redirects over real TCP (our server is
single-worker, so a scripted listener answers the redirect and a real server plays the
owning worker on its affinity port)."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import hiredis
import numpy as np
import pytest
import redis
from redis._parsers.base import BaseParser

from pion.client import (
    AsyncPionPromptCache,
    PionColdMiss,
    PionConnectionError,
    PionLoading,
    PionMisconf,
    PionNoAuth,
    PionOOM,
    PionPromptCache,
    PionProtocolError,
    PionResponseError,
    PionWrongPass,
    PionWrongWorker,
    plans,
    wire,
)
from pion.client.errors import error_from_redis, response_error
from pion.server.run import ServerThread

# -- error mapping -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "cls", "code"),
    [
        ("NOAUTH Authentication required.", PionNoAuth, "NOAUTH"),
        ("WRONGPASS invalid username-password pair", PionWrongPass, "WRONGPASS"),
        ("LOADING Pion is loading the dataset in memory", PionLoading, "LOADING"),
        ("MISCONF Errors writing to the WAL", PionMisconf, "MISCONF"),
        ("COLDMISS session evicted to cold tier (call KV.PREFIX.WARM)", PionColdMiss, "COLDMISS"),
        ("ERR unknown command 'X'", PionResponseError, "ERR"),
        ("session not found", PionResponseError, "ERR"),  # no code word: generic
        # The text decides nothing except for the documented redirect under ERR.
        ("COLDMISS session lives on worker 2", PionColdMiss, "COLDMISS"),
        ("OOM command not allowed: session lives on worker 1", PionOOM, "OOM"),
    ],
)
def test_error_replies_map_by_code(line: str, cls: type[Exception], code: str) -> None:
    # BaseParser.parse_error is what redis-py (hiredis or not) builds from `-<line>`.
    err = error_from_redis(BaseParser.parse_error(line))
    assert type(err) is cls
    assert isinstance(err, PionResponseError) and err.code == code


@pytest.mark.parametrize(
    ("line", "worker"),
    [
        ("ERR session lives on worker 3 (this is worker 0); reconnect for V.FETCH", 3),
        ("ERR KV.PREFIX.BLOCKS session lives on worker 12", 12),
    ],
)
def test_worker_redirect_is_parsed(line: str, worker: int) -> None:
    err = error_from_redis(BaseParser.parse_error(line))
    assert isinstance(err, PionWrongWorker) and err.worker == worker


def test_connection_failures_are_connection_errors() -> None:
    err = error_from_redis(redis.ConnectionError("Connection refused"))
    assert isinstance(err, PionConnectionError) and isinstance(err, ConnectionError)
    with (
        PionPromptCache("127.0.0.1", _free_port(), timeout=2) as pc,
        pytest.raises(PionConnectionError),
    ):
        pc.info()


# -- parsers -------------------------------------------------------------------------


def test_as_rows_layouts_and_dtypes() -> None:
    a = np.arange(2 * 3 * 4, dtype=np.float64).reshape(2, 3, 4)  # [H, N, D]
    rows = wire.as_rows(a, "k")
    assert rows.dtype == np.dtype("<f4") and rows.shape == (3, 8)
    np.testing.assert_array_equal(rows[1], np.concatenate([a[0, 1], a[1, 1]]))
    assert wire.as_rows(np.zeros((3, 8), np.float16), "k").dtype == np.float16
    with pytest.raises(ValueError):
        wire.as_rows(np.zeros((0, 8), np.float32), "k")


def test_decode_rows_reads_width_from_length() -> None:
    fp32 = np.arange(6, dtype="<f4")
    np.testing.assert_array_equal(wire.decode_rows(fp32.tobytes(), 2, 3, "x"), fp32.reshape(2, 3))
    half = wire.decode_rows(fp32.astype("<f2").tobytes(), 2, 3, "x")
    assert half.dtype == np.float32 and half[1, 2] == 5
    assert not wire.decode_rows(None, 2, 3, "x").any()
    with pytest.raises(PionProtocolError, match="neither fp32"):
        wire.decode_rows(b"12345", 2, 3, "x")


def test_small_parsers() -> None:
    assert wire.parse_warm(b"32") == (32, 0)
    assert wire.parse_warm(b"30 skipped_dim=2") == (30, 2)
    bits = wire.parse_membership(bytes([0b00000101, 0b1]), 9)
    assert bits is not None and bits.tolist() == [True, False, True] + [False] * 5 + [True]
    assert wire.parse_membership(b"UNKNOWN", 3) is None
    stats = wire.parse_stats({b"kvprefix_hits": 3, b"prefill_seconds_avoided": b"1.250"})
    assert stats == {"kvprefix_hits": 3, "prefill_seconds_avoided": 1.25}
    layout = wire.parse_session_layout(
        b"session_idx:1\r\nvalue_dim:0\r\nv_format:fp16\r\nnum_layers:2\r\n"
        b"schema:heterogeneous\r\nlayer_0_tokens:5\r\nlayer_0_dim:64\r\nlayer_0_fmt:fp16\r\n"
        b"layer_1_dim:32\r\nlayer_1_fmt:int8\r\ntotal_tokens:5\r\n"
    )
    assert (layout.dim(1), layout.fmt(1), layout.num_layers, layout.max_tokens) == (
        32,
        "int8",
        1,
        5,
    )


# -- COLDMISS retry (a unit: driven with scripted replies) ---------------------------

COLD = PionColdMiss("COLDMISS", "session evicted to cold tier (call KV.PREFIX.WARM)")


def _drive(plan: plans.Plan[Any], script: list[object]) -> tuple[Any, list[list[wire.Command]]]:
    """Run a plan answering each command of each batch from ``script`` in order."""
    sent: list[list[wire.Command]] = []
    replies = iter(script)
    try:
        batch = next(plan)
        while True:
            sent.append(batch)
            batch = plan.send([next(replies) for _ in batch])
    except StopIteration as done:
        return done.value, sent


def test_coldmiss_warms_and_retries_once() -> None:
    q = np.ones((2, 8), np.float32)
    rehydrated: list[int] = []
    answer = np.arange(16, dtype="<f4")
    plan = plans.attend_query(
        "ns", 3, q, top_k=1024, fa_window=None, on_rehydrate=lambda: rehydrated.append(1)
    )
    (out, lse), sent = _drive(plan, [COLD, b"4", answer.tobytes()])
    assert [b[0][0] for b in sent] == [
        "ATTEND.PREFIX.QUERY",
        "KV.PREFIX.WARM",
        "ATTEND.PREFIX.QUERY",
    ]
    assert sent[1][0] == ("KV.PREFIX.WARM", "ns", 2, 8, "ns_attn")
    assert sent[0] == sent[2] and sent[0][0][1:4] == ("ns_attn", 3, 2)
    assert rehydrated == [1] and lse is None
    np.testing.assert_array_equal(out, answer.reshape(2, 8))


@pytest.mark.parametrize("warm_reply", [b"0", PionResponseError("ERR", "not registered")])
def test_coldmiss_without_a_useful_warm_raises(warm_reply: object) -> None:
    plan = plans.attend_query(
        "ns", 0, np.ones((2, 8)), top_k=1, fa_window=None, on_rehydrate=lambda: None
    )
    with pytest.raises(PionColdMiss) as err:
        _drive(plan, [COLD, warm_reply])
    if isinstance(warm_reply, Exception):
        assert err.value.__cause__ is warm_reply


def test_second_coldmiss_is_raised_not_retried_again() -> None:
    plan = plans.attend_query(
        "ns", 0, np.ones((2, 8)), top_k=1, fa_window=5, on_rehydrate=lambda: None
    )
    with pytest.raises(PionColdMiss):
        _drive(plan, [COLD, b"2", COLD])


def test_batched_query_returns_lse() -> None:
    h, m, d = 2, 3, 4
    body = np.arange(h * m * d + h * m, dtype="<f4")
    plan = plans.attend_query(
        "ns", 0, np.ones((h, m, d)), top_k=1, fa_window=-1, on_rehydrate=lambda: None
    )
    (out, lse), sent = _drive(plan, [body.tobytes()])
    assert sent[0][0][-1] == -1 and out.shape == (h, m, d) and lse is not None
    np.testing.assert_array_equal(lse, body[h * m * d :].reshape(h, m))


class _ScriptedSync(PionPromptCache):
    """PionPromptCache whose connection is replaced by a script (unit only)."""

    def __init__(self, script: list[object]) -> None:
        super().__init__()
        self.script = iter(script)

    def _execute(self, conn: Any, batch: list[wire.Command]) -> list[object]:
        return [next(self.script) for _ in batch]


class _ScriptedAsync(AsyncPionPromptCache):
    def __init__(self, script: list[object]) -> None:
        super().__init__()
        self.script = iter(script)

    async def _execute(self, conn: Any, batch: list[wire.Command]) -> list[object]:
        return [next(self.script) for _ in batch]


def test_clients_count_cold_rehydrates() -> None:
    out = np.zeros(8, "<f4").tobytes()
    pc = _ScriptedSync([COLD, b"1", out, out])
    pc.attend_query("ns", 0, np.ones((1, 8)))
    pc.attend_query("ns", 0, np.ones((1, 8)))
    assert pc.cold_rehydrates_observed == 1
    apc = _ScriptedAsync([COLD, b"1", out])
    asyncio.run(apc.attend_query("ns", 0, np.ones((1, 8))))
    assert apc.cold_rehydrates_observed == 1


# -- worker redirects over TCP -------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Redirector:
    """Answers every command with Pion's redirect to worker 1 (it plays a worker that
    does not own the namespace)."""

    LINE = b"-ERR session lives on worker 1 (this is worker 0); reconnect for V.FETCH\r\n"

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self.commands = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        reader = hiredis.Reader()
        with conn:
            while data := conn.recv(1 << 16):
                reader.feed(data)
                while reader.gets() is not False:
                    self.commands += 1
                    conn.sendall(self.LINE)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def redirected(
    server_factory: Callable[..., ServerThread],
) -> Iterator[tuple[Redirector, ServerThread]]:
    """A redirector on port P and a real server on worker 1's affinity port P + 3."""
    for _ in range(20):
        front = Redirector()
        try:
            owner = server_factory(port=front.port + 3)
        except OSError:
            front.close()
            continue
        yield front, owner
        front.close()
        return
    pytest.skip("no free port pair for the affinity layout")


def test_redirect_is_followed_to_the_affinity_port(
    redirected: tuple[Redirector, ServerThread],
) -> None:
    front, owner = redirected
    with PionPromptCache("127.0.0.1", front.port) as pc:
        ns = pc.make_namespace("moved")
        pc.register(ns, 16, "fp16")
        keys = [np.ones((4, 16), np.float32)]
        assert pc.store(ns, keys, keys) == 4
        got, _ = pc.fetch(ns)
        np.testing.assert_array_equal(got[0], keys[0])
        assert pc.redirects_followed == 3
    # Each call's first batch was redirected (REGISTER; 2 STOREBATCH; 2 V.INFO), then
    # ran whole on the owner.
    assert front.commands == 5
    with PionPromptCache(owner.host, owner.port) as direct:
        assert direct.lookup(ns) is True
    with PionPromptCache("127.0.0.1", front.port, follow_redirects=False) as pc:
        with pytest.raises(PionWrongWorker) as err:
            pc.lookup("x")
        assert err.value.worker == 1


def test_async_redirect_is_followed(redirected: tuple[Redirector, ServerThread]) -> None:
    front, _ = redirected

    async def scenario() -> None:
        async with AsyncPionPromptCache("127.0.0.1", front.port) as apc:
            await apc.register("ns-async", 8, "int8")
            assert await apc.lookup("ns-async") is True
            assert apc.redirects_followed == 2

    asyncio.run(scenario())


def test_async_redirect_matches_the_sync_client(
    redirected: tuple[Redirector, ServerThread],
) -> None:
    """The sync scenario above, awaited: the redirect rule is the shared base's, so
    the round trips and counts are the same."""
    front, owner = redirected

    async def scenario() -> str:
        async with AsyncPionPromptCache("127.0.0.1", front.port) as apc:
            ns = apc.make_namespace("moved-async")
            await apc.register(ns, 16, "fp16")
            keys = [np.ones((4, 16), np.float32)]
            assert await apc.store(ns, keys, keys) == 4
            got, _ = await apc.fetch(ns)
            np.testing.assert_array_equal(got[0], keys[0])
            assert apc.redirects_followed == 3
            assert sorted(apc._connections) == [front.port, front.port + 3]
        async with AsyncPionPromptCache("127.0.0.1", front.port, follow_redirects=False) as apc:
            with pytest.raises(PionWrongWorker) as err:
                await apc.lookup("x")
            assert err.value.worker == 1 and apc.redirects_followed == 0
        return ns

    ns = asyncio.run(scenario())
    assert front.commands == 5 + 1
    with PionPromptCache(owner.host, owner.port) as direct:
        assert direct.lookup(ns) is True


def test_a_second_redirect_is_raised() -> None:
    moved = response_error("ERR", "session lives on worker 1 (this is worker 0)")
    pc = _ScriptedSync([moved, moved])
    with pytest.raises(PionWrongWorker):
        pc.info()
    assert pc.redirects_followed == 1
