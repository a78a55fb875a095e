"""The proxy: byte-exact forwarding, streaming, fail-open, and the warmer through real HTTP."""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pion_testing.launcher import LlamaServerProcess, free_port
from pion_testing.llama_samples import pi_chat_body
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from pion.llama.config import WarmerConfig
from pion.llama.endpoints import EndpointKind
from pion.llama.lease import SlotLeases
from pion.llama.outcome import Outcome
from pion.llama.prompt import MAX_WARM_BODY
from pion.llama.proxy import STATUS_PATH, PrefixProxy, pin_slot, running_proxy, serve_in_thread
from pion.llama.warmer import PrefixWarmer, Ticket
from support import count, log_lines, wait_log
from support.fake_llama import fake_llama_server

from .conftest import StartServer

MakeConfig = Callable[..., WarmerConfig]

# The final event carries timings, as llama-server's does; raw UTF-8 on purpose.
SSE_BYTES = (
    b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":null}}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{"content":"Hi \xc3\xa9"}}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],'
    b'"timings":{"cache_n":1300,"prompt_n":70,"prompt_ms":5.0}}\n\n'
    b"data: [DONE]\n\n"
)
# Uneven chunk edges that split lines, events and the two bytes of "é".
SSE_CUTS = (0, 5, 90, 91, 120, 121, 160, len(SSE_BYTES))
JSON_BYTES = b'{"ok": true,  "timings": {"cache_n": 5, "prompt_n": 5}}'


class Recorder:
    """A stand-in upstream for the byte-level units: records requests, answers fixed bytes."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, bytes, dict[str, str]]] = []
        methods = ["GET", "POST", "PUT", "DELETE"]
        self.app = Starlette(routes=[Route("/{p:path}", self.handle, methods=methods)])

    async def handle(self, request: Request) -> Response:
        body = await request.body()
        target = request.url.path + "?" + request.url.query
        self.requests.append((request.method, target, body, dict(request.headers)))
        if request.url.path != "/v1/chat/completions":
            return Response(b'{"error":"not llama-server"}', status_code=404)
        if b'"stream": true' in body or b'"stream":true' in body:

            async def chunks() -> AsyncIterator[bytes]:
                for a, b in itertools.pairwise(SSE_CUTS):
                    yield SSE_BYTES[a:b]

            return StreamingResponse(chunks(), media_type="text/event-stream")
        headers = {"x-upstream": "1"}
        return Response(JSON_BYTES, media_type="application/json", headers=headers)

    def chat_requests(self) -> list[tuple[str, str, bytes, dict[str, str]]]:
        return [r for r in self.requests if r[1].startswith("/v1/chat/completions")]


@pytest.fixture
def recorder(tmp_path: Path) -> Iterator[tuple[Recorder, str, str, Path]]:
    """A recording upstream and a proxy in front of it; yields (recorder, up, proxy, log)."""
    rec = Recorder()
    log = tmp_path / "prefix-cache.log"
    with serve_in_thread(rec.app) as up:
        proxy = PrefixProxy(WarmerConfig(base_url=up, log_path=log, timeout=10))
        with running_proxy(proxy) as proxy_url:
            yield rec, up, proxy_url, log


def test_request_body_is_forwarded_byte_for_byte(
    recorder: tuple[Recorder, str, str, Path],
) -> None:
    rec, up, proxy_url, log = recorder
    body = pi_chat_body()
    # Odd spacing, escaped unicode and a trailing newline: a re-encoded body would differ.
    raw = (json.dumps(body, indent=3, ensure_ascii=True) + "\n").replace('"model"', '"model" ')
    raw = raw.replace("You are", "You \\u0061re")
    sent = raw.encode()
    resp = httpx.post(
        proxy_url + "/v1/chat/completions?x=1&y=%20",
        content=sent,
        headers={"content-type": "application/json", "x-custom": "kept", "user-agent": "pi/1"},
    )
    direct = httpx.post(up + "/v1/chat/completions", content=sent)
    assert resp.status_code == 200
    assert resp.content == JSON_BYTES
    assert resp.headers.multi_items() == direct.headers.multi_items()  # x-upstream too
    (method, path, got, headers) = rec.chat_requests()[-2]
    assert (method, path, got) == ("POST", "/v1/chat/completions?x=1&y=%20", sent)
    assert headers["x-custom"] == "kept" and headers["user-agent"] == "pi/1"
    # The stand-in is not llama-server: the warmer failed, the request went through anyway.
    lines = wait_log(log, "observed normal request: prompt_n=5 cache_n=5 (reuse 50%)")
    assert count(lines, "disabled this session (fail-open): HTTP 404") == 1
    assert count(lines, "observed normal request: prompt_n=5 cache_n=5 (reuse 50%)") == 1


def test_streamed_response_is_byte_identical(recorder: tuple[Recorder, str, str, Path]) -> None:
    _rec, up, proxy_url, log = recorder
    body = json.dumps(pi_chat_body(stream=True)).encode()

    def fetch(base: str) -> tuple[bytes, str]:
        with httpx.stream("POST", base + "/v1/chat/completions", content=body) as resp:
            return b"".join(resp.iter_raw()), resp.headers["content-type"]

    (direct, direct_type), (proxied, proxied_type) = fetch(up), fetch(proxy_url)
    assert direct == SSE_BYTES
    assert proxied == direct and proxied_type == direct_type
    lines = wait_log(log, "observed normal request: prompt_n=70 cache_n=1300 (reuse 95%)")
    assert count(lines, "observed normal request: prompt_n=70 cache_n=1300 (reuse 95%)") == 1


def test_other_paths_and_methods_pass_through(recorder: tuple[Recorder, str, str, Path]) -> None:
    rec, _, proxy_url, _ = recorder
    assert httpx.get(proxy_url + "/v1/models?a=b").status_code == 404
    assert httpx.delete(proxy_url + "/anything").status_code == 404
    assert [r[:2] for r in rec.requests[-2:]] == [
        ("GET", "/v1/models?a=b"),
        ("DELETE", "/anything?"),
    ]


def test_pin_slot_inserts_only_id_slot() -> None:
    assert pin_slot(b'{"a":1}', 2) == b'{"id_slot":2,"a":1}'
    assert pin_slot(b'  {\n "a": 1}\n', 0) == b'  {"id_slot":0,\n "a": 1}\n'
    assert pin_slot(b"{ }", 1) == b'{"id_slot":1 }'
    for bad in (b"[1]", b"", b"  ", b'"x"'):
        with pytest.raises(ValueError):
            pin_slot(bad, 0)


_objects = st.dictionaries(
    st.text(max_size=8).filter(lambda k: k != "id_slot"),
    st.none() | st.integers() | st.text(max_size=8) | st.lists(st.integers(), max_size=3),
    max_size=6,
)


@given(_objects, st.integers(0, 4095), st.integers(0, 3), st.booleans())
def test_pin_slot_keeps_the_object(
    obj: dict[str, Any], slot: int, indent: int, ascii_: bool
) -> None:
    raw = json.dumps(obj, indent=indent or None, ensure_ascii=ascii_).encode()
    pinned = pin_slot(raw, slot)
    assert json.loads(pinned) == {"id_slot": slot, **obj}
    assert pinned.replace(b'"id_slot":%d' % slot, b"", 1).replace(b"{,", b"{", 1) == raw


class HitWarmer(PrefixWarmer):
    """A unit stand-in: every warmable request is a hit in slot 2 (no llama-server)."""

    async def claim(
        self, kind: EndpointKind, body: Mapping[str, Any], harness: str, *, pinnable: bool
    ) -> Ticket:
        self.leases = self.leases or SlotLeases((2,))
        lease = await self.leases.acquire(lambda free: 2, wait=5)
        return Ticket(Outcome("hit", "f" * 64, 2, 1000), lease, 2 if pinnable else None)


@pytest.mark.parametrize("multi", [True, False])
def test_multi_slot_proxy_pins_the_request_to_its_slot(tmp_path: Path, multi: bool) -> None:
    rec = Recorder()
    with serve_in_thread(rec.app) as up:
        config = WarmerConfig(
            base_url=up, log_path=tmp_path / "pc.log", slots=(0, 1, 2) if multi else ()
        )
        with running_proxy(PrefixProxy(config, HitWarmer(config))) as proxy_url:
            sent = json.dumps(pi_chat_body(), indent=1).encode()
            resp = httpx.post(proxy_url + "/v1/chat/completions", content=sent)
            pinned_by_client = json.dumps({**pi_chat_body(), "id_slot": 0}).encode()
            httpx.post(proxy_url + "/v1/chat/completions", content=pinned_by_client)
            bom = b"\xef\xbb\xbf" + sent  # valid JSON to json.loads, but not "{" first
            with_bom = httpx.post(proxy_url + "/v1/chat/completions", content=bom)
    assert resp.status_code == 200 and resp.content == JSON_BYTES
    assert with_bom.status_code == 200
    (_, _, got, _), (_, _, got_pinned, _), (_, _, got_bom, _) = rec.chat_requests()
    assert got_bom == bom
    # Pinned with one slot too: every warmed request runs in the slot it leased.
    assert got == pin_slot(sent, 2)
    assert got_pinned == pinned_by_client  # a client's own id_slot is never touched


# -- against the real llama-server ---------------------------------------------------------


def proxied_chat(proxy_url: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    resp = httpx.post(proxy_url + "/v1/chat/completions", json=body, headers=headers, timeout=120)
    return resp


@pytest.mark.llama
def test_proxy_cold_hit_then_restore_after_restart(
    llama_server: LlamaServerProcess, make_config: MakeConfig, slot_dir: Path
) -> None:
    config = make_config(llama_server)
    body = pi_chat_body(max_tokens=2)
    with running_proxy(PrefixProxy(config)) as proxy_url:
        first = proxied_chat(proxy_url, body)
        second = proxied_chat(proxy_url, pi_chat_body("Another question", max_tokens=2))
        llama_server.restart()
        third = proxied_chat(proxy_url, body)
        status = httpx.get(proxy_url + STATUS_PATH).json()
    assert [r.status_code for r in (first, second, third)] == [200, 200, 200]
    for resp in (first, second, third):
        assert resp.json()["timings"]["cache_n"] > 1000
    assert status["counts"] == {"cold": 1, "hit": 1, "restored": 1}
    assert [o["kind"] for o in status["outcomes"]] == ["cold", "hit", "restored"]
    assert len(status["files"]) == 1 and status["persist"]
    lines = wait_log(config.log_path, "observed normal request", 3)
    assert count(lines, "COLD — warmed") == 1
    assert count(lines, "WARM — slot already hot") == 1
    assert count(lines, "RESTORE verified by the real request") == 1
    assert count(lines, "observed normal request") == 3


@pytest.mark.llama
def test_proxy_streams_real_server_and_reads_final_timings(
    llama_server: LlamaServerProcess, make_config: MakeConfig
) -> None:
    config = make_config(llama_server, persist=False)
    body = pi_chat_body(max_tokens=3, stream=True)
    with (
        running_proxy(PrefixProxy(config)) as proxy_url,
        httpx.stream("POST", proxy_url + "/v1/chat/completions", json=body) as resp,
    ):
        assert resp.headers["content-type"].startswith("text/event-stream")
        raw = b"".join(resp.iter_raw())
    events = [json.loads(line[6:]) for line in raw.split(b"\n") if line.startswith(b"data: {")]
    final = events[-1]["timings"]
    assert final["cache_n"] > 1000
    expected = f"observed normal request: prompt_n={final['prompt_n']} cache_n={final['cache_n']}"
    assert count(wait_log(config.log_path, expected), expected) == 1


@pytest.mark.llama
def test_proxy_passes_other_llama_endpoints(
    llama_server: LlamaServerProcess, make_config: MakeConfig
) -> None:
    with running_proxy(PrefixProxy(make_config(llama_server))) as proxy_url:
        models = httpx.get(proxy_url + "/v1/models").json()
        health = httpx.get(proxy_url + "/health").json()
        raw = httpx.post(
            proxy_url + "/completion", json={"prompt": "Hello", "n_predict": 2}, timeout=60
        ).json()
    assert models["data"][0]["id"] and health == {"status": "ok"}
    assert raw["timings"]["prompt_n"] > 0


@pytest.mark.llama
def test_proxy_upstream_down_then_back(
    start_server: StartServer, tiny_model: Path, make_config: MakeConfig
) -> None:
    port = free_port()
    dead = LlamaServerProcess(Path("/nonexistent"), tiny_model, port=port)
    config = make_config(dead)
    body = pi_chat_body(max_tokens=2)
    with running_proxy(PrefixProxy(config)) as proxy_url:
        down = proxied_chat(proxy_url, body)
        start_server(tiny_model, port=port)
        back = proxied_chat(proxy_url, body)
    assert down.status_code == 502 and "unreachable" in down.json()["error"]["message"]
    assert back.status_code == 200
    lines = log_lines(config.log_path)
    assert count(lines, "disabled this session (fail-open): ConnectError") == 1
    assert count(lines, "COLD — warmed") == 1


@pytest.mark.llama
def test_proxy_warm_up_error_does_not_block_request(
    start_server: StartServer, tiny_model: Path, make_config: MakeConfig
) -> None:
    server = start_server(tiny_model, extra_args=["--api-key", "secret"])
    config = make_config(server)
    with running_proxy(PrefixProxy(config)) as proxy_url:
        resp = proxied_chat(proxy_url, pi_chat_body(max_tokens=2), Authorization="Bearer secret")
    assert resp.status_code == 200
    lines = log_lines(config.log_path)
    assert count(lines, "disabled this session (fail-open): HTTP 401") == 1


@pytest.mark.llama
def test_proxy_concurrent_requests(
    llama_server: LlamaServerProcess, make_config: MakeConfig
) -> None:
    config = make_config(llama_server)
    statuses: list[int] = []
    with running_proxy(PrefixProxy(config)) as proxy_url:
        threads = [
            threading.Thread(
                target=lambda i=i: statuses.append(
                    proxied_chat(proxy_url, pi_chat_body(f"question {i}", max_tokens=2)).status_code
                )
            )
            for i in range(4)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert statuses == [200] * 4
    lines = wait_log(config.log_path, "observed normal request", 4)
    assert count(lines, "warm-up done") == 1
    assert count(lines, "WARM — slot already hot") == 3
    assert count(lines, "observed normal request") == 4


def test_hostile_bodies_are_forwarded_as_sent(recorder: tuple[Recorder, str, str, Path]) -> None:
    """Nesting too deep to parse and a body over the warm limit: forwarded byte for byte,
    never a 500; the big one streamed (never parsed, rendered or warmed)."""
    rec, _up, proxy_url, _log = recorder
    deep = b"[" * 100_000 + b"]" * 100_000
    big = json.dumps({"messages": [], "pad": "x" * (MAX_WARM_BODY + 10)}).encode()
    latin = b'{"messages": "caf\xe9"}'
    for sent in (deep, big, latin):
        resp = httpx.post(proxy_url + "/v1/chat/completions", content=sent, timeout=60)
        assert resp.status_code == 200 and resp.content == JSON_BYTES
        assert rec.chat_requests()[-1][2] == sent
    status = httpx.get(proxy_url + STATUS_PATH).json()
    reasons = [o["detail"] for o in status["outcomes"] if o["kind"] == "skipped"]
    assert reasons == [
        "body nests too deep to parse: forwarded as sent",
        f"body is over {MAX_WARM_BODY} bytes: streamed, not warmed",
        "body is not JSON",
    ]
    assert status["errors"] == {}


def test_wedged_upstream_gets_504_in_llama_servers_shape(tmp_path: Path) -> None:
    slot_dir = tmp_path / "slots"
    slot_dir.mkdir()
    with fake_llama_server(slot_dir) as fake:
        fake.delay("slots", 3.0)
        config = WarmerConfig(base_url=fake.url, log_path=tmp_path / "pc.log", upstream_timeout=0.2)
        with running_proxy(PrefixProxy(config)) as url:
            resp = httpx.get(url + "/slots", timeout=30)
            status = httpx.get(url + STATUS_PATH, timeout=30).json()
    assert resp.status_code == 504
    assert resp.json()["error"]["code"] == 504
    assert resp.json()["error"]["type"] == "unavailable_error"
    assert status["upstream_errors"]["timeouts"] == 1
    assert status["upstream_errors"]["last"]["code"] == 504
