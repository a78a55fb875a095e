"""Two real llama-servers (the tiny generated model, each with its own slot dir) behind
one proxy, and a real pion-server as the shared store: sessions spread over both, a
session's next turn is a hit where it is warm, and when its server is stopped the
session continues on the other, pulled from the store, not prefilled again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from pion_testing.llama_samples import pi_chat_body

from pion.llama.config import WarmerConfig
from pion.llama.fleet import Fleet
from pion.llama.proxy import STATUS_PATH, PrefixProxy, running_proxy

from .conftest import StartServer, store_url

pytestmark = pytest.mark.llama


def session(name: str, turn: int) -> dict[str, Any]:
    return pi_chat_body(f"turn {turn}", variant=f"Session {name}.", max_tokens=2)


def post(url: str, payload: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The answer's timings and the fleet's status after it."""
    response = httpx.post(url + "/v1/chat/completions", json=payload, timeout=120)
    assert response.status_code == 200, response.text
    fleet: dict[str, Any] = httpx.get(url + STATUS_PATH, timeout=30).json()["fleet"]
    timings: dict[str, Any] = response.json()["timings"]
    return timings, fleet


def test_two_llama_servers_share_sessions_and_fail_over(
    start_server: StartServer, tiny_model: Path, tmp_path: Path, pion_store: Any
) -> None:
    dirs = [tmp_path / "slots-a", tmp_path / "slots-b"]
    a, b = (start_server(tiny_model, slot_dir=d) for d in dirs)
    config = WarmerConfig(
        base_url=a.url,
        persist=True,
        slot_dir=dirs[0],
        log_path=tmp_path / "prefix-cache.log",
        timeout=120.0,
        store=store_url(pion_store),
        store_timeout=1.0,
    )
    proxy = PrefixProxy(config, fleet=Fleet.from_config(config, [a.url, b.url], dirs))
    with running_proxy(proxy) as url:
        post(url, session("one", 1))
        _, fleet = post(url, session("two", 1))
        assert [s["routed"] for s in fleet["servers"]] == [{"cold": 1}, {"cold": 1}]
        warm, fleet = post(url, session("one", 2))
        assert fleet["servers"][0]["routed"] == {"cold": 1, "hit": 1}
        assert proxy.flush()  # session one's prefix is in the store
        a.stop()
        pulled, fleet = post(url, session("one", 3))
    tokens = fleet["servers"][1]["slots"]["0"]["tokens"]
    assert warm["cache_n"] >= 0.9 * tokens
    assert pulled["cache_n"] >= 0.9 * tokens  # B restored A's prefix: no cold prefill
    assert not fleet["servers"][0]["healthy"]
    assert fleet["servers"][1]["routed"] == {"cold": 1, "pull": 1}
    assert fleet["decisions"] == {"cold": 2, "hit": 1, "pull": 1, "failover": 1}


def test_two_proxies_route_a_session_to_the_same_real_server(
    start_server: StartServer, tiny_model: Path, tmp_path: Path, pion_store: Any
) -> None:
    """Proxy A places session one on llama-server a and session two on b. Proxy B starts
    fresh in front of the same servers: its own tables are empty (alone, it would send
    session two's next turn to a, the first of two idle servers, and prefill it cold);
    the registry in the shared pion-server sends it to b, whose slot still holds the
    prefix: the turn reuses it (B's own table knew nothing of the slot, so B counts its
    check of the slot as a warm-up). No slot files (no --persist): nothing but the
    registry says where the session is."""
    dirs = [tmp_path / "slots-a", tmp_path / "slots-b"]
    a, b = (start_server(tiny_model, slot_dir=d) for d in dirs)

    def proxy(name: str) -> PrefixProxy:
        config = WarmerConfig(
            base_url=a.url,
            persist=False,
            slot_dir=dirs[0],
            log_path=tmp_path / f"prefix-cache-{name}.log",
            timeout=120.0,
            store=store_url(pion_store),
            store_timeout=1.0,
        )
        return PrefixProxy(config, fleet=Fleet.from_config(config, [a.url, b.url], dirs))

    first = proxy("A")
    with running_proxy(first) as url:
        post(url, session("one", 1))
        _, fleet = post(url, session("two", 1))
        assert first.flush()  # places published
    assert [s["routed"] for s in fleet["servers"]] == [{"cold": 1}, {"cold": 1}]
    second = proxy("B")
    with running_proxy(second) as url:
        timings, fleet = post(url, session("two", 2))
    assert fleet["servers"][0]["routed"] == {}
    assert sum(fleet["servers"][1]["routed"].values()) == 1
    assert fleet["registry"]["counts"]["found"] == 1
    tokens = fleet["servers"][1]["slots"]["0"]["tokens"]
    assert timings["cache_n"] >= 0.9 * tokens
