"""A conversation resumed after a llama-server restart, on the real server with the tiny
generated model: the checkpoint of its last turn is restored, so the next request
computes only its new turn (``pion.llama.checkpoint``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
from pion_testing.launcher import LlamaServerProcess

from pion.llama.config import WarmerConfig
from pion.llama.proxy import STATUS_PATH, PrefixProxy, running_proxy
from pion.llama.timings import Timings

pytestmark = pytest.mark.llama

SYSTEM = " ".join(f"Rule {i}: keep the change small and run the tests." for i in range(30))


def turn_text(turn: int) -> str:
    return " ".join(f"Step {turn}.{i}: read the file, then change line {i}." for i in range(8))


def test_conversation_resumed_after_a_restart_restores_its_last_turn(
    llama_server: LlamaServerProcess, make_config: Callable[..., WarmerConfig]
) -> None:
    config = make_config(llama_server, checkpoint_tokens=32)
    messages: list[dict[str, Any]] = []
    timings: list[Timings] = []
    proxy = PrefixProxy(config)
    with running_proxy(proxy) as url:
        for turn in range(6):
            if turn == 5:
                assert proxy.flush(60)  # the fifth turn's checkpoint is written
                llama_server.restart()
            messages.append({"role": "user", "content": turn_text(turn)})
            body = {"model": "pion-test", "system": SYSTEM, "messages": messages, "max_tokens": 2}
            resp = httpx.post(url + "/v1/messages", json=body, timeout=120)
            assert resp.status_code == 200, resp.text
            found = Timings.from_json(resp.json())
            assert found is not None
            timings.append(found)
            text = "".join(p.get("text", "") for p in resp.json()["content"])
            messages.append({"role": "assistant", "content": text or "ok"})
        assert proxy.flush(60)
        status = httpx.get(url + STATUS_PATH, timeout=30).json()
    events = status["events"]
    assert events["checkpoints_saved"] >= 3, status["log_tail"]
    assert events["checkpoint_restores"] == 1, status["log_tail"]
    assert status["outcomes"][-1]["kind"] == "restored"
    fifth, sixth = timings[4], timings[5]
    # All of the fifth request but its generation prompt (rendered anew once the answer
    # follows it) came from the checkpoint: only the new turn was computed.
    assert sixth.cache_n >= fifth.total - 4, (fifth, sixth)
    assert sixth.prompt_n <= sixth.total - fifth.total + 4, (fifth, sixth)
    checkpoints = [f for f in status["files"].values() if f.get("prefix")]
    assert len(checkpoints) == 1  # each turn's checkpoint replaced the one before
