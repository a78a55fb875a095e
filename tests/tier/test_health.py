"""The circuit breaker: down after a failure, backoff doubling to a cap, up again after
a success, one log line at each edge."""

from __future__ import annotations

import logging

import pytest

from pion.tier.health import INITIAL_BACKOFF_S, MAX_BACKOFF_S, Health


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_backoff_doubles_to_the_cap_and_resets(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    h = Health(clock)
    assert h.up and h.available() and h.retry_in() == 0
    with caplog.at_level(logging.DEBUG, "pion.tier"):
        h.failure("read", "Connection refused")
        assert not h.up and not h.available()
        assert h.retry_in() == pytest.approx(INITIAL_BACKOFF_S)
        waits = []
        for _ in range(8):
            clock.now += h.retry_in()
            assert h.available()
            h.failure("write", "Connection refused")
            waits.append(h.retry_in())
        assert waits[0] == pytest.approx(2 * INITIAL_BACKOFF_S)
        assert max(waits) == pytest.approx(MAX_BACKOFF_S) == pytest.approx(waits[-1])
        clock.now += 3
        h.success("write", 0.002)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert "tier unavailable (Connection refused)" in warnings[0]
    assert "reachable again" in warnings[1]
    f = h.fields()
    assert f["status"] == "ok" and f["read_errors"] == 1 and f["write_errors"] == 8
    assert f["errors"] == 9 and f["outages"] == 1 and f["write_latency_max_us"] == 2000
    assert f["last_error"] == "Connection refused"
    h.failure("read", "x\r\ny" * 100)
    assert "\n" not in str(h.fields()["last_error"]) and len(h.last_error) <= 200
    assert h.retry_in() == pytest.approx(INITIAL_BACKOFF_S)
