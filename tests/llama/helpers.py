"""Small helpers shared by the `pion llama` tests."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx

from pion.llama.timings import Timings


def chat(base_url: str, body: dict[str, Any], **headers: str) -> tuple[dict[str, Any], Timings]:
    """Send a non-streamed chat request; return the JSON and its timings."""
    resp = httpx.post(base_url + "/v1/chat/completions", json=body, headers=headers, timeout=120)
    resp.raise_for_status()
    data = resp.json()
    timings = Timings.from_json(data)
    assert timings is not None, data
    return data, timings


def log_lines(path: Path | None) -> list[str]:
    """The ``[prefix-cache]`` messages of a log file, without the timestamps."""
    if path is None or not path.exists():
        return []
    return [line.split("[prefix-cache] ", 1)[1] for line in path.read_text().splitlines()]


def count(lines: list[str], needle: str) -> int:
    return sum(needle in line for line in lines)


def wait_log(path: Path | None, needle: str, n: int = 1, timeout: float = 10.0) -> list[str]:
    """Wait until ``needle`` occurs ``n`` times in the log; return its lines.

    The proxy logs the observed reuse after the last byte went to the client, so a client
    can read its answer a moment before that line is written.
    """
    deadline = time.monotonic() + timeout
    while True:
        lines = log_lines(path)
        if count(lines, needle) >= n or time.monotonic() > deadline:
            return lines
        time.sleep(0.02)
