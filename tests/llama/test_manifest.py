"""The store manifest: round trip, and strict refusal of anything it cannot trust."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pion.llama.fingerprint import file_name
from pion.llama.manifest import (
    CHUNK_BYTES,
    MAX_CHUNK_BYTES,
    MAX_SLOT_FILE_BYTES,
    Manifest,
    chunk_key,
    manifest_key,
)
from pion.llama.slotfile import SlotLayout

FP = "0123456789abcdef" * 4
LAYOUT = SlotLayout(1, 2, False, 0, 0, ("f16", "f16"), ("f16", "f16"), (64, 64), (64, 64))
GOOD = Manifest(
    fingerprint=FP,
    size=2 * CHUNK_BYTES + 1,
    sha256="e" * 64,
    chunks=3,
    upload="0011223344556677",
    tokens=1400,
    prefill_ms=812.5,
    build="b11434",
    model={"id": "tiny.gguf", "size": 1234, "sample_sha256": "f" * 64},
    n_ctx=4096,
    layout=LAYOUT,
    created=1.7e9,
    origin="host-a",
)


def doc() -> dict[str, Any]:
    value: dict[str, Any] = json.loads(GOOD.to_bytes())
    return value


def test_round_trip_and_keys() -> None:
    assert Manifest.parse(GOOD.to_bytes(), FP) == GOOD
    assert GOOD.file == file_name(FP)
    assert [GOOD.chunk_size(i) for i in range(3)] == [CHUNK_BYTES, CHUNK_BYTES, 1]
    assert manifest_key("p:", FP) == "p:" + FP
    assert chunk_key("p:", FP, "00", 2) == f"p:{FP}:00:2"
    no_layout = Manifest.parse(
        json.dumps({**doc(), "layout": None, "model": {"id": "x"}}).encode(), FP
    )
    assert no_layout.layout is None and no_layout.model["size"] is None


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"version": 2}, "version"),
        ({"fingerprint": "ab" * 32}, "is for"),
        ({"fingerprint": "XYZ"}, "malformed"),
        ({"size": 0}, "size"),
        ({"size": MAX_SLOT_FILE_BYTES + 1}, "size"),
        ({"size": True}, "size"),
        ({"size": "5"}, "size"),
        ({"chunks": 2}, "chunks for"),
        ({"chunk_bytes": MAX_CHUNK_BYTES + 1}, "chunk_bytes"),
        ({"chunk_bytes": 0}, "chunk_bytes"),
        ({"sha256": "E" * 64}, "sha256"),
        ({"sha256": "e" * 63}, "sha256"),
        ({"upload": "../../x"}, "upload"),
        ({"file": "../../etc/passwd"}, "file name"),
        ({"tokens": 0}, "tokens"),
        ({"prefill_ms": -1}, "prefill_ms"),
        ({"prefill_ms": float("nan")}, "prefill_ms"),
        ({"prefill_ms": 1e12}, "prefill_ms"),
        ({"build": 5}, "build"),
        ({"build": "b" * 1000}, "build"),
        ({"model": "tiny"}, "model"),
        ({"model": {"id": "x", "size": "big"}}, "model size"),
        ({"model": {"id": "x", "sample_sha256": "zz"}}, "sample_sha256"),
        ({"n_ctx": -1}, "n_ctx"),
        ({"layout": {"n_stream": 1}}, "layout"),
        ({"layout": []}, "layout"),
        ({"origin": None}, "origin"),
    ],
)
def test_each_bad_field_is_refused(change: dict[str, Any], why: str) -> None:
    raw = json.dumps({**doc(), **change}).encode()
    with pytest.raises(ValueError, match=why):
        Manifest.parse(raw, change.get("fingerprint", FP) if "is for" not in why else FP)


def test_missing_fields_and_non_objects_are_refused() -> None:
    for key in doc():
        if key == "version":
            continue
        partial = {k: v for k, v in doc().items() if k != key}
        with pytest.raises(ValueError):
            Manifest.parse(json.dumps(partial).encode(), FP)
    for raw in (b"", b"null", b"[1]", b"\xff\xfe", b"x" * (300 * 1024)):
        with pytest.raises(ValueError):
            Manifest.parse(raw, FP)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=6)
    ),
    max_leaves=20,
)


@given(st.dictionaries(st.sampled_from(sorted(doc())), _json, max_size=16))
def test_random_documents_parse_or_raise_value_error(mutation: dict[str, Any]) -> None:
    raw = json.dumps({**doc(), **mutation}).encode()
    try:
        parsed = Manifest.parse(raw, FP)
    except ValueError:
        return
    # Whatever got through is internally consistent.
    assert parsed.chunks == -(-parsed.size // parsed.chunk_bytes)
    assert 0 < parsed.size <= MAX_SLOT_FILE_BYTES


@given(st.binary(max_size=2000))
def test_random_bytes_parse_or_raise_value_error(raw: bytes) -> None:
    with contextlib.suppress(ValueError):
        Manifest.parse(raw, FP)
