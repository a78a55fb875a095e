"""The proxy in front of the fake llama-server (:mod:`support.fake_llama`): its
configuration, the fake's slot files read as the warmer reads llama-server's, and the
status and polling helpers the interleaving tests share."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from pion.llama.config import WarmerConfig
from pion.llama.proxy import STATUS_PATH
from support.fake_llama import FakeLlamaServer
from support.fake_llama_model import decode_slot_file

BYTES_PER_TOKEN = 16
# Every module of the warmer that reads a slot file's tokens.
TOKEN_READERS = (
    "pion.llama.coldbuild.read_tokens",
    "pion.llama.context.read_tokens",
    "pion.llama.checkpoint.read_tokens",
)


def fake_tokens(path: Path) -> tuple[int, ...] | None:
    """The tokens of a slot file the fake wrote (its own format, not llama.cpp's)."""
    try:
        return tuple(decode_slot_file(path.read_bytes(), BYTES_PER_TOKEN))
    except (OSError, ValueError):
        return None


def read_fake_slot_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """The warmer reads the fake's slot files the way it reads llama-server's."""
    for target in TOKEN_READERS:
        monkeypatch.setattr(target, fake_tokens)


def config_for(fake: FakeLlamaServer, tmp_path: Path, **kwargs: Any) -> WarmerConfig:
    return WarmerConfig(
        base_url=fake.url,
        persist=True,
        slot_dir=fake.slot_dir,
        log_path=tmp_path / "pc.log",
        timeout=30,
        **kwargs,
    )


def status(url: str) -> dict[str, Any]:
    data: dict[str, Any] = httpx.get(url + STATUS_PATH, timeout=30).json()
    return data


def until(predicate: Callable[[], bool], tries: int = 3000) -> None:
    """Poll a condition (a safety bound, never a timing assertion)."""
    event = threading.Event()
    for _ in range(tries):
        if predicate():
            return
        event.wait(0.01)
    raise AssertionError("condition never met")


def file_tokens(fake: FakeLlamaServer, name: str) -> list[int]:
    tokens = fake_tokens(fake.slot_dir / name)
    assert tokens is not None
    return list(tokens)
