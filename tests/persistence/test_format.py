"""The byte-level format: golden bytes (the layout is frozen), round trips of every
mutation, and refusal of malformed or oversized input before allocation."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest

from pion.persistence import format as fmt
from pion.persistence.format import FormatError, SnapshotHeader, WalHeader, crc32c
from pion.persistence.reader import Damage, LogDamage, read_records
from pion.persistence.vstore_format import decode_mutation, encode_record
from pion.vstore import (
    CreateSession,
    DropSession,
    ReleaseSnapshot,
    RestoreSnapshot,
    SetBlocks,
    SnapshotIds,
    StoreRows,
    TakeSnapshot,
)


def _join(parts: list[fmt.Buffer]) -> bytes:
    return b"".join(bytes(p) for p in parts)


def test_crc32c_is_castagnoli() -> None:
    assert crc32c(b"123456789") == 0xE3069283
    big = np.arange(1 << 20, dtype=np.uint32).view(np.uint8)
    assert crc32c(memoryview(big)) == crc32c(big.tobytes())
    assert crc32c(b"6789", crc32c(b"12345")) == crc32c(b"123456789")


def test_wal_header_golden() -> None:
    raw = WalHeader(worker=3, start=42).encode()
    assert len(raw) == 32
    assert raw[:8] == b"\x93PIONWAL"
    assert raw[8:28] == struct.pack("<HHIQI", 1, 0, 3, 42, 0)
    assert raw[28:] == struct.pack("<I", crc32c(raw[:28]))
    assert WalHeader.decode(raw) == WalHeader(3, 42)


def test_snapshot_header_golden() -> None:
    raw = SnapshotHeader(worker=1, covered=7, created_ms=1234).encode()
    assert len(raw) == 40
    assert raw[:8] == b"\x93PIONSNP"
    assert raw[8:36] == struct.pack("<HHIQQI", 1, 0, 1, 7, 1234, 0)
    assert SnapshotHeader.decode(raw) == SnapshotHeader(1, 7, 1234)


@pytest.mark.parametrize(
    ("mutate", "error"),
    [
        (lambda b: b[:31], "truncated"),
        (lambda b: b"X" + b[1:], "bad magic"),
        (lambda b: b[:8] + b"\x02" + b[9:], "checksum"),
    ],
)
def test_header_damage_is_refused(mutate: object, error: str) -> None:
    raw = WalHeader(0, 1).encode()
    with pytest.raises(FormatError, match=error):
        WalHeader.decode(mutate(raw))  # type: ignore[operator]


def test_future_version_is_refused_by_name() -> None:
    body = struct.pack("<8sHHIQI", fmt.WAL_MAGIC, 2, 0, 0, 1, 0)
    with pytest.raises(FormatError, match="version 2 is not supported"):
        WalHeader.decode(body + struct.pack("<I", crc32c(body)))


def test_store_record_golden() -> None:
    data = bytes(range(12))
    parts, size = encode_record(5, StoreRows(b"ab", 2, 10, 3, 5, 2, data))
    raw = _join(parts)
    assert size == len(raw) == 21 + 2 + 2 + 23 + 12
    payload = struct.pack("<H", 2) + b"ab" + struct.pack("<HIIBIQ", 2, 10, 3, 5, 2, 12) + data
    head = struct.pack("<IBQ", len(payload), 2, 5)
    assert raw == (
        head + struct.pack("<I", crc32c(head)) + payload + struct.pack("<I", crc32c(payload))
    )


def _payload_of(m: object, op: int) -> bytes:
    raw = _join(encode_record(3, m)[0])  # type: ignore[arg-type]
    length, got_op, seq = struct.unpack_from("<IBQ", raw)
    assert (got_op, seq) == (op, 3)
    return raw[17 : 17 + length]


def test_rollback_records_golden() -> None:
    sid = struct.pack("<H", 2) + b"ab"
    snap = TakeSnapshot(b"ab", 9, ((0, 100), (3, 7)))
    assert _payload_of(snap, 5) == sid + struct.pack("<QHHIHI", 9, 2, 0, 100, 3, 7)
    assert _payload_of(RestoreSnapshot(b"ab", 9), 6) == sid + struct.pack("<Q", 9)
    assert _payload_of(ReleaseSnapshot(b"ab", 9), 7) == sid + struct.pack("<Q", 9)
    assert _payload_of(SnapshotIds(41), 8) == struct.pack("<Q", 41)


def test_create_with_ropes_golden() -> None:
    m = CreateSession(b"ab", 0, "bf16_rope_fp8_body", (("bf16_rope_fp8_body", 576), ("fp8", 64)))
    plain = struct.pack("<H", 2) + b"ab" + struct.pack("<IBH", 0, 8, 2)
    # Without ropes it would be a plain CREATE (and refused by the store on replay).
    assert _payload_of(m, 1) == plain + struct.pack("<BIBI", 8, 576, 6, 64)
    with_ropes = CreateSession(m.sid, 0, m.default_fmt, m.schema, (64, 0))
    assert _payload_of(with_ropes, 9) == plain + struct.pack("<BIIBII", 8, 576, 64, 6, 64, 0)


def test_store_payload_is_passed_through_not_copied() -> None:
    arr = np.arange(64, dtype=np.uint8)
    parts, _ = encode_record(1, StoreRows(b"s", 0, 0, 4, 5, 8, memoryview(arr)))
    bulk = parts[2]
    assert isinstance(bulk, memoryview)
    assert np.shares_memory(np.frombuffer(bulk, np.uint8), arr)


MUTATIONS = [
    CreateSession(b"u", 128, "int8", None),
    CreateSession(b"s" * 512, 0, "fp16", (("fp16", 4), ("turbo2", 128), ("mlx4g32", 64))),
    StoreRows(b"x_pk", 79, 199_999, 1, 1, 8192, bytes(range(256)) * 3),
    DropSession(b"d", "drop"),
    DropSession(b"e", "evict"),
    SetBlocks(b"b", 8192, np.arange(5, dtype="<u8").tobytes()),
    SetBlocks(b"b", 1, b""),
    CreateSession(
        b"mla", 0, "bf16_rope_fp8_body", (("bf16_rope_fp8_body", 576), ("int8", 512)), (64, 0)
    ),
    TakeSnapshot(b"t", 1, ()),
    TakeSnapshot(b"t", 2**63, ((0, 5), (79, 199_999))),
    RestoreSnapshot(b"t", 7),
    ReleaseSnapshot(b"t", 7),
    SnapshotIds(123),
]


@pytest.mark.parametrize("m", MUTATIONS, ids=lambda m: type(m).__name__)
def test_round_trip(m: object) -> None:
    parts, size = encode_record(9, m)  # type: ignore[arg-type]
    raw = _join(parts)
    recs = list(read_records(io.BytesIO(raw), 0, size, 9))
    assert len(recs) == 1
    got = decode_mutation(recs[0].op, recs[0].payload)
    if isinstance(got, StoreRows):
        got = StoreRows(
            got.sid, got.layer, got.start, got.count, got.format_id, got.dim, bytes(got.data)
        )
    if isinstance(got, SetBlocks):
        got = SetBlocks(got.sid, got.block_size, bytes(got.hashes))
    assert got == m


@pytest.mark.parametrize(
    ("op", "payload", "error"),
    [
        (3, b"\x00\x00", "session id length 0"),
        (3, b"\x01\x00a", "shorter than its fields"),
        (3, b"\x01\x00a\x01\x00", "trailing"),
        (3, b"\x01\x00a\x07", "drop reason"),
        (1, b"\x01\x00a" + struct.pack("<IBH", 8, 99, 0), "format id 99"),
        (4, b"\x01\x00a" + struct.pack("<II", 4, 1_000_000), "shorter than its"),
        (10, b"\x01\x00a", "op code"),
        (9, b"\x01\x00a" + struct.pack("<IBH", 0, 8, 0), "without a schema"),
        (9, b"\x01\x00a" + struct.pack("<IBHBI", 0, 8, 1, 8, 64), "shorter than its fields"),
        (5, b"\x01\x00a" + struct.pack("<QH", 1, 2) + struct.pack("<HI", 0, 1), "shorter"),
        (6, b"\x01\x00a" + struct.pack("<Q", 1) + b"\x00", "trailing"),
        (7, b"\x01\x00a", "shorter than its fields"),
        (8, struct.pack("<Q", 1) + b"\x00", "trailing"),
    ],
)
def test_malformed_payloads(op: int, payload: bytes, error: str) -> None:
    with pytest.raises(FormatError, match=error):
        decode_mutation(op, payload)


def test_oversized_length_is_refused_before_allocating() -> None:
    # A header that passed its CRC yet claims 4 GiB: never allocated, never read.
    head = struct.pack("<IBQ", 0xFFFFFFFF, 2, 1)
    raw = head + struct.pack("<I", crc32c(head)) + b"\x00" * 64
    with pytest.raises(LogDamage, match="over the cap") as info:
        list(read_records(io.BytesIO(raw), 0, len(raw), 1))
    assert not info.value.damage.torn


def test_a_record_past_the_end_of_file_is_torn() -> None:
    parts, _ = encode_record(1, DropSession(b"abc", "drop"))
    raw = _join(parts)[:-3]
    with pytest.raises(LogDamage) as info:
        list(read_records(io.BytesIO(raw), 0, len(raw), 1))
    assert info.value.damage.torn and info.value.damage.offset == 0


def test_writer_refuses_a_record_over_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fmt, "MAX_PAYLOAD", 100)
    with pytest.raises(fmt.PionError, match="record limit"):
        encode_record(1, StoreRows(b"s", 0, 0, 1, 5, 64, bytes(128)))


def test_damage_with_valid_records_after_is_corruption() -> None:
    raw = b"".join(
        bytes(p) for i in (1, 2, 3) for p in encode_record(i, DropSession(b"x%d" % i))[0]
    )
    bad = bytearray(raw)
    bad[3] ^= 1  # the first record's length: its header CRC fails
    with pytest.raises(LogDamage) as info:
        list(read_records(io.BytesIO(bytes(bad)), 0, len(bad), 1))
    d = info.value.damage
    assert (d.offset, d.torn, d.next_valid) == (0, False, len(raw) // 3)


def _two_records() -> bytes:
    return b"".join(
        bytes(p)
        for i in (1, 2)
        for p in encode_record(i, StoreRows(b"s", 0, i, 1, 5, 4, bytes(8)))[0]
    )


def _damage_of(raw: bytes) -> Damage:
    with pytest.raises(LogDamage) as info:
        list(read_records(io.BytesIO(raw), 0, len(raw), 1))
    return info.value.damage


@pytest.mark.parametrize(
    ("where", "reason"),
    [
        (-1, "payload checksum mismatch in the last record, complete,"),  # its CRC
        (-6, "payload checksum mismatch in the last record, complete,"),  # its payload
        (0, "header checksum mismatch in the last record, whose payload is complete"),
        (4, "header checksum mismatch in the last record, whose payload is complete"),
    ],
)
def test_a_complete_last_record_that_fails_its_checksum_is_corruption(
    where: int, reason: str
) -> None:
    """It was written whole, so it may have been fsynced and acknowledged: cutting it
    as if a crash had torn it would drop an acknowledged write silently."""
    raw = bytearray(_two_records())
    last = len(raw) // 2
    raw[where if where < 0 else last + where] ^= 0x20
    d = _damage_of(bytes(raw))
    assert (d.offset, d.torn) == (last, False)
    assert reason in d.reason


@pytest.mark.parametrize(
    "tail",
    [b"\x00" * 40, b"\xff" * 3, b"\x00" * 4096, bytes(range(200))],
)
def test_trailing_zeros_or_garbage_are_a_torn_write(tail: bytes) -> None:
    raw = _two_records()
    d = _damage_of(raw + tail)
    assert (d.offset, d.torn) == (len(raw), True)


def test_an_incomplete_last_record_says_how_much_of_it_is_there() -> None:
    raw = _two_records()
    d = _damage_of(raw[:-7])
    assert (
        d.torn
        and d.reason == f"incomplete final record: {len(raw) // 2 - 7} of its {len(raw) // 2} bytes"
    )
