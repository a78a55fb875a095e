"""Opaque per-layer state of recurrent and hybrid models: ``SSM.PREFIX.*`` (docs/attention.md).

A recurrent layer (Mamba, RWKV, a GatedDeltaNet slot of a hybrid) has no per-token
K/V to reuse, only a fixed-size state after the prefix. Clients serialise it however
they like; the server stores the bytes under ``(sid, layer)`` and never parses them.
A stored empty blob is kept (``SSM.PREFIX.FETCH`` answers ``$0``), which is not the
same as an absent one (``$-1``).

Durable like the V-store: every change is a :data:`SsmMutation` handed to the journal
(the write-ahead log) before it is applied, the same order as ``pion.vstore``; replay
applies records through :meth:`SsmStore.apply` without journaling them.

Bounds: a session id is 1..``MAX_SID_LEN`` bytes (the V-store's), a layer
0..:data:`MAX_SSM_LAYER`, a blob at most the protocol's bulk limit (checked by the
decoder), and all blobs together at most ``--ssm-maxmemory`` bytes when set.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol, TypeAlias

from pion.errors import OOMError

__all__ = [
    "MAX_SSM_LAYER",
    "SsmDrop",
    "SsmJournal",
    "SsmMutation",
    "SsmStore",
    "SsmWrite",
]

# Layer ids are u16 on disk; Pion's client keys SSM state by the model's cache-list
# index, which stays far below this.
MAX_SSM_LAYER = 65535


@dataclass(frozen=True, slots=True)
class SsmWrite:
    """``(sid, layer)`` now holds ``blob`` (replacing what it held)."""

    sid: bytes
    layer: int
    blob: bytes


@dataclass(frozen=True, slots=True)
class SsmDrop:
    """``sid``'s ``layer`` (every layer when None) is gone."""

    sid: bytes
    layer: int | None = None


SsmMutation: TypeAlias = SsmWrite | SsmDrop


class SsmJournal(Protocol):
    def append_ssm(self, mutation: SsmMutation) -> None:
        """Accept the record (or raise: then nothing is applied)."""
        ...


class SsmStore:
    """``(sid, layer) -> blob`` with byte accounting; see the module docstring."""

    def __init__(self, max_bytes: int = 0, journal: SsmJournal | None = None) -> None:
        self.max_bytes = max_bytes  # 0 = no budget
        self.journal = journal
        self._blobs: dict[bytes, dict[int, bytes]] = {}
        self.bytes = 0
        self.entries = 0

    def __len__(self) -> int:
        return self.entries

    def get(self, sid: bytes, layer: int) -> bytes | None:
        layers = self._blobs.get(sid)
        return None if layers is None else layers.get(layer)

    def store(self, sid: bytes, layer: int, blob: bytes) -> None:
        """Keep ``blob`` under ``(sid, layer)``; refused with OOM past the budget."""
        old = self.get(sid, layer)
        grow = len(blob) - (len(old) if old is not None else 0)
        if self.max_bytes and self.bytes + grow > self.max_bytes:
            raise OOMError(
                f"command not allowed: SSM state would hold {self.bytes + grow} bytes, "
                f"more than ssm-maxmemory ({self.max_bytes} bytes)"
            )
        self._log(SsmWrite(sid, layer, blob))
        self._apply_write(sid, layer, blob)

    def drop(self, sid: bytes, layer: int | None = None) -> int:
        """Remove ``sid``'s ``layer`` (or all its layers); how many blobs went."""
        layers = self._blobs.get(sid)
        gone = 0 if layers is None else (len(layers) if layer is None else int(layer in layers))
        if gone:
            self._log(SsmDrop(sid, layer))
            self._apply_drop(sid, layer)
        return gone

    def apply(self, m: SsmMutation) -> None:
        """Apply a journaled record (replay) without journaling it or checking the
        budget: the log is authoritative."""
        if isinstance(m, SsmWrite):
            self._apply_write(m.sid, m.layer, m.blob)
        else:
            self._apply_drop(m.sid, m.layer)

    def dump(self) -> Iterator[SsmWrite]:
        """The records that rebuild the current state from an empty store."""
        for sid, layers in self._blobs.items():
            for layer, blob in sorted(layers.items()):
                yield SsmWrite(sid, layer, blob)

    def clear(self) -> None:
        self._blobs.clear()
        self.bytes = 0
        self.entries = 0

    # -- internals -------------------------------------------------------------------

    def _log(self, m: SsmMutation) -> None:
        if self.journal is not None:
            self.journal.append_ssm(m)

    def _apply_write(self, sid: bytes, layer: int, blob: bytes) -> None:
        layers = self._blobs.setdefault(sid, {})
        old = layers.get(layer)
        if old is None:
            self.entries += 1
        else:
            self.bytes -= len(old)
        layers[layer] = blob
        self.bytes += len(blob)

    def _apply_drop(self, sid: bytes, layer: int | None) -> None:
        layers = self._blobs.get(sid)
        if layers is None:
            return
        doomed = list(layers) if layer is None else [layer] if layer in layers else []
        for lay in doomed:
            self.bytes -= len(layers.pop(lay))
            self.entries -= 1
        if not layers:
            del self._blobs[sid]
