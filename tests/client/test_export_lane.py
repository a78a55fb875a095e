"""PionPromptCache.fetch through the export lane: the same arrays as over TCP, used
only where it gives them exactly, and the fallbacks (refusal, an older server, a file
this process cannot read) that turn it off."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import pytest
import redis

from pion.client import AsyncPionPromptCache, PionPromptCache, plans
from pion.client.errors import PionProtocolError, PionResponseError
from pion.client.export import ExportLane, read_export
from pion.commands import COMMAND_TABLE
from pion.export.format import FormatError, build_header
from pion.server.run import ServerThread
from support import non_loopback_address

RNG = np.random.default_rng(11)
L, H, N, D = 4, 2, 33, 16


def _kv(n: int = N, layers: int = L, dtype: Any = np.float32) -> tuple[list[Any], list[Any]]:
    keys = [RNG.standard_normal((H, n, D)).astype(dtype) for _ in range(layers)]
    values = [RNG.standard_normal((H, n, D)).astype(dtype) for _ in range(layers)]
    return keys, values


@pytest.fixture
def pair(server: ServerThread) -> Iterator[tuple[PionPromptCache, PionPromptCache]]:
    """A client on the lane (the default for 127.0.0.1) and one that never uses it."""
    lane, tcp = (
        PionPromptCache(server.host, server.port),
        PionPromptCache(server.host, server.port, export=False),
    )
    yield lane, tcp
    lane.close()
    tcp.close()


def _same(a: tuple[list[Any], list[Any]], b: tuple[list[Any], list[Any]]) -> None:
    assert len(a[0]) == len(b[0]) and len(a[1]) == len(b[1])
    for x, y in zip([*a[0], *a[1]], [*b[0], *b[1]], strict=True):
        assert x.dtype == np.float32 and x.shape == y.shape
        np.testing.assert_array_equal(x, y)


def test_fp16_prefix_comes_through_the_file(
    pair: tuple[PionPromptCache, PionPromptCache], server: ServerThread
) -> None:
    lane, tcp = pair
    assert lane.export_lane.enabled and not tcp.export_lane.enabled
    ns = lane.make_namespace("fp16")
    lane.register(ns, H * D)  # fp16, the client's default
    lane.store(ns, *_kv())
    for n_tokens in (None, N, N + 5, 7):
        _same(lane.fetch(ns, n_tokens), tcp.fetch(ns, n_tokens))
    assert lane.export_lane.used == 4 and lane.export_lane.fallbacks == 0
    exports = server.state.exports
    assert exports is not None and exports.files == 3 and exports.reused == 1
    # A write makes the file stale: the next fetch sees the new rows.
    keys, values = _kv()
    lane.store(ns, keys, values)
    _, got_v = lane.fetch(ns)
    np.testing.assert_array_equal(
        got_v[3],
        values[3].transpose(1, 0, 2).reshape(N, H * D).astype(np.float16).astype(np.float32),
    )
    assert lane.export_lane.used == 5


def test_formats_the_file_cannot_give_exactly_go_by_tcp(
    pair: tuple[PionPromptCache, PionPromptCache],
) -> None:
    lane, tcp = pair
    ns = lane.make_namespace("int8")
    lane.register(ns, H * D, "int8")
    lane.store(ns, *_kv())
    _same(lane.fetch(ns), tcp.fetch(ns))
    assert lane.export_lane.used == 0 and ns in lane.export_lane.unsuitable
    _same(lane.fetch(ns, N), tcp.fetch(ns, N))  # remembered: no V.INFO round trip first
    assert lane.export_lane.enabled and lane.export_lane.fallbacks == 0

    mixed = lane.make_namespace("mixed")
    redis_client = redis.Redis(port=lane.port)
    redis_client.execute_command("V.CREATE", f"{mixed}_pk", H * D, "VQUANT", "fp16")
    redis_client.execute_command("V.CREATE", f"{mixed}_pv", H * D, "VQUANT", "fp8")
    lane.store(mixed, *_kv())
    _same(lane.fetch(mixed), tcp.fetch(mixed))
    assert mixed in lane.export_lane.unsuitable and lane.export_lane.used == 0


def test_missing_rows_and_picked_layers_go_by_tcp(
    pair: tuple[PionPromptCache, PionPromptCache],
) -> None:
    lane, tcp = pair
    ns = lane.make_namespace("ragged")
    lane.register(ns, H * D)
    keys, values = _kv()
    lane.store(ns, keys[:2], values[:2])
    raw = redis.Redis(port=lane.port)
    for i in (2, 3):  # keys hold 4 layers, values 2
        rows = keys[i].transpose(1, 0, 2).reshape(N, H * D)
        raw.execute_command("V.STOREBATCH", f"{ns}_pk", i, 0, N, rows.tobytes())
    _same(lane.fetch(ns), tcp.fetch(ns))  # layers 2, 3 of values read as zeros
    assert lane.export_lane.used == 0 and ns not in lane.export_lane.unsuitable
    lane.store(ns, keys, values)  # now complete: the lane serves it
    _same(lane.fetch(ns, layers=[3, 1]), tcp.fetch(ns, layers=[3, 1]))
    assert lane.export_lane.used == 0
    _same(lane.fetch(ns), tcp.fetch(ns))
    assert lane.export_lane.used == 1


def test_refusals_turn_the_lane_off(server_factory: Callable[..., ServerThread]) -> None:
    keys, values = _kv()

    def check(srv: ServerThread, host: str, reason: str) -> None:
        with (
            PionPromptCache(host, srv.port, export=True) as pc,
            PionPromptCache(host, srv.port, export=False) as tcp,
        ):
            ns = pc.make_namespace("refused")
            pc.register(ns, H * D)
            pc.store(ns, keys, values)
            _same(pc.fetch(ns), tcp.fetch(ns))
            assert not pc.export_lane.enabled and reason in pc.export_lane.reason
            assert pc.export_lane.fallbacks == 1 and pc.export_lane.used == 0
            _same(pc.fetch(ns), tcp.fetch(ns))  # no further attempt
            assert pc.export_lane.fallbacks == 1

    check(server_factory(export_enabled=False), "127.0.0.1", "disabled")
    check(server_factory(bind="0.0.0.0", unsafe_no_auth=True), non_loopback_address(), "non-local")
    older = {k: v for k, v in COMMAND_TABLE.items() if k != "V.EXPORT"}
    srv = server_factory()
    srv.stop()  # its config (a fresh data directory) serves a server without V.EXPORT
    old_server = ServerThread(srv.config, table=MappingProxyType(older)).start()
    try:
        check(old_server, "127.0.0.1", "unknown command")
    finally:
        old_server.stop()


def test_default_follows_the_host() -> None:
    for host, on in (("127.0.0.1", True), ("localhost", True), ("::1", True), ("10.1.2.3", False)):
        pc = PionPromptCache(host, 1)  # redis-py connects lazily: nothing is sent
        assert pc.export_lane.enabled is on
        pc.close()
    assert not PionPromptCache("127.0.0.1", 1, export=False).export_lane.enabled
    assert PionPromptCache("10.1.2.3", 1, export=True).export_lane.enabled


def test_async_client_uses_the_lane_too(server: ServerThread) -> None:
    async def main() -> None:
        async with AsyncPionPromptCache(server.host, server.port) as apc:
            ns = apc.make_namespace("async")
            await apc.register(ns, H * D)
            keys, values = _kv()
            await apc.store(ns, keys, values)
            k, _ = await apc.fetch(ns)
            assert apc.export_lane.used == 1
            np.testing.assert_array_equal(
                k[1],
                keys[1].transpose(1, 0, 2).reshape(N, H * D).astype(np.float16).astype(np.float32),
            )

    asyncio.run(main())


# -- the plan's fallbacks, driven without a socket -------------------------------------

_INFO = (
    b"session_idx:0\r\nvalue_dim:4\r\nv_format:fp16\r\nnum_layers:1\r\n"
    b"schema:uniform\r\nlayer_0_tokens:2\r\ntotal_tokens:2\r\n"
)


def _drive(plan: Any, export_replies: list[object]) -> Any:
    """Run a fetch plan: V.INFO answers _INFO, each V.EXPORT the next reply given, the
    TCP fallback's V.FETCH BATCH answers one fp16 layer of ones."""
    replies: list[object] | None = None
    while True:
        try:
            batch = next(plan) if replies is None else plan.send(replies)
        except StopIteration as done:
            return done.value
        replies = []
        for command in batch:
            if command[0] == "V.INFO":
                replies.append(_INFO)
            elif command[0] == "V.EXPORT":
                assert command[3:] == (0, 2, 1, 1, 4)  # start, end, layers, 1 head of kv_dim
                replies.append(export_replies.pop(0))
            else:
                replies.append([np.ones(8, "<f2").tobytes()])


def _file(tmp_path: Path, value: float) -> bytes:
    head, _ = build_header([("k.0", "F16", (1, 1, 2, 4)), ("v.0", "F16", (1, 1, 2, 4))])
    path = tmp_path / f"f{value}.safetensors"
    path.write_bytes(head + np.full(16, value, "<f2").tobytes())
    return os.fsencode(path)


def test_a_vanished_file_is_asked_for_again(tmp_path: Path) -> None:
    lane = ExportLane(True)
    gone = os.fsencode(tmp_path / "gone.safetensors")
    k, _ = _drive(plans.fetch("ns", None, None, lane), [gone, _file(tmp_path, 3.0)])
    assert k[0].tolist() == [[3.0] * 4] * 2 and lane.used == 1 and lane.enabled
    k, _ = _drive(plans.fetch("ns", None, None, lane), [gone, gone])
    assert k[0].tolist() == [[1.0] * 4] * 2  # fell back to TCP
    assert not lane.enabled and "not visible" in lane.reason and lane.fallbacks == 1


@pytest.mark.parametrize("what", ["directory", "garbage", "wrong shape"])
def test_an_unreadable_file_turns_the_lane_off(tmp_path: Path, what: str) -> None:
    if what == "directory":
        path = os.fsencode(tmp_path)
    elif what == "garbage":
        (tmp_path / "g").write_bytes(b"\x10" + b"\0" * 7 + b"{not json}")
        path = os.fsencode(tmp_path / "g")
    else:
        head, _ = build_header([("k.0", "F16", (1, 2, 1, 4)), ("v.0", "F16", (1, 2, 1, 4))])
        (tmp_path / "w").write_bytes(head + b"\0" * 32)
        path = os.fsencode(tmp_path / "w")
    lane = ExportLane(True)
    k, _ = _drive(plans.fetch("ns", None, None, lane), [path])
    assert k[0].tolist() == [[1.0] * 4] * 2
    assert not lane.enabled and "cannot read the export file" in lane.reason


def test_other_errors_fall_back_for_that_call_only(tmp_path: Path) -> None:
    lane = ExportLane(True)
    full = PionResponseError("ERR", "V.EXPORT: the export directory's file system has 0 bytes free")
    k, _ = _drive(plans.fetch("ns", None, None, lane), [full])
    assert k[0].tolist() == [[1.0] * 4] * 2 and lane.enabled and lane.fallbacks == 1
    with pytest.raises(PionProtocolError, match="expected a bulk path"):
        _drive(plans.fetch("ns", None, None, lane), [42])


def test_read_export_checks_every_tensor(tmp_path: Path) -> None:
    path = os.fsdecode(_file(tmp_path, 2.0))
    k, v = read_export(path, 1, 2, 4)
    assert k[0].dtype == np.float32 and v[0].tolist() == [[2.0] * 4] * 2
    with pytest.raises(FormatError, match=r"k\.1 is None"):
        read_export(path, 2, 2, 4)
    with pytest.raises(FormatError, match=r"not F16 \[1, 1, 3, 4\]"):
        read_export(path, 1, 3, 4)
    (tmp_path / "tiny").write_bytes(b"\0" * 4)
    with pytest.raises(FormatError, match="no safetensors file"):
        read_export(str(tmp_path / "tiny"), 1, 2, 4)
    with pytest.raises(FileNotFoundError):
        read_export(str(tmp_path / "absent"), 1, 2, 4)
