"""The request decoder: whole, byte by byte, garbage, limits, and against hiredis;
large bulks received in place. Every test runs with the pure-Python batch scanner and,
when it is built, with the compiled one."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import hiredis
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pion.config import ProtocolLimits
from pion.errors import ProtocolError
from pion.resp import decoder as decoder_module
from pion.resp import scan as scan_module
from pion.resp.decoder import DIRECT_BULK_MIN, RequestDecoder, split_inline

_IMPLS: list[str] = ["python"] + (["compiled"] if scan_module.COMPILED else [])


@pytest.fixture(autouse=True, scope="module", params=_IMPLS)
def implementation(request: pytest.FixtureRequest) -> Iterator[str]:
    """The scanner and in-place buffer the decoder uses (module-scoped, so hypothesis
    tests run under it too)."""
    saved = decoder_module.scan, decoder_module.BulkWriter
    if request.param == "python":
        decoder_module.scan = scan_module.py_scan
        decoder_module.BulkWriter = scan_module.PyBulkWriter  # type: ignore[misc]
    try:
        yield request.param
    finally:
        decoder_module.scan, decoder_module.BulkWriter = saved  # type: ignore[misc]


def encode(args: list[bytes]) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


def drain(dec: RequestDecoder) -> list[list[bytes]]:
    out = []
    while (cmd := dec.get()) is not None:
        out.append(cmd)
    return out


commands = st.lists(st.lists(st.binary(max_size=40), min_size=1, max_size=6), max_size=8)


@given(commands)
def test_whole_and_byte_by_byte_agree(cmds: list[list[bytes]]) -> None:
    wire = b"".join(encode(c) for c in cmds)
    whole = RequestDecoder()
    whole.feed(wire)
    assert drain(whole) == cmds
    dec = RequestDecoder()
    got: list[list[bytes]] = []
    for i in range(len(wire)):
        dec.feed(wire[i : i + 1])
        got.extend(drain(dec))
    assert got == cmds
    assert dec.buffered == 0


@given(commands)
def test_differential_against_hiredis(cmds: list[list[bytes]]) -> None:
    """hiredis parses the same bytes (as replies) into the same argument lists."""
    wire = b"".join(encode(c) for c in cmds)
    reader = hiredis.Reader()
    reader.feed(wire)
    expected = []
    while (item := reader.gets()) is not False:
        expected.append(item)
    dec = RequestDecoder()
    dec.feed(wire)
    assert drain(dec) == expected


@settings(max_examples=300)
@given(st.binary(max_size=300))
def test_garbage_yields_frames_or_protocol_error(data: bytes) -> None:
    dec = RequestDecoder(ProtocolLimits(max_inline_len=64, max_bulk_len=1000))
    dec.feed(data)
    try:
        for cmd in drain(dec):
            assert isinstance(cmd, list)
            assert all(isinstance(a, bytes) for a in cmd)
    except ProtocolError:
        pass


def test_inline_commands() -> None:
    dec = RequestDecoder()
    dec.feed(b"PING\r\nset  a 'b c'\n\r\n  \r\necho \"x\\ty\\x41\"\r\n")
    assert drain(dec) == [[b"PING"], [b"set", b"a", b"b c"], [b"echo", b"x\tyA"]]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b"a b", [b"a", b"b"]),
        (b"  a   b  ", [b"a", b"b"]),
        (b'"a b" c', [b"a b", b"c"]),
        (b"'it\\'s'", [b"it's"]),
        (b'"\\n\\r\\t\\b\\a\\\\\\""', [b'\n\r\t\b\a\\"']),
        (b"", []),
    ],
)
def test_split_inline(line: bytes, expected: list[bytes]) -> None:
    assert split_inline(line) == expected


@pytest.mark.parametrize("line", [b'"abc', b"'abc", b'"a"b', b"'a'b"])
def test_unbalanced_quotes(line: bytes) -> None:
    with pytest.raises(ProtocolError, match="unbalanced quotes"):
        split_inline(line)


@pytest.mark.parametrize(
    ("wire", "message"),
    [
        (b"*abc\r\n", "invalid multibulk length"),
        (b"*2000000\r\n", "invalid multibulk length"),
        (b"*1\r\n$-5\r\n", "invalid bulk length"),
        (b"*1\r\n$x\r\n", "invalid bulk length"),
        (b"*1\r\n$1000000000000\r\n", "invalid bulk length"),
        (b"*1\r\n:5\r\n", "expected '$', got ':'"),
        (b"*1\r\n$3\r\nabcXY", "not terminated by CRLF"),
        (b"*" + b"1" * 40, "too big mbulk count string"),
    ],
)
def test_protocol_errors(wire: bytes, message: str) -> None:
    dec = RequestDecoder()
    dec.feed(wire)
    with pytest.raises(ProtocolError, match=re.escape(message)):
        dec.get()


def test_oversized_bulk_header_refused_before_payload() -> None:
    """The limit is enforced when the header line arrives, not after buffering."""
    dec = RequestDecoder(ProtocolLimits(max_bulk_len=1024))
    dec.feed(b"*2\r\n$3\r\nSET\r\n$1025\r\n")
    with pytest.raises(ProtocolError, match="invalid bulk length"):
        dec.get()


def test_query_buffer_limit_sums_declared_bulks() -> None:
    dec = RequestDecoder(ProtocolLimits(max_bulk_len=600, max_query_buffer=1000))
    dec.feed(b"*3\r\n$500\r\n" + b"a" * 500 + b"\r\n$501\r\n")
    with pytest.raises(ProtocolError, match="query buffer"):
        dec.get()


def test_inline_line_limit() -> None:
    dec = RequestDecoder(ProtocolLimits(max_inline_len=16))
    dec.feed(b"x" * 17)
    with pytest.raises(ProtocolError, match="too big inline request"):
        dec.get()
    ok = RequestDecoder(ProtocolLimits(max_inline_len=16))
    ok.feed(b"x" * 10)
    assert ok.get() is None


def test_empty_multibulk_is_skipped() -> None:
    dec = RequestDecoder()
    dec.feed(b"*0\r\n*-1\r\n*1\r\n$4\r\nPING\r\n")
    assert drain(dec) == [[b"PING"]]


def test_large_bulk_split_across_feeds() -> None:
    payload = bytes(range(256)) * 4096
    wire = encode([b"V.STOREBATCH", payload])
    dec = RequestDecoder()
    for i in range(0, len(wire), 65536):
        dec.feed(wire[i : i + 65536])
    assert drain(dec) == [[b"V.STOREBATCH", payload]]


@pytest.mark.parametrize(
    ("wire", "message"),
    [
        (b"*01\r\n$4\r\nPING\r\n", "invalid multibulk length"),
        (b"*00\r\n", "invalid multibulk length"),
        (b"*-0\r\n", "invalid multibulk length"),
        (b"*-01\r\n", "invalid multibulk length"),
        (b"*+1\r\n", "invalid multibulk length"),
        (b"*1\r\n$04\r\nPING\r\n", "invalid bulk length"),
        (b"*1\r\n$00\r\n\r\n", "invalid bulk length"),
        (b"*1\r\n$+4\r\nPING\r\n", "invalid bulk length"),
        (b"*1\r\n$ 4\r\nPING\r\n", "invalid bulk length"),
    ],
)
def test_leading_zeros_and_signs_are_protocol_errors(wire: bytes, message: str) -> None:
    """Lengths are read as Redis's string2ll reads them."""
    dec = RequestDecoder()
    dec.feed(wire)
    with pytest.raises(ProtocolError, match=re.escape(message)):
        dec.get()


def test_zero_lengths_are_fine() -> None:
    dec = RequestDecoder()
    dec.feed(b"*0\r\n*2\r\n$4\r\nECHO\r\n$0\r\n\r\n*-1\r\n*-10\r\n")
    assert drain(dec) == [[b"ECHO", b""]]


@settings(max_examples=300)
@given(st.binary(max_size=300), st.lists(st.binary(max_size=40), min_size=1, max_size=14))
def test_unauthenticated_garbage_and_commands(data: bytes, args: list[bytes]) -> None:
    """Before AUTH: any bytes give frames or a ProtocolError, and a well-formed
    multibulk is returned only within the budget."""
    dec = RequestDecoder(ProtocolLimits(max_unauth_bulk_len=32))
    dec.authenticated = False
    dec.feed(data)
    try:
        for cmd in drain(dec):
            assert all(isinstance(a, bytes) for a in cmd)
    except ProtocolError:
        pass
    dec = RequestDecoder(ProtocolLimits(max_unauth_bulk_len=32))
    dec.authenticated = False
    dec.feed(encode(args))
    within = len(args) <= 10 and all(len(a) <= 32 for a in args)
    try:
        assert drain(dec) == [args]
        assert within
    except ProtocolError as exc:
        assert not within
        assert exc.message.startswith("unauthenticated")


def _unauth(limits: ProtocolLimits | None = None) -> RequestDecoder:
    dec = RequestDecoder(limits)
    dec.authenticated = False
    return dec


@pytest.mark.parametrize(
    ("wire", "message"),
    [
        (b"*11\r\n", "unauthenticated multibulk length"),
        (b"*2\r\n$4\r\nAUTH\r\n$16385\r\n", "unauthenticated bulk length"),
        (b"*2\r\n$4\r\nAUTH\r\n$536870912\r\n", "unauthenticated bulk length"),
        # Over the authenticated limits too: the general text, as in Redis.
        (b"*2000000\r\n", "invalid multibulk length"),
        (b"*1\r\n$999999999999\r\n", "invalid bulk length"),
    ],
)
def test_unauthenticated_limits_refuse_at_the_header(wire: bytes, message: str) -> None:
    dec = _unauth()
    dec.feed(wire)  # no payload follows: refused before it is waited for
    with pytest.raises(ProtocolError, match=re.escape(message)):
        dec.get()


def test_unauthenticated_limits_allow_auth_and_hello() -> None:
    dec = _unauth()
    hello = [b"HELLO", b"3", b"AUTH", b"default", b"p" * 16384, b"SETNAME", b"n"]
    dec.feed(encode([b"AUTH", b"x" * 16384]) + encode(hello) + encode([b"PING"] * 10))
    assert drain(dec) == [[b"AUTH", b"x" * 16384], hello, [b"PING"] * 10]


def test_authenticating_between_commands_lifts_the_limits() -> None:
    """The caller flips the flag after AUTH runs; the next command already in the
    buffer is checked against the full limits."""
    big = b"y" * 100_000
    dec = _unauth()
    dec.feed(encode([b"AUTH", b"pw"]) + encode([b"ECHO", big]))
    assert dec.get() == [b"AUTH", b"pw"]
    dec.authenticated = True
    assert dec.get() == [b"ECHO", big]


def test_unauthenticated_limits_are_configurable() -> None:
    dec = _unauth(ProtocolLimits(max_unauth_array_len=2, max_unauth_bulk_len=4))
    dec.feed(encode([b"AUTH", b"abcd"]))
    assert dec.get() == [b"AUTH", b"abcd"]
    dec.feed(encode([b"AUTH", b"abcde"]))
    with pytest.raises(ProtocolError, match="unauthenticated bulk length"):
        dec.get()
    dec = _unauth(ProtocolLimits(max_unauth_array_len=2, max_unauth_bulk_len=4))
    dec.feed(b"*3\r\n")
    with pytest.raises(ProtocolError, match="unauthenticated multibulk length"):
        dec.get()


def test_held_counts_the_buffer_and_a_partial_command() -> None:
    dec = RequestDecoder()
    assert dec.held == 0
    dec.feed(b"*3\r\n$3\r\nSET\r\n$5000\r\n" + b"a" * 5000 + b"\r\n$10\r\n12345")
    assert dec.get() is None
    # The 5000-byte argument was copied out and the buffer not yet compacted.
    assert dec.held >= 5000 + 5000
    dec.feed(b"67890\r\n")
    assert dec.get() == [b"SET", b"a" * 5000, b"1234567890"]
    assert dec.get() is None
    assert dec.held == 0
    dec.feed(b"*2\r\n$4\r\nECHO\r\n$100\r\nabc")
    assert dec.get() is None
    assert dec.held > 0
    dec.clear()
    assert dec.held == 0
    assert dec.buffered == 0


# -- large bulks received in place ---------------------------------------------------


def receive(dec: RequestDecoder, wire: bytes, chunk: int) -> list[list[bytes]]:
    """Drive the decoder as an asyncio.BufferedProtocol's transport does: ask for a
    buffer, write at most ``chunk`` bytes into it, report them, run the commands."""
    scratch = memoryview(bytearray(chunk))
    got: list[list[bytes]] = []
    i = 0
    while i < len(wire):
        target = dec.get_buffer(scratch)
        n = min(len(target), chunk, len(wire) - i)
        assert n > 0
        target[:n] = wire[i : i + n]
        del target
        dec.buffer_updated(scratch, n)
        i += n
        got.extend(drain(dec))
    return got


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.lists(st.binary(max_size=20), min_size=1, max_size=3),
            st.integers(DIRECT_BULK_MIN, DIRECT_BULK_MIN + 70_000).map(
                lambda n: [b"V.STOREBATCH", b"s", bytes([n % 251]) * n]
            ),
        ),
        min_size=1,
        max_size=5,
    ),
    st.sampled_from([1000, 4096, 65536, 262144]),
)
def test_large_bulks_received_in_place(cmds: list[list[bytes]], chunk: int) -> None:
    """Any mix of small commands and large bulks, through get_buffer/buffer_updated
    with any read size, gives the same commands as feeding them whole."""
    wire = b"".join(encode(c) for c in cmds)
    dec = RequestDecoder()
    assert receive(dec, wire, chunk) == cmds
    assert dec.buffered == 0
    assert dec.held == 0


def test_in_place_buffer_is_the_argument() -> None:
    """Once a large bulk's header is read, the reads go into a buffer of its exact
    size, except its last bytes, which come through the scratch buffer."""
    payload = bytes(range(256)) * 1024  # 256 KiB
    wire = encode([b"SET", b"k", payload])
    dec = RequestDecoder()
    scratch = memoryview(bytearray(65536))
    head = len(wire) - len(payload) - 2
    first = dec.get_buffer(scratch)
    assert first.obj is scratch.obj
    first[: head + 100] = wire[: head + 100]
    dec.buffer_updated(scratch, head + 100)
    assert dec.get() is None
    assert dec.held >= len(payload)  # charged in full as soon as the header is read
    target = dec.get_buffer(scratch)
    assert target.obj is not scratch.obj
    assert len(target) == len(payload) - 100 - 64
    target[:] = wire[head + 100 : head + len(payload) - 64]
    n = len(target)
    del target
    dec.buffer_updated(scratch, n)
    assert dec.get() is None
    last = dec.get_buffer(scratch)
    assert last.obj is scratch.obj
    rest = wire[head + len(payload) - 64 :] + encode([b"PING"])
    last[: len(rest)] = rest
    dec.buffer_updated(scratch, len(rest))
    assert drain(dec) == [[b"SET", b"k", payload], [b"PING"]]
    assert dec.held == 0


def test_in_place_bulk_must_end_with_crlf() -> None:
    payload = b"x" * DIRECT_BULK_MIN
    dec = RequestDecoder()
    dec.feed(b"*2\r\n$4\r\nECHO\r\n$%d\r\nxx" % len(payload))
    assert dec.get() is None
    dec.feed(payload[2:])
    assert dec.get() is None
    dec.feed(b"\r")
    assert dec.get() is None
    dec.feed(b"X")
    with pytest.raises(ProtocolError, match="not terminated by CRLF"):
        dec.get()


def test_in_place_bulk_dropped_with_the_connection() -> None:
    dec = RequestDecoder()
    dec.feed(b"*2\r\n$4\r\nECHO\r\n$10000000\r\nabc")
    assert dec.get() is None
    assert dec.held >= 10_000_000
    dec.clear()
    assert dec.held == 0
    dec.feed(encode([b"PING"]))
    assert dec.get() == [b"PING"]


def test_batch_waiting_is_counted_as_held() -> None:
    """Commands parsed ahead (the batch path) are still the client's query buffer."""
    wire = b"".join(encode([b"ECHO", b"%d" % i]) for i in range(50))
    dec = RequestDecoder()
    dec.feed(wire)
    assert dec.get() == [b"ECHO", b"0"]
    assert dec.held > 0
    assert dec.buffered > 0
    assert len(drain(dec)) == 49
    assert dec.buffered == 0


def test_unauthenticated_batch_respects_the_budget() -> None:
    """Before AUTH the batch path is bounded by the unauthenticated limits: the
    command over them reaches the exact parser, which refuses it in Redis's words."""
    dec = RequestDecoder(ProtocolLimits(max_unauth_array_len=2))
    dec.authenticated = False
    dec.feed(encode([b"AUTH", b"pw"]) + encode([b"PING"]) + encode([b"A", b"B", b"C"]))
    assert dec.get() == [b"AUTH", b"pw"]
    assert dec.get() == [b"PING"]
    with pytest.raises(ProtocolError, match="unauthenticated multibulk length"):
        dec.get()


def test_mixed_inline_and_batches(implementation: Any) -> None:
    wire = encode([b"A"]) * 3 + b"PING\r\n" + encode([b"B"]) * 3 + b"*0\r\n" + encode([b"C"])
    dec = RequestDecoder()
    dec.feed(wire)
    assert drain(dec) == [[b"A"]] * 3 + [[b"PING"]] + [[b"B"]] * 3 + [[b"C"]]
