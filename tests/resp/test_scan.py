"""The decoder's batch scanner and in-place bulk buffer: each implementation (pure
Python always, compiled when it was built) against the contract in ``scan.py``, and
the two against each other on random and hostile input."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pion.resp import scan as scan_module
from pion.resp.scan import COMPILED, PyBulkWriter, py_scan

Scan = Callable[..., tuple[list[list[bytes]], int]]

SCANS: list[Any] = [pytest.param(py_scan, id="python")]
WRITERS: list[Any] = [pytest.param(PyBulkWriter, id="python")]
if COMPILED:
    SCANS.append(pytest.param(scan_module.scan, id="compiled"))
    WRITERS.append(pytest.param(scan_module.BulkWriter, id="compiled"))

BIG = 1 << 30


def encode(args: list[bytes]) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def test_compiled_twin_is_built_where_required() -> None:
    """`make test` builds the compiled twin and sets PION_REQUIRE_SPEEDUPS, so a
    build that silently fell back to pure Python cannot pass as tested."""
    if os.environ.get("PION_REQUIRE_SPEEDUPS") == "1":
        assert COMPILED, "pion.resp._speedups is not built: run scripts/build-speedups"


@pytest.mark.parametrize("scan", SCANS)
def test_parses_whole_commands_and_stops_at_a_partial_one(scan: Scan) -> None:
    wire = encode([b"SET", b"a", b"1"]) + encode([b"GET", b""]) + b"*2\r\n$3\r\nGET\r\n$1\r\n"
    cmds, pos = scan(bytearray(wire), 0, 100, 100, BIG, 100)
    assert cmds == [[b"SET", b"a", b"1"], [b"GET", b""]]
    assert wire[pos:] == b"*2\r\n$3\r\nGET\r\n$1\r\n"


@pytest.mark.parametrize("scan", SCANS)
@pytest.mark.parametrize(
    "tail",
    [
        b"PING\r\n",  # inline
        b"*0\r\n",  # empty: the exact parser skips it
        b"*-1\r\n",
        b"*01\r\n$1\r\na\r\n",  # leading zero
        b"*+1\r\n$1\r\na\r\n",
        b"*1\r\n$-1\r\n",
        b"*1\r\n$01\r\na\r\n",
        b"*1\r\n:1\r\n",  # not a bulk
        b"*1\r\n$1\r\naXY",  # not terminated by CRLF
        b"*1\r\n$1 \r\na\r\n",
        b"*1\r\n$1234567890123456789\r\n",  # more digits than the fast path reads
        b"*3\r\n$1\r\na\r\n",  # fewer elements than declared (incomplete)
        b"*1\r\n$5\r\nab",  # incomplete payload
        b"*1\r\n$5",  # incomplete header
    ],
)
def test_stops_before_anything_else(scan: Scan, tail: bytes) -> None:
    head = encode([b"PING"])
    cmds, pos = scan(bytearray(head + tail + head), 0, 100, 100, BIG, 100)
    assert cmds == [[b"PING"]]
    assert pos == len(head)


@pytest.mark.parametrize("scan", SCANS)
def test_bounds_stop_the_scan(scan: Scan) -> None:
    first = encode([b"a", b"bb"])
    wire = first + encode([b"a", b"b", b"c"]) + encode([b"x" * 10])
    # max_args 2: the three-argument command stops it.
    assert scan(bytearray(wire), 0, 2, 100, BIG, 100) == ([[b"a", b"bb"]], len(first))
    # max_bulk 1: the first command's "bb" stops it.
    assert scan(bytearray(wire), 0, 5, 1, BIG, 100) == ([], 0)
    # max_frame 2: "a" + "bb" declares 3 bytes.
    assert scan(bytearray(wire), 0, 5, 100, 2, 100) == ([], 0)
    # max_cmds 2 of 3.
    cmds, _ = scan(bytearray(wire), 0, 5, 100, BIG, 2)
    assert len(cmds) == 2
    # From an offset.
    assert scan(bytearray(wire), len(first), 5, 100, BIG, 100)[0][0] == [b"a", b"b", b"c"]


@pytest.mark.parametrize("scan", SCANS)
def test_accepts_bytes_and_empty(scan: Scan) -> None:
    assert scan(b"", 0, 1, 1, 1, 1) == ([], 0)
    assert scan(bytearray(b"*"), 0, 1, 1, 1, 1) == ([], 0)
    assert scan(encode([b"x"]), 0, 1, 1, 1, 1) == ([[b"x"]], 11)


commands = st.lists(st.lists(st.binary(max_size=30), min_size=1, max_size=6), max_size=8)


@settings(max_examples=400)
@given(
    commands,
    st.lists(st.tuples(st.integers(0, 10_000), st.sampled_from(b"*$:\r\n0123-+x")), max_size=3),
    st.integers(0, 10_000),
    st.tuples(
        st.sampled_from([1, 2, 6, 100]),
        st.sampled_from([0, 5, 30, 100]),
        st.sampled_from([0, 10, 1000, BIG]),
        st.sampled_from([1, 3, 256]),
    ),
)
def test_twins_agree_on_mutated_input(
    cmds: list[list[bytes]],
    mutations: list[tuple[int, int]],
    cut: int,
    bounds: tuple[int, int, int, int],
) -> None:
    """Both implementations return the same commands and stop at the same offset, on
    well-formed input damaged at random places and cut anywhere; and what they return
    is exactly what the reference parser of the well-formed prefix gives."""
    wire = bytearray(b"".join(encode(c) for c in cmds))
    for at, byte in mutations:
        if wire:
            wire[at % len(wire)] = byte
    wire = wire[: cut % (len(wire) + 1)]
    max_args, max_bulk, _, _ = bounds
    expected = py_scan(wire, 0, *bounds)
    if COMPILED:
        assert scan_module.scan(wire, 0, *bounds) == expected
    got, pos = expected
    # What was accepted re-encodes to exactly the bytes it consumed.
    assert b"".join(encode(c) for c in got) == bytes(wire[:pos])
    assert all(1 <= len(c) <= max_args and all(len(a) <= max_bulk for a in c) for c in got)


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_garbage_never_raises(data: bytes) -> None:
    for fn in [py_scan] + ([scan_module.scan] if COMPILED else []):
        cmds, pos = fn(bytearray(data), 0, 1000, 1000, BIG, 1000)
        assert 0 <= pos <= len(data)
        assert b"".join(encode(c) for c in cmds) == data[:pos]


@pytest.mark.parametrize("writer", WRITERS)
def test_bulk_writer_fills_then_hands_over(writer: Any) -> None:
    w = writer(10)
    assert len(w) == 10
    assert w.filled == 0
    with w.view() as v:
        v[:4] = b"abcd"
    w.advance(4)
    with pytest.raises(RuntimeError, match="not filled"):
        w.take()
    with w.view() as v:
        v[4:] = b"efghij"
    w.advance(6)
    with pytest.raises(ValueError, match="past the end"):
        w.advance(1)
    data = w.take()
    assert data == b"abcdefghij"
    assert type(data) is bytes
    with pytest.raises(RuntimeError, match="already taken"):
        w.take()
    with pytest.raises(BufferError):
        w.view()


@pytest.mark.parametrize("writer", WRITERS)
def test_bulk_writer_with_a_view_still_alive_hands_over_a_copy(writer: Any) -> None:
    """A writable view kept by someone cannot change the bytes handed out."""
    w = writer(3)
    stale = w.view()
    stale[:] = b"abc"
    w.advance(3)
    data = w.take()
    stale[:] = b"xyz"
    assert data == b"abc"


@pytest.mark.parametrize("writer", WRITERS)
def test_bulk_writer_refuses_bad_sizes(writer: Any) -> None:
    with pytest.raises(ValueError):
        writer(-1)
    w = writer(0)
    assert w.take() == b""
    w = writer(2)
    with pytest.raises(ValueError):
        w.advance(-1)
