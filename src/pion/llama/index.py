"""``index.json``: what the slot files in the slot dir are, and cleanup by count and bytes.

Owns the index file beside llama-server's slot files (``--slot-save-path``) and the only
code that deletes slot files. Format (JSON, version 1)::

    {
      "version": 1,
      "files": {
        "pi-prefix-0123456789abcdef.bin": {
          "fingerprint": "<64 hex>", "tokens": 8123, "bytes": 1234567,
          "created": 1760000000.0, "last_used": 1760000100.0,
          "model": "...", "server": "...", "harness": "...",
          "prefill_ms": 812.5, "file_tokens": 8123, "n_ctx": 32768,
          "model_identity": {"id": "...", "size": 123, "sample_sha256": "..."},
          "layout": {...} | null, "origin": "local" | "store:<host>",
          "prefix": "" | "<64 hex>"
        }
      },
      "no_restore": {
        "<build>|<model>": {"since": 1760000000.0, "reason": "..."}
      }
    }

``tokens`` is the prefix's token count, ``file_tokens`` what the file holds (more when a
slot was saved with a conversation after the prefix, on eviction), ``prefill_ms`` the cold
prefill time measured when the prefix was built, and ``n_ctx``, ``model_identity`` and
``layout`` what :mod:`pion.llama.compat` checks against the running server before a
restore. ``prefix`` is set on a checkpoint of a conversation (:mod:`pion.llama.checkpoint`):
the fingerprint of the stable prefix it continues (its own ``fingerprint`` names the file).
Entries written before these fields existed read with them unknown (0, empty).

Rules (pi-prefix-cache's, docs/llama.md):

- A missing index is an empty one.
- A corrupt index (not JSON, wrong shape, unknown version) disables deletion for the rest of
  this process ("that run"): files are never deleted against an index that cannot be
  trusted. It is moved aside to ``index.json.corrupt`` so the next run starts clean; files
  the fresh index does not list are never deleted.
- Writes are atomic (temp file, fsync, rename) and serialised between processes with a
  ``flock`` on ``index.lock``; every change is read-modify-write under that lock.
- Cleanup keeps the most recently used files within ``max_files`` and ``max_bytes`` and
  never deletes a file named in ``keep`` (the one just saved or restored).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pion.llama.compat import FileFacts
from pion.llama.fingerprint import FILE_PREFIX
from pion.llama.slotfile import SlotLayout

__all__ = ["INDEX_NAME", "INDEX_VERSION", "IndexEntry", "SlotIndex"]

INDEX_NAME = "index.json"
INDEX_VERSION = 1


@dataclass
class IndexEntry:
    """One slot file."""

    fingerprint: str
    tokens: int
    bytes: int
    created: float
    last_used: float
    model: str = ""
    server: str = ""
    harness: str = ""
    prefill_ms: float = 0.0
    file_tokens: int = 0
    n_ctx: int = 0
    model_identity: dict[str, Any] | None = None
    layout: dict[str, Any] | None = None
    origin: str = "local"
    # A checkpoint of a conversation (pion.llama.checkpoint): the fingerprint of the
    # prefix it continues. Empty for a prefix's own file.
    prefix: str = ""

    @property
    def checkpoint(self) -> bool:
        return bool(self.prefix)

    def facts(self) -> FileFacts:
        """What :func:`pion.llama.compat.mismatch` compares (an unreadable layout: unknown)."""
        layout = None
        if self.layout is not None:
            with contextlib.suppress(ValueError):
                layout = SlotLayout.from_json(self.layout)
        return FileFacts(self.server, self.model_identity, self.n_ctx, layout)

    @classmethod
    def from_json(cls, obj: Any) -> IndexEntry:
        if not isinstance(obj, dict):
            raise ValueError("entry is not an object")
        fp, tokens, size = obj.get("fingerprint"), obj.get("tokens"), obj.get("bytes")
        created, last = obj.get("created"), obj.get("last_used")
        if not isinstance(fp, str) or not isinstance(tokens, int) or not isinstance(size, int):
            raise ValueError("entry lacks fingerprint/tokens/bytes")
        if not isinstance(created, int | float) or not isinstance(last, int | float):
            raise ValueError("entry lacks created/last_used")
        prefill, file_tokens, n_ctx = (
            obj.get("prefill_ms", 0.0),
            obj.get("file_tokens", 0),
            obj.get("n_ctx", 0),
        )
        ident, layout = obj.get("model_identity"), obj.get("layout")
        if not isinstance(prefill, int | float) or not isinstance(file_tokens, int):
            raise ValueError("entry prefill_ms/file_tokens are not numbers")
        if not isinstance(n_ctx, int) or not isinstance(ident, dict | None):
            raise ValueError("entry n_ctx/model_identity have the wrong type")
        if not isinstance(layout, dict | None):
            raise ValueError("entry layout is not an object")
        return cls(
            fingerprint=fp,
            tokens=tokens,
            bytes=size,
            created=float(created),
            last_used=float(last),
            model=str(obj.get("model", "")),
            server=str(obj.get("server", "")),
            harness=str(obj.get("harness", "")),
            prefill_ms=float(prefill),
            file_tokens=file_tokens,
            n_ctx=n_ctx,
            model_identity=ident,
            layout=layout,
            origin=str(obj.get("origin", "local")),
            prefix=str(obj.get("prefix", "")),
        )


class _Corrupt(Exception):
    pass


def _parse(text: str) -> tuple[dict[str, IndexEntry], dict[str, dict[str, Any]]]:
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise _Corrupt(f"not JSON ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("version") != INDEX_VERSION:
        raise _Corrupt("not a version-1 index")
    files, no_restore = doc.get("files", {}), doc.get("no_restore", {})
    if not isinstance(files, dict) or not isinstance(no_restore, dict):
        raise _Corrupt("files/no_restore are not objects")
    try:
        entries = {str(k): IndexEntry.from_json(v) for k, v in files.items()}
    except ValueError as exc:
        raise _Corrupt(str(exc)) from exc
    return entries, {str(k): v for k, v in no_restore.items() if isinstance(v, dict)}


class SlotIndex:
    """The index of one slot dir. Methods reload from disk first, so processes can share it."""

    def __init__(self, slot_dir: Path, log: Callable[[str], None] = lambda _m: None) -> None:
        self.slot_dir = slot_dir
        self.path = slot_dir / INDEX_NAME
        self._log = log
        # False once a corrupt index was seen in this process: deletion stays off.
        self.trusted = True
        self.files: dict[str, IndexEntry] = {}
        self.no_restore: dict[str, dict[str, Any]] = {}

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.slot_dir.mkdir(parents=True, exist_ok=True)
        with (self.slot_dir / "index.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _load(self) -> None:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            self.files, self.no_restore = {}, {}
            return
        except OSError as exc:
            text = f"\0unreadable: {exc}"
        try:
            self.files, self.no_restore = _parse(text)
        except _Corrupt as exc:
            self.trusted = False
            aside = self.path.with_name(INDEX_NAME + ".corrupt")
            with contextlib.suppress(OSError):
                self.path.replace(aside)
            self._log(
                f"index.json corrupt ({exc}): cleanup disabled for this run, "
                f"moved to {aside.name}; no slot file will be deleted"
            )
            self.files, self.no_restore = {}, {}

    def _store(self) -> None:
        doc = {
            "version": INDEX_VERSION,
            "files": {k: asdict(v) for k, v in sorted(self.files.items())},
            "no_restore": self.no_restore,
        }
        tmp = self.path.with_name(f".{INDEX_NAME}.{os.getpid()}.tmp")
        with tmp.open("w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(self.path)
        # The rename is durable only once the directory entry is.
        fd = os.open(self.slot_dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def edit(self) -> Iterator[SlotIndex]:
        """Read-modify-write under the inter-process lock."""
        with self._locked():
            self._load()
            yield self
            self._store()

    def load(self) -> SlotIndex:
        """Refresh from disk (read-only)."""
        with self._locked():
            self._load()
        return self

    def get(self, name: str) -> IndexEntry | None:
        return self.load().files.get(name)

    def put(self, name: str, entry: IndexEntry) -> None:
        with self.edit():
            self.files[name] = entry

    def touch(self, name: str) -> None:
        with self.edit():
            if name in self.files:
                self.files[name].last_used = time.time()

    def drop(self, name: str, delete_file: bool = False) -> None:
        """Forget a file; delete it too when asked (a slot file we know to be bad)."""
        with self.edit():
            self.files.pop(name, None)
            if delete_file:
                with contextlib.suppress(FileNotFoundError):
                    (self.slot_dir / name).unlink()

    def set_no_restore(self, key: str, reason: str) -> None:
        with self.edit():
            self.no_restore[key] = {"since": time.time(), "reason": reason}

    def orphans(self) -> list[str]:
        """Slot files in the dir that the index does not list."""
        listed = set(self.load().files)
        return sorted(
            p.name
            for p in self.slot_dir.glob(f"{FILE_PREFIX}*.bin")
            if p.is_file() and p.name not in listed
        )

    def cleanup(
        self, max_files: int, max_bytes: int, keep: frozenset[str] = frozenset()
    ) -> list[str]:
        """Delete least recently used slot files beyond the budgets; return their names.

        Entries whose file has vanished are forgotten. Nothing is deleted when the index
        could not be trusted in this run.
        """
        removed: list[str] = []
        with self.edit():
            if not self.trusted:
                self._log("cleanup skipped: index.json was corrupt in this run")
                return []
            for name in [n for n in self.files if not (self.slot_dir / n).is_file()]:
                del self.files[name]
            n_files = n_bytes = 0
            for name, entry in sorted(self.files.items(), key=lambda kv: -kv[1].last_used):
                size = _size(self.slot_dir / name, entry.bytes)
                within = n_files + 1 <= max_files and n_bytes + size <= max_bytes
                if within or name in keep:
                    n_files += 1
                    n_bytes += size
                    continue
                with contextlib.suppress(FileNotFoundError):
                    (self.slot_dir / name).unlink()
                del self.files[name]
                removed.append(name)
        for name in removed:
            self._log(f"cleanup: removed {name} (budget {max_files} files / {max_bytes} bytes)")
        return removed


def _size(path: Path, fallback: int) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return fallback
