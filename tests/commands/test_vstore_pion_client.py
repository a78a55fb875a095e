"""The real Pion client (`pion-vllm-mlx`'s PionPromptCache, imported without mlx) stores
and fetches rows against our server through its own raw wire helpers."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from pion_vllm_mlx import prompt_cache

from pion.codecs import FORMAT_NAMES, get_codec
from pion.server.run import ServerThread

N_LAYERS, KV_DIM, TOKENS = 4, 128, 37


@pytest.fixture
def pc(server: ServerThread) -> Iterator[object]:
    cache = prompt_cache.PionPromptCache(model=None, host=server.host, port=server.port)
    yield cache
    cache.resp.sock.close()


def _layers(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((TOKENS, KV_DIM)).astype(np.float32) for _ in range(N_LAYERS)]


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_storebatch_then_fetch_range_and_batch(pc: object, fmt: str) -> None:
    ns = prompt_cache.PionPromptCache.make_namespace("model", "tok", fmt)
    codec = get_codec(fmt)
    for side, seed in (("_pk", 1), ("_pv", 2)):
        sid = ns + side
        assert pc.resp.call("V.CREATE", sid, str(KV_DIM), "VQUANT", fmt).startswith(b":")
        layers = _layers(seed)
        for li, values in enumerate(layers):
            pc._storebatch(sid, li, values)
        want = [codec.decode(codec.encode(v), KV_DIM).reshape(-1) for v in layers]
        for li in range(N_LAYERS):
            np.testing.assert_array_equal(pc._fetch_range(sid, li, TOKENS), want[li])
        got = pc._fetch_batch_all_layers(sid, TOKENS, N_LAYERS)
        assert len(got) == N_LAYERS
        for li in range(N_LAYERS):
            assert got[li].dtype == np.float32
            np.testing.assert_array_equal(got[li], want[li])
        # FMT NATIVE: fp16 layers come back as stored fp16, the others as fp32; the
        # client tells them apart by payload length.
        native = pc._fetch_batch_all_layers(sid, TOKENS, N_LAYERS, native_dim=KV_DIM)
        one = pc._fetch_range(sid, 1, TOKENS, native_dim=KV_DIM)
        if fmt == "fp16":
            assert native[0].dtype == np.float16 and one.dtype == np.float16
            np.testing.assert_array_equal(one, layers[1].astype(np.float16).reshape(-1))
        else:
            assert native[0].dtype == np.float32
            np.testing.assert_array_equal(one, want[1])


def test_schema_sessions_as_the_client_creates_them(pc: object) -> None:
    # PionPromptCache._register_schema's exact calls (boundary_protect=1, 4 layers).
    ns = prompt_cache.PionPromptCache.make_namespace("schema")
    k_specs = [f"fmt=fp16,dim={KV_DIM}"] * N_LAYERS
    v_specs = [f"fmt={'fp16' if li in (0, 3) else 'turbo4'},dim={KV_DIM}" for li in range(4)]
    r = pc.resp.call("V.CREATE", ns + "_pk", "0", "SCHEMA", str(N_LAYERS), *k_specs)
    assert r == b":0\r\n"
    r = pc.resp.call("V.CREATE", ns + "_pv", "0", "SCHEMA", str(N_LAYERS), *v_specs)
    assert r == b":1\r\n"
    layers = _layers(3)
    for li, values in enumerate(layers):
        pc._storebatch(ns + "_pv", li, values)
    got = pc._fetch_batch_all_layers(ns + "_pv", TOKENS, N_LAYERS, native_dim=KV_DIM)
    assert [g.dtype for g in got] == [np.float16, np.float32, np.float32, np.float16]
    turbo = get_codec("turbo4")
    np.testing.assert_array_equal(got[1], turbo.decode(turbo.encode(layers[1]), KV_DIM).reshape(-1))


def test_client_sees_errors_and_short_prefixes(pc: object) -> None:
    with pytest.raises(RuntimeError, match="session not found"):
        pc._storebatch("missing", 0, np.zeros((2, KV_DIM), np.float32))
    pc.resp.call("V.CREATE", "s", str(KV_DIM), "VQUANT", "fp16")
    pc._storebatch("s", 0, np.ones((5, KV_DIM), np.float32))
    # Asking for more rows than stored: zeros past tpl, as Pion does.
    got = pc._fetch_range("s", 0, 8)
    assert got.shape == (8 * KV_DIM,) and got[: 5 * KV_DIM].all() and not got[5 * KV_DIM :].any()
    # Far more rows than stored is refused (a huge reply of zeros), and the client says so.
    with pytest.raises(RuntimeError, match=r"V\.FETCH RANGE failed: b'-ERR rows 0\.\.100000 would"):
        pc._fetch_range("s", 0, 100_000)
    assert pc._fetch_range("s", 0, 5).shape == (5 * KV_DIM,)  # the connection is fine
    with pytest.raises(RuntimeError, match=r"V\.FETCH BATCH layer 1 nil"):
        pc._fetch_batch_all_layers("s", 5, 2)
