"""Failures swallowed to stay fail-open: a traceback at debug level and a count by where,
shown by `pion llama status --proxy` (no llama-server needed: the upstream is dead)."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from pion_testing.launcher import free_port
from pion_testing.llama_samples import pi_chat_body

from pion.llama.background import Background
from pion.llama.cli import llama_group
from pion.llama.config import WarmerConfig
from pion.llama.outcome import Outcome
from pion.llama.proxy import STATUS_PATH, PrefixProxy, running_proxy
from pion.llama.timings import Timings

from .blocking import BlockingWarmer


def test_background_reports_a_failing_job() -> None:
    seen: list[tuple[str, str]] = []
    bg = Background(lambda _m: None)
    bg.on_failure = lambda where, exc: seen.append((where, str(exc)))
    ran = threading.Event()

    def boom() -> None:
        raise RuntimeError("store said no")

    bg.submit("push pi-prefix-x.bin", boom)
    bg.submit("next", ran.set)
    assert bg.flush(10) and ran.is_set()
    bg.close()
    assert seen == [("background push", "store said no")]


def test_swallowed_failures_are_counted_shown_and_traced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    config = WarmerConfig(base_url=dead, log_path=tmp_path / "pc.log", timeout=5)
    caplog.set_level(logging.DEBUG, logger="pion.llama")
    proxy = PrefixProxy(config)
    with running_proxy(proxy) as url:
        for path, body in (
            ("/v1/chat/completions", pi_chat_body(max_tokens=1)),
            ("/v1/messages", {"system": "s" * 400, "messages": [], "max_tokens": 1}),
        ):
            resp = httpx.post(url + path, json=body, timeout=30)
            assert resp.status_code == 502  # llama-server is down: answered, not hung
        # observe() swallows what breaks in it too.
        assert proxy.flush(10)
        broken = Outcome("hit", "f" * 64, slot=0, tokens=10)
        slots, proxy.warmer.ctx.slots = proxy.warmer.ctx.slots, None  # type: ignore[assignment]
        proxy.call(proxy.warmer.observe(broken, Timings(10, 1)))
        proxy.warmer.ctx.slots = slots
        status = httpx.get(url + STATUS_PATH).json()
        result = CliRunner(env={"COLUMNS": "200"}).invoke(
            llama_group, ["status", "--upstream", dead, "--proxy", url]
        )
        as_json = CliRunner().invoke(
            llama_group, ["status", "--upstream", dead, "--proxy", url, "--json"]
        )
    assert status["failures"] == {"route": 1, "prefix": 1, "observe": 1}
    # llama-server down is expected; an AttributeError in the warmer is a bug, counted by type.
    assert status["errors"] == {"AttributeError": 1}
    assert status["counts"] == {"disabled": 2}
    assert "failures swallowed (fail-open)" in result.output, result.output
    assert "'route': 1" in result.output
    assert as_json.exit_code == 0, (as_json.output, as_json.exception)
    assert json.loads(as_json.output)["proxy"]["failures"]["observe"] == 1
    traced = [r for r in caplog.records if r.levelno == logging.DEBUG and r.exc_info]
    assert {r.getMessage().split(" failed")[0] for r in traced} >= {"route", "prefix"}
    errors = [r for r in caplog.records if r.levelno == logging.ERROR and r.exc_info]
    assert [r.getMessage().split(" failed")[0] for r in errors] == ["observe"]


def test_library_warmer_counts_its_failures(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    config = WarmerConfig(base_url=dead, log_path=tmp_path / "pc.log", timeout=5)
    with BlockingWarmer(config) as warmer:
        outcome = warmer.ensure_for("completion", {"prompt": "hello " * 100}, "raw")
        assert outcome.kind == "disabled" and "Connect" in outcome.detail
        assert warmer.status()["failures"] == {"prefix": 1}
