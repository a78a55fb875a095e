"""bf16_rope_fp8_body layers on the wire: SCHEMA only, the rope parameter, every fetch
form, V.INFO, and the refusals that name SCHEMA or rope."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import redis

from pion.codecs import get_codec

NAME = "bf16_rope_fp8_body"


def err(client: redis.Redis, *args: Any) -> str:
    with pytest.raises(redis.ResponseError) as info:
        client.execute_command(*args)
    return str(info.value)


def info_of(client: redis.Redis, sid: str) -> dict[str, str]:
    raw = client.execute_command("V.INFO", sid).decode()
    return dict(line.split(":", 1) for line in raw.split("\r\n") if line)


def test_mla_style_session(client: redis.Redis, client3: redis.Redis) -> None:
    # DeepSeek-style: keys 512 compressed + 64 rotary, values in fp8.
    specs = [f"fmt={NAME},dim=576,rope=64", "FMT=fp8,DIM=512", f"FMT={NAME.upper()},ROPE=7,DIM=100"]
    assert client.execute_command("V.CREATE", "mla", 0, "SCHEMA", 3, *specs) == 0
    info = info_of(client, "mla")
    assert info["v_format"] == NAME and info["num_layers"] == "3"
    assert (info["layer_0_fmt"], info["layer_0_dim"], info["layer_0_rope"]) == (NAME, "576", "64")
    assert (info["layer_2_rope"], "layer_1_rope" in info) == ("7", False)
    rng = np.random.default_rng(11)
    k = rng.standard_normal((9, 576)).astype(np.float32)
    odd = rng.standard_normal((9, 100)).astype(np.float32)
    assert client.execute_command("V.STOREBATCH", "mla", 0, 0, 9, k.tobytes()) == b"OK"
    assert client.execute_command("V.STOREBATCH", "mla", 2, 0, 9, odd.tobytes()) == b"OK"
    codec = get_codec(NAME, 64)
    want = codec.decode(codec.encode(k), 576)
    got = np.frombuffer(client.execute_command("V.FETCH", "mla", 0, "RANGE", 0, 9), "<f4")
    assert np.array_equal(got.reshape(9, 576), want)
    # The rope part is exact bf16; the body is the fp8 format's.
    assert np.abs(want[:, :64] - k[:, :64]).max() <= np.abs(k[:, :64]).max() * 2.0**-8
    native = client.execute_command("V.FETCH", "mla", 0, "RANGE", 0, 9, "FMT", "NATIVE")
    assert native == got.tobytes()  # not fp16: NATIVE is ignored, as for other formats
    ids = client.execute_command("V.FETCH", "mla", 0, 8, 0, 100)
    rows = np.frombuffer(ids, "<f4").reshape(3, 576)
    assert np.array_equal(rows[0], want[8]) and np.array_equal(rows[1], want[0])
    assert not rows[2].any()
    batch = client3.execute_command("V.FETCH", "mla", "BATCH", 0, 9)
    assert batch[0] == got.tobytes() and batch[1] is None
    codec7 = get_codec(NAME, 7)
    want7 = codec7.decode(codec7.encode(odd), 100)
    assert np.array_equal(np.frombuffer(batch[2], "<f4").reshape(9, 100), want7)
    # FMT F16 input is widened and quantized like any fp32 input.
    half = k[:2].astype("<f2")
    assert client.execute_command("V.STOREBATCH", "mla", 0, 9, 2, half.tobytes(), "FMT", "F16")
    got2 = np.frombuffer(client.execute_command("V.FETCH", "mla", 0, "RANGE", 9, 11), "<f4")
    f32 = half.astype(np.float32)
    assert np.array_equal(got2.reshape(2, 576), codec.decode(codec.encode(f32), 576))


def test_bf16_overflow_names_layer_and_row(client: redis.Redis) -> None:
    client.execute_command("V.CREATE", "o", 0, "SCHEMA", 1, f"fmt={NAME},dim=40,rope=8")
    x = np.ones((3, 40), np.float32)
    x[2, 1] = 3.4e38  # rounds to bf16 infinity
    text = err(client, "V.STOREBATCH", "o", 0, 5, 3, x.tobytes())
    assert "layer 0 row 7" in text and "overflows bf16" in text
    assert info_of(client, "o")["total_tokens"] == "0"  # nothing stored


def test_uniform_forms_refuse_it_naming_schema(client: redis.Redis) -> None:
    assert "SCHEMA" in err(client, "V.CREATE", "u", 64, "VQUANT", NAME)
    text = err(client, "KV.PREFIX.REGISTER", "ns", 64, NAME)
    assert text.startswith("KV.PREFIX.REGISTER: unknown vquant 'bf16_rope_fp8_body' (want ")
    assert "SCHEMA" in text
    assert client.execute_command("V.INFO").startswith(b"enabled:1\r\nsessions:0\r\n")


def test_an_existing_session_keeps_its_layout(client: redis.Redis) -> None:
    spec = f"fmt={NAME},dim=64,rope=16"
    assert client.execute_command("V.CREATE", "k", 0, "SCHEMA", 1, spec) == 0
    assert client.execute_command("V.CREATE", "k", 0, "SCHEMA", 1, "fmt=int8,dim=8") == 0
    assert info_of(client, "k")["layer_0_rope"] == "16"
