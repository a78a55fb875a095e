"""V.CREATE / V.STOREBATCH / V.FETCH / V.INFO over real TCP with redis-py: every happy
path, every error text, zero-filled rows, idempotent create, eviction and the budget."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import redis

from pion.codecs import FORMAT_NAMES, get_codec
from pion.server.run import ServerThread
from support import data_budget

WANT = "int8|turbo4|turbo3|turbo2|fp16|fp8|mlx4g32"


def f32(n: int, dim: int, seed: int = 0) -> npt.NDArray[np.float32]:
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)


def err(client: redis.Redis, *args: Any) -> str:
    with pytest.raises(redis.ResponseError) as info:
        client.execute_command(*args)
    return str(info.value)


def info_of(client: redis.Redis, *args: Any) -> dict[str, str]:
    raw = client.execute_command("V.INFO", *args)
    assert isinstance(raw, bytes) and raw.endswith(b"\r\n")
    return dict(line.split(":", 1) for line in raw.decode().split("\r\n") if line)


# -- V.CREATE ------------------------------------------------------------------------


def test_create_uniform_defaults_to_int8_and_is_idempotent(client: redis.Redis) -> None:
    assert client.execute_command("V.CREATE", "a", 64) == 0
    assert client.execute_command("V.CREATE", "b", 32, "vquant", "FP16") == 1
    assert client.execute_command("V.CREATE", "a", 128, "VQUANT", "turbo2") == 0
    assert info_of(client, "a") == {
        "session_idx": "0",
        "value_dim": "64",
        "v_format": "int8",
        "num_layers": "0",
        "schema": "uniform",
        "total_tokens": "0",
    }
    assert info_of(client, "b")["v_format"] == "fp16"


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_create_every_format(client: redis.Redis, fmt: str) -> None:
    assert client.execute_command("V.CREATE", f"s-{fmt}", 100, "VQUANT", fmt) == 0
    x = f32(3, 100)
    assert client.execute_command("V.STOREBATCH", f"s-{fmt}", 0, 0, 3, x.tobytes()) == b"OK"
    got = np.frombuffer(client.execute_command("V.FETCH", f"s-{fmt}", 0, "RANGE", 0, 3), "<f4")
    codec = get_codec(fmt)
    np.testing.assert_array_equal(got.reshape(3, 100), codec.decode(codec.encode(x), 100))


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (("s", 0), "invalid value_dim (must be 1-8192)"),
        (("s", 8193), "invalid value_dim (must be 1-8192)"),
        (("s", "-1"), "invalid value_dim (must be 1-8192)"),
        (("s", "12x"), "value is not an integer or out of range"),
        (("s", "012"), "value is not an integer or out of range"),
        (("s", 8, "VQUANT", "fp32"), f"V.CREATE: unknown VQUANT format 'fp32' (want {WANT})"),
        (("s", 8, "VQUANT"), f"V.CREATE: VQUANT requires a format (want {WANT})"),
        (("s", 8, "QUANT", "fp16"), "V.CREATE: unknown option 'QUANT' (expected VQUANT <fmt>)"),
        (("s",), "wrong number of arguments for 'v.create' command"),
        (("s", "SCHEMA"), "V.CREATE SCHEMA requires N (layer count)"),
        (("s", "SCHEMA", 0), "V.CREATE SCHEMA: N must be 1-59"),
        # Pion's word ("exceeds") and ours, both: tools grep for either.
        (("s", "SCHEMA", 60, *["dim=8"] * 60), "V.CREATE SCHEMA: N 60 exceeds 59 (N must be 1-59"),
        (("s", "SCHEMA", 60, "dim=8"), "exceeds 59"),
        (("s", "SCHEMA", 2, "dim=8"), "V.CREATE SCHEMA: expected 2 layer specs, got 1"),
        (("s", "SCHEMA", 1, "dim=8", "dim=8"), "V.CREATE SCHEMA: expected 1 layer specs, got 2"),
        (("s", "SCHEMA", 1, "fmt=fp16"), "V.CREATE SCHEMA: layer 0 missing dim and no default"),
        (("s", 0, "SCHEMA", 1, "fmt=fp16"), "V.CREATE SCHEMA: layer 0 missing dim"),
        (("s", 9000, "SCHEMA", 1, "fmt=fp16"), "V.CREATE SCHEMA: default_dim must be 0-8192"),
        (("s", 8, "SCHEMA", 2, "fmt=fp16", "fmt=q4"), "V.CREATE SCHEMA: layer 1 unknown fmt 'q4'"),
        (("s", 8, "SCHEMA", 1, "fmt=fp16,dim=0"), "V.CREATE SCHEMA: layer 0 dim must be 1-8192"),
        (("s", 8, "SCHEMA", 1, "dim=abc"), "V.CREATE SCHEMA: layer 0 dim must be 1-8192"),
        (("s", 8, "SCHEMA", 1, "rope=4"), "layer 0 rope= applies only to fmt=bf16_rope_fp8_body"),
        (("s", 8, "SCHEMA", 1, "fmt=int8,s=fp16"), "V.CREATE SCHEMA: layer 0 S-tensor reserved"),
        (("s", 8, "SCHEMA", 1, "S=1"), "S-tensor reserved"),
        (("s", 0, "SCHEMA", 1, "fmt=bf16_rope_fp8_body,dim=64"), "needs rope=N (0 < N < dim)"),
        (
            ("s", 0, "SCHEMA", 1, "fmt=bf16_rope_fp8_body,dim=64,rope=64"),
            "layer 0 bf16_rope_fp8_body needs rope=N (0 < N < dim): rope 64 >= dim 64",
        ),
        (("s", 0, "SCHEMA", 1, "fmt=bf16_rope_fp8_body,dim=64,rope=0"), "rope must be 1-8191"),
        (("s", 0, "SCHEMA", 1, "fmt=bf16_rope_fp8_body,dim=64,rope=x"), "rope must be 1-8191"),
        (("s", 0, "SCHEMA", 1, "fmt=bf16_rope_fp8_body,rope=8"), "missing dim"),
        (("s", 64, "VQUANT", "bf16_rope_fp8_body"), "requires the SCHEMA form"),
        (
            ("s", 64, "VQUANT", "BF16_ROPE_FP8_BODY"),
            "requires the SCHEMA form with a per-layer rope",
        ),
        (("s", 8, "SCHEMA", 1, "dim=8," + "x" * 300), "spec longer than 256 bytes"),
        (("s", 8, "SCHEMA", 1, "fmt=fp16,"), "V.CREATE SCHEMA: layer 0 unknown key ''"),
    ],
)
def test_create_errors(client: redis.Redis, args: tuple[Any, ...], text: str) -> None:
    assert text in err(client, "V.CREATE", *args)
    assert client.execute_command("V.INFO").startswith(b"enabled:1\r\nsessions:0\r\n")


def test_create_schema_forms(client: redis.Redis) -> None:
    # The Pion client's form: default_dim 0, every spec carries dim=.
    specs = ["fmt=fp16,dim=64", "fmt=turbo4,dim=64", "FMT=int8,DIM=32"]
    assert client.execute_command("V.CREATE", "k", 0, "SCHEMA", 3, *specs) == 0
    assert client.execute_command("V.CREATE", "v", "schema", 2, "dim=16", "fmt=fp8,dim=8") == 1
    assert client.execute_command("V.CREATE", "d", 48, "SCHEMA", 2, "fmt=fp16", "dim=24") == 2
    assert client.execute_command("V.CREATE", "k", 0, "SCHEMA", 1, "fmt=fp8,dim=8") == 0
    info = info_of(client, "k")
    assert info["schema"] == "heterogeneous" and info["num_layers"] == "3"
    assert (info["layer_2_dim"], info["layer_2_fmt"]) == ("32", "int8")
    assert (info["layer_0_fmt"], info["layer_1_fmt"]) == ("fp16", "turbo4")
    d = info_of(client, "d")
    assert (d["value_dim"], d["layer_0_dim"], d["layer_1_dim"], d["layer_1_fmt"]) == (
        "48",
        "48",
        "24",
        "int8",
    )
    same = client.execute_command("V.CREATE", "u", 16, "SCHEMA", 2, "fmt=fp16", "fmt=fp16")
    assert same == 3 and info_of(client, "u")["schema"] == "uniform"
    x = f32(5, 24)
    assert client.execute_command("V.STOREBATCH", "d", 1, 0, 5, x.tobytes()) == b"OK"
    assert "beyond this session's SCHEMA of 2" in err(
        client, "V.STOREBATCH", "d", 2, 0, 5, x.tobytes()
    )


# -- V.STOREBATCH --------------------------------------------------------------------


def test_storebatch_fp32_and_f16(client: redis.Redis) -> None:
    client.execute_command("V.CREATE", "h", 8, "VQUANT", "fp16")
    client.execute_command("V.CREATE", "q", 8, "VQUANT", "int8")
    bits = np.arange(0x7BF0, 0x7C30, dtype="<u2").reshape(8, 8)  # runs into inf/NaN bits
    assert client.execute_command("V.STOREBATCH", "h", 0, 0, 8, bits.tobytes(), "FMT", "F16")
    native = client.execute_command("V.FETCH", "h", 0, "RANGE", 0, 8, "FMT", "NATIVE")
    assert native == bits.tobytes()  # verbatim, unvalidated
    x = f32(8, 8).astype("<f2")
    assert client.execute_command("V.STOREBATCH", "q", 3, 0, 8, x.tobytes(), "fmt", "f16")
    got = np.frombuffer(client.execute_command("V.FETCH", "q", 3, "RANGE", 0, 8), "<f4")
    np.testing.assert_allclose(got.reshape(8, 8), x.astype(np.float32), atol=0.05)
    bad = x.copy()
    bad[6, 2] = np.inf
    assert "layer 3 row 16: non-finite value" in err(
        client, "V.STOREBATCH", "q", 3, 10, 8, bad.tobytes(), "FMT", "F16"
    )
    big = f32(4, 8)
    big[1, 1] = 7e4
    assert "layer 0 row 3: value 70000 overflows fp16" in err(
        client, "V.STOREBATCH", "h", 0, 2, 4, big.tobytes()
    )


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (("nope", 0, 0, 1, bytes(32)), "session not found"),
        (
            ("s", 0, 0, 2, bytes(32)),
            "V.STOREBATCH: blob size 32 != expected 64 (count=2 x dim=8 x 4",
        ),
        (("s", 0, 0, 2, bytes(64), "FMT", "F16"), "V.STOREBATCH: blob size 64 != expected 32"),
        (("s", 0, 0, 1, bytes(33)), "V.STOREBATCH: blob size 33 != expected 32"),
        (("s", 80, 0, 1, bytes(32)), "layer_id out of range (0..79)"),
        (("s", -1, 0, 1, bytes(32)), "layer_id out of range (0..79)"),
        (("s", 0, -1, 1, bytes(32)), "V.STOREBATCH: invalid start/count (start >= 0, count >= 1)"),
        (("s", 0, 0, 0, b""), "V.STOREBATCH: invalid start/count"),
        (("s", 0, 199_999, 2, bytes(64)), "V.STOREBATCH: rows out of range (start+count must be"),
        (("s", 0, 0, 2**62, bytes(32)), "V.STOREBATCH: rows out of range"),
        (("s", 0, 0, 1, bytes(32), "FMT"), "V.STOREBATCH: unknown option (expected FMT F16)"),
        (("s", 0, 0, 1, bytes(32), "FMT", "F8"), "V.STOREBATCH: unknown option (expected FMT"),
        (("s", 0, 0, 1, bytes(32), "X", "F16"), "V.STOREBATCH: unknown option (expected FMT"),
        (("s", 0, 0, 1, bytes(32), "FMT", "F16", "X"), "V.STOREBATCH: unknown option"),
        (("s", "x", 0, 1, bytes(32)), "value is not an integer or out of range"),
        (("s", 0, 0, 1), "wrong number of arguments for 'v.storebatch' command"),
    ],
)
def test_storebatch_errors(client: redis.Redis, args: tuple[Any, ...], text: str) -> None:
    client.execute_command("V.CREATE", "s", 8, "VQUANT", "fp16")
    assert text in err(client, "V.STOREBATCH", *args)
    assert info_of(client)["total_tokens"] == "0"


# -- V.FETCH -------------------------------------------------------------------------


def test_fetch_range_zero_fill_and_nil(client: redis.Redis) -> None:
    client.execute_command("V.CREATE", "s", 4, "VQUANT", "fp16")
    assert client.execute_command("V.FETCH", "s", 0, "RANGE", 0, 4) is None  # no rows
    x = f32(2, 4).astype("<f2").astype(np.float32)
    client.execute_command("V.STOREBATCH", "s", 0, 3, 2, x.tobytes())  # rows 0..2 unwritten
    raw = client.execute_command("V.FETCH", "s", 0, "RANGE", 0, 8)
    got = np.frombuffer(raw, "<f4").reshape(8, 4)
    assert not got[:3].any() and not got[5:].any()
    np.testing.assert_array_equal(got[3:5], x)
    assert client.execute_command("V.FETCH", "s", 0, "RANGE", 5, 9) is None  # start >= tpl
    assert client.execute_command("V.FETCH", "s", 1, "RANGE", 0, 1) is None  # empty layer
    native = client.execute_command("V.FETCH", "s", 0, "range", 2, 6, "fmt", "native")
    assert len(native) == 4 * 4 * 2
    np.testing.assert_array_equal(np.frombuffer(native, "<f2").reshape(4, 4)[1:3], x)


def test_fetch_native_is_ignored_by_quantized_layers(client: redis.Redis) -> None:
    client.execute_command("V.CREATE", "s", 32, "VQUANT", "turbo4")
    client.execute_command("V.STOREBATCH", "s", 0, 0, 2, f32(2, 32).tobytes())
    raw = client.execute_command("V.FETCH", "s", 0, "RANGE", 0, 2, "FMT", "NATIVE")
    assert len(raw) == 2 * 32 * 4


def test_fetch_batch(client: redis.Redis) -> None:
    client.execute_command("V.CREATE", "s", 0, "SCHEMA", 3, "fmt=fp16,dim=8", "dim=16", "dim=8")
    assert "V.FETCH BATCH: session has no stored layers" in err(
        client, "V.FETCH", "s", "BATCH", 0, 4
    )
    a, b = f32(4, 8), f32(2, 8)
    client.execute_command("V.STOREBATCH", "s", 0, 0, 4, a.tobytes())
    client.execute_command("V.STOREBATCH", "s", 2, 0, 2, b.tobytes())
    out = client.execute_command("V.FETCH", "s", "BATCH", 0, 4)
    assert len(out) == 3 and out[1] is None
    assert len(out[0]) == 4 * 8 * 4 and len(out[2]) == 4 * 8 * 4
    np.testing.assert_allclose(np.frombuffer(out[0], "<f4").reshape(4, 8), a, atol=1e-2)
    assert not np.frombuffer(out[2], "<f4").reshape(4, 8)[2:].any()
    native = client.execute_command("V.FETCH", "s", "BATCH", 0, 4, 2, "FMT", "NATIVE")
    assert [len(p) if p else None for p in native] == [4 * 8 * 2, None]
    wide = client.execute_command("V.FETCH", "s", "BATCH", 0, 4, 5)
    assert len(wide) == 5 and wide[3:] == [None, None]
    assert client.execute_command("V.FETCH", "s", "BATCH", 3, 4, "FMT", "NATIVE")[2] is None


def test_fetch_ids(client: redis.Redis) -> None:
    client.execute_command("V.CREATE", "s", 4, "VQUANT", "fp16")
    x = f32(5, 4).astype("<f2").astype(np.float32)
    client.execute_command("V.STOREBATCH", "s", 0, 0, 5, x.tobytes())
    got = np.frombuffer(client.execute_command("V.FETCH", "s", 0, 4, 0, 9, -2, 2), "<f4")
    got = got.reshape(5, 4)
    np.testing.assert_array_equal(got[[0, 1, 4]], x[[4, 0, 2]])
    assert not got[[2, 3]].any()
    assert client.execute_command("V.FETCH", "s", 0, 5, 6) is None
    assert client.execute_command("V.FETCH", "s", 7, 0) is None


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (("nope", 0, "RANGE", 0, 1), "session not found"),
        (("nope", "BATCH", 0, 1), "session not found"),
        (("nope", 0, 1), "session not found"),
        (("s", 0, "RANGE", 4, 4), "invalid RANGE: end must exceed start (>=0)"),
        (("s", 0, "RANGE", -1, 4), "invalid RANGE: end must exceed start (>=0)"),
        (("s", 0, "RANGE", 0), "wrong number of arguments for 'v.fetch' command"),
        (("s", 0, "RANGE", 0, 200_001), "rows out of range (end must be <= 200000)"),
        (("s", 80, "RANGE", 0, 1), "layer_id out of range (0..79)"),
        (("s", 0, "RANGE", 0, 1, "FMT"), "V.FETCH: unknown option (expected FMT NATIVE)"),
        (("s", 0, "RANGE", 0, 1, "FMT", "F16"), "V.FETCH: unknown option (expected FMT NATIVE)"),
        (("s", 0, "RANGE", 0, 1, "NATIVE"), "V.FETCH: unknown option (expected FMT NATIVE)"),
        (("s", "BATCH", 2, 1), "V.FETCH BATCH invalid range: end must exceed start (>=0)"),
        (("s", "BATCH", 0, 1, 0), "V.FETCH BATCH: num_layers out of range (1..80)"),
        (("s", "BATCH", 0, 1, 81), "V.FETCH BATCH: num_layers out of range (1..80)"),
        (("s", "BATCH", 0, 1, 2, "3"), "V.FETCH: unknown option (expected FMT NATIVE)"),
        (("s", "BATCH", 0), "wrong number of arguments for 'v.fetch' command"),
        (("s", 0, 1, "FMT", "NATIVE"), "FMT NATIVE requires the RANGE or BATCH form"),
        (("s", 0, *range(1025)), "V.FETCH: too many ids (1025 > 1024)"),
        (("s", 0, "x"), "value is not an integer or out of range"),
        (("s", "x", 0), "value is not an integer or out of range"),
    ],
)
def test_fetch_errors(client: redis.Redis, args: tuple[Any, ...], text: str) -> None:
    client.execute_command("V.CREATE", "s", 4, "VQUANT", "fp16")
    client.execute_command("V.STOREBATCH", "s", 0, 0, 1, bytes(16))
    assert text in err(client, "V.FETCH", *args)


def test_option_scans_stop_at_the_command(client: redis.Redis) -> None:
    client.execute_command("V.CREATE", "s", 4, "VQUANT", "fp16")
    client.execute_command("V.STOREBATCH", "s", 0, 0, 1, bytes(16))
    pipe = client.pipeline(transaction=False)
    pipe.execute_command("V.FETCH", "s", 0, "RANGE", 0, 1)
    pipe.execute_command("FMT", "NATIVE")  # a neighbour that looks like an option
    pipe.execute_command("V.FETCH", "s", "BATCH", 0, 1)
    pipe.execute_command("V.STOREBATCH", "s", 0, 0, 1, bytes(16))
    pipe.execute_command("FMT", "F16")
    replies = pipe.execute(raise_on_error=False)
    assert replies[0] == bytes(16)  # fp32: 4 zeros, not the fp16 NATIVE reply
    assert isinstance(replies[1], redis.ResponseError)
    assert replies[2] == [bytes(16)] and replies[3] == b"OK"


# -- V.INFO --------------------------------------------------------------------------


def test_info(client: redis.Redis, client3: redis.Redis) -> None:
    client.execute_command("V.CREATE", "s", 8, "VQUANT", "fp16")
    client.execute_command("V.STOREBATCH", "s", 0, 0, 3, f32(3, 8).tobytes())
    client.execute_command("V.STOREBATCH", "s", 2, 10, 2, f32(2, 8).tobytes())
    client.execute_command("V.FETCH", "s", "BATCH", 0, 1)
    client.execute_command("V.FETCH", "s", 0, "RANGE", 0, 1)
    assert client.execute_command("V.INFO") == (
        b"enabled:1\r\nsessions:1\r\ntotal_tokens:15\r\ntotal_fetches:4\r\n"
    )
    assert client.execute_command("V.INFO", "s") == (
        b"session_idx:0\r\nvalue_dim:8\r\nv_format:fp16\r\nnum_layers:3\r\nschema:uniform\r\n"
        b"layer_0_tokens:3\r\nlayer_2_tokens:12\r\ntotal_tokens:15\r\n"
    )
    assert client3.execute_command("V.INFO", "s").startswith(b"session_idx:0\r\n")
    assert "session not found" in err(client, "V.INFO", "nope")
    assert "syntax error" in err(client, "V.INFO", "s", "extra")


def test_resp3_batch_and_big_payload(client3: redis.Redis) -> None:
    client3.execute_command("V.CREATE", "big", 1024, "VQUANT", "fp16")
    x = f32(4096, 1024)
    client3.execute_command("V.STOREBATCH", "big", 5, 0, 4096, x.tobytes())
    out = client3.execute_command("V.FETCH", "big", "BATCH", 0, 4096, "FMT", "NATIVE")
    assert out[:5] == [None] * 5
    np.testing.assert_array_equal(np.frombuffer(out[5], "<f2").reshape(4096, 1024), x.astype("<f2"))


# -- eviction and the byte budget ----------------------------------------------------


def test_lru_eviction_of_whole_namespaces(server_factory: Callable[..., ServerThread]) -> None:
    srv = server_factory(vstore_max_sessions=4)
    r = redis.Redis(host=srv.host, port=srv.port)
    for sid in ("a_pk", "a_pv", "b_pk", "b_pv"):
        r.execute_command("V.CREATE", sid, 4, "VQUANT", "fp16")
    r.execute_command("V.FETCH", "a_pv", 0, "RANGE", 0, 1)  # refreshes namespace a
    assert r.execute_command("V.CREATE", "c", 4) in (2, 3)  # b's slots are reused
    names = {s: _exists(r, s) for s in ("a_pk", "a_pv", "b_pk", "b_pv", "c")}
    assert names == {"a_pk": True, "a_pv": True, "b_pk": False, "b_pv": False, "c": True}
    assert srv.state.vstore.evictions == 2
    assert info_of(r)["sessions"] == "3"
    r.close()


def _exists(r: redis.Redis, sid: str) -> bool:
    try:
        r.execute_command("V.INFO", sid)
    except redis.ResponseError:
        return False
    return True


def test_maxmemory_budget(server_factory: Callable[..., ServerThread]) -> None:
    row = 64 * 2
    srv = server_factory()
    r = redis.Redis(host=srv.host, port=srv.port)
    data_budget(r, 100 * row)
    for sid in ("old", "new"):
        r.execute_command("V.CREATE", sid, 64, "VQUANT", "fp16")
    r.execute_command("V.STOREBATCH", "old", 0, 0, 60, f32(60, 64).tobytes())
    r.execute_command("V.STOREBATCH", "new", 0, 0, 30, f32(30, 64).tobytes())
    # Larger than all the budget leaves beside the server's startup memory.
    with pytest.raises(redis.exceptions.OutOfMemoryError, match="larger than maxmemory"):
        r.execute_command("V.STOREBATCH", "new", 1, 0, 200, f32(200, 64).tobytes())
    assert srv.state.vstore.vstore_bytes == 90 * row
    r.execute_command("V.STOREBATCH", "new", 1, 0, 50, f32(50, 64).tobytes())  # evicts old
    assert not _exists(r, "old")
    assert srv.state.vstore.vstore_bytes == 80 * row
    r.close()
