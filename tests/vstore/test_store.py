"""VStore: sessions, rows, zero fill, accounting, reads (eviction and the journal have
their own modules)."""

from __future__ import annotations

import numpy as np
import pytest

import pion.vstore.layer as layer_module
import pion.vstore.reads as reads_module
import pion.vstore.session as session_module
from pion.codecs import FORMAT_NAMES, get_codec
from pion.config import VStoreLimits
from pion.errors import CodecError, PionError, SessionNotFoundError
from pion.vstore import GROWTH
from support import durable_state, make_store, rows


def test_create_returns_stable_slots_and_is_idempotent() -> None:
    vs = make_store()
    assert vs.create(b"a", 64, "fp16") == 0
    assert vs.create(b"b", 32, "int8") == 1
    # Same sid, other layout: the existing layout stays and the slot is the same.
    assert vs.create(b"a", 128, "turbo2") == 0
    info = vs.describe(b"a")
    assert (info.default_dim, info.default_fmt, info.schema) == (64, "fp16", None)
    assert len(vs) == 2 and b"a" in vs and vs.session_count == 2


def test_freed_slots_are_reused_lowest_first() -> None:
    vs = make_store()
    for i in range(4):
        vs.create(b"s%d" % i, 8, "fp16")
    assert vs.drop(b"s2") and vs.drop(b"s1")
    assert not vs.drop(b"s1")
    assert vs.create(b"x", 8, "fp16") == 1
    assert vs.create(b"y", 8, "fp16") == 2
    assert vs.create(b"z", 8, "fp16") == 4


@pytest.mark.parametrize(
    ("sid", "dim", "fmt", "text"),
    [
        (b"a", 0, "fp16", "invalid value_dim (must be 1-8192)"),
        (b"a", 8193, "fp16", "invalid value_dim"),
        (b"a", 8, "fp32", "unknown format 'fp32' (want int8|turbo4|"),
        (b"", 8, "fp16", "session id length must be 1..512"),
        (b"x" * 513, 8, "fp16", "session id length"),
    ],
)
def test_create_refuses_bad_layouts(sid: bytes, dim: int, fmt: str, text: str) -> None:
    vs = make_store()
    with pytest.raises(PionError, match=text.replace("(", r"\(").replace(")", r"\)")):
        vs.create(sid, dim, fmt)
    assert len(vs) == 0


def test_schema_sessions_have_fixed_layers() -> None:
    vs = make_store()
    assert vs.create_schema(b"s", 0, [("fp16", 16), ("turbo4", 32), ("int8", 16)]) == 0
    info = vs.describe(b"s")
    assert info.num_layers == 3 and info.heterogeneous and info.default_dim == 0
    assert [(li.fmt, li.dim, li.tpl) for li in info.layers] == [
        ("fp16", 16, 0),
        ("turbo4", 32, 0),
        ("int8", 16, 0),
    ]
    vs.store(b"s", 1, 0, rows(4, 32))
    with pytest.raises(PionError, match="beyond this session's SCHEMA of 3"):
        vs.store(b"s", 3, 0, rows(4, 16))
    with pytest.raises(PionError, match=r"must be \[count>=1, 16\]"):
        vs.store(b"s", 0, 0, rows(4, 32))
    same = make_store()
    same.create_schema(b"u", 16, [("fp16", 16)] * 2)
    assert not same.describe(b"u").heterogeneous
    with pytest.raises(PionError, match="SCHEMA layer count must be 1-59"):
        same.create_schema(b"big", 8, [("fp16", 8)] * 60)
    with pytest.raises(PionError, match="layer 1 dim must be 1-8192"):
        same.create_schema(b"bad", 8, [("fp16", 8), ("fp16", 0)])


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_round_trip_every_format(fmt: str) -> None:
    vs = make_store()
    vs.create(b"s", 96, fmt)
    x = rows(40, 96, seed=3)
    vs.store(b"s", 2, 0, x)
    got = vs.fetch_range(b"s", 2, 0, 40)
    assert got is not None and got.dtype == np.float32 and got.shape == (40, 96)
    codec = get_codec(fmt)
    np.testing.assert_array_equal(got, codec.decode(codec.encode(x), 96))
    rel = float(np.mean((got - x) ** 2) / np.mean(x**2))
    assert rel < 0.2
    assert vs.vstore_bytes == 40 * codec.row_bytes(96)


def test_unwritten_rows_read_as_zeros_and_past_tpl_is_nil() -> None:
    vs = make_store()
    vs.create(b"s", 8, "int8")
    x = rows(3, 8)
    vs.store(b"s", 0, 5, x)  # rows 0..4 never written
    got = vs.fetch_range(b"s", 0, 0, 12)
    assert got is not None and got.shape == (12, 8)
    assert not got[:5].any() and not got[8:].any()
    np.testing.assert_allclose(got[5:8], x, atol=0.05)
    assert vs.fetch_range(b"s", 0, 8, 10) is None  # start >= tpl
    assert vs.fetch_range(b"s", 1, 0, 4) is None  # layer never stored
    assert vs.describe(b"s").layers[0].tpl == 8
    # Holes are not held: only the 3 rows written cost bytes; tpl counts as Pion does.
    assert vs.describe(b"s").layers[0].held == 3
    assert vs.vstore_bytes == vs.bytes_allocated == 3 * get_codec("int8").row_bytes(8)
    assert vs.total_tokens == 8


def test_fp16_bits_are_stored_verbatim() -> None:
    vs = make_store()
    vs.create(b"s", 4, "fp16")
    # bf16 bit patterns sent as "fp16": inf/NaN patterns included, never validated.
    bits = np.array([[0x7C00, 0xFC00, 0x7E01, 0x3F80], [1, 2, 3, 0xFFFF]], dtype="<u2")
    vs.store(b"s", 0, 0, bits.view("<f2"))
    native = vs.fetch_range(b"s", 0, 0, 2, native=True)
    assert native is not None and native.dtype == np.dtype("<f2")
    np.testing.assert_array_equal(native.view("<u2"), bits)


def test_fp16_input_to_a_quantized_layer_is_validated() -> None:
    vs = make_store()
    vs.create(b"s", 4, "int8")
    x = np.zeros((3, 4), dtype="<f2")
    x[2, 1] = np.inf
    with pytest.raises(CodecError, match="layer 1 row 12: non-finite value"):
        vs.store(b"s", 1, 10, x)
    assert vs.vstore_bytes == 0 and vs.describe(b"s").layers == ()


def test_overflow_names_layer_and_absolute_row() -> None:
    vs = make_store()
    vs.create(b"s", 4, "fp16")
    x = rows(5, 4)
    x[3, 0] = 1e6
    with pytest.raises(CodecError, match=r"layer 2 row 10: value 1e\+06 overflows fp16"):
        vs.store(b"s", 2, 7, x)


def test_store_checks_limits_and_inputs() -> None:
    vs = make_store(limits=VStoreLimits(max_rows=100, max_layers=4))
    vs.create(b"s", 4, "fp16")
    with pytest.raises(SessionNotFoundError, match="session not found"):
        vs.store(b"nope", 0, 0, rows(1, 4))
    with pytest.raises(PionError, match=r"layer_id out of range \(0..3\)"):
        vs.store(b"s", 4, 0, rows(1, 4))
    with pytest.raises(PionError, match=r"rows out of range \(end must be <= 100\)"):
        vs.store(b"s", 0, 98, rows(3, 4))
    with pytest.raises(PionError, match="invalid range"):
        vs.store(b"s", 0, -1, rows(1, 4))
    with pytest.raises(PionError, match="little-endian float32 or float16"):
        vs.store(b"s", 0, 0, rows(1, 4).astype(np.float64))  # type: ignore[arg-type]
    vs.store(b"s", 0, 97, rows(3, 4))  # exactly up to the limit
    assert vs.describe(b"s").layers[0].tpl == 100


def test_accounting_follows_stores_and_drops() -> None:
    vs = make_store()
    vs.create(b"a", 32, "fp16")
    vs.create(b"b", 64, "turbo3")
    vs.store(b"a", 0, 0, rows(10, 32))
    vs.store(b"a", 0, 5, rows(10, 32))  # overlaps: tpl 15
    vs.store(b"a", 3, 0, rows(2, 32))
    vs.store(b"b", 1, 0, rows(7, 64))
    expect = 17 * 64 + 7 * get_codec("turbo3").row_bytes(64)
    assert vs.vstore_bytes == expect
    assert vs.total_tokens == 24
    assert vs.describe(b"a").total_tokens == 17
    assert vs.describe(b"a").nbytes == 17 * 64
    vs.drop(b"a")
    assert vs.vstore_bytes == 7 * get_codec("turbo3").row_bytes(64)
    vs.drop(b"b")
    assert (vs.vstore_bytes, vs.total_tokens, vs.bytes_allocated) == (0, 0, 0)


def test_growth_is_bounded_and_trim_releases_slack() -> None:
    vs = make_store(limits=VStoreLimits(max_rows=5000))
    vs.create(b"s", 16, "fp16")
    for i in range(300):  # decode-style appends of 16 rows
        vs.store(b"s", 0, 16 * i, rows(16, 16, seed=i))
        assert vs.bytes_allocated <= GROWTH * vs.vstore_bytes
    assert vs.bytes_allocated <= 5000 * 32  # never past max_rows
    before = vs.fetch_range(b"s", 0, 0, 4800)
    slack = vs.bytes_allocated - vs.vstore_bytes
    assert vs.trim() == slack
    assert vs.bytes_allocated == vs.vstore_bytes
    np.testing.assert_array_equal(vs.fetch_range(b"s", 0, 0, 4800), before)


def test_a_single_store_allocates_exactly_its_rows() -> None:
    vs = make_store()
    vs.create(b"s", 1024, "fp16")
    vs.store(b"s", 0, 0, rows(4096, 1024))
    assert vs.bytes_allocated == vs.vstore_bytes == 4096 * 2048


def test_native_view_survives_a_later_overwrite() -> None:
    vs = make_store()
    vs.create(b"s", 8, "fp16")
    x = rows(20, 8)
    vs.store(b"s", 0, 0, x)
    view = vs.fetch_range(b"s", 0, 0, 10, native=True)
    assert view is not None and not view.flags.writeable
    snapshot = view.copy()
    vs.store(b"s", 0, 0, rows(20, 8, seed=9))  # copy-on-write: the view keeps old bytes
    np.testing.assert_array_equal(view, snapshot)
    fresh = vs.fetch_range(b"s", 0, 0, 10, native=True)
    assert fresh is not None
    np.testing.assert_array_equal(fresh, rows(20, 8, seed=9)[:10].astype("<f2"))


def test_writes_without_outstanding_views_stay_in_place() -> None:
    vs = make_store()
    vs.create(b"s", 8, "fp16")
    vs.store(b"s", 0, 0, rows(20, 8))
    run = vs._sessions[b"s"].layers[0].runs[0]
    before = id(run.buf)
    vs.store(b"s", 0, 3, rows(4, 8))
    assert vs._sessions[b"s"].layers[0].runs == [run] and id(run.buf) == before


def test_fetch_ids_gathers_in_order() -> None:
    vs = make_store()
    vs.create(b"s", 4, "fp16")
    x = rows(6, 4).astype("<f2").astype(np.float32)  # exact in fp16
    vs.store(b"s", 0, 0, x)
    got = vs.fetch_ids(b"s", 0, [5, 0, -3, 6, 2**70, 2])
    assert got is not None
    np.testing.assert_array_equal(got[[0, 1, 5]], x[[5, 0, 2]])
    assert not got[[2, 3, 4]].any()
    assert vs.fetch_ids(b"s", 0, [6, 7]) is None
    assert vs.fetch_ids(b"s", 3, [0]) is None
    with pytest.raises(PionError, match="between 1 and 1024 ids"):
        vs.fetch_ids(b"s", 0, list(range(1025)))


def test_fetch_batch_shapes() -> None:
    vs = make_store()
    vs.create(b"s", 4, "fp16")
    assert vs.fetch_batch(b"s", 0, 4) is None  # no rows at all
    vs.store(b"s", 0, 0, rows(4, 4))
    vs.store(b"s", 2, 0, rows(2, 4))
    out = vs.fetch_batch(b"s", 0, 4)
    assert out is not None and len(out) == 3
    assert out[1] is None and out[0] is not None and out[2] is not None
    assert out[2].shape == (4, 4) and not out[2][2:].any()
    wide = vs.fetch_batch(b"s", 0, 4, 5, native=True)
    assert wide is not None and len(wide) == 5 and wide[3] is None and wide[4] is None
    assert wide[0] is not None and wide[0].dtype == np.dtype("<f2")
    tail = vs.fetch_batch(b"s", 3, 4)  # layer 2 holds 2 rows: start >= its tpl
    assert tail is not None and tail[0] is not None and tail[1] is None and tail[2] is None
    np.testing.assert_array_equal(tail[0], out[0][3:])
    with pytest.raises(PionError, match=r"num_layers out of range \(1..80\)"):
        vs.fetch_batch(b"s", 0, 4, 81)


def test_fetch_counts_and_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    vs = make_store()
    vs.create(b"s", 1024, "fp16")
    vs.store(b"s", 0, 0, rows(1, 1024))
    vs.fetch_range(b"s", 0, 0, 1)
    vs.fetch_batch(b"s", 0, 1, 3)
    vs.fetch_ids(b"s", 0, [0])
    assert vs.total_fetches == 5
    with pytest.raises(PionError, match="invalid range: end must exceed start"):
        vs.fetch_range(b"s", 0, 5, 5)
    with pytest.raises(PionError, match="end must be <= 200000"):
        vs.fetch_range(b"s", 0, 0, 200001)
    monkeypatch.setattr(reads_module, "MAX_REPLY_BYTES", 1 << 20)
    with pytest.raises(PionError, match="exceeds the 1048576-byte limit"):
        vs.fetch_range(b"s", 0, 0, 257)  # 257 rows x 4 KiB fp32
    assert vs.fetch_range(b"s", 0, 0, 257, native=True) is not None  # fp16: half
    assert vs.total_fetches == 6


def test_blocks_are_copied_sorted_and_searchable() -> None:
    vs = make_store()
    vs.create(b"n_pk", 8, "fp16")
    assert vs.blocks(b"n_pk") is None
    hashes = np.array([9, 3, 2**64 - 1, 3, 0], dtype=np.uint64)
    vs.set_blocks(b"n_pk", 64, hashes)
    hashes[0] = 1  # the store kept its own copy
    table = vs.blocks(b"n_pk")
    assert table is not None and table.block_size == 64 and table.count == 5
    assert table.hashes.tolist() == [9, 3, 2**64 - 1, 3, 0]
    assert table.sorted.tolist() == [0, 3, 3, 9, 2**64 - 1]
    probes = np.array([3, 4, 2**64 - 1, 10, 0], dtype=np.uint64)
    assert table.contains(probes).tolist() == [True, False, True, False, True]
    vs.set_blocks(b"n_pk", 16, np.zeros(0, dtype=np.uint64))
    empty = vs.blocks(b"n_pk")
    assert empty is not None and empty.count == 0 and not empty.contains(probes).any()
    with pytest.raises(PionError, match="block_size must be positive"):
        vs.set_blocks(b"n_pk", 0, hashes)
    with pytest.raises(SessionNotFoundError):
        vs.set_blocks(b"n_pv", 1, hashes)


def test_set_limits_and_sids_order() -> None:
    vs = make_store()
    for sid in (b"a", b"b", b"c"):
        vs.create(sid, 4, "fp16")
    vs.touch(b"a")
    assert vs.sids() == [b"b", b"c", b"a"]
    assert not vs.touch(b"zz")
    vs.describe(b"b", touch=False)
    assert vs.sids()[0] == b"b"
    vs.set_limits(max_sessions=7, maxmemory=1000)
    assert (vs.max_sessions, vs.maxmemory) == (7, 1000)


@pytest.mark.parametrize("fmt", ["int8", "turbo3", "fp16"])
def test_big_batches_are_encoded_and_decoded_in_slices(
    monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    whole = make_store()
    whole.create(b"s", 32, fmt)
    x = rows(50, 32, seed=5)
    whole.store(b"s", 0, 3, x)
    monkeypatch.setattr(session_module, "ENCODE_CHUNK_BYTES", 7 * 32 * 4)  # 7-row slices
    monkeypatch.setattr(layer_module, "DECODE_CHUNK_BYTES", 6 * 32 * 4)  # 6-row slices
    sliced = make_store()
    sliced.create(b"s", 32, fmt)
    sliced.store(b"s", 0, 3, x)
    assert durable_state(sliced) == durable_state(whole)
    got = sliced.fetch_range(b"s", 0, 0, 60)
    want = whole.fetch_range(b"s", 0, 0, 60)
    assert got is not None and want is not None and got.shape == (60, 32)
    np.testing.assert_array_equal(got, want)
    assert not got[:3].any() and not got[53:].any()
    bad = x.copy()
    bad[45, 7] = np.nan  # in the 7th slice
    with pytest.raises(CodecError, match="layer 0 row 48: non-finite value"):
        sliced.store(b"s", 0, 3, bad)
