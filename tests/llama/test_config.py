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


def test_slots_and_store_from_env_and_flags() -> None:
    env = {
        "PI_PREFIX_CACHE_SLOTS": "0,2",
        "PI_PREFIX_CACHE_STORE": "redis://:pw@store:1974",
        "PI_PREFIX_CACHE_STORE_TIMEOUT": "0.5",
        "PI_PREFIX_CACHE_STORE_TTL": "60",
        "PI_PREFIX_CACHE_STORE_USERNAME": "llama",
        "PION_PASSWORD": "fallback",
    }
    c = WarmerConfig.from_env(env)
    assert c.slots == (0, 2) and not c.all_slots and c.multi_slot
    store = c.store_config()
    assert store is not None and store.url == "redis://:pw@store:1974"
    assert (store.timeout, store.ttl, store.username, store.password) == (
        0.5,
        60,
        "llama",
        "fallback",
    )
    assert WarmerConfig.from_env({"PI_PREFIX_CACHE_SLOTS": "all"}).all_slots
    # Invalid values fall back, as the seed's numeric env vars do.
    bad = WarmerConfig.from_env(
        {"PI_PREFIX_CACHE_SLOTS": "0,0", "PI_PREFIX_CACHE_STORE_TIMEOUT": "-1"}
    )
    assert not bad.multi_slot and bad.store_timeout == WarmerConfig().store_timeout
    assert bad.store_config() is None
    flags = WarmerConfig.from_env(env, slots=(1,), all_slots=False, store_password="flag")
    assert flags.slots == (1,) and flags.store_password == "flag"


def test_invalid_slot_and_store_settings_are_refused() -> None:
    for kwargs in (
        {"slots": (0, 0)},
        {"slots": (-1,)},
        {"store_timeout": 0.0},
        {"store_ttl": -1},
        {"checkpoint_tokens": -1},
    ):
        with pytest.raises(ValueError):
            WarmerConfig(**kwargs)  # type: ignore[arg-type]


def test_cli_refuses_a_bad_slots_flag() -> None:
    from click.testing import CliRunner

    from pion.llama.cli import llama_group

    result = CliRunner().invoke(llama_group, ["proxy", "--slots", "0,x"])
    assert result.exit_code == 2 and "--slots wants 'all' or slot ids" in result.output


def test_checkpoint_tokens_from_env_and_flags() -> None:
    assert WarmerConfig().checkpoint_tokens == 1024
    env = {"PI_PREFIX_CACHE_CHECKPOINT_TOKENS": "4096"}
    assert WarmerConfig.from_env(env).checkpoint_tokens == 4096
    assert WarmerConfig.from_env(env, checkpoint_tokens=0).checkpoint_tokens == 0
    bad = {"PI_PREFIX_CACHE_CHECKPOINT_TOKENS": "-5"}
    assert WarmerConfig.from_env(bad).checkpoint_tokens == 0


def test_slot_trust_from_env_and_flags() -> None:
    assert WarmerConfig().slot_trust == 0.0
    env = {"PI_PREFIX_CACHE_SLOT_TRUST": "2.5"}
    assert WarmerConfig.from_env(env).slot_trust == 2.5
    assert WarmerConfig.from_env(env, slot_trust=0.0).slot_trust == 0.0
    assert WarmerConfig.from_env({"PI_PREFIX_CACHE_SLOT_TRUST": "-1"}).slot_trust == 0.0
    with pytest.raises(ValueError, match="slot trust"):
        WarmerConfig(slot_trust=-1.0)
