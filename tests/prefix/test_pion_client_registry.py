"""The real Pion client (PyPI `pion-vllm-mlx`, driven with numpy, no mlx) against our
registry: `lookup`, `_register` and the SCHEMA path of boundary_protect."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import redis
from pion_vllm_mlx.prompt_cache import PionPromptCache

from pion.server.run import ServerThread


def stand_in_model(
    n_layers: int = 4, n_heads: int = 8, n_kv: int = 2, head_dim: int = 16
) -> SimpleNamespace:
    """The layout attributes PionPromptCache reads from an mlx-lm model's `args`."""
    args = SimpleNamespace(
        num_attention_heads=n_heads,
        num_key_value_heads=n_kv,
        head_dim=head_dim,
        hidden_size=n_heads * head_dim,
        num_hidden_layers=n_layers,
    )
    return SimpleNamespace(args=args)


def test_register_then_lookup(server: ServerThread, client: redis.Redis) -> None:
    pc = PionPromptCache(model=stand_in_model(), vquant="int8", host=server.host, port=server.port)
    ns = PionPromptCache.make_namespace("model", "tok", "int8", "prompt-a")
    assert pc.lookup(ns) is False
    pc.last_prefill_ms = 842.4
    pc._register(ns)
    assert pc.lookup(ns) is True
    info = client.execute_command("V.INFO", f"{ns}_pk").decode()
    assert "value_dim:32" in info and "v_format:int8" in info
    stats = dict(zip(*[iter(client.execute_command("PION.STATS"))] * 2, strict=True))
    assert stats[b"kvprefix_hits"] == 1 and stats[b"kvprefix_misses"] == 1
    assert stats[b"kvprefix_prefill_us_measured"] == 842_000


def test_boundary_protect_schema_register_and_rows(server: ServerThread) -> None:
    pc = PionPromptCache(
        model=stand_in_model(n_layers=6),
        vquant="turbo4",
        host=server.host,
        port=server.port,
        boundary_protect=1,
    )
    ns = PionPromptCache.make_namespace("m", "schema")
    pc._register(ns)
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((12, 32)).astype(np.float32)
    for layer in range(6):
        pc._storebatch(f"{ns}_pv", layer, rows)
    # Boundary layers are fp16 (near exact), middle layers turbo4 (lossy).
    first = pc._fetch_range(f"{ns}_pv", 0, 12).reshape(12, 32)
    middle = pc._fetch_range(f"{ns}_pv", 3, 12).reshape(12, 32)
    assert np.allclose(first, rows, atol=1e-2)
    rel = float(np.sum((middle - rows) ** 2) / np.sum(rows**2))
    assert 0 < rel < 0.05
    # K/V halves both exist: the namespace is a HIT for the client.
    assert pc.lookup(ns) is True
