"""Who may be handed an export path: loopback peers, by the address the kernel reports."""

from __future__ import annotations

import pytest

from pion.client.export import is_loopback_host
from pion.export.peer import is_local_peer, peer_host


@pytest.mark.parametrize(
    "addr",
    [
        "127.0.0.1:5000",
        "127.0.0.2:1",
        "127.255.255.254:65535",
        "::1:6000",
        "[::1]:6000",
        "::ffff:127.0.0.1:7000",
        "::ffff:127.9.9.9:7000",
    ],
)
def test_loopback_peers_are_local(addr: str) -> None:
    assert is_local_peer(addr)


@pytest.mark.parametrize(
    "addr",
    [
        "192.0.2.2:5000",  # this machine's own non-loopback address is not loopback
        "10.0.0.1:1",
        "0.0.0.0:1",
        ":::1",
        "fe80::1%lo:1",
        "fd00::2:1",
        "::ffff:10.0.0.1:7000",
        "128.0.0.1:1",
        "",
        "localhost:1",  # a name, never resolved: the kernel reports addresses
        "garbage",
        "1.2.3.4:x",
    ],
)
def test_other_peers_are_not(addr: str) -> None:
    assert not is_local_peer(addr)


def test_peer_host() -> None:
    assert peer_host("::1:80") == "::1"
    assert peer_host("[::1]:80") == "::1"
    assert peer_host("10.0.0.1:80") == "10.0.0.1"
    assert peer_host("nonsense") == "nonsense"


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("localhost", True),
        ("LOCALHOST", True),
        ("::1", True),
        ("[::1]", True),
        ("192.0.2.2", False),
        ("example.com", False),
        ("", False),
    ],
)
def test_client_side_guess(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback
