"""SlotStore against real stores (pion-server in-process, Debian's redis-server): chunked
push and pull, every kind of damage refused before a file appears, a down store, receipts."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from pion_testing.launcher import free_port

from pion.llama.manifest import CHUNK_BYTES, Manifest, chunk_key, manifest_key
from pion.llama.slotfile import SlotLayout
from pion.llama.store import (
    RETRY_AFTER_S,
    SlotStore,
    StoreConfig,
    StoreCorrupt,
    StoreError,
    receipt_namespace,
)
from support.workers import make_certs

from .conftest import store_url

FP = "ab" * 32
PREFIX = "pion:llama:"
LAYOUT = SlotLayout(1, 2, False, 0, 0, ("f16", "f16"), ("f16", "f16"), (64, 64), (64, 64))
FIELDS: dict[str, Any] = {
    "fingerprint": FP,
    "tokens": 1234,
    "prefill_ms": 812.4,
    "build": "b11434-test",
    "model": {"id": "tiny.gguf", "size": 10, "sample_sha256": "c" * 64},
    "n_ctx": 4096,
    "layout": LAYOUT,
}


@pytest.fixture(params=["pion-server", "redis-server"])
def url(request: pytest.FixtureRequest) -> str:
    if request.param == "pion-server":
        return store_url(request.getfixturevalue("pion_store"))
    value: str = request.getfixturevalue("redis_store")
    return value


@pytest.fixture
def store(url: str) -> Iterator[tuple[SlotStore, list[str]]]:
    lines: list[str] = []
    s = SlotStore(StoreConfig(url, ttl=3600), lines.append)
    yield s, lines
    s.close()


def pion_stats(r: redis.Redis) -> dict[bytes, Any]:
    reply = r.execute_command("PION.STATS")
    if isinstance(reply, dict):
        return reply
    return dict(zip(reply[::2], reply[1::2], strict=True))


def raw(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=10)


def slot_file(path: Path, size: int, seed: int = 0) -> bytes:
    data = (seed.to_bytes(4, "little") + os.urandom(61)) * (size // 65) + b"x" * (size % 65)
    path.write_bytes(data)
    return data


def test_push_then_pull_in_chunks(
    store: tuple[SlotStore, list[str]], url: str, tmp_path: Path
) -> None:
    s, _ = store
    src = tmp_path / "src.bin"
    data = slot_file(src, 2 * CHUNK_BYTES + 12345)
    manifest, pushed = s.push(src, FIELDS)
    assert pushed and manifest.chunks == 3 and manifest.size == len(data)
    r = raw(url)
    stored = Manifest.parse(r.get(manifest_key(PREFIX, FP)), FP)
    assert stored == manifest and stored.layout == LAYOUT and stored.tokens == 1234
    sizes = [len(r.get(chunk_key(PREFIX, FP, manifest.upload, i))) for i in range(3)]
    assert sizes == [CHUNK_BYTES, CHUNK_BYTES, 12345]
    assert 0 < r.ttl(manifest_key(PREFIX, FP)) <= 3600

    dest_dir = tmp_path / "slots"
    dest_dir.mkdir()
    dest = dest_dir / manifest.file
    got = s.manifest(FP)
    assert got == manifest
    s.pull(got, dest)
    assert dest.read_bytes() == data
    assert [p.name for p in dest_dir.iterdir()] == [manifest.file]  # no temporary left
    assert s.counts["pulls"] == 1 and s.counts["bytes_pulled"] == len(data)
    assert s.manifest("cd" * 32) is None


def test_existing_manifest_is_kept_unless_replaced(
    store: tuple[SlotStore, list[str]], url: str, tmp_path: Path
) -> None:
    s, _ = store
    first, second = tmp_path / "a.bin", tmp_path / "b.bin"
    slot_file(first, 1000, seed=1)
    slot_file(second, 2000, seed=2)
    mine, pushed = s.push(first, FIELDS)
    kept, pushed_again = s.push(second, FIELDS)
    assert pushed and not pushed_again and kept == mine
    replaced, pushed_third = s.push(second, FIELDS, replace=True)
    assert pushed_third and replaced.size == 2000 and replaced.upload != mine.upload
    r = raw(url)
    assert Manifest.parse(r.get(manifest_key(PREFIX, FP)), FP) == replaced
    # The superseded chunk stays readable for pulls under way, then expires.
    assert 0 < r.ttl(chunk_key(PREFIX, FP, mine.upload, 0)) <= 300


def _damage(r: redis.Redis, m: Manifest, how: str) -> None:
    key0 = chunk_key(PREFIX, FP, m.upload, 1)
    if how == "flipped byte":
        block = bytearray(r.get(key0))
        block[100] ^= 0x01
        r.set(key0, bytes(block))
    elif how == "truncated chunk":
        r.set(key0, r.get(key0)[:-1])
    elif how == "missing chunk":
        r.delete(key0)
    elif how == "truncated file":
        # A consistent manifest for a shorter file: the hash tells.
        doc = json.loads(r.get(manifest_key(PREFIX, FP)))
        doc["size"], doc["chunks"] = CHUNK_BYTES + 10, 2
        r.set(key0, r.get(key0)[:10])
        r.set(manifest_key(PREFIX, FP), json.dumps(doc))
    else:
        raise AssertionError(how)


@pytest.mark.parametrize(
    "how", ["flipped byte", "truncated chunk", "missing chunk", "truncated file"]
)
def test_damaged_file_never_appears(
    store: tuple[SlotStore, list[str]], url: str, tmp_path: Path, how: str
) -> None:
    s, _ = store
    src = tmp_path / "src.bin"
    slot_file(src, 2 * CHUNK_BYTES + 7)
    manifest, _ = s.push(src, FIELDS)
    _damage(raw(url), manifest, how)
    dest_dir = tmp_path / "slots"
    dest_dir.mkdir()
    got = s.manifest(FP)
    assert got is not None
    with pytest.raises(StoreCorrupt):
        s.pull(got, dest_dir / got.file)
    assert list(dest_dir.iterdir()) == []  # neither the file nor a temporary
    assert s.counts["refused"] == 1 and s.usable()


@pytest.mark.parametrize(
    "manifest",
    [
        b"not json",
        b"[]",
        b'{"version": 2}',
        b'{"version": 1}',
        b"x" * 300_000,
    ],
)
def test_bad_manifest_is_refused(
    store: tuple[SlotStore, list[str]], url: str, manifest: bytes
) -> None:
    s, _ = store
    raw(url).set(manifest_key(PREFIX, FP), manifest)
    with pytest.raises(StoreCorrupt):
        s.manifest(FP)


def test_manifest_of_another_fingerprint_is_refused(
    store: tuple[SlotStore, list[str]], url: str, tmp_path: Path
) -> None:
    s, _ = store
    src = tmp_path / "src.bin"
    slot_file(src, 100)
    s.push(src, FIELDS)
    r = raw(url)
    other = "cd" * 32
    r.set(manifest_key(PREFIX, other), r.get(manifest_key(PREFIX, FP)))
    with pytest.raises(StoreCorrupt, match="is for abababab"):
        s.manifest(other)


def test_down_store_fails_fast_then_is_skipped(tmp_path: Path) -> None:
    lines: list[str] = []
    s = SlotStore(StoreConfig(f"redis://127.0.0.1:{free_port()}", timeout=1.0), lines.append)
    t = time.monotonic()
    with pytest.raises(StoreError, match="ConnectionError"):
        s.manifest(FP)
    assert time.monotonic() - t < 5
    assert not s.usable() and s.counts["errors"] == 1
    # Within RETRY_AFTER_S nothing touches the network.
    with pytest.raises(StoreError, match="marked down"):
        s.manifest(FP)
    src = tmp_path / "f.bin"
    slot_file(src, 100)
    with pytest.raises(StoreError):
        s.push(src, FIELDS)
    assert s.counts["skipped_down"] == 2
    assert sum("store skipped for" in line for line in lines) == 1
    assert RETRY_AFTER_S >= 5


def test_blackholed_store_times_out(tmp_path: Path) -> None:
    """A listener that accepts and never answers: the operation timeout bounds the wait."""
    import socket

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        s = SlotStore(StoreConfig(f"redis://127.0.0.1:{port}", timeout=0.5), lambda _m: None)
        t = time.monotonic()
        with pytest.raises(StoreError, match="Timeout"):
            s.manifest(FP)
        assert time.monotonic() - t < 5 and not s.usable()


def test_bad_url_is_a_store_error() -> None:
    with pytest.raises(StoreError, match="bad store URL"):
        SlotStore(StoreConfig("http://example"), lambda _m: None)


def test_receipt_on_pion_server(pion_store: Any) -> None:
    lines: list[str] = []
    s = SlotStore(StoreConfig(store_url(pion_store)), lines.append)
    r = raw(store_url(pion_store))
    # Never registered: counted as a miss and registered for the next one.
    assert s.report(FP, 1000, 1500.4) is False
    assert s.report(FP, 1000, 1500.4) is True
    s.register("cd" * 32, 0.2)  # sub-millisecond measurements are still measurements
    assert s.report("cd" * 32, 10, 0.2) is True
    stats = pion_stats(r)
    assert stats[b"kvprefix_hits"] == 2 and stats[b"kvprefix_misses"] == 1
    assert stats[b"kvprefix_hits_measured"] == 2
    assert stats[b"kvprefix_tokens_served"] == 1010
    assert stats[b"kvprefix_prefill_us_measured"] == 1_500_000 + 1_000
    assert r.execute_command("KV.PREFIX.LOOKUP", receipt_namespace(FP)) == b"HIT"
    assert s.counts["receipts"] == 2 and s.counts["receipt_misses"] == 1


def test_receipts_are_off_on_a_plain_redis(redis_store: str) -> None:
    lines: list[str] = []
    s = SlotStore(StoreConfig(redis_store), lines.append)
    assert s.report(FP, 100, 10.0) is None
    s.register(FP, 10.0)
    assert s.report(FP, 100, 10.0) is None
    assert lines == ["STORE is not a pion-server (no KV.PREFIX.*): receipts off"]
    assert s.usable()


def test_a_file_rewritten_during_upload_is_not_published(
    store: tuple[SlotStore, list[str]], url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """llama-server saving the same name while it is pushed: no manifest points at the mix."""
    s, _ = store
    src = tmp_path / "src.bin"
    slot_file(src, 2 * CHUNK_BYTES + 5)
    real_set = s._redis.set
    calls = 0

    def set_and_rewrite(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            slot_file(src, 2 * CHUNK_BYTES + 9, seed=9)  # a save of the same file name
        return real_set(*args, **kwargs)

    monkeypatch.setattr(s._redis, "set", set_and_rewrite)
    with pytest.raises(StoreError, match="changed while it was uploaded"):
        s.push(src, FIELDS)
    assert raw(url).get(manifest_key(PREFIX, FP)) is None


def test_store_over_tls_with_a_password(server_factory: Callable[..., Any], tmp_path: Path) -> None:
    """``rediss://`` with ``--store-tls-ca`` and ``--store-password``, as the client's
    options: a pion-server with TLS and requirepass serves files and the receipt."""
    certs = make_certs(tmp_path / "certs")
    srv = server_factory(tls_cert=certs.cert, tls_key=certs.key, requirepass="s3cret")
    url = f"rediss://127.0.0.1:{srv.port}"
    src = tmp_path / "src.bin"
    data = slot_file(src, CHUNK_BYTES + 3)
    lines: list[str] = []
    s = SlotStore(StoreConfig(url, password="s3cret", tls_ca=certs.ca), lines.append)
    manifest, pushed = s.push(src, FIELDS)
    dest = tmp_path / manifest.file
    s.pull(s.manifest(FP) or manifest, dest)
    assert pushed and dest.read_bytes() == data
    s.register(FP, 10.0)
    assert s.report(FP, 100, 10.0) is True
    # Without the password, or trusting another CA: a store error, never a crash.
    for config in (
        StoreConfig(url, tls_ca=certs.ca),
        StoreConfig(url, password="s3cret", tls_ca=certs.other_ca),
    ):
        with pytest.raises(StoreError):
            SlotStore(config, lines.append).manifest(FP)
