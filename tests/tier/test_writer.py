"""The writer thread against a real redis-server: FIFO application, a layout conflict,
a tier that refuses writes (OOM under noeviction), and stopping while the tier is down."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from pion_testing.redis_nodes import RedisNode

from pion.config import TierConfig, VStoreLimits
from pion.tier.client import TierClient
from pion.tier.health import Health
from pion.tier.keys import KeyLayout
from pion.tier.ledger import Ledger
from pion.tier.meta import Layout
from pion.tier.ops import CheckOp, CreateOp, DropOp, StoreOp
from pion.tier.remote import Remote
from pion.tier.writer import Writer
from support import wait_until

FP16 = Layout(64, "fp16", None)  # 128 bytes a row


@pytest.fixture
def writer(redis_node: RedisNode) -> Iterator[Writer]:
    cfg = TierConfig(url=redis_node.url, timeout=1)
    health = Health()
    w = Writer(
        Remote(TierClient(cfg, health), KeyLayout("w"), VStoreLimits()), health, Ledger(64), cfg
    )
    w.start()
    yield w
    w.stop(0.5)


def _store(sid: bytes, start: int, count: int) -> StoreOp:
    return StoreOp(sid, 0, start, count, 5, 64, b"\x07" * 128 * count)


def test_operations_apply_in_order(writer: Writer) -> None:
    writer.offer(CreateOp(b"a", FP16))
    writer.offer(_store(b"a", 0, 300))
    seq = writer.offer(DropOp(b"a"))
    writer.offer(CreateOp(b"a", FP16))
    last = writer.offer(_store(b"a", 0, 5))
    assert seq is not None and last is not None and writer.wait_done(last, 10)
    meta = writer.remote.load(b"a")
    assert meta is not None and meta.tpl == {0: 5}  # the drop came between
    assert writer.counters.applied == 5 and writer.counters.bytes_out == 305 * 128
    assert writer.ledger.gen(b"a") == meta.gen
    assert not writer.pending(b"a") and writer.depth == 0


def test_a_layout_conflict_abandons_the_session(writer: Writer) -> None:
    writer.remote.create(b"c", Layout(32, "int8", None))  # another node was first
    writer.offer(CreateOp(b"c", FP16))
    seq = writer.offer(_store(b"c", 0, 3))
    assert seq is not None and writer.wait_done(seq, 10)
    assert writer.counters.conflicts == 1 and writer.counters.skipped == 1
    assert writer.ledger.is_abandoned(b"c")
    meta = writer.remote.load(b"c")
    assert meta is not None and meta.layout.default_fmt == "int8" and meta.tpl == {}
    writer.offer(CheckOp(b"c", FP16, {0: 3}))  # the start-up check agrees: not ours
    writer.offer(CreateOp(b"d", FP16))
    done = writer.offer(_store(b"d", 0, 1))
    assert done is not None and writer.wait_done(done, 10) and writer.counters.conflicts == 2


def test_a_refused_write_gives_up_the_session_and_the_queue_moves_on(
    writer: Writer, redis_node: RedisNode
) -> None:
    r = redis_node.client()
    r.config_set("maxmemory-policy", "noeviction")
    r.config_set("maxmemory", int(r.info("memory")["used_memory"]) + 512 * 1024)
    writer.offer(CreateOp(b"big", FP16))
    writer.offer(_store(b"big", 0, 20_000))  # 2.5 MB: OOM
    writer.offer(CreateOp(b"small", FP16))
    seq = writer.offer(_store(b"small", 0, 2))
    assert seq is not None and writer.wait_done(seq, 10)
    assert writer.counters.rejected == 1 and writer.ledger.is_abandoned(b"big")
    assert writer.remote.load(b"big") is None  # its partial copy was dropped
    assert not r.keys(f"w:v1:r:{b'big'.hex()}:*")  # and the chunks its write left
    meta = writer.remote.load(b"small")
    assert meta is not None and meta.tpl == {0: 2}


def test_the_start_up_check_marks_what_the_tier_lacks(writer: Writer) -> None:
    writer.offer(CreateOp(b"k", FP16))
    writer.offer(_store(b"k", 0, 10))
    writer.offer(CheckOp(b"k", FP16, {0: 10}))  # as held: nothing to do
    writer.offer(CheckOp(b"m", FP16, {0: 4}))  # never reached the tier
    seq = writer.offer(CheckOp(b"k2", FP16, {0: 4}))
    assert seq is not None and writer.wait_done(seq, 10)
    assert not writer.ledger.is_dirty(b"k") and writer.ledger.is_dirty(b"m")
    writer.offer(CreateOp(b"n", FP16))
    writer.offer(_store(b"n", 0, 3))
    seq = writer.offer(CheckOp(b"n", FP16, {0: 9}))  # we hold more rows than the tier
    assert seq is not None and writer.wait_done(seq, 10) and writer.ledger.is_dirty(b"n")


def test_stop_is_prompt_while_the_tier_is_down(writer: Writer, redis_node: RedisNode) -> None:
    redis_node.kill()
    for i in range(5):
        writer.offer(CreateOp(b"x%d" % i, FP16))
    wait_until(lambda: not writer.health.up, what="the writer to notice")
    t0 = time.monotonic()
    assert writer.stop(0.3) == 5
    assert time.monotonic() - t0 < 3


def _idle_writer(redis_node: RedisNode) -> Writer:
    """A writer whose thread is not started yet: what is offered now queues up."""
    cfg = TierConfig(url=redis_node.url, timeout=1)
    health = Health()
    remote = Remote(TierClient(cfg, health), KeyLayout("b"), VStoreLimits())
    return Writer(remote, health, Ledger(64), cfg)


def test_stores_queued_back_to_back_are_written_together(redis_node: RedisNode) -> None:
    w = _idle_writer(redis_node)
    w.offer(CreateOp(b"x", FP16))
    w.offer(CreateOp(b"y", FP16))
    last = 0
    for i in range(20):  # appends crossing chunk boundaries, two sessions interleaved
        for sid in (b"x", b"y"):
            data = bytes([i + 1]) * 128 * 30
            seq = w.offer(StoreOp(sid, 0, 30 * i, 30, 5, 64, data))
            assert seq is not None
            last = seq
    w.start()
    try:
        assert w.wait_done(last, 10)
        assert w.counters.batched == 40 and w.counters.applied == 42
        assert w.counters.bytes_out == 2 * 20 * 30 * 128
        for sid in (b"x", b"y"):
            meta = w.remote.load(sid)
            assert meta is not None and meta.tpl == {0: 600}
            r = redis_node.client()
            rows = b"".join(
                r.get(w.remote.keys.chunk(sid, meta.gen, 0, block)) or b"" for block in range(3)
            )
            assert rows == b"".join(bytes([i + 1]) * 128 * 30 for i in range(20))
    finally:
        w.stop(0.5)


def test_a_refused_batch_gives_up_only_the_refused_session(redis_node: RedisNode) -> None:
    r = redis_node.client()
    r.config_set("maxmemory-policy", "noeviction")
    r.config_set("maxmemory", int(r.info("memory")["used_memory"]) + 512 * 1024)
    w = _idle_writer(redis_node)
    w.offer(CreateOp(b"small", FP16))
    w.offer(CreateOp(b"big", FP16))
    w.offer(_store(b"small", 0, 2))
    w.offer(_store(b"big", 0, 20_000))  # 2.5 MB: OOM
    seq = w.offer(_store(b"small", 2, 2))
    assert seq is not None
    w.start()
    try:
        assert w.wait_done(seq, 10)
        assert w.counters.rejected == 1 and w.ledger.is_abandoned(b"big")
        assert not w.ledger.is_abandoned(b"small")
        assert w.remote.load(b"big") is None
        meta = w.remote.load(b"small")
        assert meta is not None and meta.tpl == {0: 4}
    finally:
        w.stop(0.5)
