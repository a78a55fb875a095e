"""The request decoder: whole, byte by byte, garbage, limits, and against hiredis."""

from __future__ import annotations

import re

import hiredis
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pion.config import ProtocolLimits
from pion.errors import ProtocolError
from pion.resp.decoder import RequestDecoder, split_inline


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
