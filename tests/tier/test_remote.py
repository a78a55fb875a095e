"""The tier operations against a real redis-server: what each writes where, the
generation checks, tombstones, and a tier that refuses."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pion_testing.redis_nodes import RedisNode

from pion.config import TierConfig, VStoreLimits
from pion.tier.client import TierClient, TierIOError, TierRejected
from pion.tier.health import Health
from pion.tier.keys import CHUNK_ROWS, KeyLayout
from pion.tier.meta import Layout
from pion.tier.ops import StoreOp
from pion.tier.remote import TOMBSTONE_TTL_S, Remote

FP16 = Layout(4, "fp16", None)  # 8 bytes a row
ROW = 8


@pytest.fixture
def remote(redis_node: RedisNode) -> Iterator[Remote]:
    client = TierClient(TierConfig(url=redis_node.url, timeout=2), Health())
    yield Remote(client, KeyLayout("u"), VStoreLimits())
    client.close()


def _rows(first: int, count: int) -> bytes:
    return b"".join(bytes([(first + i) % 251]) * ROW for i in range(count))


def _store(remote: Remote, gen: str, start: int, count: int, layer: int = 0) -> bool:
    op = StoreOp(b"s", layer, start, count, 5, 4, _rows(start, count))
    return remote.store(gen, op)


def test_create_is_idempotent_and_reports_the_layout_held(remote: Remote) -> None:
    gen, layout = remote.create(b"s", FP16)
    assert layout == FP16 and len(gen) == 16
    again, held = remote.create(b"s", Layout(8, "int8", None))
    assert (again, held) == (gen, FP16)
    meta = remote.load(b"s")
    assert meta is not None and meta.gen == gen and meta.tpl == {}


def test_rows_land_in_their_chunks_and_the_mark_only_rises(
    remote: Remote, redis_node: RedisNode
) -> None:
    gen, _ = remote.create(b"s", FP16)
    assert _store(remote, gen, 250, 300)
    assert _store(remote, gen, 0, 10)  # lower rows: the mark stays at 550
    r = redis_node.client()
    k = remote.keys
    assert r.get(k.chunk(b"s", gen, 0, 0)) == _rows(0, 10) + b"\0" * ROW * 240 + _rows(250, 6)
    assert r.get(k.chunk(b"s", gen, 0, 1)) == _rows(256, CHUNK_ROWS)
    assert r.get(k.chunk(b"s", gen, 0, 2)) == _rows(512, 38)
    meta = remote.load(b"s")
    assert meta is not None and meta.tpl == {0: 550}
    assert [r.getbit(k.written(b"s"), k.bit(0, b)) for b in range(4)] == [1, 1, 1, 0]
    assert remote.set_blocks(b"s", gen, 16, b"\1" * 16)
    assert r.get(k.blocks(b"s")) == b"\x10\0\0\0" + b"\1" * 16


def test_writes_under_a_dropped_generation_are_refused_and_cleaned(
    remote: Remote, redis_node: RedisNode
) -> None:
    gen, _ = remote.create(b"s", FP16)
    assert _store(remote, gen, 0, 300)
    assert remote.drop(b"s", "f" * 16) is None  # another generation: nothing dropped
    assert remote.drop(b"s", None) == gen
    r = redis_node.client()
    k = remote.keys
    assert remote.load(b"s") is None and remote.tombstone(b"s") == gen
    assert 0 < r.ttl(k.tombstone(b"s")) <= TOMBSTONE_TTL_S
    assert not r.exists(
        k.written(b"s"), k.blocks(b"s"), *(k.chunk(b"s", gen, 0, b) for b in (0, 1))
    )
    assert not _store(remote, gen, 0, 10)  # stale: the chunk it wrote is gone again
    assert not r.exists(k.chunk(b"s", gen, 0, 0))
    assert not remote.set_blocks(b"s", gen, 16, b"")
    fresh, _ = remote.create(b"s", FP16)  # re-created: a new generation, no tombstone
    assert fresh != gen and remote.tombstone(b"s") is None
    assert remote.probe([b"s", b"t"]) == {b"s": (fresh, None), b"t": (None, None)}


def test_a_key_of_the_wrong_type_is_a_refusal_not_a_crash(
    remote: Remote, redis_node: RedisNode
) -> None:
    redis_node.client().set(remote.keys.meta(b"s"), b"not a hash")
    with pytest.raises(TierRejected, match="WRONGTYPE"):
        remote.read_metas([b"s"])
    assert remote.client.health.up  # an answer, not an outage


def test_an_unreachable_tier_is_an_io_error_and_marks_health_down() -> None:
    health = Health()
    client = TierClient(TierConfig(url="redis://127.0.0.1:9", timeout=0.5), health)
    with pytest.raises(TierIOError, match="no seed node answered"):
        Remote(client, KeyLayout(), VStoreLimits()).read_metas([b"s"])
    assert not health.up and health.read_errors == 1
