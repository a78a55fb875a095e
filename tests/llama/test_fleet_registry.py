"""Several proxies in front of the same llama-servers agree through the store's registry
(``pion.llama.registry``): two in-process proxies, fake llama-servers with two slots
each, and a real pion-server as the store and registry.

Each test asserts where requests ran (the fakes' records: the slot a request was pinned
to), the keys in the registry, and the proxies' counters in ``/pion/status``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from pion_testing.llama_samples import pi_chat_body

from pion.client.hashing import block_hashes, hashes_to_blob
from pion.llama.fleet import Fleet
from pion.llama.proxy import PrefixProxy, running_proxy
from pion.llama.registry import BLOCK_SIZE, Place, PrefixRegistry, blocks_namespace
from pion.llama.store import StoreConfig
from support.fake_llama import FakeLlamaServer, fake_llama_server
from support.fake_llama_proxy import (
    BYTES_PER_TOKEN,
    config_for,
    read_fake_slot_files,
    status,
    until,
)
from support.keyspace import free_port

PREFIX = "pion:llama:"


@pytest.fixture(autouse=True)
def fake_slot_files(monkeypatch: pytest.MonkeyPatch) -> None:
    read_fake_slot_files(monkeypatch)


@contextlib.contextmanager
def fakes(tmp_path: Path, n: int) -> Iterator[list[FakeLlamaServer]]:
    """``n`` fake llama-servers with two slots each, each with its own slot dir."""
    with contextlib.ExitStack() as stack:
        yield [
            stack.enter_context(
                fake_llama_server(
                    tmp_path / f"slots-{i}", n_slots=2, bytes_per_token=BYTES_PER_TOKEN
                )
            )
            for i in range(n)
        ]


def proxy_for(servers: list[FakeLlamaServer], home: Path, store: str, **kwargs: Any) -> PrefixProxy:
    """A proxy in front of ``servers`` (both slots of each), with its own log."""
    home.mkdir(exist_ok=True)
    kwargs.setdefault("slots", (0, 1))
    config = config_for(servers[0], home, store=store, **kwargs)
    fleet = Fleet.from_config(config, [s.url for s in servers], [s.slot_dir for s in servers])
    return PrefixProxy(config, fleet=fleet)


def session(name: str, turn: int) -> dict[str, Any]:
    return pi_chat_body(f"turn {turn}", variant=f"Session {name}.", max_tokens=2)


def post(url: str, payload: dict[str, Any]) -> None:
    response = httpx.post(url + "/v1/chat/completions", json=payload, timeout=60)
    assert response.status_code == 200, response.text


def pinned(fake: FakeLlamaServer, turn: str) -> list[int | None]:
    """The slot each real request of user turn ``turn`` was pinned to on ``fake``."""
    chats = fake.records_for("chat")
    return [r.body.get("id_slot") for r in chats if r.body["messages"][-1]["content"] == turn]


def registry_status(url: str) -> dict[str, Any]:
    data: dict[str, Any] = status(url)["fleet"]["registry"]
    return data


def places(r: redis.Redis) -> dict[str, Place | None]:
    return {
        key.decode()[len(PREFIX) + 3 :]: Place.decode(r.get(key)) for key in r.keys(PREFIX + "at:*")
    }


def test_a_prefix_placed_by_one_proxy_is_routed_to_its_slot_by_another(
    tmp_path: Path, pion_store: Any
) -> None:
    """Proxy A places three sessions: one on a's slot 0, two on b, three on a's slot 1.
    Proxy B, fresh, knows none of it: the registry sends session three's next turn to a's
    slot 1, not to the slot a fresh slot table would pick (0, session one's)."""
    store = f"redis://{pion_store.host}:{pion_store.port}"
    r = redis.Redis(host=pion_store.host, port=pion_store.port)
    with fakes(tmp_path, 2) as (a, b):
        first = proxy_for([a, b], tmp_path / "A", store)
        with running_proxy(first) as url:
            for name in ("one", "two", "three"):
                post(url, session(name, 1))
            assert first.flush()
        assert pinned(a, "turn 1") == [0, 1] and pinned(b, "turn 1") == [0]
        placed = places(r)
        assert sorted(placed.values(), key=str) == sorted(
            [Place(a.url, 0), Place(a.url, 1), Place(b.url, 0)], key=str
        )
        fp = next(fp for fp, place in placed.items() if place == Place(a.url, 1))
        # Its namespace is registered (text mode: no tokens, so no block hashes).
        assert r.execute_command("KV.PREFIX.OWNER", blocks_namespace(fp)) == b"0"

        second = proxy_for([a, b], tmp_path / "B", store)
        with running_proxy(second) as url:
            post(url, session("three", 2))
            post(url, session("one", 2))
            assert second.flush()
            counts = registry_status(url)["counts"]
    assert pinned(a, "turn 2") == [1, 0] and not pinned(b, "turn 2")
    assert a.slot_tokens(0) and a.slot_tokens(1)  # neither session evicted the other
    assert counts["found"] == 2 and not counts.get("errors")
    assert places(r)[fp] == Place(a.url, 1)


def test_a_proxys_places_live_while_it_does_and_expire_after(
    tmp_path: Path, pion_store: Any
) -> None:
    """A short TTL: the running proxy keeps refreshing its place past the TTL; once it
    is gone, the place expires and a new proxy routes as if none were known."""
    store = f"redis://{pion_store.host}:{pion_store.port}"
    r = redis.Redis(host=pion_store.host, port=pion_store.port)
    with fakes(tmp_path, 1) as (a,):
        proxy = proxy_for([a], tmp_path / "A", store, registry_ttl=0.6)
        with running_proxy(proxy) as url:
            post(url, session("one", 1))
            assert proxy.flush()
            until(lambda: registry_status(url)["counts"].get("refreshed", 0) >= 5)
            assert list(places(r).values()) == [Place(a.url, 0)]  # outlived its TTL
        until(lambda: not r.keys(PREFIX + "at:*"))
    assert not r.keys(PREFIX + "slot:*")


def test_taking_a_slot_over_drops_the_prefix_it_held(tmp_path: Path, pion_store: Any) -> None:
    """One slot, two sessions: the second takes the slot over, and the first's place
    and block hashes leave the registry."""
    store = f"redis://{pion_store.host}:{pion_store.port}"
    r = redis.Redis(host=pion_store.host, port=pion_store.port)
    with fakes(tmp_path, 1) as (a,):
        proxy = proxy_for([a], tmp_path / "A", store, slots=())
        with running_proxy(proxy) as url:
            post(url, session("one", 1))
            assert proxy.flush()
            (old,) = places(r)
            post(url, session("two", 1))
            assert proxy.flush()
            counts = registry_status(url)["counts"]
    (new,) = places(r)
    assert new != old and places(r)[new] == Place(a.url, 0)
    assert r.execute_command("KV.PREFIX.OWNER", blocks_namespace(old)) == b"-1"
    assert r.execute_command("KV.PREFIX.OWNER", blocks_namespace(new)) == b"0"
    assert counts["dropped"] == 1


def test_a_plain_redis_store_keeps_the_places(tmp_path: Path, redis_store: str) -> None:
    """A real redis-server as the store: no KV.PREFIX, so no namespaces (counted), but
    the places and their take-over work the same."""
    r = redis.Redis.from_url(redis_store)
    with fakes(tmp_path, 1) as (a,):
        proxy = proxy_for([a], tmp_path / "A", redis_store, slots=())
        with running_proxy(proxy) as url:
            post(url, session("one", 1))
            assert proxy.flush()
            (old,) = places(r)
            post(url, session("two", 1))
            assert proxy.flush()
            counts = registry_status(url)["counts"]
    (new,) = places(r)
    assert new != old and places(r)[new] == Place(a.url, 0)
    assert counts["dropped"] == 1 and counts["register_errors"] == 3
    assert not counts.get("errors")


def test_a_token_prefix_publishes_its_block_hashes(pion_store: Any) -> None:
    """A prefix known as tokens: its namespace holds its block hashes, so MEMBERSHIP
    tells how much of a longer request it covers; a malformed place reads as none."""
    store = StoreConfig(url=f"redis://{pion_store.host}:{pion_store.port}")
    tokens = list(range(1000, 1000 + 5 * BLOCK_SIZE + 3))  # five whole blocks
    longer = tokens + list(range(7, 7 + 3 * BLOCK_SIZE))
    lines: list[str] = []

    async def publish() -> Place | None:
        registry = PrefixRegistry(store, 30.0, lines.append)
        try:
            await registry.publish("f" * 64, Place("http://gpu0:8080", 2), tokens)
            return await registry.locate("f" * 64)
        finally:
            await registry.aclose()

    assert asyncio.run(publish()) == Place("http://gpu0:8080", 2)
    r = redis.Redis(host=pion_store.host, port=pion_store.port)
    probes = block_hashes(longer, BLOCK_SIZE)
    bitmap = r.execute_command(
        "KV.PREFIX.MEMBERSHIP", blocks_namespace("f" * 64), len(probes), hashes_to_blob(probes)
    )
    assert bitmap == bytes([0b00011111])  # the five blocks of the prefix, not the rest
    assert 0 < r.pttl(PREFIX + "at:" + "f" * 64) <= 30_000 and not lines
    assert Place.decode(b"no slot") is None and Place.decode(b"http://x\nslot") is None


def test_a_down_registry_never_fails_a_request(tmp_path: Path) -> None:
    """Nothing listens where the store should be: every request is answered, and the
    registry's failures are counted."""
    with fakes(tmp_path, 2) as (a, b):
        proxy = proxy_for([a, b], tmp_path / "A", f"redis://127.0.0.1:{free_port()}")
        with running_proxy(proxy) as url:
            for turn in (1, 2):
                post(url, session("one", turn))
                post(url, session("two", turn))
            assert proxy.flush()
            counts = registry_status(url)["counts"]
    assert counts["errors"] >= 1 and counts.get("skipped_down", 0) >= 1
    assert len(a.records_for("chat")) + len(b.records_for("chat")) >= 4
