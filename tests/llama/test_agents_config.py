"""The agent configurations of docs/llama.md are the ones :mod:`pion.llama.agents`
generates (what `pion llama serve` prints), they parse, and the URL a run replaces is
the only place the proxy's address appears. tests/llama/test_agents.py runs them."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from pion_testing.agents import DOCS_BASE_URL, HARNESSES, doc_blocks

from pion.llama.agents import (
    AgentConfig,
    claude_code_env,
    codex_config_toml,
    configuration_text,
    pi_models_json,
    pi_settings_json,
)

DEFAULT = AgentConfig(base_url=DOCS_BASE_URL)


def test_docs_blocks_are_the_generated_configurations() -> None:
    blocks = doc_blocks()
    env = "".join(f"export {k}={v}\n" for k, v in claude_code_env(DEFAULT).items())
    assert blocks == {
        "pi-models.json": pi_models_json(DEFAULT),
        "pi-settings.json": pi_settings_json(DEFAULT),
        "claude-code.env": env,
        "codex-config.toml": codex_config_toml(DEFAULT),
    }


def test_blocks_parse_and_point_at_the_proxy() -> None:
    models = json.loads(pi_models_json(DEFAULT))
    provider = models["providers"]["pion"]
    assert provider["baseUrl"] == DOCS_BASE_URL + "/v1"
    (model,) = provider["models"]
    assert model["contextWindow"] == 32768 and model["maxTokens"] < model["contextWindow"]
    settings = json.loads(pi_settings_json(DEFAULT))
    assert settings["compaction"]["reserveTokens"] < model["contextWindow"]
    codex = tomllib.loads(codex_config_toml(DEFAULT))
    chosen = codex["model_providers"][codex["model_provider"]]
    assert chosen["wire_api"] == "responses"
    assert chosen["base_url"] == DOCS_BASE_URL + "/v1"
    assert codex["analytics"] == {"enabled": False}
    env = claude_code_env(DEFAULT)
    # Claude Code appends /v1/messages itself: the base URL is the root.
    assert env["ANTHROPIC_BASE_URL"] == DOCS_BASE_URL
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"


def test_another_url_and_context_reach_every_block() -> None:
    other = AgentConfig(base_url="http://10.0.0.7:9000", context=8192, max_tokens=512)
    text = configuration_text(other)
    assert DOCS_BASE_URL not in text
    assert text.count("http://10.0.0.7:9000") == 3
    assert '"contextWindow": 8192' in text and "model_context_window = 8192" in text


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"base_url": "127.0.0.1:8089"}, "http"),
        ({"base_url": "http://127.0.0.1:8089/"}, "end with"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"context": 4096, "max_tokens": 4096}, "max_tokens"),
    ],
)
def test_bad_configuration_is_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AgentConfig(**kwargs)  # type: ignore[arg-type]


def test_each_harness_is_prepared_from_the_docs(tmp_path: Path) -> None:
    home = tmp_path
    url = "http://127.0.0.1:40001"
    blocks = doc_blocks()
    argv, env = HARNESSES["pi"].prepare(home / "pi", url, blocks)
    written = json.loads((home / "pi/.pi/agent/models.json").read_text())
    assert written["providers"]["pion"]["baseUrl"] == url + "/v1"
    assert argv[:1] == ["-p"] and env["PI_CODING_AGENT_DIR"].endswith(".pi/agent")
    _, env = HARNESSES["claude"].prepare(home / "cc", url, blocks)
    assert env["ANTHROPIC_BASE_URL"] == url and env["ANTHROPIC_MODEL"] == "local"
    _, env = HARNESSES["codex"].prepare(home / "cx", url, blocks)
    toml = tomllib.loads((home / "cx/.codex/config.toml").read_text())
    assert toml["model_providers"]["pion"]["base_url"] == url + "/v1"
    assert env["LLAMA_API_KEY"]
