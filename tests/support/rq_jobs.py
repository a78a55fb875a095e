"""Jobs for tests/integrations/test_rq.py: an RQ worker imports them by name."""

from __future__ import annotations


def add(a: int, b: int) -> int:
    return a + b


def fail(message: str) -> None:
    raise ValueError(message)
