"""`pion llama status --store`: the prefixes a real store holds, with sizes and ages."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from pion_testing.launcher import free_port

from pion.llama.cli import llama_group
from pion.llama.manifest import manifest_key
from pion.llama.slotfile import SlotLayout
from pion.llama.store import SlotStore, StoreConfig

from .conftest import store_url

PREFIX = "pion:llama:"
LAYOUT = SlotLayout(1, 2, False, 0, 0, ("f16", "f16"), ("f16", "f16"), (64, 64), (64, 64))


def fields(fp: str, tokens: int) -> dict[str, Any]:
    return {
        "fingerprint": fp,
        "tokens": tokens,
        "prefill_ms": 812.4,
        "build": "b11434-test",
        "model": {"id": "tiny.gguf", "size": 10, "sample_sha256": "c" * 64},
        "n_ctx": 4096,
        "layout": LAYOUT,
    }


def status(*args: str) -> Any:
    dead = f"http://127.0.0.1:{free_port()}"
    runner = CliRunner(env={"COLUMNS": "200"})
    return runner.invoke(llama_group, ["status", "--upstream", dead, *args])


def test_status_lists_the_stores_prefixes(pion_store: Any, tmp_path: Path) -> None:
    url = store_url(pion_store)
    store = SlotStore(StoreConfig(url, ttl=3600), lambda _m: None)
    sizes = {"ab" * 32: 5000, "cd" * 32: 70000}
    for i, (fp, size) in enumerate(sizes.items()):
        path = tmp_path / f"f{i}.bin"
        path.write_bytes(bytes([i]) * size)
        store.push(path, fields(fp, 100 + i))
    # A damaged manifest is listed as such, and keys that are not manifests are not.
    store._redis.set(manifest_key(PREFIX, "ef" * 32), b"{not json")
    store._redis.set(PREFIX + "unrelated", b"x")
    store.close()

    result = status("--store", url, "--json")
    assert result.exit_code == 0, result.output
    listing = json.loads(result.output)["store"]
    rows = {r["fingerprint"]: r for r in listing["prefixes"]}
    assert set(rows) == {"ab" * 32, "cd" * 32, "ef" * 32}
    assert rows["ab" * 32]["bytes"] == 5000 and rows["cd" * 32]["bytes"] == 70000
    assert rows["cd" * 32]["tokens"] == 101
    assert rows["cd" * 32]["file"] == "pi-prefix-cdcdcdcdcdcdcdcd.bin"
    for fp in sizes:
        assert 0 <= rows[fp]["age_s"] < 600
        assert 0 < rows[fp]["expires_in_s"] <= 3600
        assert rows[fp]["model"] == "tiny.gguf"
    assert "unreadable" in rows["ef" * 32]["error"]

    table = status("--store", url)
    assert table.exit_code == 0, table.output
    assert "pi-prefix-abababababababab.bin" in table.output
    assert "3 prefix(es)" in table.output


def test_status_store_down_is_reported_not_raised() -> None:
    result = status("--store", f"redis://127.0.0.1:{free_port()}", "--json")
    assert result.exit_code == 0, result.output
    assert "error" in json.loads(result.output)["store"]
    bare = status("--store", "--json")
    assert "no store" in json.loads(bare.output)["store"]["error"]
