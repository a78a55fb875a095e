"""Two llama-servers ("machines" A and B: separate slot dirs, same model) and one real
pion-server as the shared store: a prefix built on A is restored on B; damaged or
incompatible stored files are refused before llama-server sees them; a stopped store means
a cold build and a request that succeeds; the receipt counts the llama hits."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from click.testing import CliRunner
from pion_testing.launcher import LlamaServerProcess
from pion_testing.llama_samples import pi_chat_body

from pion.client.cli import stats_command
from pion.llama.config import WarmerConfig
from pion.llama.fingerprint import file_name
from pion.llama.index import SlotIndex
from pion.llama.manifest import Manifest, chunk_key, manifest_key
from pion.llama.proxy import STATUS_PATH, PrefixProxy, running_proxy
from pion.llama.store import receipt_namespace
from support import count, log_lines

from .conftest import SERVER_CTX, StartServer, store_url

pytestmark = pytest.mark.llama

MakeConfig = Callable[..., WarmerConfig]
PREFIX = "pion:llama:"


def body(session: int) -> dict[str, Any]:
    return pi_chat_body(f"Session {session}: what next?", project=f"p{session}", max_tokens=2)


def post(proxy_url: str, payload: dict[str, Any]) -> dict[str, Any]:
    resp = httpx.post(proxy_url + "/v1/chat/completions", json=payload, timeout=120)
    assert resp.status_code == 200, resp.text
    data: dict[str, Any] = resp.json()
    return data


def last_outcome(proxy_url: str) -> dict[str, Any]:
    outcome: dict[str, Any] = httpx.get(proxy_url + STATUS_PATH, timeout=30).json()["outcomes"][-1]
    return outcome


def pion_stats(r: redis.Redis) -> dict[bytes, Any]:
    reply = r.execute_command("PION.STATS")
    if isinstance(reply, dict):
        return reply
    return dict(zip(reply[::2], reply[1::2], strict=True))


class Machine:
    """One llama-server with its own slot dir, and a proxy config in front of it."""

    def __init__(
        self,
        name: str,
        *,
        start_server: StartServer,
        model: Path,
        make_config: MakeConfig,
        tmp_path: Path,
        store: str,
        **server_args: Any,
    ) -> None:
        self.slot_dir = tmp_path / f"slots-{name}"
        self.log = tmp_path / f"{name}.log"
        self.server: LlamaServerProcess = start_server(model, slot_dir=self.slot_dir, **server_args)
        self.config = make_config(
            self.server, slot_dir=self.slot_dir, log_path=self.log, store=store, store_timeout=1.0
        )

    def lines(self) -> list[str]:
        return log_lines(self.log)


@pytest.fixture
def machines(
    start_server: StartServer,
    tiny_model: Path,
    make_config: MakeConfig,
    tmp_path: Path,
    pion_store: Any,
) -> Callable[..., Machine]:
    def make(name: str, **server_args: Any) -> Machine:
        url = store_url(pion_store)
        return Machine(
            name,
            start_server=start_server,
            model=tiny_model,
            make_config=make_config,
            tmp_path=tmp_path,
            store=url,
            **server_args,
        )

    return make


def build_on_a(a: Machine) -> tuple[dict[str, Any], float]:
    """Session 1 on A (cold, saved, pushed); returns its outcome and measured prefill."""
    proxy = PrefixProxy(a.config)
    with running_proxy(proxy) as url:
        post(url, body(1))
        outcome = last_outcome(url)
        assert proxy.flush()
    assert outcome["kind"] == "cold" and outcome["saved"]
    assert count(a.lines(), f"STORE PUSHED {file_name(outcome['fingerprint'])}") == 1
    entry = SlotIndex(a.slot_dir).get(file_name(outcome["fingerprint"]))
    assert entry is not None and entry.prefill_ms > 0
    return outcome, entry.prefill_ms


def test_built_on_a_restored_on_b_and_counted_in_the_receipt(
    machines: Callable[..., Machine], pion_store: Any
) -> None:
    a, b = machines("a"), machines("b")
    built, prefill_ms = build_on_a(a)
    fp, tokens = built["fingerprint"], built["tokens"]
    proxy_b = PrefixProxy(b.config)
    with running_proxy(proxy_b) as url:
        first = post(url, body(2))["timings"]
        restored = last_outcome(url)
        second = post(url, body(3))["timings"]
        hit = last_outcome(url)
        assert proxy_b.flush()
    assert restored["kind"] == "restored" and restored["fingerprint"] == fp
    assert first["cache_n"] >= 0.9 * tokens  # B reused A's prefix: no cold prefill
    assert hit["kind"] == "hit" and second["cache_n"] >= 0.9 * tokens
    name = file_name(fp)
    assert (b.slot_dir / name).read_bytes() == (a.slot_dir / name).read_bytes()
    lines = b.lines()
    assert count(lines, f"STORE PULLED {name}") == 1
    assert count(lines, "size and SHA-256 verified") == 1
    assert count(lines, "RESTORE verified by the real request") == 1
    assert count(lines, "warm-up done") == 0
    # The receipt: both llama hits (the restore and the in-process hit), each credited with
    # the prefill time measured when A built the prefix.
    r = redis.Redis(host=pion_store.host, port=pion_store.port)
    stats = pion_stats(r)
    ms = max(1, round(prefill_ms))
    assert stats[b"kvprefix_hits"] == 2 and stats[b"kvprefix_misses"] == 0
    assert stats[b"kvprefix_hits_measured"] == 2
    assert stats[b"kvprefix_tokens_served"] == 2 * tokens
    assert stats[b"kvprefix_prefill_us_measured"] == 2 * ms * 1000
    assert r.execute_command("KV.PREFIX.LOOKUP", receipt_namespace(fp)) == b"HIT"
    shown = CliRunner().invoke(
        stats_command, ["--port", str(pion_store.port), "--json"], catch_exceptions=False
    )
    receipt = json.loads(shown.output)["receipt"]
    assert receipt["kvprefix_hits_measured"] == 3  # the LOOKUP just above is a hit too


@pytest.mark.parametrize("damage", ["flipped byte", "truncated chunk", "missing manifest field"])
def test_damaged_stored_file_is_refused_on_b(
    machines: Callable[..., Machine], pion_store: Any, damage: str
) -> None:
    a, b = machines("a"), machines("b")
    built, _ = build_on_a(a)
    fp = built["fingerprint"]
    r = redis.Redis(host=pion_store.host, port=pion_store.port)
    manifest = Manifest.parse(r.get(manifest_key(PREFIX, fp)), fp)
    key = chunk_key(PREFIX, fp, manifest.upload, manifest.chunks - 1)
    if damage == "flipped byte":
        block = bytearray(r.get(key))
        block[len(block) // 2] ^= 0x40
        r.set(key, bytes(block))
    elif damage == "truncated chunk":
        r.set(key, r.get(key)[: len(r.get(key)) // 2])
    else:
        doc = json.loads(r.get(manifest_key(PREFIX, fp)))
        del doc["sha256"]
        r.set(manifest_key(PREFIX, fp), json.dumps(doc))
    pid = b.server.pid
    proxy_b = PrefixProxy(b.config)
    with running_proxy(proxy_b) as url:
        answer = post(url, body(2))
        outcome = last_outcome(url)
        assert proxy_b.flush()
    assert answer["choices"] and outcome["kind"] == "cold" and outcome["saved"]
    # llama-server B never saw the damaged file: it is the same process, and healthy.
    assert b.server.proc is not None and b.server.proc.poll() is None and b.server.pid == pid
    assert httpx.get(b.server.url + "/health", timeout=10).json() == {"status": "ok"}
    lines = b.lines()
    assert count(lines, "STORE REFUSED") == 1
    assert count(lines, "RESTORE ") == 0
    # B's rebuild replaced the bad copy: the store now holds B's file, whole.
    name = file_name(fp)
    stored = Manifest.parse(r.get(manifest_key(PREFIX, fp)), fp)
    assert stored.sha256 == hashlib.sha256((b.slot_dir / name).read_bytes()).hexdigest()
    assert count(lines, f"STORE PUSHED {name}") == 1


def test_store_stopped_b_goes_cold_and_the_request_succeeds(
    machines: Callable[..., Machine], pion_store: Any
) -> None:
    a, b = machines("a"), machines("b")
    build_on_a(a)
    pion_store.stop()
    proxy_b = PrefixProxy(b.config)
    with running_proxy(proxy_b) as url:
        t = time.monotonic()
        answer = post(url, body(2))
        elapsed = time.monotonic() - t
        outcome = last_outcome(url)
        second = post(url, body(3))
        assert proxy_b.flush()
        st = httpx.get(url + STATUS_PATH, timeout=30).json()
    assert answer["choices"] and outcome["kind"] == "cold" and outcome["saved"]
    assert second["timings"]["cache_n"] > 0
    assert elapsed < 30  # one short store timeout, not a hang
    assert st["store"]["usable"] is False and st["store"]["counts"]["errors"] >= 1
    lines = b.lines()
    # One failed connection (the first ask: the checkpoints listed under the prefix, for
    # a conversation to resume), then the store is skipped, not asked again.
    assert count(lines, "failed (ConnectionError") == 1
    assert count(lines, "STORE HGETALL checkpoints failed (ConnectionError") == 1
    assert count(lines, "STORE skipped (it failed moments ago) → cold build") == 1
    # The push after B's cold build and the hit's receipt are skipped, logged, harmless.
    assert count(lines, "failed (fail-open)") >= 1


@pytest.mark.parametrize(
    ("flags", "why"),
    [
        ({"ctx": SERVER_CTX // 2}, f"slot context {SERVER_CTX} != {SERVER_CTX // 2} tokens"),
        ({"extra_args": ["-ctk", "f32"]}, "cache type K f16 / V f16 != K f32 / V f16"),
    ],
)
def test_incompatible_stored_file_is_refused_before_pulling(
    machines: Callable[..., Machine], flags: dict[str, Any], why: str
) -> None:
    a = machines("a")
    built, _ = build_on_a(a)
    b = machines("b", **flags)
    with running_proxy(PrefixProxy(b.config)) as url:
        answer = post(url, body(2))
        outcome = last_outcome(url)
    assert answer["choices"] and outcome["kind"] == "cold"
    lines = b.lines()
    assert count(lines, f"STORE REFUSED {file_name(built['fingerprint'])}") == 1
    assert count(lines, why) == 1
    assert count(lines, "STORE PULLED") == 0 and count(lines, "RESTORE ") == 0


def test_local_file_of_another_context_is_refused_before_restore(
    llama_server: LlamaServerProcess, make_config: MakeConfig, slot_dir: Path
) -> None:
    """The same check for the disk tier: the server came back with another -c."""
    config = make_config(llama_server)
    with running_proxy(PrefixProxy(config)) as url:
        post(url, body(1))
    llama_server.ctx = SERVER_CTX // 2
    llama_server.restart()
    with running_proxy(PrefixProxy(config)) as url:
        answer = post(url, body(2))
        outcome = last_outcome(url)
    assert answer["choices"] and outcome["kind"] == "cold"
    lines = log_lines(config.log_path)
    why = f"slot context {SERVER_CTX} != {SERVER_CTX // 2} tokens"
    assert count(lines, f"before restore: {why} → cold build") == 1
    assert count(lines, "RESTORE ") == 0
