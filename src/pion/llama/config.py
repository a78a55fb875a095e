"""Configuration of the prefix warmer and proxy: defaults, ``PI_PREFIX_CACHE_*`` env vars, flags.

Owns :class:`WarmerConfig` (frozen) and its construction from the environment. The env vars
mirror pi-prefix-cache's so an existing Pi setup keeps working; every one also has
a CLI flag, and a flag wins over its env var. As in pi-prefix-cache, a numeric env var that is
unset or invalid falls back to its default.

=================================  ==========================================  ===========
env var                            meaning                                     default
=================================  ==========================================  ===========
PI_PREFIX_CACHE_BASE_URL           llama-server URL (a trailing /v1 is fine)   127.0.0.1:8080
PI_PREFIX_CACHE_SLOT               slot that holds the prefix                  0
PI_PREFIX_CACHE_SLOTS              several prefixes: slot ids ``0,1,2``|all    (one slot)
PI_PREFIX_CACHE_PERSIST            1 = save/restore the prefix on disk         0
PI_PREFIX_CACHE_SLOT_DIR           llama-server's --slot-save-path             (none)
PI_PREFIX_CACHE_LOG                log file of ``[prefix-cache]`` lines        (see below)
PI_PREFIX_CACHE_SERVER_ID          bump to force one clean cold rebuild        "" (+ build)
PI_PREFIX_CACHE_VERIFY             fast (real request verifies) or probe       fast
PI_PREFIX_CACHE_MAX_FILES          slot files kept in the slot dir             16
PI_PREFIX_CACHE_MAX_BYTES          bytes of slot files kept                    16 GiB
PI_PREFIX_CACHE_MARKERS            ``|``-separated prefix boundary markers     Pi's three
PI_PREFIX_CACHE_HARNESS            harness id for the fingerprint              request UA
PI_PREFIX_CACHE_TIMEOUT            seconds for one warm-up request             600
PI_PREFIX_CACHE_API_KEY            llama-server --api-key for warm-ups         (none)
PI_PREFIX_CACHE_STORE              redis:// or rediss:// URL of the store      (none)
PI_PREFIX_CACHE_STORE_PASSWORD     store AUTH password (else PION_PASSWORD)    (none)
PI_PREFIX_CACHE_STORE_USERNAME     store AUTH user                             (none)
PI_PREFIX_CACHE_STORE_TLS_CA       CA bundle for a rediss:// store             (system)
PI_PREFIX_CACHE_STORE_TIMEOUT      seconds per store operation                 2
PI_PREFIX_CACHE_STORE_TTL          seconds slot files live in the store        604800
PI_PREFIX_CACHE_REGISTRY_TTL       seconds a proxy's registry claims live      30
PI_PREFIX_CACHE_KEEP_BILLING_HEADER  1 = leave Claude Code's billing header in     0
PI_PREFIX_CACHE_DIVERGENCE_EXCERPTS  0 = no prompt text in divergence reports   1
PI_PREFIX_CACHE_LEASE_WAIT         seconds a request waits for a slot          30
PI_PREFIX_CACHE_UPSTREAM_TIMEOUT   seconds without a byte from llama-server    600
PI_PREFIX_CACHE_CHECKPOINT_TOKENS  new tokens before a conversation checkpoint 1024
PI_PREFIX_CACHE_SLOT_TRUST         seconds a confirmed slot is trusted unasked  0
PI_PREFIX_CACHE_CHECK_EVERY_HIT    1 = GET /slots on every hit                 0
=================================  ==========================================  ===========

The log defaults to ``$PION_CACHE/prefix-cache.log`` (``~/.cache/pion/prefix-cache.log``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pion.llama.paths import default_log_path
from pion.llama.slots import parse_slots
from pion.llama.store import StoreConfig

__all__ = [
    "DEFAULT_MARKERS",
    "ENV_PREFIX",
    "VerifyMode",
    "WarmerConfig",
    "normalize_base_url",
]

ENV_PREFIX = "PI_PREFIX_CACHE_"

# Pi's variable-section boundaries, earliest wins (pi-prefix-cache's rule).
DEFAULT_MARKERS: tuple[str, ...] = (
    "\n<project_context>",
    "\n<cwd>",
    "\nCurrent working directory:",
)

VerifyMode = Literal["fast", "probe"]

GIB = 1024**3


def normalize_base_url(url: str) -> str:
    """The server root: no trailing slash, no trailing ``/v1`` (pi-prefix-cache's form has one)."""
    url = url.strip().rstrip("/")
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    if "://" not in url:
        url = "http://" + url
    return url


@dataclass(frozen=True)
class WarmerConfig:
    """Everything a :class:`~pion.llama.warmer.PrefixWarmer` is started with."""

    base_url: str = "http://127.0.0.1:8080"
    slot: int = 0
    persist: bool = False
    slot_dir: Path | None = None
    log_path: Path | None = dataclasses.field(default_factory=default_log_path)
    server_id: str = ""
    verify: VerifyMode = "fast"
    max_files: int = 16
    max_bytes: int = 16 * GIB
    markers: tuple[str, ...] = DEFAULT_MARKERS
    harness: str | None = None
    timeout: float = 600.0
    api_key: str | None = None
    # The identical-prompt gate: a valid restore serves at least this share from cache.
    gate_ratio: float = 0.9
    # The divergent probe's user message (`--verify probe`); any non-empty text works.
    probe_message: str = "ping"
    # Several stable prefixes, one per slot (`--slots 0,1,2`); `all_slots`: every slot the
    # server has (`--slots all`). Neither: one prefix, in `slot`.
    slots: tuple[int, ...] = ()
    all_slots: bool = False
    # The shared second tier of slot files (pion-server or any Redis keyspace).
    store: str | None = None
    store_password: str | None = None
    store_username: str | None = None
    store_tls_ca: Path | None = None
    store_timeout: float = 2.0
    store_ttl: int = 7 * 24 * 3600
    # A pull that takes longer than this is abandoned (the prefix is built cold).
    store_deadline: float = 120.0
    store_prefix: str = "pion:llama:"
    # Seconds a proxy's claims in the store's prefix registry live unless refreshed (a
    # dead proxy's are gone after this); 0: no registry (docs/llama.md, "Several proxies").
    registry_ttl: float = 30.0
    # Claude Code's per-prompt ``x-anthropic-billing-header`` system block is removed from
    # /v1/messages requests unless this is set (docs/llama.md, "Claude Code's billing header").
    keep_billing_header: bool = False
    # How long a request waits, in order, for a slot another request leases
    # (docs/llama.md, "One request per slot"); then it is forwarded unwarmed.
    lease_wait: float = 30.0
    # A forwarded request whose llama-server sends nothing for this long is answered 504
    # (a wedged llama-server must not hang the proxy); a long prefill sends nothing for its
    # whole duration, so this is generous.
    upstream_timeout: float = 600.0
    # Excerpts of prompt text where a request left its harness's learned prefix, in the
    # status and the log (off: positions and causes only; docs/llama.md, "Why a request
    # missed").
    divergence_excerpts: bool = True
    # Conversation checkpoints (docs/llama.md, "Whole conversations"): after an answer, the
    # slot is saved as a checkpoint of the conversation when it grew by at least this many
    # tokens past the longest file of it already saved; 0 turns checkpoints off.
    checkpoint_tokens: int = 1024
    # Seconds a slot is trusted to hold its prefix without ``GET /slots`` once llama-server
    # or a real request confirmed it, while no unpinned request ran (docs/llama.md, "What
    # a hit costs"), whatever the llama-server process. 0: trusted only while the local
    # process that confirmed it still serves (``pion.llama.identity``), so a restart is
    # noticed before the request; above 0, a restart within that time is noticed by the
    # request's own answer (it ran cold, the next one restores).
    slot_trust: float = 0.0
    # Ask ``GET /slots`` on every proxied hit, even while the local llama-server process
    # that confirmed the slot still serves (``pion.llama.identity``): for a llama-server
    # that other clients use directly, beside the proxy, and may evict a slot unseen.
    check_every_hit: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "base_url", normalize_base_url(self.base_url))
        if self.verify not in ("fast", "probe"):
            raise ValueError(f"verify must be fast or probe, not {self.verify!r}")
        if self.slot < 0 or any(s < 0 for s in self.slots):
            raise ValueError("slot ids must be >= 0")
        if len(set(self.slots)) != len(self.slots):
            raise ValueError("slots must be distinct")
        if self.lease_wait < 0 or self.upstream_timeout <= 0:
            raise ValueError("lease wait must be >= 0 and upstream timeout > 0")
        if self.slot_trust < 0:
            raise ValueError("slot trust must be >= 0 (0: every hit checked)")
        if self.checkpoint_tokens < 0:
            raise ValueError("checkpoint tokens must be >= 0 (0: no checkpoints)")
        if self.store_timeout <= 0 or self.store_deadline <= 0 or self.store_ttl < 0:
            raise ValueError("store timeout and deadline must be > 0, ttl >= 0")
        if self.registry_ttl < 0:
            raise ValueError("registry ttl must be >= 0 (0: no registry)")

    @property
    def multi_slot(self) -> bool:
        """Several prefixes, one per slot, requests pinned with ``id_slot``."""
        return bool(self.slots) or self.all_slots

    def store_config(self) -> StoreConfig | None:
        """How to reach the store, or None when there is none."""
        if not self.store:
            return None
        return StoreConfig(
            url=self.store,
            password=self.store_password,
            username=self.store_username,
            tls_ca=self.store_tls_ca,
            timeout=self.store_timeout,
            deadline=self.store_deadline,
            ttl=self.store_ttl,
            prefix=self.store_prefix,
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> WarmerConfig:
        """Read ``PI_PREFIX_CACHE_*``; keyword overrides (flags) win when not None."""
        env = os.environ if env is None else env
        default = cls()

        def get(name: str) -> str | None:
            value = env.get(ENV_PREFIX + name)
            return value if value not in (None, "") else None

        def num(name: str, fallback: int) -> int:
            raw = get(name)
            try:
                return int(raw) if raw is not None else fallback
            except ValueError:
                return fallback

        def flt(name: str, fallback: float) -> float:
            raw = get(name)
            try:
                return float(raw) if raw is not None else fallback
            except ValueError:
                return fallback

        slots: tuple[int, ...] | None = ()
        if (spec := get("SLOTS")) is not None:
            try:
                slots = parse_slots(spec)
            except ValueError:
                slots = ()  # like the numeric env vars: invalid means unset
        values: dict[str, Any] = {
            "base_url": get("BASE_URL") or default.base_url,
            "slots": slots or (),
            "all_slots": slots is None,
            "store": get("STORE"),
            "store_password": get("STORE_PASSWORD") or env.get("PION_PASSWORD") or None,
            "store_username": get("STORE_USERNAME"),
            "store_tls_ca": Path(c) if (c := get("STORE_TLS_CA")) else None,
            "store_timeout": t
            if (t := flt("STORE_TIMEOUT", default.store_timeout)) > 0
            else default.store_timeout,
            "store_ttl": max(0, num("STORE_TTL", default.store_ttl)),
            "registry_ttl": max(0.0, flt("REGISTRY_TTL", default.registry_ttl)),
            "slot": max(0, num("SLOT", default.slot)),
            "persist": (get("PERSIST") or "0").lower() in ("1", "true", "yes", "on"),
            "keep_billing_header": (get("KEEP_BILLING_HEADER") or "0").lower()
            in ("1", "true", "yes", "on"),
            "divergence_excerpts": (get("DIVERGENCE_EXCERPTS") or "1").lower()
            not in ("0", "false", "no", "off"),
            "slot_dir": Path(d) if (d := get("SLOT_DIR")) else None,
            "log_path": Path(p) if (p := get("LOG")) else default.log_path,
            "server_id": get("SERVER_ID") or "",
            "verify": "probe" if (get("VERIFY") or "").lower() == "probe" else "fast",
            "max_files": max(0, num("MAX_FILES", default.max_files)),
            "max_bytes": max(0, num("MAX_BYTES", default.max_bytes)),
            "markers": tuple(m.replace("\\n", "\n") for m in markers.split("|") if m)
            if (markers := get("MARKERS"))
            else default.markers,
            "harness": get("HARNESS"),
            "timeout": flt("TIMEOUT", default.timeout),
            "lease_wait": w if (w := flt("LEASE_WAIT", default.lease_wait)) >= 0 else 0.0,
            "upstream_timeout": u
            if (u := flt("UPSTREAM_TIMEOUT", default.upstream_timeout)) > 0
            else default.upstream_timeout,
            "api_key": get("API_KEY"),
            "checkpoint_tokens": max(0, num("CHECKPOINT_TOKENS", default.checkpoint_tokens)),
            "slot_trust": max(0.0, flt("SLOT_TRUST", default.slot_trust)),
            "check_every_hit": (get("CHECK_EVERY_HIT") or "0").lower()
            in ("1", "true", "yes", "on"),
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)
