"""WarmerConfig from PI_PREFIX_CACHE_* env vars and flags (pure units)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pion.llama.config import DEFAULT_MARKERS, WarmerConfig, normalize_base_url


def test_seed_env_vars() -> None:
    env = {
        "PI_PREFIX_CACHE_BASE_URL": "http://localhost:8080/v1",
        "PI_PREFIX_CACHE_PERSIST": "1",
        "PI_PREFIX_CACHE_SLOT_DIR": "/srv/slots",
        "PI_PREFIX_CACHE_SLOT": "2",
        "PI_PREFIX_CACHE_LOG": "/tmp/pc.log",
        "PI_PREFIX_CACHE_SERVER_ID": "v2",
        "PI_PREFIX_CACHE_VERIFY": "probe",
        "PI_PREFIX_CACHE_MAX_FILES": "3",
        "PI_PREFIX_CACHE_MAX_BYTES": "1000",
        "PI_PREFIX_CACHE_MARKERS": "\\n## Env|\\n## Cwd",
        "PI_PREFIX_CACHE_HARNESS": "pi",
        "PI_PREFIX_CACHE_API_KEY": "k",
    }
    c = WarmerConfig.from_env(env)
    assert c.base_url == "http://localhost:8080"
    assert c.persist and c.slot_dir == Path("/srv/slots") and c.slot == 2
    assert c.log_path == Path("/tmp/pc.log") and c.server_id == "v2" and c.verify == "probe"
    assert (c.max_files, c.max_bytes) == (3, 1000)
    assert c.markers == ("\n## Env", "\n## Cwd")
    assert c.harness == "pi" and c.api_key == "k"


def test_defaults_and_invalid_numbers_fall_back() -> None:
    c = WarmerConfig.from_env({"PI_PREFIX_CACHE_SLOT": "zero", "PI_PREFIX_CACHE_MAX_FILES": ""})
    d = WarmerConfig()
    assert (c.slot, c.max_files, c.persist, c.markers) == (
        d.slot,
        d.max_files,
        False,
        DEFAULT_MARKERS,
    )
    assert c.verify == "fast"


def test_flags_win_over_env() -> None:
    env = {"PI_PREFIX_CACHE_SLOT": "2", "PI_PREFIX_CACHE_PERSIST": "1"}
    c = WarmerConfig.from_env(env, slot=0, persist=False, base_url=None)
    assert c.slot == 0 and not c.persist and c.base_url == WarmerConfig().base_url


def test_base_url_forms() -> None:
    assert normalize_base_url("http://h:1/v1/") == "http://h:1"
    assert normalize_base_url("h:1") == "http://h:1"
    with pytest.raises(ValueError):
        WarmerConfig(verify="sometimes")  # type: ignore[arg-type]
