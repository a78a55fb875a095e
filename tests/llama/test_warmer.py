"""PrefixWarmer against a real llama-server: cold, hit, restore, fallbacks, fail-open, hybrid."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from pion_testing.launcher import LlamaServerProcess, free_port
from pion_testing.llama_samples import pi_chat_body, pi_tools

from pion.llama.config import WarmerConfig
from pion.llama.fingerprint import file_name
from pion.llama.index import SlotIndex
from pion.llama.outcome import Outcome
from pion.llama.prefix import WarmRequest, warm_request_from_chat
from support import chat, count, log_lines

from .blocking import BlockingWarmer
from .conftest import StartServer

pytestmark = pytest.mark.llama

MakeConfig = Callable[..., WarmerConfig]
HARNESS = "pi/0.87 test"


def warm_request(body: dict[str, object], config: WarmerConfig) -> WarmRequest:
    found = warm_request_from_chat(body, config.markers, harness=HARNESS)
    assert isinstance(found, WarmRequest), found
    return found


def replace_slot_file(slot_dir: Path, source: str, target: str) -> None:
    """Copy a slot file over another, with an index that vouches for the new size (as if
    file and index had been copied together from elsewhere): only verification is left."""
    shutil.copyfile(slot_dir / source, slot_dir / target)
    with SlotIndex(slot_dir).edit() as index:
        index.files[target].bytes = (slot_dir / target).stat().st_size


def session(warmer: BlockingWarmer, url: str, body: dict[str, object]) -> Outcome:
    """One harness session start: ensure the prefix, send the real request, observe it."""
    outcome = warmer.ensure(warm_request(body, warmer.config))
    _, timings = chat(url, body)
    warmer.observe(outcome, timings)
    return outcome


def test_first_request_cold_saves_and_real_request_reuses(
    llama_server: LlamaServerProcess, make_config: MakeConfig, slot_dir: Path
) -> None:
    config = make_config(llama_server)
    body = pi_chat_body(max_tokens=2)
    with BlockingWarmer(config) as warmer:
        outcome = warmer.ensure(warm_request(body, config))
        assert outcome.kind == "cold" and outcome.saved
        name = file_name(outcome.fingerprint)
        assert (slot_dir / name).stat().st_size > 0
        entry = SlotIndex(slot_dir).get(name)
        assert entry is not None and entry.fingerprint == outcome.fingerprint
        assert entry.tokens == outcome.tokens > 1000  # the gate below means something
        assert entry.harness == HARNESS

        _, timings = chat(llama_server.url, body)
        warmer.observe(outcome, timings)
    assert timings.cache_n > 0
    assert timings.cache_n >= 0.9 * outcome.tokens
    lines = log_lines(config.log_path)
    assert count(lines, "cache=MISS → warming slot=0 (cold)") == 1
    assert count(lines, f"SAVED {name}: n_saved={entry.tokens}") == 1
    assert count(lines, "COLD — warmed") == 1
    assert count(lines, "normal request proceeding (source=warm-up)") == 1
    assert count(lines, f"observed normal request: prompt_n={timings.prompt_n}") == 1


def test_second_request_is_in_process_hit_without_warm_up(
    llama_server: LlamaServerProcess, make_config: MakeConfig
) -> None:
    config = make_config(llama_server, persist=False)
    body = pi_chat_body(max_tokens=2)
    with BlockingWarmer(config) as warmer:
        first = session(warmer, llama_server.url, body)
        second_body = pi_chat_body("And now the tests, please.", max_tokens=2)
        second = warmer.ensure(warm_request(second_body, config))
        _, timings = chat(llama_server.url, second_body)
    assert first.kind == "cold" and not first.saved
    assert second.kind == "hit" and second.fingerprint == first.fingerprint
    assert timings.cache_n >= 0.9 * first.tokens
    lines = log_lines(config.log_path)
    assert count(lines, "warm-up done") == 1
    assert count(lines, "cache=HIT (slot 0 already warmed for this fingerprint)") == 1
    assert count(lines, "WARM — slot already hot") == 1


@pytest.mark.parametrize("verify", ["probe", "fast"])
def test_restart_restores_verifies_and_reuses(
    llama_server: LlamaServerProcess, make_config: MakeConfig, verify: str
) -> None:
    config = make_config(llama_server, verify=verify)
    body = pi_chat_body(max_tokens=2)
    with BlockingWarmer(config) as warmer:
        cold = session(warmer, llama_server.url, body)
    llama_server.restart()
    with BlockingWarmer(config) as warmer:
        outcome = warmer.ensure(warm_request(body, config))
        assert outcome.kind == "restored"
        assert outcome.pending_verify == (verify == "fast")
        _, timings = chat(llama_server.url, body)
        warmer.observe(outcome, timings)
        again = warmer.ensure(warm_request(body, config))
    assert cold.kind == "cold"
    assert outcome.fingerprint == cold.fingerprint and outcome.tokens == cold.tokens
    assert timings.cache_n >= 0.9 * cold.tokens
    assert again.kind == "hit"
    lines = log_lines(config.log_path)
    name = file_name(cold.fingerprint)
    assert count(lines, f"RESTORE {name}: n_restored={cold.tokens}") == 1
    if verify == "probe":
        verified = [line for line in lines if line.startswith("RESTORE verified: identical ")]
        assert len(verified) == 1
        # Both stages: identical c/n with c >= 90% of n, divergent probe c > 0.
        ident, div = (
            verified[0].removeprefix("RESTORE verified: identical ").split(", divergent probe ")
        )
        c1, n1 = map(int, ident.split("/"))
        c2, _ = map(int, div.split("/"))
        assert c1 >= 0.9 * n1 and c2 > 0
    else:
        assert count(lines, "RESTORE verified by the real request") == 1
    assert count(lines, "normal request proceeding (source=restore)") == 1
    assert count(lines, "warm-up done") == 1  # only the very first session was cold


def test_slot_file_unknown_to_index_is_not_restored(
    llama_server: LlamaServerProcess, make_config: MakeConfig, slot_dir: Path
) -> None:
    config = make_config(llama_server)
    body = pi_chat_body(max_tokens=2)
    with BlockingWarmer(config) as warmer:
        cold = session(warmer, llama_server.url, body)
    (slot_dir / "index.json").unlink()  # a missing index is an empty one
    llama_server.restart()
    with BlockingWarmer(config) as warmer:
        outcome = session(warmer, llama_server.url, body)
    assert outcome.kind == "cold" and outcome.saved
    assert SlotIndex(slot_dir).get(file_name(cold.fingerprint)) is not None
    lines = log_lines(config.log_path)
    assert count(lines, "is not in index.json, not restored) → cold build") == 1


def test_missing_slot_file_falls_back_to_cold(
    llama_server: LlamaServerProcess, make_config: MakeConfig, slot_dir: Path
) -> None:
    config = make_config(llama_server)
    body = pi_chat_body(max_tokens=2)
    with BlockingWarmer(config) as warmer:
        cold = session(warmer, llama_server.url, body)
    (slot_dir / file_name(cold.fingerprint)).unlink()
    llama_server.restart()
    with BlockingWarmer(config) as warmer:
        outcome = session(warmer, llama_server.url, body)
    assert outcome.kind == "cold" and outcome.saved
    assert (slot_dir / file_name(cold.fingerprint)).is_file()
    lines = log_lines(config.log_path)
    assert count(lines, "not in the slot dir) → cold build") == 2


@pytest.mark.parametrize("verify", ["fast", "probe"])
def test_truncated_slot_file_falls_back_to_cold(
    llama_server: LlamaServerProcess, make_config: MakeConfig, slot_dir: Path, verify: str
) -> None:
    config = make_config(llama_server, verify=verify)
    body = pi_chat_body(max_tokens=2)
    with BlockingWarmer(config) as warmer:
        cold = session(warmer, llama_server.url, body)
    path = slot_dir / file_name(cold.fingerprint)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    llama_server.restart()
    with BlockingWarmer(config) as warmer:
        outcome = session(warmer, llama_server.url, body)
    assert outcome.kind == "cold" and outcome.saved
    assert (
        llama_server.proc is not None and llama_server.proc.poll() is None
    )  # never sent to the server
    lines = log_lines(config.log_path)
    assert count(lines, "truncated or replaced, deleted) → cold build") == 1
    # The rebuilt file is whole again: a restart now restores it.
    llama_server.restart()
    with BlockingWarmer(config) as warmer:
        assert session(warmer, llama_server.url, body).kind == "restored"


@pytest.mark.parametrize("verify", ["fast", "probe"])
def test_foreign_slot_file_of_same_model_is_rejected(
    llama_server: LlamaServerProcess, make_config: MakeConfig, slot_dir: Path, verify: str
) -> None:
    """Another prefix's file under our name: restore works, verification must not."""
    config = make_config(llama_server, verify=verify)
    ours = pi_chat_body(max_tokens=2)
    theirs = pi_chat_body(max_tokens=2, variant="Another harness setup entirely.")
    with BlockingWarmer(config) as warmer:
        a = session(warmer, llama_server.url, ours)
        b = session(warmer, llama_server.url, theirs)
    assert a.fingerprint != b.fingerprint
    replace_slot_file(slot_dir, file_name(b.fingerprint), file_name(a.fingerprint))
    llama_server.restart()
    with BlockingWarmer(config) as warmer:
        outcome = warmer.ensure(warm_request(ours, config))
        _, timings = chat(llama_server.url, ours)
        warmer.observe(outcome, timings)
        following = session(warmer, llama_server.url, ours)
    lines = log_lines(config.log_path)
    assert count(lines, "RESTORE invalid (") == 1
    if verify == "probe":
        assert outcome.kind == "cold"  # erased and rebuilt before the real request
        assert timings.cache_n >= 0.9 * a.tokens
        assert following.kind == "hit"
    else:
        assert outcome.kind == "restored"  # the real request ran (partly) cold
        assert count(lines, "real request reused") == 1
        assert following.kind == "cold" and following.saved  # rebuilt for the next session
    assert (slot_dir / file_name(a.fingerprint)).is_file()
    assert SlotIndex(slot_dir).load().no_restore == {}  # a bad file is not a hybrid model


def test_slot_file_of_another_model_falls_back_to_cold(
    start_server: StartServer,
    tiny_model: Path,
    other_model: Path,
    make_config: MakeConfig,
    slot_dir: Path,
) -> None:
    body = pi_chat_body(max_tokens=2)
    other = start_server(other_model)
    with BlockingWarmer(make_config(other)) as warmer:
        foreign = session(warmer, other.url, body)
    other.stop()
    server = start_server(tiny_model)
    config = make_config(server)
    with BlockingWarmer(config) as warmer:
        fp = warmer.ensure(warm_request(body, config)).fingerprint
    server.restart()
    replace_slot_file(slot_dir, file_name(foreign.fingerprint), file_name(fp))
    with BlockingWarmer(config) as warmer:
        outcome = session(warmer, server.url, body)
    assert outcome.kind == "cold" and outcome.saved
    lines = log_lines(config.log_path)
    assert count(lines, "no checkpoint (restore HTTP 400") == 1


def test_changed_model_file_or_tools_give_new_fingerprint(
    start_server: StartServer, make_config: MakeConfig, tiny_model: Path, tmp_path: Path
) -> None:
    model = tmp_path / "model.gguf"
    shutil.copyfile(tiny_model, model)
    server = start_server(model)
    config = make_config(server)
    body = pi_chat_body(max_tokens=2)
    with BlockingWarmer(config) as warmer:
        first = session(warmer, server.url, body)
        fewer_tools = pi_chat_body(max_tokens=2, tools=pi_tools()[:2])
        tools_changed = session(warmer, server.url, fewer_tools)
        # A touched file is the same model (as on another machine with another mtime)...
        st = model.stat()
        os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        touched = warmer.ensure(warm_request(body, config))
        # ...a replaced one (other weights at the end of the file) is not.
        data = bytearray(model.read_bytes())
        data[-1] ^= 0x01
        replacement = tmp_path / "replacement.gguf"
        replacement.write_bytes(bytes(data))
        os.replace(replacement, model)
        model_changed = session(warmer, server.url, body)
    assert touched.fingerprint == first.fingerprint
    assert len({first.fingerprint, tools_changed.fingerprint, model_changed.fingerprint}) == 3
    assert tools_changed.kind == "cold" and model_changed.kind == "cold"
    server.restart()
    with BlockingWarmer(config) as warmer:
        assert warmer.ensure(warm_request(body, config)).fingerprint == model_changed.fingerprint


def test_server_down_fails_open(make_config: MakeConfig, tmp_path: Path) -> None:
    dead = LlamaServerProcess(Path("/nonexistent"), tmp_path / "m.gguf", port=free_port())
    config = make_config(dead)
    with BlockingWarmer(config) as warmer:
        outcome = warmer.ensure(warm_request(pi_chat_body(), config))
        warmer.observe(outcome, None)
    assert outcome.kind == "disabled"
    assert "ConnectError" in outcome.detail
    lines = log_lines(config.log_path)
    assert count(lines, "disabled this session (fail-open): ConnectError") == 1
    assert count(lines, "normal request proceeding (source=none)") == 1


def test_server_erroring_during_warm_up_fails_open(
    start_server: StartServer, tiny_model: Path, make_config: MakeConfig
) -> None:
    """A llama-server with --api-key answers 401 to the warmer that was not given the key."""
    server = start_server(tiny_model, extra_args=["--api-key", "secret"])
    config = make_config(server)
    body = pi_chat_body(max_tokens=2)
    with BlockingWarmer(config) as warmer:
        outcome = warmer.ensure(warm_request(body, config))
        _, timings = chat(server.url, body, Authorization="Bearer secret")
        warmer.observe(outcome, timings)
    assert outcome.kind == "disabled" and "HTTP 401" in outcome.detail
    lines = log_lines(config.log_path)
    assert count(lines, "disabled this session (fail-open): HTTP 401") == 1
    assert count(lines, "observed normal request") == 1
    with BlockingWarmer(make_config(server, api_key="secret")) as warmer:
        assert warmer.ensure(warm_request(body, config)).kind == "cold"


def test_save_failure_is_logged_and_request_proceeds(
    start_server: StartServer, tiny_model: Path, make_config: MakeConfig
) -> None:
    server = start_server(tiny_model, slot_dir=None)  # no --slot-save-path
    config = make_config(server)
    with BlockingWarmer(config) as warmer:
        outcome = session(warmer, server.url, pi_chat_body(max_tokens=2))
    assert outcome.kind == "cold" and not outcome.saved
    lines = log_lines(config.log_path)
    assert count(lines, "SAVE failed (HTTP 501") == 1


def test_concurrent_ensures_warm_once(
    llama_server: LlamaServerProcess, make_config: MakeConfig
) -> None:
    config = make_config(llama_server)
    body = pi_chat_body(max_tokens=2)
    outcomes: list[Outcome] = []
    with BlockingWarmer(config) as warmer:
        request = warm_request(body, config)
        threads = [
            threading.Thread(target=lambda: outcomes.append(warmer.ensure(request)))
            for _ in range(4)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert sorted(o.kind for o in outcomes) == ["cold", "hit", "hit", "hit"]
    assert count(log_lines(config.log_path), "warm-up done") == 1


def test_restarted_server_is_noticed_in_process(
    llama_server: LlamaServerProcess, make_config: MakeConfig
) -> None:
    config = make_config(llama_server)
    body = pi_chat_body(max_tokens=2)
    with BlockingWarmer(config) as warmer:
        session(warmer, llama_server.url, body)
        llama_server.restart()
        outcome = session(warmer, llama_server.url, body)
    assert outcome.kind == "restored"  # not a false in-process hit
    lines = log_lines(config.log_path)
    assert count(lines, "no longer holds the prefix") == 1


@pytest.mark.parametrize(
    ("kind", "verify"), [("recurrent", "fast"), ("recurrent", "probe"), ("hybrid", "fast")]
)
def test_recurrent_model_disables_restore_once(
    start_server: StartServer,
    request: pytest.FixtureRequest,
    make_config: MakeConfig,
    slot_dir: Path,
    *,
    kind: str,
    verify: str,
) -> None:
    """Mamba (recurrent) and LFM2 (hybrid) on this build: restores lose the state. Known
    from the model's GGUF header before anything is saved: said once, never saved or
    restored, warmed cold in process."""
    model: Path = request.getfixturevalue("mamba_model" if kind == "recurrent" else "hybrid_model")
    server = start_server(model)
    config = make_config(server, verify=verify)
    body = pi_chat_body(max_tokens=2)
    with BlockingWarmer(config) as warmer:
        first = session(warmer, server.url, body)
        assert first.kind == "cold" and not first.saved
        assert warmer.status()["model_kinds"] == {next(iter(warmer.ctx.model_kinds)): kind}
    server.restart()
    with BlockingWarmer(config) as warmer:
        first = session(warmer, server.url, body)
        assert first.kind == "cold" and not first.saved
    index = SlotIndex(slot_dir).load()
    assert len(index.no_restore) == 1 and not index.files
    lines = log_lines(config.log_path)
    assert count(lines, f"no save or restore for this model kind: {kind} model") == 1
    assert count(lines, "--ctx-checkpoints") == 1
    assert count(lines, "RESTORE accepted by llama-server (n_restored=") == 0
    server.restart()
    with BlockingWarmer(config) as warmer:
        later = session(warmer, server.url, body)
    assert later.kind == "cold" and not later.saved  # no more files that cannot be used
    lines = log_lines(config.log_path)
    assert count(lines, "no save or restore for this model kind") == 1
    assert count(lines, "restore disabled for this server build/model") == 3  # once a run
