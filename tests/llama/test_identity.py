"""The upstream's llama-server process (pion.llama.identity): found from /proc, checked
with one readlink, and what the proxy trusts with it (a hit asks llama-server nothing
while the process that confirmed the slot still serves; a restart is still noticed
before the request)."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from pion_testing.launcher import LlamaServerProcess
from pion_testing.llama_samples import pi_chat_body

from pion.llama import steps
from pion.llama.config import WarmerConfig
from pion.llama.identity import ServerProcess, find, listening_inodes
from pion.llama.proxy import STATUS_PATH, PrefixProxy, running_proxy
from support.fake_llama import fake_llama_server
from support.fake_llama_proxy import BYTES_PER_TOKEN, config_for, read_fake_slot_files, status

MakeConfig = Callable[..., WarmerConfig]

_HEADER = (
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid"
    "  timeout inode\n"
)


def _row(local: str, state: str, inode: int) -> str:
    timers = "00000000:00000000 00:00000000 00000000"
    return f"   0: {local} 00000000:0000 {state} {timers}  0  0 {inode} 1\n"


def fake_proc(tmp_path: Path, port: int, holders: dict[int, str]) -> Path:
    """A /proc with a socket listening on ``port`` (inode 4242, IPv4) and one on port+1
    (IPv6, inode 4343), a connected socket on ``port`` (inode 5555), and ``holders``
    (pid -> comm) each holding inode 4242 on descriptor 7."""
    proc = tmp_path / "proc"
    (proc / "net").mkdir(parents=True)
    (proc / "net" / "tcp").write_text(
        _HEADER
        + _row(f"0100007F:{port:04X}", "0A", 4242)
        + _row(f"0100007F:{port:04X}", "01", 5555)
        + "   1: garbage\n"
    )
    (proc / "net" / "tcp6").write_text(
        _HEADER + _row(f"00000000000000000000000000000000:{port + 1:04X}", "0A", 4343)
    )
    (proc / "self").mkdir()
    for pid, comm in holders.items():
        fd = proc / str(pid) / "fd"
        fd.mkdir(parents=True)
        (proc / str(pid) / "comm").write_text(comm + "\n")
        os.symlink("socket:[4242]", fd / "7")
        os.symlink("/dev/null", fd / "0")
    return proc


def test_listening_inodes_reads_ipv4_and_ipv6_listeners_only(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, 8080, {})
    assert listening_inodes(8080, proc) == {4242}
    assert listening_inodes(8081, proc) == {4343}
    assert listening_inodes(9, proc) == set()
    assert listening_inodes(8080, tmp_path / "nothing") == set()


def test_find_takes_only_a_llama_process_on_a_loopback_url(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, 8080, {10: "docker-proxy", 20: "llama-server"})
    assert find("http://127.0.0.1:8080", proc) == ServerProcess(20, 7, 4242)
    assert find("http://localhost:8080/", proc) == ServerProcess(20, 7, 4242)
    # A port forwarder outlives the llama-server behind it: it proves nothing.
    assert (
        find(
            "http://127.0.0.1:8080",
            fake_proc(tmp_path / "b", 8080, {10: "docker-proxy"}),
        )
        is None
    )
    assert find("http://10.1.2.3:8080", proc) is None  # remote: never known
    assert find("http://gpu-box:8080", proc) is None
    assert find("http://127.0.0.1:9999", proc) is None  # nothing listens
    assert find("http://127.0.0.1:bad", proc) is None


def listening() -> tuple[socket.socket, ServerProcess]:
    """A listening socket of this process, and this process as its holder."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock, ServerProcess(os.getpid(), sock.fileno(), os.fstat(sock.fileno()).st_ino)


def test_serves_follows_the_descriptor() -> None:
    """A process holding the socket serves; once it is closed (a server that stopped, or
    a new one under the same pid with another socket) it does not."""
    sock, me = listening()
    inode = me.inode
    assert me.serves()
    assert not ServerProcess(os.getpid(), sock.fileno(), inode + 1).serves()
    sock.close()
    assert not me.serves()


@pytest.mark.llama
def test_find_knows_a_real_llama_server_and_its_restart(
    llama_server: LlamaServerProcess,
) -> None:
    first = find(llama_server.url)
    assert first is not None and first.pid == llama_server.pid and first.serves()
    llama_server.restart()
    assert not first.serves()
    second = find(llama_server.url)
    assert second is not None and second != first and second.serves()


def _ask(url: str, question: str) -> httpx.Response:
    body = pi_chat_body(question, max_tokens=2)
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=120)


@pytest.mark.llama
def test_hits_on_a_local_server_ask_nothing_and_a_restart_is_still_noticed(
    llama_server: LlamaServerProcess, make_config: MakeConfig
) -> None:
    proxy = PrefixProxy(make_config(llama_server))
    with running_proxy(proxy) as url:
        answers = [_ask(url, q) for q in ("first", "second", "third")]
        proxy.flush()
        before = httpx.get(url + STATUS_PATH).json()
        old_pid = llama_server.pid
        llama_server.restart()
        answers.append(_ask(url, "fourth"))
        proxy.flush()
        after = httpx.get(url + STATUS_PATH).json()
    assert [a.status_code for a in answers] == [200] * 4
    assert [o["kind"] for o in after["outcomes"]] == ["cold", "hit", "hit", "restored"]
    # The two hits asked no GET /slots: the process that confirmed the slot still served.
    assert before["events"].get("slot_snapshots", 0) == 0
    assert before["upstream_process"] == {"pid": old_pid, "serves": True}
    # After the restart the old process no longer served: asked, found empty, restored.
    assert after["events"]["slot_snapshots"] == 1
    assert after["upstream_process"] == {"pid": llama_server.pid, "serves": True}
    assert answers[-1].json()["timings"]["cache_n"] > 1000


@pytest.mark.llama
def test_check_every_hit_asks_for_each_hit(
    llama_server: LlamaServerProcess, make_config: MakeConfig
) -> None:
    proxy = PrefixProxy(make_config(llama_server, check_every_hit=True))
    with running_proxy(proxy) as url:
        answers = [_ask(url, q) for q in ("first", "second", "third")]
        proxy.flush()
        status = httpx.get(url + STATUS_PATH).json()
    assert [a.status_code for a in answers] == [200] * 3
    assert [o["kind"] for o in status["outcomes"]] == ["cold", "hit", "hit"]
    assert status["events"]["slot_snapshots"] == 2
    assert status["upstream_process"] is None


def test_a_restart_forgets_every_slot_the_old_process_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two prefixes in two slots; llama-server restarts. The request that notices it
    (its process no longer serves) restores its own slot, and what the other slot held
    is forgotten with the old process: the next hit asks nothing (had the other slot's
    state stayed, unconfirmed by the new process, every request would ask again).
    The fake runs in this process, so the "process" is a socket this test holds."""
    read_fake_slot_files(monkeypatch)
    old_sock, old = listening()
    new_sock, new = listening()
    serving = [old]
    monkeypatch.setattr(steps, "find_server", lambda _url: serving[0])
    (tmp_path / "slots").mkdir()
    with fake_llama_server(tmp_path / "slots", n_slots=2, bytes_per_token=BYTES_PER_TOKEN) as fake:
        proxy = PrefixProxy(config_for(fake, tmp_path, all_slots=True))
        with running_proxy(proxy) as url:

            def ask(variant: str, question: str) -> None:
                body = pi_chat_body(question, variant=variant, max_tokens=2)
                response = httpx.post(url + "/v1/chat/completions", json=body, timeout=60)
                assert response.status_code == 200
                proxy.flush()

            ask("", "main")
            ask("You write a short title for the conversation.", "title")
            ask("", "main again")
            before = status(url)["events"].get("slot_snapshots", 0)
            fake.restart()
            old_sock.close()
            serving[0] = new
            ask("", "after the restart")
            ask("", "and once more")
            final = status(url)
    new_sock.close()
    kinds = [o["kind"] for o in final["outcomes"]]
    assert kinds == ["cold", "cold", "hit", "restored", "hit"]
    assert before == 0
    assert final["events"]["slot_snapshots"] == 1  # the one that noticed the restart
    assert final["upstream_process"] == {"pid": os.getpid(), "serves": True}
