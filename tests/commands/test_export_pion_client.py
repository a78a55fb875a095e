"""The real Pion client (``pion-vllm-mlx`` 0.1.6) and its export lane against our
server: ``_export`` as it sends it, the file read by ``mx.load`` (real MLX, CPU build),
and the whole ``get_or_prefill`` flow (a miss that stores and pre-writes the file, then
hits from other client objects through the export lane and through TCP) giving the
same cache both ways.

mlx-lm is not installed here: its ``KVCache`` container and a model are stood in for
by the few lines below (a cache that concatenates along the token axis, a "model" that
writes deterministic K/V per token). Everything Pion's client and MLX do with them is
their own code.
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import redis
from pion_vllm_mlx import prompt_cache
from safetensors.numpy import load_file

from pion.server.run import ServerThread
from support import non_loopback_address

mx = pytest.importorskip("mlx.core")

LAYERS, HEADS, HEAD_DIM, TOKENS = 3, 4, 16, 37
KV_DIM = HEADS * HEAD_DIM


class KVCache:
    """mlx-lm's KVCache as Pion's client uses it: keys/values ``[1, H, N, D]``."""

    def __init__(self) -> None:
        self.keys: Any = None
        self.values: Any = None
        self.offset = 0

    def update_and_fetch(self, keys: Any, values: Any) -> tuple[Any, Any]:
        if self.keys is None:
            self.keys, self.values = keys, values
        else:
            self.keys = mx.concatenate([self.keys, keys], axis=2)
            self.values = mx.concatenate([self.values, values], axis=2)
        self.offset = self.keys.shape[2]
        return self.keys, self.values

    @property
    def state(self) -> tuple[Any, Any]:
        return self.keys, self.values

    @state.setter
    def state(self, kv: tuple[Any, Any]) -> None:
        self.keys, self.values = kv
        self.offset = self.keys.shape[2]


class Model:
    """Deterministic K/V per token id (a stand-in for a transformer's prefill)."""

    args = types.SimpleNamespace(
        num_attention_heads=HEADS * 2,
        num_key_value_heads=HEADS,
        head_dim=HEAD_DIM,
        num_hidden_layers=LAYERS,
    )
    calls = 0

    def __call__(self, ids: Any, cache: list[KVCache]) -> None:
        Model.calls += 1
        tokens = np.array(ids)[0]
        for li, c in enumerate(cache):
            rng = np.random.default_rng(int(tokens.sum()) + li)
            k = rng.standard_normal((1, HEADS, len(tokens), HEAD_DIM)).astype(np.float16)
            c.update_and_fetch(mx.array(k), mx.array(k * 2))


@pytest.fixture
def mlx_lm(monkeypatch: pytest.MonkeyPatch) -> None:
    cache_mod = types.ModuleType("mlx_lm.models.cache")
    cache_mod.make_prompt_cache = lambda model: [  # type: ignore[attr-defined]
        KVCache() for _ in range(model.args.num_hidden_layers)
    ]
    models = types.ModuleType("mlx_lm.models")
    models.cache = cache_mod  # type: ignore[attr-defined]
    root = types.ModuleType("mlx_lm")
    root.models = models  # type: ignore[attr-defined]
    for name, module in (
        ("mlx_lm", root),
        ("mlx_lm.models", models),
        ("mlx_lm.models.cache", cache_mod),
    ):
        monkeypatch.setitem(sys.modules, name, module)


@pytest.fixture
def clients(server: ServerThread, mlx_lm: None) -> Iterator[list[Any]]:
    made: list[Any] = []

    def make(**env: str) -> Any:
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            pc = prompt_cache.PionPromptCache(Model(), host="127.0.0.1", port=server.port)
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        made.append(pc)
        return pc

    yield make  # type: ignore[misc]
    for pc in made:
        pc.resp.sock.close()


def _as_np(cache: list[KVCache]) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(np.array(c.state[0]), np.array(c.state[1])) for c in cache]


def test_get_or_prefill_hits_through_the_export_lane(clients: Any, server: ServerThread) -> None:
    ids = list(range(100, 100 + TOKENS))
    ns = prompt_cache.PionPromptCache.make_namespace("model", "export-lane")
    cold = clients()
    Model.calls = 0
    built = cold.get_or_prefill(ids, ns)
    assert cold.misses == 1 and Model.calls == 1
    assert not cold._export_disabled  # its V.EXPORT after the store was answered
    files = list(server.config.export_directory.iterdir())
    assert len(files) == 1  # the miss pre-wrote the file, as Pion's client intends

    via_file = clients()
    hit = via_file.get_or_prefill(ids, ns)
    assert via_file.hits == 1 and Model.calls == 1 and not via_file._export_disabled
    assert list(server.config.export_directory.iterdir()) == files  # the same file, reused

    via_tcp = clients(PION_PROMPT_CACHE_NO_EXPORT="1")
    assert via_tcp._export_disabled
    tcp_hit = via_tcp.get_or_prefill(ids, ns)
    assert via_tcp.hits == 1 and Model.calls == 1

    want = _as_np(built)
    for got in (_as_np(hit), _as_np(tcp_hit)):
        for (k, v), (wk, wv) in zip(got, want, strict=True):
            assert k.dtype == np.float16 and k.shape == (1, HEADS, TOKENS, HEAD_DIM)
            np.testing.assert_array_equal(k, wk)
            np.testing.assert_array_equal(v, wv)


def test_export_call_and_file_as_the_client_reads_them(server: ServerThread) -> None:
    pc = prompt_cache.PionPromptCache(model=None, host="127.0.0.1", port=server.port)
    pc.layout = prompt_cache.CacheLayout(n_layers=LAYERS, n_kv_heads=HEADS, head_dim=HEAD_DIM)
    ns = "raw"
    pc._register(ns)
    rng = np.random.default_rng(5)
    stored = {}
    for side in ("_pk", "_pv"):
        for li in range(LAYERS):
            rows = rng.standard_normal((TOKENS, KV_DIM)).astype(np.float32)
            pc._storebatch(ns + side, li, rows)
            stored[side, li] = rows
    path = pc._export(ns, TOKENS)
    assert isinstance(path, str) and os.path.isabs(path)
    by_mlx = mx.load(path)
    by_st = load_file(path)
    for (side, li), rows in stored.items():
        name = f"{side[-1]}.{li}"
        # Its TCP lane: V.FETCH BATCH FMT NATIVE, then [N, H*D] -> [1, H, N, D].
        flat = pc._fetch_batch_all_layers(ns + side, TOKENS, LAYERS, native_dim=KV_DIM)[li]
        want = flat.reshape(TOKENS, HEADS, HEAD_DIM).transpose(1, 0, 2)[None]
        assert np.array_equal(
            want[0], rows.astype(np.float16).reshape(TOKENS, HEADS, -1).transpose(1, 0, 2)
        )
        np.testing.assert_array_equal(np.array(by_mlx[name]), want)
        np.testing.assert_array_equal(by_st[name], want)
        assert by_mlx[name].dtype == mx.float16
    pc.resp.sock.close()


def test_the_client_turns_its_lane_off_when_refused(server_factory: Any, mlx_lm: None) -> None:
    addr = non_loopback_address()
    srv = server_factory(bind="0.0.0.0", unsafe_no_auth=True)
    local = redis.Redis(port=srv.port)
    local.execute_command("KV.PREFIX.REGISTER", "r", KV_DIM, "fp16")
    for side in ("_pk", "_pv"):
        for li in range(LAYERS):
            blob = np.ones((TOKENS, KV_DIM), np.float32).tobytes()
            local.execute_command("V.STOREBATCH", "r" + side, li, 0, TOKENS, blob)
    pc = prompt_cache.PionPromptCache(Model(), host=addr, port=srv.port)
    assert pc._export_disabled  # its own rule: not a loopback host
    pc._export_disabled = False  # as if it had guessed wrong: the server decides
    assert pc._export("r", TOKENS) is None and pc._export_disabled
    cache = pc._fetch_to_cache("r", TOKENS)  # and the hit still works, over TCP
    assert np.array(cache[2].state[1]).shape == (1, HEADS, TOKENS, HEAD_DIM)
    assert list(srv.config.export_directory.glob("*.safetensors")) == []
    pc.resp.sock.close()
