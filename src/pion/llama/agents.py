"""The configuration that points each agent harness at `pion llama`: one place for it.

Owns the exact files and environment lines for the three harnesses people run, as text
ready to paste (docs/llama.md shows these very texts, and the real-harness tests run the
docs' blocks, checked equal to these):

- **Pi** (``@mariozechner/pi-coding-agent``, ``POST /v1/chat/completions``):
  ``models.json`` (a provider whose ``baseUrl`` is the proxy's ``/v1``) and
  ``settings.json`` (a compaction reserve that fits the context, install telemetry off);
- **Claude Code** (``@anthropic-ai/claude-code``, ``POST /v1/messages``): environment
  variables (``ANTHROPIC_BASE_URL`` is the proxy's root, without ``/v1``);
- **Codex** (``@openai/codex``, ``POST /v1/responses``): ``config.toml`` with a provider
  of ``wire_api = "responses"`` (Codex refuses ``"chat"``).

The model id is a name only: llama-server serves the one model it loaded whatever the
request names. Does not own running the harnesses (test and benchmark scaffolding).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

__all__ = [
    "DEFAULT_CONTEXT",
    "DEFAULT_MODEL",
    "AgentConfig",
    "claude_code_env",
    "codex_config_toml",
    "configuration_text",
    "pi_models_json",
    "pi_settings_json",
]

DEFAULT_MODEL = "local"
# The context the configurations announce; llama-server's -c (per slot) must hold it.
# Claude Code's first request alone is ~20k tokens when the template renders its tools.
DEFAULT_CONTEXT = 32768


@dataclass(frozen=True)
class AgentConfig:
    """What the configurations depend on: the proxy's root URL, the model name, the
    context window announced to the harness and the largest answer it may ask for."""

    base_url: str = "http://127.0.0.1:8089"
    model: str = DEFAULT_MODEL
    context: int = DEFAULT_CONTEXT
    max_tokens: int = 4096

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base URL must be http(s)://HOST:PORT, got {self.base_url!r}")
        if self.base_url.endswith("/"):
            raise ValueError(f"base URL must not end with '/': {self.base_url!r}")
        if not 0 < self.max_tokens < self.context:
            raise ValueError(f"max_tokens {self.max_tokens} must be in (0, {self.context})")


def pi_models_json(config: AgentConfig) -> str:
    """``~/.pi/agent/models.json``: a provider ``pion`` with one model. llama-server's
    chat endpoint knows no ``developer`` role nor reasoning effort, hence the compat."""
    model = {
        "id": config.model,
        "reasoning": False,
        "input": ["text"],
        "contextWindow": config.context,
        "maxTokens": config.max_tokens,
    }
    provider = {
        "baseUrl": f"{config.base_url}/v1",
        "api": "openai-completions",
        "apiKey": "none",
        "compat": {"supportsDeveloperRole": False, "supportsReasoningEffort": False},
        "models": [model],
    }
    return json.dumps({"providers": {"pion": provider}}, indent=2) + "\n"


def pi_settings_json(config: AgentConfig) -> str:
    """``~/.pi/agent/settings.json``: Pi's default compaction reserve (16384 tokens) is
    most of a local model's context; reserve an answer's worth instead."""
    reserve = config.max_tokens
    compaction = {
        "enabled": True,
        "reserveTokens": reserve,
        "keepRecentTokens": min(2 * reserve, config.context // 4),
    }
    settings = {"compaction": compaction, "enableInstallTelemetry": False}
    return json.dumps(settings, indent=2) + "\n"


def claude_code_env(config: AgentConfig) -> dict[str, str]:
    """Claude Code's environment: every model role on the local model, no traffic to
    Anthropic besides the requests (no telemetry, error reports or update checks)."""
    return {
        "ANTHROPIC_BASE_URL": config.base_url,
        "ANTHROPIC_AUTH_TOKEN": "none",
        "ANTHROPIC_MODEL": config.model,
        "ANTHROPIC_SMALL_FAST_MODEL": config.model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": config.model,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
    }


def codex_config_toml(config: AgentConfig) -> str:
    """``~/.codex/config.toml``: a provider on the proxy's ``/v1`` speaking the
    Responses API; the key comes from ``LLAMA_API_KEY`` (any value)."""
    return "\n".join(
        [
            f'model = "{config.model}"',
            'model_provider = "pion"',
            f"model_context_window = {config.context}",
            "check_for_update_on_startup = false",
            "",
            "[model_providers.pion]",
            'name = "llama-server via pion llama"',
            f'base_url = "{config.base_url}/v1"',
            'wire_api = "responses"',
            'env_key = "LLAMA_API_KEY"',
            "request_max_retries = 1",
            "stream_max_retries = 1",
            "",
            "[analytics]",
            "enabled = false",
            "",
            "[feedback]",
            "enabled = false",
            "",
        ]
    )


def configuration_text(config: AgentConfig) -> str:
    """What ``pion llama serve`` prints: each harness's configuration, ready to paste."""
    env = "\n".join(f"export {k}={v}" for k, v in claude_code_env(config).items())
    return "\n".join(
        [
            "Pi: ~/.pi/agent/models.json",
            pi_models_json(config),
            "Pi: ~/.pi/agent/settings.json",
            pi_settings_json(config),
            f"Pi: pi --provider pion --model {config.model}",
            "",
            "Claude Code: environment, then `claude`",
            env,
            "",
            "Codex: ~/.codex/config.toml, then `LLAMA_API_KEY=none codex`",
            codex_config_toml(config),
        ]
    )
