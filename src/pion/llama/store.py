"""The second tier of slot files: pion-server (or any Redis-protocol keyspace), shared by
every machine that runs the same llama-server build and model.

Owns :class:`SlotStore`: pushing a saved slot file in bounded chunks with its manifest
(:mod:`pion.llama.manifest` has the key layout), pulling one into the slot dir with its size
and SHA-256 checked before the file takes its final name, and the value receipt
(``KV.PREFIX.REGISTER`` / ``KV.PREFIX.LOOKUP ... TOKENS n PREFILL_MS ms`` on pion-server).

Fail-open is the caller's rule and this module's duty: every method raises only
:class:`StoreError` (transport failures, timeouts, refusals, a manifest or a file that does
not verify), and after a transport failure the store is skipped for
:data:`RETRY_AFTER_S` seconds (:meth:`SlotStore.usable`), so a store that is down costs a
request one short timeout, not one per operation. Every operation has a socket timeout
(``timeout``) and a pull a deadline for the whole transfer.

Nothing here decides *whether* to push, pull or trust a file for a server: the warmer does
(:mod:`pion.llama.warmer`). Does not import the server package: it speaks RESP through
redis-py, as any client would.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import shutil
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from pion.llama.manifest import (
    CHUNK_BYTES,
    DEFAULT_KEY_PREFIX,
    Manifest,
    checkpoints_key,
    chunk_key,
    manifest_key,
)

__all__ = [
    "MAX_CHECKPOINTS",
    "PIPELINE_CHUNKS",
    "RECEIPT_NS_PREFIX",
    "RETRY_AFTER_S",
    "SlotStore",
    "StoreConfig",
    "StoreCorrupt",
    "StoreError",
    "prefill_ms_arg",
    "receipt_namespace",
]

# After a transport failure the store is not tried again for this long: a dead or
# blackholed store must not add a timeout to every request.
RETRY_AFTER_S = 15.0
# A manifest key's suffix (chunk keys have ``:upload:i`` after it).
_FINGERPRINT = re.compile(r"[0-9a-f]{64}")
# Checkpoints of one prefix read from the store at most, and the most tokens one may claim.
MAX_CHECKPOINTS = 256
_MAX_CHECKPOINT_TOKENS = 1 << 24
# Chunks requested per round trip while pulling (16 MB in flight at 4 MB chunks).
PIPELINE_CHUNKS = 4
# Superseded chunks stay readable this long, for pulls already under way.
SUPERSEDED_GRACE_S = 300
# Free space kept on the slot dir's disk beyond the file being pulled.
DISK_MARGIN_BYTES = 256 * 1024 * 1024
# Receipt namespaces: "llama:" + the 64-hex fingerprint (70 bytes; KV.PREFIX allows 200).
RECEIPT_NS_PREFIX = "llama:"
# REGISTER needs a kv_dim and a format; the namespace holds no rows (the K/V is the slot
# file), so the smallest valid ones.
_RECEIPT_KV_DIM = 1
_RECEIPT_VQUANT = "fp16"
_MAX_PREFILL_MS = 86_400_000


def receipt_namespace(fingerprint: str) -> str:
    """The KV.PREFIX namespace a llama prefix is registered and looked up under."""
    return RECEIPT_NS_PREFIX + fingerprint


class StoreError(Exception):
    """The store could not be used for this operation (the caller fails open)."""


class StoreCorrupt(StoreError):
    """What the store holds does not verify (manifest, chunk sizes, size or SHA-256)."""


@dataclass(frozen=True)
class StoreConfig:
    """How to reach the store. ``url``: ``redis://[user:pass@]host:port[/db]`` or
    ``rediss://`` for TLS; ``password``/``username`` override the URL's."""

    url: str
    password: str | None = None
    username: str | None = None
    tls_ca: Path | None = None
    timeout: float = 2.0
    deadline: float = 120.0
    ttl: int = 7 * 24 * 3600
    prefix: str = DEFAULT_KEY_PREFIX

    def redis_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {
            "socket_timeout": self.timeout,
            "socket_connect_timeout": self.timeout,
            "protocol": 2,
            # redis-py retries with backoff by default: a down store would stall requests.
            "retry": Retry(NoBackoff(), 0),
        }
        if self.password is not None:
            options["password"] = self.password
        if self.username is not None:
            options["username"] = self.username
        if self.tls_ca is not None:
            options["ssl_ca_certs"] = str(self.tls_ca)
        return options


def prefill_ms_arg(value: float) -> int:
    """PREFILL_MS as the server takes it: whole ms, at least 1 when anything was measured."""
    if value <= 0:
        return 0
    return min(_MAX_PREFILL_MS, max(1, round(value)))


class SlotStore:
    """One store, shared by the warmer's threads (redis-py's pool is thread-safe)."""

    def __init__(self, config: StoreConfig, log: Callable[[str], None]) -> None:
        self.config = config
        self.log = log
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._down_until = 0.0
        self._receipts = True
        try:
            self._redis = redis.Redis.from_url(config.url, **config.redis_options())
        except ValueError as exc:
            raise StoreError(f"bad store URL {config.url!r}: {exc}") from None

    def close(self) -> None:
        self._redis.close()

    # -- availability -----------------------------------------------------------------

    def usable(self) -> bool:
        """False while a recent transport failure is being waited out."""
        with self._lock:
            return time.monotonic() >= self._down_until

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counts[name] += n

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        """Run one store operation; transport failures mark the store down for a while."""
        if not self.usable():
            self._count("skipped_down")
            raise StoreError(f"{what}: store marked down (retrying in <= {RETRY_AFTER_S:.0f} s)")
        try:
            return fn()
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            with self._lock:
                self._down_until = time.monotonic() + RETRY_AFTER_S
                self.counts["errors"] += 1
            self.log(
                f"STORE {what} failed ({type(exc).__name__}: {exc}) → store skipped for "
                f"{RETRY_AFTER_S:.0f} s (fail-open)"
            )
            raise StoreError(f"{what}: {type(exc).__name__}: {exc}") from exc
        except redis.RedisError as exc:
            self._count("errors")
            raise StoreError(f"{what}: {exc}") from exc

    # -- manifests --------------------------------------------------------------------

    def manifest(self, fingerprint: str) -> Manifest | None:
        """The stored manifest of ``fingerprint``; None when there is none; StoreCorrupt
        when there is one this version cannot trust."""
        key = manifest_key(self.config.prefix, fingerprint)
        raw = self._call("GET manifest", lambda: self._redis.get(key))
        if raw is None:
            return None
        if not isinstance(raw, bytes):
            raise StoreCorrupt("manifest is not a string")
        try:
            return Manifest.parse(raw, fingerprint)
        except ValueError as exc:
            self._count("refused")
            raise StoreCorrupt(str(exc)) from None

    def listing(self, limit: int = 1000) -> list[tuple[str, Manifest | str, int]]:
        """The prefixes the store holds: (fingerprint, manifest or why it is unreadable,
        seconds left before it expires, -1 for none), at most ``limit``, found with
        ``SCAN`` over the manifest keys (``pion llama status --store``)."""
        pattern = self.config.prefix + "*"
        found: list[str] = []
        for raw in self._call(
            "SCAN", lambda: list(self._redis.scan_iter(match=pattern, count=500))
        ):
            key = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
            fp = key[len(self.config.prefix) :]
            if _FINGERPRINT.fullmatch(fp):
                found.append(fp)
        out: list[tuple[str, Manifest | str, int]] = []
        for fp in sorted(found)[:limit]:
            key = manifest_key(self.config.prefix, fp)
            ttl = int(self._call("TTL", functools.partial(self._redis.ttl, key)))
            try:
                manifest: Manifest | str | None = self.manifest(fp)
            except StoreCorrupt as exc:
                manifest = f"unreadable: {exc}"
            if manifest is not None:
                out.append((fp, manifest, ttl))
        return out

    # -- push -------------------------------------------------------------------------

    def push(
        self, path: Path, fields: dict[str, Any], *, replace: bool = False
    ) -> tuple[Manifest, bool]:
        """Upload ``path`` (a saved slot file) in chunks, then its manifest.

        ``fields``: the manifest fields the file itself does not give (fingerprint, tokens,
        prefill_ms, build, model, n_ctx, layout). An existing manifest of the fingerprint
        is kept unless ``replace`` (a peer's copy is as good as ours; replace it only when
        it failed to verify here). Returns the manifest now in the store and whether it
        is ours (False: a peer's was kept)."""
        fp = str(fields["fingerprint"])
        existing: Manifest | None = None
        with contextlib.suppress(StoreCorrupt):  # a manifest that does not verify is replaced
            existing = self.manifest(fp)
        if existing is not None and not replace:
            self._count("push_skipped")
            return existing, False
        ttl = self.config.ttl or None
        upload = os.urandom(8).hex()
        digest = hashlib.sha256()
        size = index = 0
        with path.open("rb") as f:
            before = os.fstat(f.fileno())
            while block := f.read(CHUNK_BYTES):
                digest.update(block)
                key = chunk_key(self.config.prefix, fp, upload, index)
                self._call("SET chunk", functools.partial(self._redis.set, key, block, ex=ttl))
                size += len(block)
                index += 1
            after = path.stat()
        # llama-server rewrites a slot file in place (truncate, write): a save of the same
        # name during the upload would leave a mix of two files behind a valid hash.
        if (after.st_ino, after.st_size, after.st_mtime_ns) != (
            before.st_ino,
            before.st_size,
            before.st_mtime_ns,
        ) or size != before.st_size:
            raise StoreError(f"{path.name} changed while it was uploaded; not published")
        if size == 0:
            raise StoreError(f"{path.name} is empty")
        manifest = Manifest(
            size=size,
            sha256=digest.hexdigest(),
            chunks=index,
            upload=upload,
            created=time.time(),
            origin=socket.gethostname()[:200],
            **fields,
        )
        key = manifest_key(self.config.prefix, fp)
        self._call("SET manifest", lambda: self._redis.set(key, manifest.to_bytes(), ex=ttl))
        self._count("pushes")
        self._count("bytes_pushed", size)
        if existing is not None:
            self._expire_chunks(existing, SUPERSEDED_GRACE_S)
        return manifest, True

    def _expire_chunks(self, manifest: Manifest, seconds: int) -> None:
        def run() -> None:
            pipe = self._redis.pipeline(transaction=False)
            for key in self._chunk_keys(manifest):
                pipe.expire(key, seconds)
            pipe.execute()

        with contextlib.suppress(StoreError):
            self._call("EXPIRE superseded chunks", run)

    def _chunk_keys(self, manifest: Manifest) -> list[str]:
        fp, upload = manifest.fingerprint, manifest.upload
        return [chunk_key(self.config.prefix, fp, upload, i) for i in range(manifest.chunks)]

    # -- pull -------------------------------------------------------------------------

    def pull(self, manifest: Manifest, dest: Path) -> None:
        """Download the file of ``manifest`` to ``dest``. It is written to a temporary name
        beside ``dest`` and renamed only after its size and SHA-256 match the manifest, so
        a truncated or corrupt file never appears under a slot-file name."""
        free = shutil.disk_usage(dest.parent).free
        if manifest.size + DISK_MARGIN_BYTES > free:
            raise StoreError(f"{manifest.size} bytes do not fit in the slot dir ({free} free)")
        deadline = time.monotonic() + self.config.deadline
        tmp = dest.with_name(f".{dest.name}.pull-{os.getpid()}-{threading.get_ident()}")
        try:
            self._download(manifest, tmp, deadline)
            tmp.replace(dest)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        self._count("pulls")
        self._count("bytes_pulled", manifest.size)
        self._refresh(manifest)

    def _download(self, manifest: Manifest, tmp: Path, deadline: float) -> None:
        digest = hashlib.sha256()
        size = 0
        with tmp.open("wb") as f:
            for start in range(0, manifest.chunks, PIPELINE_CHUNKS):
                if time.monotonic() > deadline:
                    raise StoreError(f"pull took longer than {self.config.deadline:.0f} s")
                batch = range(start, min(manifest.chunks, start + PIPELINE_CHUNKS))
                keys = [
                    chunk_key(self.config.prefix, manifest.fingerprint, manifest.upload, i)
                    for i in batch
                ]
                blocks = self._call("GET chunks", functools.partial(self._get_many, keys))
                for i, block in zip(batch, blocks, strict=True):
                    want = manifest.chunk_size(i)
                    got = len(block) if isinstance(block, bytes) else None
                    if got != want:
                        self._count("refused")
                        raise StoreCorrupt(
                            f"chunk {i} of {manifest.chunks} is "
                            f"{'missing' if got is None else f'{got} bytes'}, want {want}"
                        )
                    digest.update(block)
                    f.write(block)
                    size += want
            f.flush()
            os.fsync(f.fileno())
        if size != manifest.size or digest.hexdigest() != manifest.sha256:
            self._count("refused")
            raise StoreCorrupt(
                f"pulled {size} bytes with SHA-256 {digest.hexdigest()[:16]}…, manifest "
                f"says {manifest.size} bytes {manifest.sha256[:16]}…"
            )

    def _get_many(self, keys: list[str]) -> list[Any]:
        pipe = self._redis.pipeline(transaction=False)
        for key in keys:
            pipe.get(key)
        result: list[Any] = pipe.execute()
        return result

    def _refresh(self, manifest: Manifest) -> None:
        """A pulled file is in use: give its keys a full TTL again (LRU-like expiry)."""
        ttl = self.config.ttl
        if not ttl:
            return

        def run() -> None:
            pipe = self._redis.pipeline(transaction=False)
            pipe.expire(manifest_key(self.config.prefix, manifest.fingerprint), ttl)
            for key in self._chunk_keys(manifest):
                pipe.expire(key, ttl)
            pipe.execute()

        with contextlib.suppress(StoreError):
            self._call("EXPIRE pulled keys", run)

    # -- conversation checkpoints -----------------------------------------------------

    def add_checkpoint(self, prefix_fp: str, fingerprint: str, tokens: int, digest: str) -> None:
        """List the stored checkpoint ``fingerprint`` under the prefix it continues: the
        first ``tokens`` of its conversation have SHA-256 ``digest``."""
        key = checkpoints_key(self.config.prefix, prefix_fp)
        ttl = self.config.ttl

        def run() -> None:
            pipe = self._redis.pipeline(transaction=False)
            pipe.hset(key, fingerprint, f"{tokens} {digest}")
            if ttl:
                pipe.expire(key, ttl)
            pipe.execute()

        self._call("HSET checkpoints", run)

    def checkpoints(self, prefix_fp: str) -> list[tuple[str, int, str]]:
        """The checkpoints listed under a prefix: (fingerprint, tokens, digest). The
        store is untrusted: malformed entries are skipped, at most
        :data:`MAX_CHECKPOINTS` are read."""
        key = checkpoints_key(self.config.prefix, prefix_fp)
        raw = self._call("HGETALL checkpoints", lambda: self._redis.hgetall(key))
        out: list[tuple[str, int, str]] = []
        for field_, value in list((raw or {}).items())[:MAX_CHECKPOINTS]:
            fp = field_.decode("ascii", "replace") if isinstance(field_, bytes) else ""
            text = value.decode("ascii", "replace") if isinstance(value, bytes) else ""
            tokens, _, digest = text.partition(" ")
            valid = _FINGERPRINT.fullmatch(fp) and _FINGERPRINT.fullmatch(digest)
            if valid and tokens.isdigit() and 0 < int(tokens) <= _MAX_CHECKPOINT_TOKENS:
                out.append((fp, int(tokens), digest))
        return out

    # -- the receipt ------------------------------------------------------------------

    def register(self, fingerprint: str, prefill_ms: float) -> None:
        """Register the prefix's receipt namespace with its measured cold prefill time."""
        if not self._receipts:
            return
        ns = receipt_namespace(fingerprint)
        args: list[Any] = ["KV.PREFIX.REGISTER", ns, _RECEIPT_KV_DIM, _RECEIPT_VQUANT]
        if prefill_ms_arg(prefill_ms):
            args += ["PREFILL_MS", prefill_ms_arg(prefill_ms)]
        self._receipt_call("REGISTER", args)

    def report(self, fingerprint: str, tokens: int, prefill_ms: float) -> bool | None:
        """``KV.PREFIX.LOOKUP ns TOKENS n PREFILL_MS ms`` for a restore or hit: True on
        HIT. On MISS (the namespace was never registered there, or was evicted) the
        namespace is registered for the next one and False returned."""
        if not self._receipts:
            return None
        ns = receipt_namespace(fingerprint)
        args: list[Any] = ["KV.PREFIX.LOOKUP", ns, "TOKENS", max(0, tokens)]
        if prefill_ms_arg(prefill_ms):
            args += ["PREFILL_MS", prefill_ms_arg(prefill_ms)]
        reply = self._receipt_call("LOOKUP", args)
        if not self._receipts:
            return None
        if reply in (b"HIT", "HIT"):
            self._count("receipts")
            return True
        self._count("receipt_misses")
        self.register(fingerprint, prefill_ms)
        return False

    def _receipt_call(self, what: str, args: list[Any]) -> Any:
        try:
            return self._call(
                f"KV.PREFIX.{what}",
                lambda: self._redis.execute_command(*args),  # type: ignore[no-untyped-call]
            )
        except StoreError as exc:
            cause = exc.__cause__
            if isinstance(cause, redis.ResponseError) and "unknown command" in str(cause).lower():
                # A plain Redis/Valkey store: slot files work, receipts are pion-server's.
                self._receipts = False
                self.log("STORE is not a pion-server (no KV.PREFIX.*): receipts off")
                return None
            raise
