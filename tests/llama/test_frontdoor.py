"""The proxy's front door (``pion.llama.frontdoor``): ``GET /pion/status`` answered in its
own thread while the event loop is held, every other request handed to uvicorn unread."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from pion.llama import httpserver
from pion.llama.config import WarmerConfig
from pion.llama.frontdoor import FastRequest, fast_request
from pion.llama.proxy import STATUS_PATH, PrefixProxy, running_proxy, serve_in_thread

PATHS = frozenset({STATUS_PATH})
GET = b"GET /pion/status HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (GET, FastRequest(STATUS_PATH, len(GET), keep_alive=True)),
        (GET + b"POST /v1/chat", FastRequest(STATUS_PATH, len(GET), keep_alive=True)),
        (
            b"GET /pion/status?x=1 HTTP/1.1\r\nhost: x\r\nConnection: Close\r\n\r\n",
            FastRequest(STATUS_PATH, 61, keep_alive=False),
        ),
        (b"GET /pion/status HTTP/1.0\r\n\r\n", FastRequest(STATUS_PATH, 29, keep_alive=False)),
        (
            b"GET /pion/status HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
            FastRequest(STATUS_PATH, 53, keep_alive=True),
        ),
    ],
)
def test_status_heads_are_recognised(data: bytes, expected: FastRequest) -> None:
    assert fast_request(data, PATHS) == expected


@pytest.mark.parametrize(
    "data",
    [
        GET[:-1],  # the head is not complete yet
        b"",
        b"GET /pion/metrics HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /pion/statusx HTTP/1.1\r\nHost: x\r\n\r\n",
        b"HEAD /pion/status HTTP/1.1\r\nHost: x\r\n\r\n",
        b"POST /pion/status HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
        b"GET /pion/status HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
        b"GET /pion/status HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"GET /pion/status HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n\r\n",
        b"GET /pion/status HTTP/1.1\r\n\r\n",  # no Host: uvicorn's 400
        b"GET /pion/status HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n",
        b"GET /pion/status HTTP/1.1\r\nHost : x\r\n\r\n",
        b"GET /pion/status HTTP/1.1\r\nno colon\r\n\r\n",
        b"GET  /pion/status HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /pion/status HTTP/2.0\r\nHost: x\r\n\r\n",
        b"GET /pion/\xffstatus HTTP/1.1\r\nHost: x\r\n\r\n",
    ],
)
def test_anything_else_goes_to_uvicorn(data: bytes) -> None:
    assert fast_request(data, PATHS) is None


@given(st.binary(max_size=200))
def test_any_bytes_give_a_request_or_none(data: bytes) -> None:
    found = fast_request(GET[:20] + data, PATHS)
    if found is not None:
        head = (GET[:20] + data)[: found.size]
        assert head.endswith(b"\r\n\r\n") and head.count(b"\r\n\r\n") == 1


def _upstream() -> Starlette:
    async def models(_request: Request) -> Response:
        return JSONResponse({"data": [{"id": "stand-in"}]})

    return Starlette(routes=[Route("/v1/models", models)])


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[tuple[PrefixProxy, str]]:
    """A proxy in front of a stand-in upstream; yields (proxy, its URL)."""
    with serve_in_thread(_upstream()) as up:
        config = WarmerConfig(base_url=up, log_path=tmp_path / "prefix-cache.log", timeout=10)
        app = PrefixProxy(config)
        with running_proxy(app) as url:
            yield app, url


class HeldLoop:
    """Holds the proxy's event loop (one callback that does not return) until released."""

    def __init__(self, proxy: PrefixProxy) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

        async def hold() -> None:
            self.entered.set()
            self.release.wait(60)  # blocks the loop: nothing else runs on it meanwhile

        self._thread = threading.Thread(target=proxy.call, args=(hold(),), daemon=True)

    def __enter__(self) -> HeldLoop:
        self._thread.start()
        assert self.entered.wait(30)
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self._thread.join(30)


def test_status_answers_while_the_loop_is_held(proxy: tuple[PrefixProxy, str]) -> None:
    app, url = proxy
    forwarded: list[int] = []
    with HeldLoop(app) as held:
        # Another request is handed to the loop: it waits there.
        other = threading.Thread(
            target=lambda: forwarded.append(httpx.get(url + "/v1/models", timeout=60).status_code)
        )
        other.start()
        resp = httpx.get(url + STATUS_PATH, timeout=30)
        assert resp.status_code == 200
        assert resp.headers["content-type"] == "application/json"
        assert resp.json()["upstream"] == app.config.base_url
        assert not held.release.is_set() and forwarded == []  # the loop was held throughout
    other.join(60)
    assert forwarded == [200]


def test_the_front_door_answers_what_the_loop_answers(proxy: tuple[PrefixProxy, str]) -> None:
    app, url = proxy
    front = httpx.get(url + STATUS_PATH, timeout=30).json()
    # With a body header the request is uvicorn's: the app's own route answers it.
    loop = httpx.request("GET", url + STATUS_PATH, content=b"", headers={"content-length": "0"})
    assert loop.status_code == 200
    assert set(front) == set(loop.json()) == set(app.status())
    assert front["fleet"]["servers"][0]["url"] == app.config.base_url


def test_status_read_right_after_an_answer_holds_it(tmp_path: Path) -> None:
    """The counters an answer changed are in the status read right after it (the front
    door reads them in its thread: nothing is left for the loop to do)."""
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    config = WarmerConfig(
        base_url=f"http://127.0.0.1:{dead.getsockname()[1]}",
        log_path=tmp_path / "prefix-cache.log",
        timeout=10,
    )
    app = PrefixProxy(config)
    with running_proxy(app) as url, httpx.Client(timeout=30) as client:
        for n in range(1, 4):
            assert client.get(url + "/v1/models").status_code == 502
            status = httpx.get(url + STATUS_PATH, timeout=30).json()
            assert status["upstream_errors"]["unreachable"] == n
    dead.close()


def _read_response(sock: socket.socket, buf: bytearray) -> tuple[bytes, dict[str, str], bytes]:
    """One response from ``sock`` (status line, headers, body by content-length); what
    follows it stays in ``buf``."""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        assert chunk, f"closed before a response: {bytes(buf)!r}"
        buf += chunk
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    line, *fields = head.split(b"\r\n")
    headers = {
        k.strip().lower().decode(): v.strip().decode()
        for k, v in (f.split(b":", 1) for f in fields)
    }
    size = int(headers["content-length"])
    while len(rest) < size:
        chunk = sock.recv(65536)
        assert chunk
        rest += chunk
    buf[:] = rest[size:]
    return line, headers, rest[:size]


def _connect(url: str) -> socket.socket:
    return socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=30)


def test_keep_alive_then_a_request_for_the_loop(proxy: tuple[PrefixProxy, str]) -> None:
    _app, url = proxy
    buf = bytearray()
    with _connect(url) as sock:
        for _ in range(2):
            sock.sendall(GET)
            line, headers, body = _read_response(sock, buf)
            assert line == b"HTTP/1.1 200 OK" and "connection" not in headers
            assert json.loads(body)["upstream"]
        # Pipelined: a status request and one for the loop in one write, answered in order;
        # then the connection is the loop's, and so is the status request after them.
        sock.sendall(GET + b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n" + GET)
        answers: list[Any] = [json.loads(_read_response(sock, buf)[2]) for _ in range(3)]
        assert answers[0]["upstream"] and answers[2]["upstream"]
        assert answers[1] == {"data": [{"id": "stand-in"}]}


def test_connection_close_is_honoured(proxy: tuple[PrefixProxy, str]) -> None:
    _app, url = proxy
    buf = bytearray()
    with _connect(url) as sock:
        sock.sendall(GET.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
        line, headers, _body = _read_response(sock, buf)
        assert line == b"HTTP/1.1 200 OK" and headers["connection"] == "close"
        assert sock.recv(1) == b""  # closed after the answer


def test_a_silent_connection_gets_uvicorns_header_timeout(
    proxy: tuple[PrefixProxy, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _app, url = proxy
    monkeypatch.setattr(httpserver, "HEADER_TIMEOUT", 0.5)
    with _connect(url) as sock:
        sock.settimeout(30)
        assert sock.recv(1) == b""  # handed to uvicorn, closed by TimedH11Protocol


def test_a_failing_answer_is_left_to_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fails() -> bytes:
        raise RuntimeError("status failed")

    with serve_in_thread(_upstream()) as up:
        app = PrefixProxy(WarmerConfig(base_url=up, log_path=tmp_path / "p.log", timeout=10))
        monkeypatch.setattr(app, "status_json", fails)
        with running_proxy(app) as url:
            resp = httpx.get(url + STATUS_PATH, timeout=30)
            assert resp.status_code == 200 and resp.json()["upstream"] == up


def test_shutdown_closes_the_port_and_the_connections_held(tmp_path: Path) -> None:
    with serve_in_thread(_upstream()) as up:
        app = PrefixProxy(WarmerConfig(base_url=up, log_path=tmp_path / "p.log", timeout=10))
        with running_proxy(app) as url:
            kept = _connect(url)
            kept.sendall(GET)
            assert _read_response(kept, bytearray())[0] == b"HTTP/1.1 200 OK"
        with kept:
            assert kept.recv(1) == b""  # the keep-alive connection held here is closed
        with pytest.raises(ConnectionRefusedError):
            _connect(url).close()
