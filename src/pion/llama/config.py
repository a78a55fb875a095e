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

__all__ = [
    "DEFAULT_MARKERS",
    "ENV_PREFIX",
    "VerifyMode",
    "WarmerConfig",
    "normalize_base_url",
]

ENV_PREFIX = "PI_PREFIX_CACHE_"

# Pi's variable-section boundaries, earliest wins (seed, "How it works" step 1).
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

    def __post_init__(self) -> None:
        object.__setattr__(self, "base_url", normalize_base_url(self.base_url))
        if self.verify not in ("fast", "probe"):
            raise ValueError(f"verify must be fast or probe, not {self.verify!r}")
        if self.slot < 0:
            raise ValueError("slot must be >= 0")

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

        values: dict[str, Any] = {
            "base_url": get("BASE_URL") or default.base_url,
            "slot": max(0, num("SLOT", default.slot)),
            "persist": (get("PERSIST") or "0").lower() in ("1", "true", "yes", "on"),
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
            "api_key": get("API_KEY"),
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)
