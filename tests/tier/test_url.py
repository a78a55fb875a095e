"""``--tier`` URLs: the forms operators write, and everything else refused by name."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pion.errors import PionError
from pion.tier.url import MAX_NODES, TierEndpoint, parse_tier_url


def test_one_node_several_nodes_tls_and_credentials() -> None:
    assert parse_tier_url("redis://127.0.0.1:7000") == TierEndpoint(
        (("127.0.0.1", 7000),), False, None, None
    )
    many = parse_tier_url("rediss://user:p%40ss@h1:7000,h2:7001,[::1]:7002/")
    assert many.nodes == (("h1", 7000), ("h2", 7001), ("::1", 7002))
    assert many.tls and many.username == "user" and many.password == "p@ss"
    assert many.describe() == "h1:7000,h2:7001,[::1]:7002"
    assert parse_tier_url("REDIS://:secret@h:1/0").password == "secret"
    # A repeated seed is one seed.
    assert parse_tier_url("redis://h:1,h:1").nodes == (("h", 1),)


@pytest.mark.parametrize(
    ("url", "error"),
    [
        ("http://h:1", "must start with redis://"),
        ("h:1", "must start with redis://"),
        ("redis://", "names no host"),
        ("redis://h", "has no port"),
        ("redis://h:0", "port out of range"),
        ("redis://h:65536", "port out of range"),
        ("redis://h:+1", "bad port"),
        ("redis://h:1/3", "only /0"),
        ("redis://h:1,", "has no port"),
        ("redis://::1:7000", "IPv6 hosts in brackets"),
        ("redis://[::1]7000", "want [ipv6]:port"),
        ("redis://u:@h:1", "empty password"),
        ("redis://h :1", "spaces or control characters"),
        ("redis://h:1\n", "spaces or control characters"),
        ("redis://" + ",".join(f"h:{p}" for p in range(1, MAX_NODES + 2)), "more than"),
        ("redis://" + "h" * 5000 + ":1", "longer than"),
    ],
)
def test_malformed_urls_are_refused_naming_the_problem(url: str, error: str) -> None:
    with pytest.raises(PionError, match=error.replace("[", r"\[").replace("+", r"\+")):
        parse_tier_url(url)


@given(st.text(max_size=300))
def test_any_text_parses_or_is_refused_cleanly(text: str) -> None:
    try:
        endpoint = parse_tier_url(text)
    except PionError:
        return
    assert endpoint.nodes and all(1 <= port <= 65535 for _, port in endpoint.nodes)
