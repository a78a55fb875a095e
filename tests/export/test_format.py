"""The safetensors layout: what build_header writes, safetensors' own reader accepts
bit for bit; what read_header accepts is only that layout; garbage is a FormatError."""

from __future__ import annotations

import contextlib
import json
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from safetensors.numpy import load, load_file

from pion.export.format import (
    ALIGNMENT,
    MAX_HEADER_BYTES,
    FormatError,
    build_header,
    read_header,
    tensor_name,
)


def _file(arrays: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> bytes:
    specs = [(name, "F16", a.shape) for name, a in arrays.items()]
    head, infos = build_header(specs, metadata)
    data = b"".join(np.ascontiguousarray(a, dtype="<f2").tobytes() for a in arrays.values())
    assert infos[-1].end == len(data)
    return head + data


def test_safetensors_reads_what_we_write(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    arrays = {
        tensor_name(side, i): rng.standard_normal((1, 3, 5, 4)).astype(np.float16)
        for i in range(3)
        for side in "kv"
    }
    blob = _file(arrays, {"producer": "test", "start": "0"})
    (tmp_path / "x.safetensors").write_bytes(blob)
    for loaded in (load(blob), load_file(tmp_path / "x.safetensors")):
        assert sorted(loaded) == sorted(arrays)
        for name, a in arrays.items():
            assert loaded[name].dtype == np.float16 and loaded[name].shape == a.shape
            np.testing.assert_array_equal(loaded[name], a)


def test_header_is_padded_to_the_alignment() -> None:
    for n in range(1, 12):
        head, _ = build_header([(f"t{'x' * n}", "F16", (n,))])
        (length,) = struct.unpack_from("<Q", head)
        assert len(head) == 8 + length and len(head) % ALIGNMENT == 0
        assert head.endswith(b" ") or head.endswith(b"}")


def test_read_header_round_trip() -> None:
    blob = _file({"k.0": np.ones((1, 1, 2, 3)), "v.0": np.zeros((1, 1, 2, 3))}, {"a": "b"})
    start, tensors = read_header(blob, len(blob))
    assert start % ALIGNMENT == 0
    assert tensors["k.0"].shape == (1, 1, 2, 3) and tensors["k.0"].dtype == "F16"
    assert (tensors["k.0"].begin, tensors["v.0"].begin, tensors["v.0"].end) == (0, 12, 24)
    assert start + 24 == len(blob)


def test_empty_tensors_and_no_metadata() -> None:
    blob = _file({"e": np.zeros((0, 4))})
    start, tensors = read_header(blob, len(blob))
    assert tensors["e"].nbytes == 0 and start == len(blob)
    assert load(blob)["e"].shape == (0, 4)


def _raw(header: object, data: bytes = b"") -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


@pytest.mark.parametrize(
    ("blob", "why"),
    [
        (b"\x01\x00", "length prefix"),
        (struct.pack("<Q", MAX_HEADER_BYTES + 1) + b"{}", "exceeds"),
        (struct.pack("<Q", 100) + b"{}", "runs past"),
        (struct.pack("<Q", 2) + b"\xff\xfe", "not JSON"),
        (_raw([1, 2]), "not a JSON object"),
        (_raw({"t": 3}), "not an object"),
        (_raw({"t": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}}, b"\0" * 8), "dtype"),
        (_raw({"t": {"dtype": "F16", "shape": [-1], "data_offsets": [0, 2]}}, b"\0" * 2), "shape"),
        (
            _raw({"t": {"dtype": "F16", "shape": [True], "data_offsets": [0, 2]}}, b"\0" * 2),
            "shape",
        ),
        (_raw({"t": {"dtype": "F16", "shape": [1], "data_offsets": [0]}}, b"\0" * 2), "offsets"),
        (
            _raw({"t": {"dtype": "F16", "shape": [2], "data_offsets": [0, 2]}}, b"\0" * 2),
            "bytes for",
        ),
        (
            _raw({"t": {"dtype": "F16", "shape": [1], "data_offsets": [2, 4]}}, b"\0" * 4),
            "begins at",
        ),
        (
            _raw(
                {
                    "a": {"dtype": "F16", "shape": [1], "data_offsets": [0, 2]},
                    "b": {"dtype": "F16", "shape": [1], "data_offsets": [0, 2]},
                },
                b"\0" * 2,
            ),
            "begins at",
        ),
        (
            _raw({"t": {"dtype": "F16", "shape": [1], "data_offsets": [0, 2]}}, b"\0" * 3),
            "the file",
        ),
        (_raw({"t": {"dtype": "F16", "shape": [1], "data_offsets": [0, 2]}}), "the file"),
    ],
)
def test_read_header_refuses(blob: bytes, why: str) -> None:
    with pytest.raises(FormatError, match=why):
        read_header(blob, len(blob))


def test_build_header_refuses_bad_specs() -> None:
    with pytest.raises(FormatError, match="reserved"):
        build_header([("__metadata__", "F16", (1,))])
    with pytest.raises(FormatError, match="reserved or repeated"):
        build_header([("a", "F16", (1,)), ("a", "F16", (1,))])
    with pytest.raises(FormatError, match="dtype"):
        build_header([("a", "Q4", (1,))])
    with pytest.raises(FormatError, match="negative"):
        build_header([("a", "F16", (-1,))])


@given(st.binary(max_size=300), st.integers(min_value=0, max_value=1 << 40))
def test_garbage_is_a_format_error(blob: bytes, size: int) -> None:
    # Any other exception fails the test: garbage is a FormatError or a header.
    with contextlib.suppress(FormatError):
        read_header(blob, size)


@given(
    st.lists(
        st.tuples(st.integers(0, 4), st.integers(0, 4), st.integers(0, 3)), min_size=1, max_size=6
    ),
    st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3),
)
def test_any_layout_round_trips_through_both_readers(
    shapes: list[tuple[int, int, int]], metadata: dict[str, str]
) -> None:
    arrays = {
        f"t{i}": np.arange(np.prod(s), dtype=np.float16).reshape(s) for i, s in enumerate(shapes)
    }
    blob = _file(arrays, metadata)
    _, tensors = read_header(blob, len(blob))
    assert {n: t.shape for n, t in tensors.items()} == {n: a.shape for n, a in arrays.items()}
    loaded = load(blob)
    for name, a in arrays.items():
        np.testing.assert_array_equal(loaded[name], a)
