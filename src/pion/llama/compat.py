"""Will a slot file load, and help, in the running llama-server? Checked before any restore.

Owns :class:`FileFacts` (what is recorded beside a slot file: in ``index.json`` for the
local disk, in the manifest for the store) and :func:`mismatch`, which compares them with
the running server and says why a file must not be restored. The rules:

- **build**: the llama-server build (``/props`` ``build_info``) must be the same: the
  slot-file format and the K/V computation are the build's.
- **model**: the model's identity (alias, size, sampled content hash) must be the same.
- **context**: the slot context (``n_ctx`` per slot, from ``-c`` and ``-np``) must be the
  same. llama.cpp would load a file into a larger slot, but the rule is deliberately
  strict: machines sharing slot files should run one configuration, and a mismatch is
  logged with both values so it is fixed rather than silently half-used.
- **cache type and layout**: the file's K/V types (``-ctk``/``-ctv``), stream count,
  layers and row sizes, read from the file's own bytes (:mod:`pion.llama.slotfile`),
  against those of a file the running server wrote.

A fact that is unknown on either side (an index entry written before these fields existed,
a cache layout the reader does not parse) is not compared; llama-server's own checks on
restore still refuse a type or layout mismatch with an error on the build we test.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pion.llama.slotfile import SlotLayout

__all__ = ["FileFacts", "ServerFacts", "describe_model", "mismatch"]


@dataclass(frozen=True)
class FileFacts:
    """What the index or the manifest records about one slot file."""

    build: str
    model: dict[str, Any] | None
    n_ctx: int
    layout: SlotLayout | None


@dataclass(frozen=True)
class ServerFacts:
    """The running server, as the same facts (``layout``: learned from a file it wrote)."""

    build: str
    model: dict[str, Any]
    n_ctx: int
    layout: SlotLayout | None


def describe_model(model: dict[str, Any] | None) -> str:
    if not model:
        return "?"
    sample = model.get("sample_sha256")
    return f"{model.get('id')} ({model.get('size')} bytes, {str(sample)[:12]})"


def mismatch(file: FileFacts, server: ServerFacts) -> str | None:
    """Why ``file`` must not be restored into ``server``, or None when nothing known differs."""
    if file.build and file.build != server.build:
        return f"built by llama-server {file.build}, this one is {server.build}"
    if file.model and file.model != server.model:
        return f"model {describe_model(file.model)} != {describe_model(server.model)}"
    if file.n_ctx and server.n_ctx and file.n_ctx != server.n_ctx:
        return f"slot context {file.n_ctx} != {server.n_ctx} tokens"
    if file.layout is not None and server.layout is not None:
        return file.layout.difference(server.layout)
    return None
