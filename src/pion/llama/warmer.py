"""The prefix warmer: make sure a llama-server slot holds a stable prefix before a request.

Owns the state machine of pi-prefix-cache (docs/llama.md):

1. **In-process hit.** This process warmed the fingerprint into the slot and ``GET /slots``
   still shows the slot's ``n_prompt_tokens`` (a restarted server shows none) → proceed.
2. **Restore** (``persist``): load ``pi-prefix-<fp16>.bin`` into the slot, then verify.
   Only a file that ``index.json`` lists for this fingerprint with its exact byte size is
   sent to the server (llama-server b11434 aborts on a truncated slot file).
   ``verify="fast"`` (default): the real request is the verification; its ``timings`` are
   handed to :meth:`PrefixWarmer.observe`, and ``cache_n`` must reach 90% of the restored
   tokens (the identical-prompt gate) and so be > 0 (the divergent probe, since the real
   request diverges after the prefix). If not, that request simply ran cold; the file is
   dropped and the next session cold-builds. ``verify="probe"``: pi-prefix-cache's two requests
   before the real one, identical prompt (>= 90% from cache, else erase + cold build) and
   a divergent probe (``cache_n > 0``, else logged loudly and the restore kept).
3. **Cold warm-up**: a chat request with only the prefix and an empty user message,
   ``n_predict: 0``, pinned to the slot; then, with ``persist``, save and index the file.

Hybrid/recurrent models: when a restore of *our own* file (its token count matches the
index) fails verification, the next cold build checks a save → erase → restore → identical
round trip right away. If that fails too, restores cannot work on this (server build,
model): it is recorded in ``index.json`` (``no_restore``), logged with the flags that help,
and from then on the prefix is warmed cold.

Fail-open: :meth:`PrefixWarmer.ensure` never raises. Any error is logged and returned as a
``disabled`` outcome; the caller forwards its request anyway. Warm-ups of one slot are
serialised by a per-slot lock, so concurrent callers (proxy threads, harness threads) are
safe. Does not own HTTP forwarding (:mod:`pion.llama.proxy`) or the file format of the
index (:mod:`pion.llama.index`).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

from pion.llama.client import LlamaClient, LlamaServerError
from pion.llama.config import WarmerConfig
from pion.llama.eventlog import EventLog
from pion.llama.fingerprint import FingerprintInputs, file_name, fingerprint, model_file_identity
from pion.llama.index import IndexEntry, SlotIndex
from pion.llama.outcome import Outcome
from pion.llama.prefix import WarmRequest
from pion.llama.serverinfo import ServerInfo
from pion.llama.timings import Timings

__all__ = ["HYBRID_ADVICE", "PrefixWarmer"]

HYBRID_ADVICE = (
    "this llama.cpp build does not keep context checkpoints in slot files (a build with "
    "upstream #26004 does); for in-process reuse on hybrid/recurrent models start "
    "llama-server with --ctx-checkpoints N (e.g. 32), --checkpoint-min-step 0..4096 and a "
    "small -ub (128-512)"
)


@dataclass
class _Pending:
    """A restore the real request has yet to verify (fast path)."""

    file: str
    own_file: bool
    restore_key: str


@dataclass
class _SlotState:
    fingerprint: str
    tokens: int
    source: str
    since: float
    pending: _Pending | None = None


class PrefixWarmer:
    """Keeps stable prefixes warm in llama-server slots. Thread-safe; never raises from
    :meth:`ensure` or :meth:`observe`."""

    def __init__(
        self,
        config: WarmerConfig,
        client: LlamaClient | None = None,
        log: EventLog | None = None,
    ) -> None:
        self.config = config
        self.client = client or LlamaClient(
            config.base_url, timeout=config.timeout, api_key=config.api_key
        )
        self.log = log or EventLog(config.log_path)
        self.index: SlotIndex | None = None
        if config.persist and config.slot_dir is None:
            self.log("persistence needs a slot dir (llama-server's --slot-save-path) → disk off")
        elif config.persist and config.slot_dir is not None:
            self.index = SlotIndex(config.slot_dir, self.log)
        self._guard = threading.Lock()
        self._slot_locks: dict[int, threading.Lock] = {}
        self._slots: dict[int, _SlotState] = {}
        self._info: ServerInfo | None = None
        self._suspect: set[str] = set()
        self._said_no_restore: set[str] = set()
        self._outcomes: deque[Outcome] = deque(maxlen=50)
        self._counts: Counter[str] = Counter()

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> PrefixWarmer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _lock(self, slot: int) -> threading.Lock:
        with self._guard:
            return self._slot_locks.setdefault(slot, threading.Lock())

    # -- public API -----------------------------------------------------------------------

    def ensure(self, request: WarmRequest, slot: int | None = None) -> Outcome:
        """Make ``slot`` (default: the configured one) hold ``request``'s prefix."""
        slot = self.config.slot if slot is None else slot
        t0 = time.monotonic()
        with self._lock(slot):
            try:
                outcome = self._ensure(request, slot, t0)
            except Exception as exc:
                # The fail-open boundary: whatever broke, the caller's request proceeds.
                text = exc.short() if isinstance(exc, LlamaServerError) else repr(exc)
                outcome = self._finish(Outcome("disabled", slot=slot, detail=text), t0)
                self._slots.pop(slot, None)
        self.log(outcome.summary())
        self.log(f"normal request proceeding (source={outcome.source})")
        with self._guard:
            self._outcomes.append(outcome)
            self._counts[outcome.kind] += 1
        return outcome

    def skipped(self, reason: str) -> Outcome:
        """Record a request without a warmable prefix (the proxy calls this)."""
        outcome = Outcome("skipped", slot=self.config.slot, detail=reason, at=time.time())
        self.log(outcome.summary())
        with self._guard:
            self._outcomes.append(outcome)
            self._counts["skipped"] += 1
        return outcome

    def observe(self, outcome: Outcome, timings: Timings | None) -> None:
        """Log the real request's reuse; on the fast path, accept or reject the restore."""
        try:
            self._observe(outcome, timings)
        except Exception as exc:
            self.log(f"observation failed (fail-open): {exc!r}")

    def status(self) -> dict[str, Any]:
        """Slots, last outcomes, counters, index files and log tail, as JSON-ready data."""
        with self._guard:
            slots = {
                str(k): {
                    "fingerprint": s.fingerprint,
                    "tokens": s.tokens,
                    "source": s.source,
                    "since": s.since,
                    "verifying": s.pending is not None,
                }
                for k, s in list(self._slots.items())
            }
            outcomes = [o.to_json() for o in self._outcomes]
            counts = dict(self._counts)
        files: dict[str, Any] = {}
        no_restore: dict[str, Any] = {}
        if self.index is not None:
            try:
                self.index.load()
                files = {k: vars(v) for k, v in self.index.files.items()}
                no_restore = dict(self.index.no_restore)
            except OSError as exc:
                files = {"error": str(exc)}
        cfg = self.config
        return {
            "upstream": cfg.base_url,
            "slot": cfg.slot,
            "persist": self.index is not None,
            "slot_dir": str(cfg.slot_dir) if cfg.slot_dir else None,
            "verify": cfg.verify,
            "log": str(cfg.log_path) if cfg.log_path else None,
            "slots": slots,
            "counts": counts,
            "outcomes": outcomes,
            "files": files,
            "no_restore": no_restore,
            "log_tail": self.log.recent()[-30:],
        }

    # -- the state machine ----------------------------------------------------------------

    def _server_info(self, refresh: bool) -> ServerInfo:
        if refresh or self._info is None:
            self._info = ServerInfo.from_props(self.client.props())
        return self._info

    def _fingerprint(self, request: WarmRequest, info: ServerInfo) -> str:
        inputs = FingerprintInputs.of(
            request,
            model_id=info.model_id,
            model_file=model_file_identity(info.model_path),
            server_id=f"{self.config.server_id}|{info.build}",
            harness=self.config.harness,
        )
        return fingerprint(inputs)

    def _finish(self, outcome: Outcome, t0: float) -> Outcome:
        ms = (time.monotonic() - t0) * 1000.0
        return dataclasses.replace(outcome, ms=ms, at=time.time())

    def _ensure(self, request: WarmRequest, slot: int, t0: float) -> Outcome:
        state = self._slots.get(slot)
        if state is not None:
            fp = self._fingerprint(request, self._server_info(refresh=False))
            if state.fingerprint == fp:
                if self._slot_alive(slot, state.tokens):
                    self.log(f"fingerprint={fp[:16]}…")
                    self.log(f"cache=HIT (slot {slot} already warmed for this fingerprint)")
                    return self._finish(Outcome("hit", fp, slot, state.tokens), t0)
                self.log(
                    f"slot {slot} no longer holds the prefix (server restarted or slot "
                    "reused) → rebuilding"
                )
            self._slots.pop(slot, None)
        # Off the hit path a /props round trip is cheap next to a warm-up, and it notices a
        # restarted server with another build or model.
        info = self._server_info(refresh=True)
        fp = self._fingerprint(request, info)
        self.log(f"fingerprint={fp[:16]}…")
        if self.index is not None:
            restored = self._restore(request, slot, fp, info, t0)
            if restored is not None:
                return restored
        return self._cold(request, slot, fp, info, t0)

    def _slot_alive(self, slot: int, tokens: int) -> bool:
        try:
            entry = self.client.slot(slot)
        except LlamaServerError as exc:
            self.log(f"slot check failed ({exc.short()}) → treating slot {slot} as cold")
            return False
        n = entry.get("n_prompt_tokens") if entry else None
        return isinstance(n, int) and n > 0 and n >= self.config.gate_ratio * tokens

    def _warm_body(self, request: WarmRequest, slot: int, user: str) -> dict[str, Any]:
        # n_predict 0: process the prompt, generate nothing; id_slot pins the slot;
        # cache_prompt keeps the K/V in the slot for the next request.
        return request.body(user, n_predict=0, id_slot=slot, cache_prompt=True, stream=False)

    def _restore(
        self, request: WarmRequest, slot: int, fp: str, info: ServerInfo, t0: float
    ) -> Outcome | None:
        if self.index is None:
            return None
        index = self.index.load()
        key = info.restore_key()
        if key in index.no_restore:
            if key not in self._said_no_restore:
                self._said_no_restore.add(key)
                reason = index.no_restore[key].get("reason", "")
                self.log(f"restore disabled for this server build/model ({reason}) → cold build")
            return None
        name = file_name(fp)
        entry = index.files.get(name)
        path = index.slot_dir / name
        if not path.is_file():
            self.log(f"no checkpoint ({name} not in the slot dir) → cold build")
            return None
        # Only files the index vouches for, byte for byte, go to the server: llama-server
        # b11434 aborts (GGML_ASSERT in state_seq_load_file) on a truncated slot file
        # instead of answering an error, which would take every session down with it.
        if entry is None:
            self.log(f"no checkpoint ({name} is not in index.json, not restored) → cold build")
            return None
        if entry.fingerprint != fp:
            self.log(f"no checkpoint ({name} belongs to {entry.fingerprint[:16]}…) → cold build")
            return None
        size = path.stat().st_size
        if size != entry.bytes:
            self.log(
                f"no checkpoint ({name} is {size} bytes, index.json says {entry.bytes}: "
                "truncated or replaced, deleted) → cold build"
            )
            index.drop(name, delete_file=True)
            return None
        try:
            res = self.client.slot_restore(slot, name)
        except LlamaServerError as exc:
            self.log(f"no checkpoint (restore {exc.short()}) → cold build")
            return None
        n_restored = int(res.get("n_restored") or 0)
        restore_ms = (res.get("timings") or {}).get("restore_ms", 0.0)
        self.log(
            f"RESTORE {name}: n_restored={n_restored} n_read={res.get('n_read')} "
            f"({restore_ms:.0f} ms)"
        )
        if n_restored <= 0:
            self.log("RESTORE gave no tokens → cold build")
            return None
        own_file = entry.tokens == n_restored
        if self.config.verify == "probe":
            failure = self._probe(request, slot, n_restored)
            if failure is not None:
                self._reject(slot, name, key=key, own_file=own_file, why=failure, erase=True)
                return None
            index.touch(name)
            self._slots[slot] = _SlotState(fp, n_restored, "restore", time.time())
            return self._finish(Outcome("restored", fp, slot, n_restored, file=name), t0)
        index.touch(name)
        pending = _Pending(name, own_file, key)
        self._slots[slot] = _SlotState(fp, n_restored, "restore", time.time(), pending)
        return self._finish(
            Outcome("restored", fp, slot, n_restored, file=name, pending_verify=True), t0
        )

    def _probe(self, request: WarmRequest, slot: int, n_restored: int) -> str | None:
        """pi-prefix-cache's two-stage verification; returns why it failed, or None."""
        ident = self.client.chat(self._warm_body(request, slot, "")).timings
        if ident is None:
            return "identical-prompt gate: no timings in the answer"
        if ident.reuse < self.config.gate_ratio:
            return f"identical-prompt gate {ident.cache_n}/{ident.total} < {self._gate_pct()}"
        div = self.client.chat(self._warm_body(request, slot, self.config.probe_message)).timings
        if div is None:
            return "divergent probe: no timings in the answer"
        if div.cache_n == 0:
            # Kept: a rebuild would produce the same checkpoint chain (seed, step 4.2).
            self.log(
                f"RESTORE WARNING: divergent probe cache_n=0 of {div.total} — no context "
                "checkpoint before the divergence (server flags? e.g. the prefix is shorter "
                "than --checkpoint-min-step); restore kept"
            )
        self.log(
            f"RESTORE verified: identical {ident.cache_n}/{ident.total}, "
            f"divergent probe {div.cache_n}/{div.total}"
        )
        return None

    def _gate_pct(self) -> str:
        return f"{self.config.gate_ratio:.0%}"

    def _reject(
        self, slot: int, name: str, *, key: str, own_file: bool, why: str, erase: bool
    ) -> None:
        self.log(f"RESTORE invalid ({why}) → {'erase + ' if erase else ''}cold rebuild")
        if erase:
            self.client.slot_erase(slot)
        if self.index is not None:
            self.index.drop(name, delete_file=True)
        if own_file:
            # Our own file, right token count, and still no reuse: maybe the server cannot
            # restore this model at all. The next cold build checks (hybrid detection).
            self._suspect.add(key)

    def _cold(
        self, request: WarmRequest, slot: int, fp: str, info: ServerInfo, t0: float
    ) -> Outcome:
        self.log(f"cache=MISS → warming slot={slot} (cold)")
        res = self.client.chat(self._warm_body(request, slot, ""))
        t = res.timings
        if t is None:
            raise LlamaServerError("warm-up answer has no timings", res.status)
        self.log(f"warm-up done: HTTP {res.status} prompt_n={t.prompt_n} cache_n={t.cache_n}")
        tokens, saved = t.total, False
        key = info.restore_key()
        if self.index is not None and key not in self.index.load().no_restore:
            name = file_name(fp)
            n_saved = self._save(request, slot, fp, info, name)
            if n_saved is not None:
                tokens, saved = n_saved, True
                if key in self._suspect:
                    saved = self._check_round_trip(request, slot, name, key, info)
        self._slots[slot] = _SlotState(fp, tokens, "warm-up", time.time())
        return self._finish(Outcome("cold", fp, slot, tokens, saved=saved), t0)

    def _save(
        self, request: WarmRequest, slot: int, fp: str, info: ServerInfo, name: str
    ) -> int | None:
        index = self.index
        if index is None:
            return None
        try:
            res = self.client.slot_save(slot, name)
        except LlamaServerError as exc:
            self.log(f"SAVE failed ({exc.short()}) → continuing without a checkpoint")
            return None
        n_saved = int(res.get("n_saved") or 0)
        n_written = int(res.get("n_written") or 0)
        self.log(f"SAVED {name}: n_saved={n_saved} n_written={n_written}")
        path = index.slot_dir / name
        if not path.is_file():
            self.log(
                f"SAVED file not found at {path}: the slot dir must be llama-server's "
                "--slot-save-path → it will not be restored"
            )
        now = time.time()
        harness = self.config.harness if self.config.harness is not None else request.harness
        index.put(
            name,
            IndexEntry(
                fingerprint=fp,
                tokens=n_saved,
                bytes=n_written,
                created=now,
                last_used=now,
                model=request.model or info.model_id,
                server=info.build,
                harness=harness,
            ),
        )
        index.cleanup(self.config.max_files, self.config.max_bytes, keep=frozenset({name}))
        return n_saved

    def _check_round_trip(
        self, request: WarmRequest, slot: int, name: str, key: str, info: ServerInfo
    ) -> bool:
        """Save → erase → restore → identical prompt, on a file saved seconds ago.

        Returns whether the file is kept (False: restores do not work here)."""
        self._suspect.discard(key)
        self.log("checking a save/restore round trip (our own file failed verification)")
        self.client.slot_erase(slot)
        self.client.slot_restore(slot, name)
        t = self.client.chat(self._warm_body(request, slot, "")).timings
        if t is not None and t.reuse >= self.config.gate_ratio:
            self.log(f"round trip OK ({t.cache_n}/{t.total}): the earlier file was bad")
            return True
        got = f"{t.cache_n}/{t.total}" if t else "no timings"
        reason = (
            f"a fresh restore fails the identical-prompt gate ({got}) on build {info.build}, "
            f"model {info.model_id}: hybrid/recurrent model"
        )
        if self.index is not None:
            self.index.set_no_restore(key, reason)
            self.index.drop(name, delete_file=True)
        self._said_no_restore.add(key)
        self.log(
            f"HYBRID: {reason} → restores disabled here, warming cold instead; {HYBRID_ADVICE}"
        )
        return False

    def _observe(self, outcome: Outcome, timings: Timings | None) -> None:
        if outcome.kind in ("disabled", "skipped") and timings is None:
            return
        if timings is None:
            self.log("observed normal request: no timings in the response")
            return
        self.log(
            f"observed normal request: prompt_n={timings.prompt_n} cache_n={timings.cache_n} "
            f"(reuse {timings.reuse:.0%})"
        )
        if outcome.kind not in ("hit", "restored", "cold"):
            return
        with self._lock(outcome.slot):
            state = self._slots.get(outcome.slot)
            if state is None or state.fingerprint != outcome.fingerprint:
                return
            pending = state.pending
            if pending is not None:
                state.pending = None
                if timings.cache_n > 0 and timings.cache_n >= self.config.gate_ratio * state.tokens:
                    self.log(
                        f"RESTORE verified by the real request: identical "
                        f"{timings.cache_n}/{state.tokens}, divergent cache_n={timings.cache_n}"
                    )
                    return
                self._slots.pop(outcome.slot, None)
                self._reject(
                    outcome.slot,
                    pending.file,
                    key=pending.restore_key,
                    own_file=pending.own_file,
                    why=f"real request reused {timings.cache_n} of {state.tokens} restored tokens, "
                    f"< {self._gate_pct()}; it ran cold",
                    erase=False,
                )
            elif timings.cache_n == 0:
                # Something else took the slot since (another client, a restart): do not
                # claim a hit next time.
                self.log(f"slot {outcome.slot} did not serve the prefix → re-warming next time")
                self._slots.pop(outcome.slot, None)
