"""The fingerprint: deterministic, and sensitive to every input (pure units)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import random
from pathlib import Path

from pion.llama.fingerprint import (
    MODEL_SAMPLE_BYTES,
    FingerprintInputs,
    ModelFile,
    file_name,
    fingerprint,
    model_file_identity,
)

BASE = FingerprintInputs(
    model_id="qwen",
    model_file=ModelFile(size=10, sample_sha256="a" * 64),
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
        {"model_file": ModelFile(size=11, sample_sha256="a" * 64)},
        {"model_file": ModelFile(size=10, sample_sha256="b" * 64)},
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
    assert ident.sample_sha256 == hashlib.sha256(b"1234").hexdigest()  # a small file: all of it
    assert model_file_identity(tmp_path / "missing.gguf") is None
    assert model_file_identity("") is None


def test_model_identity_is_content_not_path_or_mtime(tmp_path: Path) -> None:
    """Two machines with the same GGUF compute the same identity; another GGUF differs,
    including one that differs only in its last bytes or only in the middle of a header
    sample."""
    rng = random.Random(7)
    data = bytes(rng.getrandbits(8) for _ in range(2 * MODEL_SAMPLE_BYTES + 1000))
    a, b = tmp_path / "a" / "model.gguf", tmp_path / "b" / "renamed.gguf"
    for p in (a, b):
        p.parent.mkdir()
        p.write_bytes(data)
    os.utime(b, ns=(10**18, 10**18))
    assert model_file_identity(a) == model_file_identity(b)
    for offset in (100, len(data) - 1):
        changed = bytearray(data)
        changed[offset] ^= 0xFF
        c = tmp_path / f"c{offset}.gguf"
        c.write_bytes(bytes(changed))
        assert model_file_identity(c) != model_file_identity(a)
    # The identity is cached per (path, size, mtime, inode): rewriting the file in place
    # with other content and a new mtime is noticed.
    a.write_bytes(data[::-1])
    assert model_file_identity(a) != model_file_identity(b)
