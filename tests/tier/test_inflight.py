"""A fill in flight, as a unit (``pion.tier.inflight``): chunks handed over by a stand-in
for the tier's network read. Replies computed from it equal the V-store's fetch of the
same stored rows (holes and a partial block included); the commit adopts the receive
buffers, and a write after it never changes rows a reply still holds."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import numpy as np
import pytest

from pion.config import VStoreLimits
from pion.errors import TierError
from pion.tier.fill import plan_fill
from pion.tier.inflight import InFlightFill
from pion.tier.keys import CHUNK_ROWS, KeyLayout
from pion.tier.meta import Layout, TierMeta
from pion.tier.rowread import Want
from pion.vstore import VStore

KEYS = KeyLayout("u")
GEN = "0123456789abcdef"
DIM = 16
ROW = DIM * 2  # fp16


class _Tier:
    """What the tier holds (key -> bytes); ``read_into`` lands them as the network
    read does, failing after ``fail_after`` chunks when set."""

    def __init__(self, values: dict[str, bytes], fail_after: int | None = None) -> None:
        self.values = values
        self.fail_after = fail_after

    def read_into(self, wants: Sequence[Want], landed: object) -> list[int]:
        sizes = []
        for i, want in enumerate(wants):
            if self.fail_after is not None and i >= self.fail_after:
                raise ConnectionError("the tier went away")
            value = self.values[want.name]
            want.dest[: len(value)] = value
            landed(i, len(value))  # type: ignore[operator]
            sizes.append(len(value))
        return sizes


class _Journal:
    @contextlib.contextmanager
    def local_only(self) -> Iterator[None]:
        yield


class _Gate:
    @contextlib.contextmanager
    def filling(self, sids: object) -> Iterator[None]:
        yield


def _bitmap(*bits: int) -> bytes:
    out = bytearray(max(bits) // 8 + 1)
    for bit in bits:
        out[bit // 8] |= 0x80 >> (bit % 8)
    return bytes(out)


def _setup(fail_after: int | None = None) -> tuple[InFlightFill, VStore, _Tier]:
    """Layer 0: 600 rows in blocks 0 and 2 (block 1 never written: a hole), the last
    block partial; layer 1: 300 rows, its first block holding only 60 (60..256 a hole);
    layer 2: two full blocks (one run over its whole receive buffer)."""
    rng = np.random.default_rng(3)
    meta = TierMeta(b"s_pk", GEN, Layout(DIM, "fp16", None), {0: 600, 1: 300, 2: 512})
    values = {
        KEYS.chunk(b"s_pk", GEN, 0, 0): rng.bytes(CHUNK_ROWS * ROW),
        KEYS.chunk(b"s_pk", GEN, 0, 2): rng.bytes(88 * ROW),
        KEYS.chunk(b"s_pk", GEN, 1, 0): rng.bytes(60 * ROW),
        KEYS.chunk(b"s_pk", GEN, 1, 1): rng.bytes(44 * ROW),
        KEYS.chunk(b"s_pk", GEN, 2, 0): rng.bytes(CHUNK_ROWS * ROW),
        KEYS.chunk(b"s_pk", GEN, 2, 1): rng.bytes(CHUNK_ROWS * ROW),
    }
    marked = [(0, 0), (0, 2), (1, 0), (1, 1), (2, 0), (2, 1)]
    bits = _bitmap(*(KEYS.bit(layer, block) for layer, block in marked))
    plan = plan_fill(KEYS, meta, bits, None)
    reference = VStore(VStoreLimits())
    reference.create(b"s_pk", DIM, "fp16")
    for (layer, block), n in {
        (0, 0): 256,
        (0, 2): 88,
        (1, 0): 60,
        (1, 1): 44,
        (2, 0): 256,
        (2, 1): 256,
    }.items():
        raw = values[KEYS.chunk(b"s_pk", GEN, layer, block)]
        rows = np.frombuffer(raw, dtype=np.uint8).reshape(n, ROW)
        reference.store_encoded(b"s_pk", layer, block * CHUNK_ROWS, rows)
    fill = InFlightFill([plan], VStoreLimits().max_rows)
    return fill, reference, _Tier(values, fail_after)


def _computed(bulks: Sequence[object]) -> list[bytes | None]:
    return [None if b is None else bytes(b[2]()) for b in bulks]  # type: ignore[index]


def _local(vs: VStore, layers: Sequence[int], start: int, end: int, native: bool) -> list[object]:
    got = vs.fetch_batch(b"s_pk", start, end, len(layers), native=native)
    assert got is not None
    return [None if a is None else a.tobytes() for a in got]


@pytest.mark.parametrize(("start", "end"), [(0, 600), (200, 700), (50, 100), (590, 600)])
@pytest.mark.parametrize("native", [True, False])
def test_replies_are_the_v_stores_fetch_of_the_same_rows(
    start: int, end: int, native: bool
) -> None:
    fill, reference, tier = _setup()
    fill.start(tier, lambda _: None)  # type: ignore[arg-type]
    fill.read.wait(10)
    assert fill.error is None
    layers = [0, 1, 2, 3]  # 3: never written, a null in both
    bulks = fill.reply(b"s_pk", layers, start, end, native)
    want = _local(reference, layers, start, end, native)
    assert [None if b is None else b[0] for b in bulks] == [
        None if x is None else len(x)
        for x in want  # type: ignore[arg-type]
    ]
    assert _computed(bulks) == want


def test_a_piece_is_ready_once_its_layer_lands() -> None:
    fill, _, tier = _setup()
    told: list[int] = []
    bulks = fill.reply(b"s_pk", [0, 2], 0, 512, True)
    for n, bulk in enumerate(bulks):
        assert bulk is not None
        bulk[1](lambda n=n: told.append(n))  # type: ignore[misc]
    assert told == []  # nothing read yet: nobody told
    fill.start(tier, lambda _: None)  # type: ignore[arg-type]
    fill.read.wait(10)
    assert sorted(told) == [0, 1]


def test_the_commit_adopts_and_a_later_write_leaves_a_reply_alone() -> None:
    fill, reference, tier = _setup()
    fill.start(tier, lambda _: None)  # type: ignore[arg-type]
    fill.read.wait(10)
    bulks = fill.reply(b"s_pk", [2], 0, 512, True)
    sent = bulks[0][2]()  # type: ignore[index]
    before = bytes(sent)
    vs = VStore(VStoreLimits())
    filled = fill.commit(vs, _Journal(), _Gate())  # type: ignore[arg-type]
    assert filled == (256 + 88 + 60 + 44 + 512) * ROW
    assert _local(vs, [0, 1, 2], 0, 600, True) == _local(reference, [0, 1, 2], 0, 600, True)
    # The V-store holds the receive buffer itself (adopted, no copy) ...
    assert np.shares_memory(vs.fetch_range(b"s_pk", 2, 0, 512, native=True), sent)
    # ... and a write into those rows while the reply holds them copies first.
    vs.store_encoded(b"s_pk", 2, 0, np.full((10, ROW), 7, dtype=np.uint8))
    assert bytes(sent) == before
    assert vs.fetch_range(b"s_pk", 2, 0, 10, native=True).tobytes() == bytes(10 * ROW * [7])


def test_a_failed_read_fails_the_layers_not_landed_and_commits_nothing() -> None:
    fill, _, tier = _setup(fail_after=2)  # layer 0's two chunks land, layer 1's do not
    fill.start(tier, lambda _: None)  # type: ignore[arg-type]
    fill.read.wait(10)
    assert fill.error is not None
    ok, gone = fill.reply(b"s_pk", [0, 1], 0, 100, True)
    assert ok is not None and len(bytes(ok[2]())) == 100 * ROW  # verified: still served
    assert gone is not None
    told: list[int] = []
    gone[1](lambda: told.append(1))  # ready: told at once, the read being over
    assert told == [1]
    with pytest.raises(TierError, match="tier failed while the session was being read"):
        gone[2]()
    vs = VStore(VStoreLimits())
    with pytest.raises(ConnectionError):
        fill.commit(vs, _Journal(), _Gate())  # type: ignore[arg-type]
    assert b"s_pk" not in vs
