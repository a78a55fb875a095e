"""Why a request missed: the proxy shows where a harness's request left its learned prefix
(``/pion/status`` ``divergence``, counted per cause), with excerpts or, for privacy,
without (fake llama-server)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from pion.llama.cli import llama_group
from pion.llama.config import WarmerConfig
from pion.llama.proxy import STATUS_PATH, PrefixProxy, running_proxy
from support.fake_llama import fake_llama_server

RULES = "Follow the coding rules of this project carefully. " * 20


def codex(day: int, question: str) -> dict[str, Any]:
    instructions = f"You are Codex.\nCurrent date: 2026-12-{day:02d}\n{RULES}"
    return {"model": "m", "instructions": instructions, "input": question, "max_output_tokens": 2}


@pytest.mark.parametrize("excerpts", [True, False])
def test_a_changed_date_is_told_with_or_without_excerpts(tmp_path: Path, excerpts: bool) -> None:
    slot_dir = tmp_path / "slots"
    slot_dir.mkdir()
    with fake_llama_server(slot_dir) as fake:
        config = WarmerConfig(
            base_url=fake.url, log_path=tmp_path / "pc.log", divergence_excerpts=excerpts
        )
        with running_proxy(PrefixProxy(config)) as url:
            for body in (codex(4, "first"), codex(4, "second"), codex(5, "third")):
                resp = httpx.post(url + "/v1/responses", json=body, timeout=60)
                assert resp.status_code == 200
            status = httpx.get(url + STATUS_PATH, timeout=30).json()
            shown = CliRunner(env={"COLUMNS": "200"}).invoke(
                llama_group, ["status", "--upstream", fake.url, "--proxy", url]
            )
    divergence = status["divergence"]
    # The second request left the first's whole prompt after the instructions (its own
    # question came in); the third left the learned instructions at the date.
    assert divergence["counts"] == {"block-inserted": 1, "date-changed": 1}
    (entry,) = divergence["harnesses"].values()
    last = entry["recent"][-1]
    assert last["cause"] == "date-changed"
    assert 0 < last["token"] < last["learned_tokens"]
    assert "date-changed" in shown.output
    if excerpts:
        assert last["learned"].startswith("4") and last["sent"].startswith("5")
        assert "2026-12-0" in last["shared"]
    else:
        assert "learned" not in last and "sent" not in last
        assert "2026-12" not in shown.output
