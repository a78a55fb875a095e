"""A Pi session through the proxy on real weights: SmolLM2-135M-Instruct served by the
real llama-server, prompts rendered by the model's own chat template (llama-server's
built-in one, from the GGUF). Cold start, a hot second session, then a restart and a
restore from the slot file, verified by the real request; the restored answer must be
the cold one, token for token (greedy)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from pion_testing.llama_samples import pi_chat_body

from pion.llama.client import LlamaClient
from pion.llama.config import WarmerConfig
from pion.llama.proxy import STATUS_PATH, PrefixProxy, running_proxy
from support import chat, count, wait_log

from .conftest import REAL_MODEL_BATCH_THREADS, StartServer

pytestmark = [pytest.mark.llama, pytest.mark.real]

# Rules in the Pi-shaped system prompt: about 1,650 tokens with SmolLM2's tokenizer,
# enough to make reuse visible, small enough for one llama-server thread.
N_RULES = 40
ANSWER_TOKENS = 12


def ask(url: str, question: str) -> tuple[dict[str, Any], Any]:
    body = pi_chat_body(question, n_rules=N_RULES, max_tokens=ANSWER_TOKENS, temperature=0)
    return chat(url, body)


def test_real_model_session_cold_hot_restored(
    start_server: StartServer, smollm2_gguf: Path, make_config: Any
) -> None:
    server = start_server(smollm2_gguf, threads_batch=REAL_MODEL_BATCH_THREADS)
    body = pi_chat_body("Q", n_rules=N_RULES)
    with LlamaClient(server.url) as client:
        rendered = client.apply_template(body)
        prompt_tokens = len(client.tokenize(rendered, add_special=True))
    # llama-server renders with SmolLM2's ChatML template from the GGUF.
    assert rendered.startswith("<|im_start|>system\nYou are an expert coding assistant")
    assert rendered.rstrip().endswith("<|im_start|>assistant")
    config: WarmerConfig = make_config(server)
    question = "Which rule matters most for a first commit?"
    with running_proxy(PrefixProxy(config)) as proxy_url:
        cold, cold_t = ask(proxy_url, question)
        _, hot_t = ask(proxy_url, "And which one for a refactor?")
        server.restart()
        restored, restored_t = ask(proxy_url, question)
        status = httpx.get(proxy_url + STATUS_PATH).json()
    assert status["counts"] == {"cold": 1, "hit": 1, "restored": 1}
    # The stable prefix (everything before <project_context>) is most of the prompt;
    # every session, including the one after the restart, reuses all of it.
    for timings in (cold_t, hot_t, restored_t):
        assert timings.cache_n > 0.8 * prompt_tokens
    answer = cold["choices"][0]["message"]["content"]
    assert answer.strip(), cold
    assert restored["choices"][0]["message"]["content"] == answer
    lines = wait_log(config.log_path, "observed normal request", 3)
    assert count(lines, "COLD — warmed") == 1
    assert count(lines, "RESTORE verified by the real request") == 1
