"""Several stable prefixes on one llama-server (``-np 3``), one per slot, through the proxy:
interleaved sessions reuse their prefix, a fourth prefix evicts the least recently used,
an evicted prefix whose file is gone is saved first, status shows which prefix is where."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from pion_testing.launcher import LlamaServerProcess
from pion_testing.llama_samples import pi_chat_body

from pion.llama.cli import llama_group
from pion.llama.config import WarmerConfig
from pion.llama.fingerprint import file_name
from pion.llama.index import SlotIndex
from pion.llama.proxy import STATUS_PATH, PrefixProxy, running_proxy
from support import count, log_lines, wait_log

from .conftest import SERVER_CTX, StartServer

pytestmark = pytest.mark.llama

MakeConfig = Callable[..., WarmerConfig]
VARIANTS = {
    "A": "You work on the compiler team.",
    "B": "You work on the storage team.",
    "C": "You work on the web team.",
    "D": "You work on the docs team.",
}


def body(name: str, session: int) -> dict[str, Any]:
    """A Pi-shaped request of prefix ``name``; the user turn differs per session."""
    return pi_chat_body(
        f"Session {session}: what next?",
        variant=VARIANTS[name],
        project=f"project {session}",
        max_tokens=2,
    )


def post(proxy_url: str, payload: dict[str, Any]) -> dict[str, Any]:
    resp = httpx.post(proxy_url + "/v1/chat/completions", json=payload, timeout=120)
    assert resp.status_code == 200, resp.text
    data: dict[str, Any] = resp.json()
    return data


def status(proxy_url: str) -> dict[str, Any]:
    data: dict[str, Any] = httpx.get(proxy_url + STATUS_PATH, timeout=30).json()
    return data


def slot_of(st: dict[str, Any], fp: str) -> int:
    (slot,) = [int(k) for k, v in st["slots"].items() if v and v["fingerprint"] == fp]
    return slot


@pytest.fixture
def np3(start_server: StartServer, tiny_model: Path) -> LlamaServerProcess:
    # Three slots of the usual test context each (-np splits -c).
    return start_server(tiny_model, parallel=3, ctx=3 * SERVER_CTX)


def test_three_interleaved_prefixes_reuse_and_a_fourth_evicts_lru(
    np3: LlamaServerProcess, make_config: MakeConfig, slot_dir: Path
) -> None:
    config = make_config(np3, all_slots=True)
    fps: dict[str, str] = {}
    tokens: dict[str, int] = {}
    session = 0
    with running_proxy(PrefixProxy(config)) as proxy_url:
        for round_ in range(4):
            for name in "ABC":
                session += 1
                timings = post(proxy_url, body(name, session))["timings"]
                last = status(proxy_url)["outcomes"][-1]
                if round_ == 0:
                    assert last["kind"] == "cold"
                    fps[name], tokens[name] = last["fingerprint"], last["tokens"]
                    continue
                # Every session after the first of its prefix: a hit in the prefix's own
                # slot, and the request reused at least 90% of the prefix.
                assert last["kind"] == "hit" and last["fingerprint"] == fps[name]
                assert timings["cache_n"] >= 0.9 * tokens[name], (name, timings)
        st = status(proxy_url)
        assert len(set(fps.values())) == 3 and min(tokens.values()) > 1000
        slots = {name: slot_of(st, fp) for name, fp in fps.items()}
        assert sorted(slots.values()) == [0, 1, 2]
        assert st["lru"] == [slots["A"], slots["B"], slots["C"]]
        assert st["slots"][str(slots["A"])]["label"].startswith("You are an expert coding")

        # A fourth prefix takes the least recently used slot: A's.
        session += 1
        post(proxy_url, body("D", session))
        st = status(proxy_url)
        fp_d = st["outcomes"][-1]["fingerprint"]
        assert st["outcomes"][-1]["kind"] == "cold"
        assert slot_of(st, fp_d) == slots["A"]
        assert slot_of(st, fps["B"]) == slots["B"] and slot_of(st, fps["C"]) == slots["C"]
        assert not any(v and v["fingerprint"] == fps["A"] for v in st["slots"].values())

        # A comes back: it takes the LRU slot now (B's) and is restored from disk.
        session += 1
        timings = post(proxy_url, body("A", session))["timings"]
        st = status(proxy_url)
        assert st["outcomes"][-1]["kind"] == "restored"
        assert slot_of(st, fps["A"]) == slots["B"]
        assert timings["cache_n"] >= 0.9 * tokens["A"]
        # The CLI shows the same table, by label.
        args = ["status", "--upstream", np3.url, "--proxy", proxy_url]
        shown = CliRunner().invoke(llama_group, args, env={"COLUMNS": "250"})
    assert shown.exit_code == 0, shown.output
    assert "which prefix is in which slot" in shown.output and "(LRU #1)" in shown.output
    for name, fp in (("A", fps["A"]), ("C", fps["C"]), ("D", fp_d)):
        row = next(line for line in shown.output.splitlines() if fp[:16] in line)
        assert VARIANTS[name] in row  # the label shows which prefix it is
    lines = wait_log(config.log_path, "RESTORE verified by the real request")
    assert count(lines, "one stable prefix per slot: slots 0, 1, 2") == 1
    assert count(lines, f"EVICT slot {slots['A']}: {fps['A'][:16]}") == 1
    assert count(lines, f"EVICT slot {slots['B']}: {fps['B'][:16]}") == 1
    assert count(lines, "already on disk") == 2
    assert count(lines, "warm-up done") == 4  # A, B, C and D once each
    assert len(SlotIndex(slot_dir).load().files) == 4


def test_evicted_prefix_whose_file_was_removed_is_saved_first(
    np3: LlamaServerProcess, make_config: MakeConfig, slot_dir: Path
) -> None:
    """`pion llama gc` (or a budget) removed the files of prefixes still warm in slots:
    evicting one of them saves it again, so it can come back from disk."""
    config = make_config(np3, slots=(0, 1))
    with running_proxy(PrefixProxy(config)) as proxy_url:
        post(proxy_url, body("A", 1))
        post(proxy_url, body("B", 2))
        fp_a = status(proxy_url)["outcomes"][0]["fingerprint"]
        args = ["gc", "--slot-dir", str(slot_dir), "--max-files", "0"]
        gc = CliRunner().invoke(llama_group, args)
        assert gc.exit_code == 0 and "removed 2 file(s)" in gc.output
        post(proxy_url, body("C", 3))  # evicts A (LRU), whose file is gone: saved first
        assert (slot_dir / file_name(fp_a)).is_file()
        # A again: evicts B (now LRU, file gone too: saved first), restored from disk.
        timings = post(proxy_url, body("A", 4))["timings"]
        st = status(proxy_url)
    assert [o["kind"] for o in st["outcomes"]] == ["cold", "cold", "cold", "restored"]
    assert timings["cache_n"] >= 0.9 * st["outcomes"][0]["tokens"]
    assert set(st["slots"]) == {"0", "1"}  # slot 2 is not ours
    lines = log_lines(config.log_path)
    assert count(lines, f"EVICT slot 0: {fp_a[:16]}") == 1
    assert count(lines, "not on disk → saving it first") == 2
    assert count(lines, f"SAVED {file_name(fp_a)}") == 2
    entry = SlotIndex(slot_dir).get(file_name(fp_a))
    assert entry is not None and entry.file_tokens >= entry.tokens == st["outcomes"][0]["tokens"]


def test_request_pinning_its_own_slot_is_left_alone(
    np3: LlamaServerProcess, make_config: MakeConfig
) -> None:
    config = make_config(np3, all_slots=True)
    with running_proxy(PrefixProxy(config)) as proxy_url:
        data = post(proxy_url, {**body("A", 1), "id_slot": 2})
        st = status(proxy_url)
    assert data["choices"]
    assert [o["kind"] for o in st["outcomes"]] == ["skipped"]
    assert "the request pins id_slot itself" in st["outcomes"][0]["summary"]
    assert st["slots"] == {}


def responses_body(name: str, session: int) -> dict[str, Any]:
    """A Codex-shaped /v1/responses request of prefix ``name`` (no Pi marker: the boundary
    is learned)."""
    system = str(body(name, 0)["messages"][0]["content"]).split("\nCurrent date")[0]
    # The variant first: the prefixes of A, B, C share nothing the learner would keep.
    instructions = f"{VARIANTS[name]}\n{system}"
    return {
        "model": "pion-test",
        "instructions": instructions,
        "input": f"Session {session}: what next?",
        "max_output_tokens": 2,
    }


@pytest.fixture
def np2(start_server: StartServer, tiny_model: Path) -> LlamaServerProcess:
    return start_server(tiny_model, parallel=2, ctx=2 * SERVER_CTX)


def test_responses_and_messages_run_in_their_leased_slot_on_np2(
    np2: LlamaServerProcess, make_config: MakeConfig, tmp_path: Path
) -> None:
    """llama-server b11434 keeps ``id_slot`` in a /v1/responses body (its conversion copies
    the body) and drops it from /v1/messages: responses are pinned ("selected slot by
    id" in its log), messages lease every slot and land by prompt similarity."""
    config = make_config(np2, all_slots=True)
    proxy = PrefixProxy(config)
    with running_proxy(proxy) as proxy_url:
        for session in range(1, 4):
            for name in "AB":
                resp = httpx.post(
                    proxy_url + "/v1/responses", json=responses_body(name, session), timeout=120
                )
                assert resp.status_code == 200, resp.text
        st = status(proxy_url)
        messages = {
            "model": "pion-test",
            "system": responses_body("C", 0)["instructions"],
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 2,
        }
        for text in ("hello", "hello again"):
            messages["messages"] = [{"role": "user", "content": text}]
            resp = httpx.post(proxy_url + "/v1/messages", json=messages, timeout=120)
            assert resp.status_code == 200, resp.text
        assert proxy.flush(60)  # the last observation ends the last lease
        after = status(proxy_url)
    kinds = [o["kind"] for o in st["outcomes"]]
    assert kinds[:2] == ["cold", "cold"] and set(kinds[2:]) == {"hit"}
    assert st["events"].get("saves_refused", 0) == 0
    server_log = (tmp_path / "llama-server-0.log").read_text(errors="replace")
    # Every warm-up and every real /v1/responses request was pinned: 2 warm-ups, 6 runs.
    assert server_log.count("selected slot by id") >= 8
    # The second /v1/messages request reused the prefix where llama-server placed it.
    assert [o["kind"] for o in after["outcomes"][-2:]][-1] == "hit"
    assert after["leases"]["held"] == {}
