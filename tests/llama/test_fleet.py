"""Several llama-servers behind one proxy (``pion.llama.fleet``): fake llama-servers
(``support.fake_llama``), one killed, held busy or restarted, and a real pion-server as
the shared store.

Every test asserts where requests ran (the fakes' records), the outcomes and the
fleet's counters in ``/pion/status``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from pion_testing.llama_samples import pi_chat_body
from prometheus_client.parser import text_string_to_metric_families

from pion.llama.cli import llama_group
from pion.llama.fleet import Fleet
from pion.llama.proxy import PrefixProxy, running_proxy
from support.fake_llama import FakeLlamaServer, fake_llama_server
from support.fake_llama_proxy import (
    BYTES_PER_TOKEN,
    config_for,
    read_fake_slot_files,
    status,
    until,
)


@pytest.fixture(autouse=True)
def fake_slot_files(monkeypatch: pytest.MonkeyPatch) -> None:
    read_fake_slot_files(monkeypatch)


@contextlib.contextmanager
def fakes(tmp_path: Path, *aliases: str | None) -> Iterator[list[FakeLlamaServer]]:
    """One fake llama-server per alias (None: the default model), each with one slot and
    its own slot dir."""
    with contextlib.ExitStack() as stack:
        yield [
            stack.enter_context(
                fake_llama_server(
                    tmp_path / f"slots-{i}", bytes_per_token=BYTES_PER_TOKEN, model_alias=alias
                )
            )
            for i, alias in enumerate(aliases)
        ]


def fleet_proxy(servers: list[FakeLlamaServer], tmp_path: Path, **kwargs: Any) -> PrefixProxy:
    config = config_for(servers[0], tmp_path, **kwargs)
    fleet = Fleet.from_config(config, [s.url for s in servers], [s.slot_dir for s in servers])
    return PrefixProxy(config, fleet=fleet)


def session(name: str, turn: int, **extra: Any) -> dict[str, Any]:
    """Turn ``turn`` of Pi session ``name``: its own setup, so its own stable prefix."""
    return pi_chat_body(f"turn {turn}", variant=f"Session {name}.", max_tokens=2, **extra)


def post(url: str, payload: dict[str, Any]) -> httpx.Response:
    response = httpx.post(url + "/v1/chat/completions", json=payload, timeout=60)
    assert response.status_code == 200, response.text
    return response


def ran(fake: FakeLlamaServer) -> list[str]:
    """The user turns of the real chat requests ``fake`` served (a text-mode warm-up is a
    chat request with an empty user turn)."""
    turns = [r.body["messages"][-1]["content"] for r in fake.records_for("chat")]
    return [turn for turn in turns if turn]


def warmups(fake: FakeLlamaServer) -> list[str]:
    """How ``fake``'s slot came to hold each prefix: ``warm-up`` (cold) or ``restore``."""
    return [
        "restore" if r.endpoint == "restore" else "warm-up"
        for r in fake.records
        if r.endpoint == "restore"
        or (r.endpoint == "chat" and r.body["messages"][-1]["content"] == "")
    ]


def fleet_status(url: str) -> dict[str, Any]:
    data: dict[str, Any] = status(url)["fleet"]
    return data


class Call(threading.Thread):
    """One client request on its own thread."""

    def __init__(self, url: str, payload: dict[str, Any]) -> None:
        super().__init__(daemon=True)
        self.url, self.payload = url, payload
        self.response: httpx.Response | None = None
        self.start()

    def run(self) -> None:
        self.response = httpx.post(self.url + "/v1/chat/completions", json=self.payload, timeout=60)

    def result(self) -> httpx.Response:
        self.join(60)
        if self.response is None:
            raise AssertionError("no answer")
        return self.response


def test_a_prefix_warmed_on_one_server_is_routed_there_next(tmp_path: Path) -> None:
    """Two sessions land on two servers (the second on the one with an empty slot); each
    later turn goes where its prefix is warm and is a hit there."""
    with fakes(tmp_path, None, None) as (a, b):
        proxy = fleet_proxy([a, b], tmp_path)
        with running_proxy(proxy) as url:
            for turn in (1, 2):
                post(url, session("one", turn))
                post(url, session("two", turn))
            assert proxy.flush()
            fleet = fleet_status(url)
    assert ran(a) == ["turn 1", "turn 2"]
    assert ran(b) == ["turn 1", "turn 2"]
    assert warmups(a) == warmups(b) == ["warm-up"]
    assert fleet["decisions"] == {"cold": 2, "hit": 2}
    servers = fleet["servers"]
    assert [s["routed"] for s in servers] == [{"cold": 1, "hit": 1}] * 2
    assert all(s["tokens_reused"] > 0 and s["healthy"] for s in servers)
    assert [s["slots"]["0"]["label"] for s in servers] != [None, None]


def test_a_new_prefix_goes_to_the_least_busy_server(tmp_path: Path) -> None:
    """Both servers hold a prefix; while the first serves its session's answer, a new
    prefix goes to the second (evicting what it held there), not behind the answer."""
    with fakes(tmp_path, None, None) as (a, b):
        proxy = fleet_proxy([a, b], tmp_path)
        with running_proxy(proxy) as url:
            post(url, session("one", 1))
            post(url, session("two", 1))
            held = a.hold("chat", at="answer")
            busy = Call(url, session("one", 2))
            held.wait_arrived(1)
            post(url, session("three", 1))
            a.unhold(held)
            assert busy.result().status_code == 200
    assert ran(a) == ["turn 1", "turn 2"]
    assert ran(b) == ["turn 1", "turn 1"]  # sessions two and three
    assert warmups(b) == ["warm-up", "warm-up"]


def test_a_dead_servers_session_is_restored_from_the_store_elsewhere(
    tmp_path: Path, pion_store: Any
) -> None:
    """Session one is warmed on A and pushed to a real pion-server; A is killed. Its next
    turn runs on B, which pulls the prefix from the store instead of warming it cold; A
    is out of the routing, and back in once it answers again."""
    store = f"redis://{pion_store.host}:{pion_store.port}"
    with fakes(tmp_path, None, None) as (a, b):
        proxy = fleet_proxy([a, b], tmp_path, store=store)
        with running_proxy(proxy) as url:
            post(url, session("one", 1))
            assert proxy.flush()  # pushed
            a.kill()
            post(url, session("one", 2))
            fleet = fleet_status(url)
            outcome = status(url)["fleet"]["servers"][1]["counts"]
            a.revive()
            until(lambda: fleet_status(url)["servers"][0]["healthy"])
    assert ran(a) == ["turn 1"]
    assert ran(b) == ["turn 2"]
    assert warmups(b) == ["restore"]
    assert outcome == {"restored": 1}
    assert fleet["decisions"] == {"cold": 1, "pull": 1, "failover": 1}
    assert not fleet["servers"][0]["healthy"] and fleet["servers"][0]["downs"] == 1


def test_without_a_store_the_session_continues_cold_elsewhere(tmp_path: Path) -> None:
    with fakes(tmp_path, None, None) as (a, b):
        proxy = fleet_proxy([a, b], tmp_path)
        with running_proxy(proxy) as url:
            post(url, session("one", 1))
            a.kill()
            post(url, session("one", 2))
            post(url, session("one", 3))
            fleet = fleet_status(url)
    assert ran(b) == ["turn 2", "turn 3"]
    assert fleet["decisions"] == {"cold": 2, "hit": 1, "failover": 1}


def test_a_restarted_server_gets_its_prefix_back_from_its_slot_dir(tmp_path: Path) -> None:
    """A is killed and started again with empty slots: once it is back in, the session
    it held returns to it and is restored from its own slot dir, not warmed cold."""
    with fakes(tmp_path, None, None) as (a, b):
        proxy = fleet_proxy([a, b], tmp_path)
        with running_proxy(proxy) as url:
            post(url, session("one", 1))
            a.kill()
            until(lambda: not fleet_status(url)["servers"][0]["healthy"])
            a.revive()
            until(lambda: fleet_status(url)["servers"][0]["healthy"])
            post(url, session("one", 2))
    assert ran(a) == ["turn 1", "turn 2"]
    assert warmups(a) == ["warm-up", "restore"]
    assert not b.records_for("chat")


def test_requests_for_a_model_wait_for_its_server_not_another_models(tmp_path: Path) -> None:
    """A busy with a ``tiny`` answer: the next ``tiny`` request waits for A's slot; B
    serves another model and is never a candidate while A is up."""
    with fakes(tmp_path, "tiny", "other") as (a, b):
        proxy = fleet_proxy([a, b], tmp_path)
        with running_proxy(proxy) as url:
            post(url, session("one", 1, model="tiny"))
            held = a.hold("chat", at="answer")
            busy = Call(url, session("one", 2, model="tiny"))
            held.wait_arrived(1)
            other = Call(url, session("two", 1, model="tiny"))
            until(lambda: status(url)["leases"]["waiting"] == 1)
            a.unhold(held)
            assert busy.result().status_code == other.result().status_code == 200
    assert ran(a) == ["turn 1", "turn 2", "turn 1"]
    assert not b.records_for("chat") and not b.records_for("restore")


def test_a_server_with_another_model_never_gets_the_prefix(tmp_path: Path, pion_store: Any) -> None:
    """Requests naming model ``tiny`` go to A, which serves it; with A dead they go to B
    (another model), which renders and warms its own prefix: it never restores or pulls
    the file A pushed to the store."""
    store = f"redis://{pion_store.host}:{pion_store.port}"
    with fakes(tmp_path, "tiny", "other") as (a, b):
        proxy = fleet_proxy([a, b], tmp_path, store=store)
        with running_proxy(proxy) as url:
            post(url, session("one", 1, model="tiny"))
            post(url, session("one", 2, model="tiny"))
            assert proxy.flush()
            a.kill()
            post(url, session("one", 3, model="tiny"))
            fleet = fleet_status(url)
    assert ran(a) == ["turn 1", "turn 2"]
    assert ran(b) == ["turn 3"]
    assert warmups(b) == ["warm-up"]
    servers = fleet["servers"]
    assert servers[0]["key"] != servers[1]["key"]
    assert servers[1]["counts"] == {"cold": 1}
    assert fleet["decisions"] == {"cold": 2, "hit": 1, "failover": 1}


def test_a_slowed_server_is_taken_out_and_back_in(tmp_path: Path) -> None:
    """A stops answering its probes in time (wedged, not dead): it is taken out, a
    session it held continues on B, and it is back in once it answers again."""
    with fakes(tmp_path, None, None) as (a, b):
        proxy = fleet_proxy([a, b], tmp_path)
        with running_proxy(proxy) as url:
            post(url, session("one", 1))
            a.delay("health", 30.0)
            until(lambda: not fleet_status(url)["servers"][0]["healthy"])
            post(url, session("one", 2))
            a.delay("health", 0.0)
            until(lambda: fleet_status(url)["servers"][0]["healthy"])
            fleet = fleet_status(url)
    assert ran(a) == ["turn 1"] and ran(b) == ["turn 2"]
    assert fleet["servers"][0]["downs"] == 1
    assert fleet["decisions"] == {"cold": 2, "failover": 1}


def test_status_shows_each_server(tmp_path: Path) -> None:
    with fakes(tmp_path, None, None) as (a, b):
        proxy = fleet_proxy([a, b], tmp_path)
        with running_proxy(proxy) as url:
            post(url, session("one", 1))
            post(url, session("two", 1))
            a.kill()
            until(lambda: not fleet_status(url)["servers"][0]["healthy"])
            result = CliRunner().invoke(
                llama_group, ["status", "--upstream", b.url, "--proxy", url], env={"COLUMNS": "250"}
            )
    assert result.exit_code == 0, result.output
    assert a.url in result.output and b.url in result.output
    assert "down" in result.output and "cold 1" in result.output


def test_proxy_takes_several_upstreams(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The command line only: ``--upstream`` repeated, one ``--slot-dir`` each (two
    servers persisting into one dir would share llama-server's scratch save names)."""
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(
        "pion.llama.cli.serve", lambda config, **kwargs: calls.append({"config": config, **kwargs})
    )
    args = ["proxy", "--upstream", "http://a:1", "--upstream", "http://b:2", "--persist"]
    args += ["--slot-dir", str(tmp_path / "a"), "--slot-dir", str(tmp_path / "b")]
    assert CliRunner().invoke(llama_group, args).exit_code == 0
    (call,) = calls
    assert call["upstreams"] == ("http://a:1", "http://b:2")
    assert call["slot_dirs"] == (tmp_path / "a", tmp_path / "b")
    assert call["config"].base_url == "http://a:1"
    for wrong in ([*args, "--slot-dir", str(tmp_path / "c")], args[:-2]):
        bad = CliRunner().invoke(llama_group, wrong)  # three dirs for two; one for two
        assert bad.exit_code == 2 and "--slot-dir" in bad.output
    one = CliRunner().invoke(llama_group, ["proxy", "--upstream", "http://a:1"])
    assert one.exit_code == 0 and calls[-1]["upstreams"] == ()


def test_proxy_reads_its_flags_from_a_config_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``--config fleet.toml``: the fleet in a file (lists for repeatable flags), a flag on
    the command line wins, an unknown key or bad TOML is a usage error naming it."""
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(
        "pion.llama.cli.serve", lambda config, **kwargs: calls.append({"config": config, **kwargs})
    )
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(
        'upstream = ["http://a:1", "http://b:2"]\n'
        f'slot-dir = ["{tmp_path / "a"}", "{tmp_path / "b"}"]\n'
        'persist = true\nslots = "all"\nport = 9001\nregistry_ttl = 12.5\n'
    )
    result = CliRunner().invoke(llama_group, ["proxy", "--config", str(fleet), "--port", "9002"])
    assert result.exit_code == 0, result.output
    (call,) = calls
    assert call["upstreams"] == ("http://a:1", "http://b:2")
    assert call["slot_dirs"] == (tmp_path / "a", tmp_path / "b")
    assert call["port"] == 9002  # the command line wins
    config = call["config"]
    assert config.persist and config.all_slots and config.registry_ttl == 12.5
    for text, error in (("colour = 1\n", "unknown setting 'colour'"), ("upstream = [", "fleet")):
        fleet.write_text(text)
        bad = CliRunner().invoke(llama_group, ["proxy", "--config", str(fleet)])
        assert bad.exit_code == 2 and error in bad.output and "--config" in bad.output


def test_a_request_waiting_on_a_wedged_server_is_routed_again(tmp_path: Path) -> None:
    """A stops answering (every request there waits 30 s) while a request for its
    session is checking A's slot: once the probes take A out, the request gives up on A
    and is warmed and answered on B, long before A would have answered."""
    with fakes(tmp_path, None, None) as (a, b):
        proxy = fleet_proxy([a, b], tmp_path)
        with running_proxy(proxy) as url:
            post(url, session("one", 1))
            for endpoint in ("health", "slots", "chat"):
                a.delay(endpoint, 30.0)
            post(url, session("one", 2))
            fleet = fleet_status(url)
            a.kill()  # the wedged requests end: nothing waits 30 s at shutdown
    assert ran(a) == ["turn 1"] and ran(b) == ["turn 2"]
    assert not fleet["servers"][0]["healthy"]
    assert fleet["decisions"] == {"cold": 2, "failover": 1}
    assert "gave up a warm-up on " + a.url in (tmp_path / "pc.log").read_text()


def test_an_answer_awaited_from_a_wedged_server_ends_when_it_is_taken_out(
    tmp_path: Path,
) -> None:
    """A request is forwarded to A (a hit there), and A stops answering: the client gets
    a 502 once the probes take A out, not after the upstream timeout; the session's next
    turn runs on B."""
    with fakes(tmp_path, None, None) as (a, b):
        proxy = fleet_proxy([a, b], tmp_path)
        with running_proxy(proxy) as url:
            post(url, session("one", 1))
            a.delay("health", 30.0)
            a.delay("chat", 30.0)
            wedged = httpx.post(url + "/v1/chat/completions", json=session("one", 2), timeout=60)
            post(url, session("one", 3))
            fleet = fleet_status(url)
            a.kill()
    assert wedged.status_code == 502
    assert "taken out of the fleet" in wedged.json()["error"]["message"]
    assert ran(b) == ["turn 3"]
    # Counted once the server took the request: the wedged hit is not.
    assert fleet["decisions"] == {"cold": 2, "failover": 1}


def test_a_hot_prefix_spreads_when_its_slot_is_busy(tmp_path: Path, pion_store: Any) -> None:
    """Two sessions of one agent share its stable prefix. While A's slot answers one, the
    other is not queued behind it: B, idle, pulls the prefix from the store and answers
    at once. Later requests find it warm on either."""
    store = f"redis://{pion_store.host}:{pion_store.port}"
    with fakes(tmp_path, None, None) as (a, b):
        proxy = fleet_proxy([a, b], tmp_path, store=store)
        with running_proxy(proxy) as url:
            post(url, session("one", 1))
            assert proxy.flush()  # pushed
            held = a.hold("chat", at="answer")
            busy = Call(url, session("one", 2))
            held.wait_arrived(1)
            post(url, session("one", 3))  # answered while A is still busy
            a.unhold(held)
            assert busy.result().status_code == 200
            post(url, session("one", 4))
            fleet = fleet_status(url)
    assert ran(a) == ["turn 1", "turn 2", "turn 4"]
    assert ran(b) == ["turn 3"]
    assert warmups(b) == ["restore"]
    assert fleet["decisions"] == {"cold": 1, "hit": 2, "pull": 1}


def test_without_a_copy_elsewhere_a_busy_prefix_waits_for_its_slot(tmp_path: Path) -> None:
    """No store, separate slot dirs: B could only warm the prefix cold, so the second
    request waits for A's slot and is a hit there."""
    with fakes(tmp_path, None, None) as (a, b):
        proxy = fleet_proxy([a, b], tmp_path)
        with running_proxy(proxy) as url:
            post(url, session("one", 1))
            held = a.hold("chat", at="answer")
            busy = Call(url, session("one", 2))
            held.wait_arrived(1)
            waiting = Call(url, session("one", 3))
            until(lambda: status(url)["leases"]["waiting"] == 1)
            a.unhold(held)
            assert busy.result().status_code == waiting.result().status_code == 200
            fleet = fleet_status(url)
    assert ran(a) == ["turn 1", "turn 2", "turn 3"] and not ran(b)
    assert fleet["decisions"] == {"cold": 1, "hit": 2}


def _samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``GET /pion/metrics`` parsed by prometheus_client: (name, labels) -> value."""
    response = httpx.get(url + "/pion/metrics", timeout=30)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def test_metrics_count_routing_decisions_health_and_reuse(tmp_path: Path) -> None:
    """The Prometheus page says what /pion/status says: decisions (a failover included),
    each server's health, what it took and the tokens it reused."""
    with fakes(tmp_path, None, None) as (a, b):
        proxy = fleet_proxy([a, b], tmp_path)
        with running_proxy(proxy) as url:
            post(url, session("one", 1))
            a.kill()
            post(url, session("one", 2))
            post(url, session("one", 3))
            assert proxy.flush()
            fleet = fleet_status(url)
            samples = _samples(url)
    decision = "pion_llama_routing_decisions_total"
    assert {d: samples[(decision, (("decision", d),))] for d in ("cold", "hit", "failover")} == {
        "cold": 2,
        "hit": 1,
        "failover": 1,
    }
    assert samples[(decision, (("decision", "pull"),))] == 0
    assert samples[("pion_llama_server_up", (("server", a.url),))] == 0
    assert samples[("pion_llama_server_up", (("server", b.url),))] == 1
    assert samples[("pion_llama_server_downs_total", (("server", a.url),))] == 1
    routed = (("decision", "hit"), ("server", b.url))
    assert samples[("pion_llama_server_routed_total", routed)] == 1
    reused = samples[("pion_llama_server_tokens_reused_total", (("server", b.url),))]
    assert reused == fleet["servers"][1]["tokens_reused"] > 0
    assert samples[("pion_llama_upstream_errors_total", (("kind", "unreachable"),))] == 0
