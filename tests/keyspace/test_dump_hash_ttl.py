"""DUMP and RESTORE of hashes with field deadlines (Redis 7.4's RDB types 22 to 25).
No redis-server 7.4 is at hand, so payloads are built byte by byte from the layout in
``rdb_hashttl``'s docstring (Redis 7.4's ``rdbSaveObject``/``rdbLoadObject``): DUMP's
bytes are compared with the layout, each type is restored, the deadlines round-trip
within pion-server, fields already past are left out, and hostile payloads answer
"Bad data format". redis-server 7.0 refuses the payload (version 12), as it would
Redis 7.4's own."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from pion.config import ServerConfig
from pion.keyspace.rdb import crc64
from pion.server.run import ServerThread
from support import data_budget
from support.keyspace import RedisServer

FAR = 4_000_000_000_000  # a deadline far ahead (year 2096), in Unix ms


def _seal(body: bytes, version: int = 12) -> bytes:
    out = body + version.to_bytes(2, "little")
    return out + crc64(out).to_bytes(8, "little")


def _len(n: int) -> bytes:
    """The payload's length encoding: 6 bits, 14 bits, 32 bits or 64 bits."""
    if n < 64:
        return bytes((n,))
    if n < 1 << 14:
        return (0x4000 | n).to_bytes(2, "big")
    if n < 1 << 32:
        return b"\x80" + n.to_bytes(4, "big")
    return b"\x81" + n.to_bytes(8, "big")


def _string(b: bytes) -> bytes:
    return _len(len(b)) + b


def _lp(items: list[bytes | int]) -> bytes:
    """A listpack: integers as 64-bit, strings with a 12-bit length."""
    body = b""
    for item in items:
        if isinstance(item, int):
            element = b"\xf4" + item.to_bytes(8, "little", signed=True)
        else:
            element = bytes((0xE0 | len(item) >> 8, len(item) & 0xFF)) + item
        body += element + bytes((len(element),))  # every element here is under 128
    return (7 + len(body)).to_bytes(4, "little") + len(items).to_bytes(2, "little") + body + b"\xff"


def _metadata(kind: int, fields: list[tuple[bytes, bytes, int]], low: int) -> bytes:
    """Type 24 (``low`` first, deadlines relative to it) or 22 (absolute)."""
    out = bytes((kind,)) + (low.to_bytes(8, "little") if kind == 24 else b"")
    out += _len(len(fields))
    for f, v, d in fields:
        ttl = (d - low + 1 if d else 0) if kind == 24 else d
        out += _len(ttl) + _string(f) + _string(v)
    return _seal(out)


def _listpack_ex(kind: int, fields: list[tuple[bytes, bytes, int]], low: int) -> bytes:
    """Type 25 (``low`` first) or 23: a listpack of field, value, deadline triples."""
    lp = _lp([x for f, v, d in fields for x in (f, v, d)])
    head = bytes((kind,)) + (low.to_bytes(8, "little") if kind == 25 else b"")
    return _seal(head + _string(lp))


FIELDS = [(b"a", b"1", FAR + 5), (b"plain", b"v", 0), (b"b", b"x" * 40, FAR)]


def _build(kind: int, fields: list[tuple[bytes, bytes, int]] = FIELDS) -> bytes:
    low = min((d for _, _, d in fields if d), default=0)
    return (_metadata if kind in (22, 24) else _listpack_ex)(kind, fields, low)


def _deadlines(r: redis.Redis, key: str) -> dict[bytes, int]:
    fields = sorted(r.hkeys(key))
    times = r.execute_command("HPEXPIRETIME", key, "FIELDS", len(fields), *fields)
    return dict(zip(fields, times, strict=True))


@pytest.mark.parametrize("kind", [22, 23, 24, 25])
def test_each_type_restores_its_fields_and_deadlines(client: redis.Redis, kind: int) -> None:
    assert client.restore("h", 0, _build(kind)) == b"OK"
    assert client.hgetall("h") == {f: v for f, v, _ in FIELDS}
    assert _deadlines(client, "h") == {f: d or -1 for f, _, d in FIELDS}


def test_dump_writes_type_24_as_the_layout_says(client: redis.Redis) -> None:
    client.hset("h", mapping={f: v for f, v, _ in FIELDS})
    for f, _, d in FIELDS:
        if d:
            client.execute_command("HPEXPIREAT", "h", d, "FIELDS", 1, f)
    assert client.dump("h") == _build(24)
    assert client.restore("copy", 0, client.dump("h")) == b"OK"
    assert client.hgetall("copy") == client.hgetall("h")
    assert _deadlines(client, "copy") == _deadlines(client, "h")


def test_large_hash_round_trip_and_replace(client: redis.Redis) -> None:
    client.hset("big", mapping={f"f{i}": i for i in range(700)})
    client.execute_command("HPEXPIRE", "big", 90_000, "FIELDS", 3, "f1", "f500", "f699")
    client.execute_command("HEXPIRE", "big", 500, "FIELDS", 1, "f2")
    payload = client.dump("big")
    assert payload is not None and payload[-10:-8] == (12).to_bytes(2, "little")
    client.hset("other", mapping={"old": "1", "f1": "stale"})
    client.execute_command("HEXPIRE", "other", 50, "FIELDS", 1, "old")
    assert client.restore("other", 0, payload, replace=True) == b"OK"
    assert client.hgetall("other") == client.hgetall("big")
    assert _deadlines(client, "other") == _deadlines(client, "big")


def test_a_restore_that_does_not_fit_leaves_the_old_value(client: redis.Redis) -> None:
    """The hash and its field deadlines are budgeted as one write: refused, the key
    REPLACE named keeps what it held (nothing is half restored)."""
    mapping = {f"f{i}": "v" * 40 for i in range(2000)}
    client.hset("plain", mapping=mapping)
    hash_alone = client.memory_usage("plain")
    client.hset("big", mapping=mapping)
    client.execute_command("HPEXPIRE", "big", 90_000_000, "FIELDS", 2000, *mapping)
    payload = client.dump("big")
    client.delete("plain", "big")
    client.set("old", "kept")
    client.config_set("maxmemory-policy", "noeviction")
    data_budget(client, hash_alone)  # room for the hash, not for its 2,000 deadlines
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        client.restore("old", 0, payload, replace=True)
    client.config_set("maxmemory", 0)
    assert client.get("old") == b"kept"


def test_fields_past_their_deadline_are_left_out(client: redis.Redis) -> None:
    past = [(b"gone", b"1", 1_000), (b"kept", b"2", 0), (b"later", b"3", FAR)]
    assert client.restore("h", 0, _build(24, past)) == b"OK"
    assert client.hgetall("h") == {b"kept": b"2", b"later": b"3"}
    assert _deadlines(client, "h") == {b"kept": -1, b"later": FAR}
    # Every field past: nothing is stored, and REPLACE deletes what the key held.
    client.set("s", "old")
    all_past = [(b"a", b"1", 1_000), (b"b", b"2", 2_000)]
    assert client.restore("s", 0, _build(25, all_past), replace=True) == b"OK"
    assert client.exists("s") == 0


def test_hostile_hash_ttl_payloads_answer_bad_data_format(client: redis.Redis) -> None:
    too_far = [(b"a", b"1", 1 << 48)]
    wrong = [
        _build(22, too_far),
        _build(23, too_far),
        _metadata(24, [(b"a", b"1", (1 << 48) + 5)], 1 << 48),  # the earliest deadline out of range
        _build(24, [(b"a", b"1", FAR), (b"a", b"2", 0)]),  # a repeated field
        _listpack_ex(25, [], 0),  # no fields
        _seal(b"\x19" + bytes(8) + _string(_lp([b"f", b"v"]))),  # not triples
        _seal(b"\x17" + _string(_lp([b"f", b"v", b"soon"]))),  # a deadline not a number
        _seal(b"\x18" + bytes(8) + b"\x81" + b"\xff" * 8),  # 2**64 - 1 fields, none there
        _seal(_build(24)[:-14]),  # cut short
    ]
    for payload in wrong:
        with pytest.raises(redis.ResponseError, match=r"^Bad data format$"):
            client.restore("bad", 0, payload, replace=True)
    assert client.exists("bad") == 0


def test_damaged_payloads_never_hurt_the_server(client: redis.Redis) -> None:
    """Bytes flipped, cut or grown in payloads of each type, resealed: an error or a
    hash that reads back whole, never a crash."""
    rng = random.Random(5)
    payloads = [_build(kind) for kind in (22, 23, 24, 25)]
    for n in range(300):
        body = bytearray(rng.choice(payloads)[:-10])
        if n % 3 == 0:
            body[rng.randrange(len(body))] = rng.randrange(256)
        elif n % 3 == 1:
            del body[rng.randrange(1, len(body)) :]
        else:
            at = rng.randrange(len(body))
            body[at:at] = rng.randbytes(rng.randint(1, 8))
        try:
            client.restore("h", 0, _seal(bytes(body)), replace=True)
        except redis.ResponseError as exc:
            assert str(exc) == "Bad data format"
        else:
            if client.type("h") == b"hash":
                _deadlines(client, "h")
                client.dump("h")
    assert client.ping() is True


@pytest.fixture
def oracle(tmp_path: Path) -> Iterator[redis.Redis]:
    server = RedisServer(tmp_path)
    try:
        r = redis.Redis(port=server.port)
        yield r
        r.close()
    finally:
        server.stop()


def test_redis_7_0_refuses_the_payload_as_it_would_redis_7_4s(
    client: redis.Redis, oracle: redis.Redis
) -> None:
    client.hset("h", "a", "1")
    client.execute_command("HEXPIRE", "h", 100, "FIELDS", 1, "a")
    payload = client.dump("h")
    with pytest.raises(redis.ResponseError, match="payload version or checksum are wrong"):
        oracle.restore("h", 0, payload)


def test_restored_deadlines_survive_a_restart(tmp_path: Path) -> None:
    config = ServerConfig(port=0, dir=tmp_path / "data", appendfsync="always")
    srv = ServerThread(config).start()
    r = redis.Redis(port=srv.port)
    assert r.restore("h", 0, _build(25)) == b"OK"
    r.close()
    srv.stop()
    srv = ServerThread(ServerConfig(port=0, dir=tmp_path / "data")).start()
    r = redis.Redis(port=srv.port)
    try:
        assert _deadlines(r, "h") == {f: d or -1 for f, _, d in FIELDS}
    finally:
        r.close()
        srv.stop()
