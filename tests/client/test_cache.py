"""PionPromptCache against our server over real TCP: every method, round trips, error
mapping by RESP code, and a password-protected server."""

from __future__ import annotations

import asyncio
import hashlib
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import redis
import redis.connection
from pion_vllm_mlx.prompt_cache import PionPromptCache as PionsClient

from pion.client import (
    AsyncPionPromptCache,
    PionLoading,
    PionMisconf,
    PionNoAuth,
    PionOOM,
    PionPromptCache,
    PionResponseError,
    PionWrongPass,
)
from pion.client.hashing import block_hashes
from pion.server.run import ServerThread
from support import data_budget

RNG = np.random.default_rng(7)
FORMATS = ["fp16", "int8", "fp8", "mlx4g32", "turbo4", "turbo3", "turbo2"]


@pytest.fixture
def pc(server: ServerThread) -> Iterator[PionPromptCache]:
    cache = PionPromptCache(server.host, server.port)
    yield cache
    cache.close()


def _layers(n_layers: int, heads: int, n: int, dim: int, dtype: Any = np.float32) -> list[Any]:
    return [RNG.standard_normal((heads, n, dim)).astype(dtype) for _ in range(n_layers)]


def _rows(a: np.ndarray) -> np.ndarray:
    h, n, d = a.shape
    return a.transpose(1, 0, 2).reshape(n, h * d)


@contextmanager
def round_trips(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Count writes to the socket: redis-py sends a whole pipeline in one
    send_packed_command, so one call is one round trip."""
    calls = [0]
    original = redis.connection.AbstractConnection.send_packed_command

    def counting(self: Any, command: Any, check_health: bool = True) -> None:
        calls[0] += 1
        original(self, command, check_health)

    with monkeypatch.context() as m:
        m.setattr(redis.connection.AbstractConnection, "send_packed_command", counting)
        yield calls


def _commands_processed(server: ServerThread) -> int:
    return server.state.counters.total_commands_processed


# -- K/V -----------------------------------------------------------------------------


def test_make_namespace_matches_pion_client_byte_for_byte() -> None:
    for parts in [("a",), ("app", "v1", "llama-3", "fp16", "prompt"), ("", "ü|x", "é")]:
        assert PionPromptCache.make_namespace(*parts) == PionsClient.make_namespace(*parts)
    assert PionPromptCache.make_namespace("a", "b") == hashlib.sha256(b"a|b").hexdigest()[:32]


@pytest.mark.parametrize("vquant", FORMATS)
def test_store_fetch_roundtrip_every_format(pc: PionPromptCache, vquant: str) -> None:
    keys, values = _layers(3, 2, 40, 32), _layers(3, 2, 40, 32)
    ns = pc.make_namespace("roundtrip", vquant)
    pc.register(ns, 64, vquant)
    assert pc.store(ns, keys, values) == 40
    got_k, got_v = pc.fetch(ns)
    assert len(got_k) == len(got_v) == 3
    for given, got in zip(keys + values, got_k + got_v, strict=True):
        want = _rows(given)
        assert got.shape == (40, 64) and got.dtype == np.float32
        rel = float(np.mean((got - want) ** 2) / np.mean(want**2))
        assert rel < 0.2, (vquant, rel)  # codec bounds are the codec suite's business
        if vquant == "fp16":
            np.testing.assert_array_equal(got, want.astype(np.float16).astype(np.float32))


def test_fp16_arrays_travel_as_fp16_and_come_back_exact(
    pc: PionPromptCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = [RNG.standard_normal((24, 48)).astype(np.float16) for _ in range(2)]
    values = [RNG.standard_normal((3, 24, 16)).astype(np.float16) for _ in range(2)]
    ns = pc.make_namespace("fp16-wire")
    pc.register(ns, 48, "fp16")
    pc.info()  # connect first: the count below is of the store alone
    with round_trips(monkeypatch) as calls:
        pc.store(ns, keys, values)
    assert calls[0] == 2  # V.INFO (which layers are fp16), then the data
    got_k, got_v = pc.fetch(ns)
    np.testing.assert_array_equal(got_k[1], keys[1].astype(np.float32))
    np.testing.assert_array_equal(got_v[0], _rows(values[0]).astype(np.float32))


def test_bf16_and_fp64_inputs_are_sent_as_fp32(pc: PionPromptCache) -> None:
    k = RNG.standard_normal((8, 16)).astype(ml_dtypes.bfloat16)
    v = RNG.standard_normal((8, 16))
    ns = pc.make_namespace("bf16")
    pc.register(ns, 16, "fp16")
    pc.store(ns, [k], [v])
    got_k, got_v = pc.fetch(ns)
    np.testing.assert_array_equal(got_k[0], k.astype(np.float32))
    np.testing.assert_allclose(got_v[0], v, rtol=1e-3)


def test_fetch_n_tokens_layers_and_empty(pc: PionPromptCache) -> None:
    keys, values = _layers(4, 1, 30, 16), _layers(4, 1, 30, 16)
    ns = pc.make_namespace("partial")
    pc.register(ns, 16, "fp16")
    assert pc.fetch(ns) == ([], [])  # registered, nothing stored yet
    pc.store(ns, keys, values)
    k, v = pc.fetch(ns, n_tokens=10)
    assert len(k) == 4 and k[2].shape == (10, 16)
    np.testing.assert_allclose(k[2], _rows(keys[2])[:10], atol=1e-2)
    k, v = pc.fetch(ns, layers=[3, 1])
    assert len(k) == len(v) == 2
    np.testing.assert_allclose(v[0], _rows(values[3]), atol=1e-2)
    np.testing.assert_allclose(v[1], _rows(values[1]), atol=1e-2)
    k, _ = pc.fetch(ns, n_tokens=40)  # rows past what was stored read as zeros
    assert k[0].shape == (40, 16) and not k[0][30:].any()
    with pytest.raises(ValueError):
        pc.fetch(ns, n_tokens=0)


def test_store_validates_shapes_before_sending(pc: PionPromptCache) -> None:
    ns = pc.make_namespace("bad-shapes")
    with pytest.raises(ValueError, match="same number"):
        pc.store(ns, _layers(2, 1, 4, 8), _layers(1, 1, 4, 8))
    with pytest.raises(ValueError, match="same 4 tokens"):
        pc.store(ns, _layers(1, 1, 4, 8), _layers(1, 1, 5, 8))
    with pytest.raises(ValueError, match=r"\[H, N, D\]"):
        pc.store(ns, [np.zeros((1, 1, 4, 8))], [np.zeros((1, 1, 4, 8))])
    with pytest.raises(TypeError):
        pc.store(ns, [np.zeros((4, 8), dtype=np.int32)], [np.zeros((4, 8))])


def test_32_layer_store_and_fetch_are_a_handful_of_round_trips(
    pc: PionPromptCache, server: ServerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys, values = _layers(32, 2, 64, 16), _layers(32, 2, 64, 16)
    ns = pc.make_namespace("32-layers")
    pc.register(ns, 32, "int8")
    before = _commands_processed(server)
    with round_trips(monkeypatch) as calls:
        pc.store(ns, keys, values)
    assert calls[0] == 1  # 64 STOREBATCHes in one pipeline
    assert _commands_processed(server) - before == 64
    with round_trips(monkeypatch) as calls:
        k, v = pc.fetch(ns)
    assert calls[0] == 2  # V.INFO x2, then V.FETCH BATCH x2
    assert len(k) == len(v) == 32
    with round_trips(monkeypatch) as calls:
        k, v = pc.fetch(ns, n_tokens=64)
    assert calls[0] == 1  # layouts and data pipelined together
    np.testing.assert_allclose(v[31], _rows(values[31]), atol=0.05)
    with round_trips(monkeypatch) as calls:
        k, v = pc.fetch(ns, n_tokens=64, layers=[31, 0])
    assert calls[0] == 1 and len(k) == 2
    np.testing.assert_allclose(k[0], _rows(keys[31]), atol=0.05)


# -- registry ------------------------------------------------------------------------


def test_register_lookup_receipt_and_stats(pc: PionPromptCache) -> None:
    ns = pc.make_namespace("receipt")
    assert pc.lookup(ns) is False
    pc.register(ns, 16, prefill_ms=250.4)
    pc.store(ns, _layers(1, 1, 12, 16), _layers(1, 1, 12, 16))
    assert pc.lookup(ns) is True
    stats = pc.stats()
    assert stats["kvprefix_hits"] == 1 and stats["kvprefix_misses"] == 1
    assert stats["kvprefix_tokens_served"] == 12
    assert stats["kvprefix_prefill_us_measured"] == 250_000
    assert stats["prefill_seconds_avoided"] == pytest.approx(0.25)
    assert pc.lookup(ns, tokens=100, prefill_ms=40) is True
    assert pc.stats()["kvprefix_tokens_served"] == 112
    pc.reset_stats()
    assert pc.stats()["kvprefix_hits"] == 0
    info = pc.info()
    assert info["registered_prefixes"] == 1 and info["total_prefix_tokens"] == 12
    assert list(info)[:3] == ["registered_prefixes", "total_prefix_tokens", "vstore_sessions"]
    assert pc.owner(ns) == 0
    assert pc.drop(ns, "never-registered") == 1
    assert pc.lookup(ns) is False and pc.owner(ns) == -1


def test_blocks_and_membership(pc: PionPromptCache) -> None:
    tokens = np.arange(640, dtype=np.uint32)
    hashes = block_hashes(tokens, 64, "pion")
    ns = pc.make_namespace("blocks")
    pc.register(ns, 8, "int8", blocks=hashes, block_size=64)
    got = pc.blocks(ns)
    assert got is not None
    assert got[0] == 64
    np.testing.assert_array_equal(got[1], hashes)
    probe = np.concatenate([hashes[::2], np.array([1, 2, 3], dtype=np.uint64)])
    bits = pc.membership(ns, probe)
    assert bits is not None
    assert bits.tolist() == [True] * 5 + [False] * 3
    empty = pc.membership(ns, [])
    assert empty is not None and empty.size == 0
    unknown = pc.make_namespace("no-table")
    pc.register(unknown, 8, "int8")
    assert pc.blocks(unknown) is None
    assert pc.membership(unknown, hashes) is None
    # 56 probes: a 7-byte bitmap, the one size where +UNKNOWN and a bulk look alike.
    assert pc.membership(unknown, np.arange(56, dtype=np.uint64)) is None
    assert pc.membership(ns, np.arange(56, dtype=np.uint64)) is not None


def test_save_and_commit(server_factory: Callable[..., ServerThread], tmp_path: Path) -> None:
    """COMMIT answers once the log is synced; SAVE writes the snapshot (default and a
    named one); a server restarted on the directory holds the prefix bit for bit."""
    data = tmp_path / "durable"
    srv = server_factory(dir=data, appendfsync="no")
    keys, values = _layers(2, 1, 4, 8), _layers(2, 1, 4, 8)
    with PionPromptCache(srv.host, srv.port) as pc:
        ns = pc.make_namespace("durable")
        pc.register(ns, 8, "fp16")
        pc.store(ns, keys, values)
        pc.commit()
        assert (data / "pion.vstore.wal.0").stat().st_size > 0
        pc.save()
        assert (data / "pion.vstore.0").is_file()
        assert pc.info()["wal_bytes"] < 100  # the snapshot covers the log: reset
        pc.save("snapshots/one")
        assert (data / "snapshots" / "one").is_file()
        before = pc.fetch(ns)
    srv.stop()
    again = server_factory(dir=data)
    with PionPromptCache(again.host, again.port) as pc:
        assert pc.lookup(ns) is True
        after = pc.fetch(ns)
    for a, b in zip([*before[0], *before[1]], [*after[0], *after[1]], strict=True):
        np.testing.assert_array_equal(a, b)


def test_error_replies_map_by_code(pc: PionPromptCache) -> None:
    with pytest.raises(PionResponseError) as err:
        pc.register(pc.make_namespace("x"), 16, "q5_k")
    assert err.value.code == "ERR" and "unknown vquant 'q5_k'" in err.value.message
    with pytest.raises(PionResponseError, match="session not found"):
        pc.fetch("never-registered")
    with pytest.raises(PionResponseError, match="path must be relative"):
        pc.save("/etc/passwd")


def test_attention_errors_map_by_code(pc: PionPromptCache) -> None:
    """The attention tier's refusals reach the caller as typed errors, not hangs or
    parse failures (the tier itself is tested in tests/client/test_attend_cache.py)."""
    ns = pc.make_namespace("stage2")
    kv = RNG.standard_normal((2, 8, 32)).astype(np.float32)
    calls: list[tuple[Callable[[], object], str]] = [
        (lambda: pc.warm(ns, 2, 32), "namespace not registered"),
        (lambda: pc.attend_query(ns, 0, kv[:, 0, :]), "session not found"),
        (lambda: pc.attend_store(ns, 0, kv, kv * np.nan), "non-finite"),
    ]
    for call, message in calls:
        with pytest.raises(PionResponseError) as err:
            call()
        assert err.value.code == "ERR" and message in err.value.message
    assert pc.lookup(pc.make_namespace("absent"), stage2=True) is False
    assert pc.cold_rehydrates_observed == 0


def test_loading_misconf_and_oom_map_to_their_classes(
    server_factory: Callable[..., ServerThread], monkeypatch: pytest.MonkeyPatch
) -> None:
    server = server_factory()
    with redis.Redis(port=server.port) as r:
        data_budget(r, 4096)
    pc = PionPromptCache(server.host, server.port)
    ns = pc.make_namespace("oom")
    pc.register(ns, 64, "fp16")
    with pytest.raises(PionOOM) as err:
        pc.store(ns, _layers(1, 1, 100, 64), _layers(1, 1, 100, 64))
    assert err.value.code == "OOM"
    server.state.loading = True
    try:
        with pytest.raises(PionLoading):
            pc.lookup(ns)
    finally:
        server.state.loading = False

    class Refusing:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def write_refusal(self) -> str:
            return "Errors writing to the WAL: no space left on device"

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

    monkeypatch.setattr(server.state, "persistence", Refusing(server.state.persistence))
    with pytest.raises(PionMisconf, match="no space left"):
        pc.register(pc.make_namespace("refused"), 8, "int8")
    assert pc.lookup(ns) is True  # reads keep working
    pc.close()


def test_password_protected_server(server_factory: Callable[..., ServerThread]) -> None:
    server = server_factory(requirepass="s3cret")
    with PionPromptCache(server.host, server.port, password="s3cret") as pc:
        ns = pc.make_namespace("auth")
        pc.register(ns, 8, "int8")
        pc.store(ns, _layers(2, 1, 5, 8), _layers(2, 1, 5, 8))
        assert pc.lookup(ns) and len(pc.fetch(ns)[0]) == 2
    with PionPromptCache(server.host, server.port) as anonymous, pytest.raises(PionNoAuth):
        anonymous.lookup("x")
    with PionPromptCache(server.host, server.port, password="nope") as wrong:
        with pytest.raises(PionWrongPass) as err:
            wrong.info()
        assert err.value.code == "WRONGPASS"


def test_async_client_shares_the_wire(server: ServerThread) -> None:
    async def scenario() -> None:
        async with AsyncPionPromptCache(server.host, server.port) as apc:
            ns = apc.make_namespace("async")
            assert await apc.lookup(ns) is False
            await apc.register(ns, 32, "int8", prefill_ms=10)
            keys, values = _layers(3, 2, 20, 16), _layers(3, 2, 20, 16)
            assert await apc.store(ns, keys, values) == 20
            k, v = await apc.fetch(ns)
            np.testing.assert_allclose(v[2], _rows(values[2]), atol=0.05)
            k, _ = await apc.fetch(ns, 5, layers=[1])
            assert k[0].shape == (5, 32)
            assert await apc.lookup(ns) is True
            assert (await apc.stats())["kvprefix_hits"] == 1
            assert (await apc.info())["registered_prefixes"] == 1
            assert await apc.blocks(ns) is None and await apc.owner(ns) == 0
            with pytest.raises(PionResponseError, match="session not found"):
                await apc.attend_query(ns, 0, np.zeros((2, 16), np.float32))
            assert await apc.drop(ns) == 1

    asyncio.run(scenario())


def test_client_survives_a_server_restart(spawn_server: Callable[..., Any]) -> None:
    """A pooled connection the old server closed is replaced on the next call (no
    retry needed), and the WAL brings the namespace back."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # The client speaks RESP only: no binary lane, whose port + 1 another socket on a
    # busy machine may hold by the time the server restarts on ``port``.
    first = spawn_server("--port", str(port), "--no-binary-lane")
    with PionPromptCache("127.0.0.1", port) as pc:
        ns = pc.make_namespace("restart")
        pc.register(ns, 8, "int8")
        pc.store(ns, _layers(1, 1, 3, 8), _layers(1, 1, 3, 8))
        pc.commit()
        first.stop()
        spawn_server("--port", str(port), "--no-binary-lane")
        assert pc.lookup(ns) is True
        assert pc.fetch(ns)[0][0].shape == (3, 8)
