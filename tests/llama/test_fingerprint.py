"""The fingerprint: deterministic, and sensitive to every input (pure units)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from pion.llama.fingerprint import (
    FingerprintInputs,
    ModelFile,
    file_name,
    fingerprint,
    model_file_identity,
)

BASE = FingerprintInputs(
    model_id="qwen",
    model_file=ModelFile(size=10, mtime_ns=20),
    server_id="|b1",
    harness="pi/0.87",
    render={"tools": [{"type": "function", "function": {"name": "read"}}]},
    prefix="You are pi.",
)


def test_deterministic_and_hex() -> None:
    fp = fingerprint(BASE)
    assert fp == fingerprint(dataclasses.replace(BASE))
    assert len(fp) == 64 and int(fp, 16) >= 0
    assert file_name(fp) == f"pi-prefix-{fp[:16]}.bin"


def test_every_input_changes_it() -> None:
    changes = [
        {"model_id": "llama"},
        {"model_file": ModelFile(size=11, mtime_ns=20)},
        {"model_file": ModelFile(size=10, mtime_ns=21)},
        {"model_file": None},
        {"server_id": "bumped|b1"},
        {"harness": "pi/0.88"},
        {"render": {"tools": []}},
        {"render": {**BASE.render, "chat_template_kwargs": {"enable_thinking": True}}},
        {"prefix": "You are pi!"},
        {"version": "9.9.9"},
    ]
    seen = {fingerprint(BASE)}
    for change in changes:
        seen.add(fingerprint(dataclasses.replace(BASE, **change)))
    assert len(seen) == len(changes) + 1


def test_fields_cannot_bleed_into_each_other() -> None:
    a = dataclasses.replace(BASE, model_id="a|b", server_id="c")
    b = dataclasses.replace(BASE, model_id="a", server_id="b|c")
    assert fingerprint(a) != fingerprint(b)


def test_model_file_identity(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(b"1234")
    ident = model_file_identity(path)
    assert ident is not None and ident.size == 4
    assert model_file_identity(tmp_path / "missing.gguf") is None
    assert model_file_identity("") is None
