"""Rollback snapshots, rope layouts and the reset recipe through the real files:
restarts keep live snapshots, restores and the id counter (from the log and from a
snapshot file); kill -9 between V.SNAPSHOT, V.STOREBATCH and V.RESTORE loses nothing
acknowledged; recovery logs ``WAL replayed: N records``; a missing snapshot beside an
empty log starts empty with a warning, beside a log that needs it refuses to start."""

from __future__ import annotations

import logging
import re
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from pion.persistence import RecoveryError, snapshot_path, wal_path
from pion.persistence.recovery import WAL_HEADER_SIZE, recover_sync
from pion.vstore import VStore
from support import durable_state as canonical
from support import f16_rows, fresh_store, no_retry, open_store, open_stores_with_ssm, rows

Spawn = Callable[..., Any]
DIM = 16


def _tokens(vs: VStore, sid: bytes) -> dict[int, int]:
    return {layer.index: layer.tpl for layer in vs.describe(sid, touch=False).layers}


def _rollback_workload(vs: VStore) -> tuple[int, int]:
    """Every rollback record and a rope layout; returns (a live snapshot, last id)."""
    vs.create(b"u", 8, "int8")
    vs.create_schema(b"mla", 0, [("bf16_rope_fp8_body", 96), ("fp8", 64)], [32, 0])
    vs.store(b"u", 0, 0, rows(10, 8, 1))
    vs.store(b"mla", 0, 0, rows(6, 96, 2))
    keep = vs.snapshot(b"u")
    released = vs.snapshot(b"u")
    vs.store(b"u", 0, 10, rows(5, 8, 3))
    vs.store(b"u", 2, 0, rows(2, 8, 4))
    vs.restore(b"u", keep)  # back to 10 rows, layer 2 gone
    assert vs.release(b"u", released)
    other = vs.snapshot(b"mla")
    vs.store(b"mla", 0, 6, rows(3, 96, 5))
    vs.restore(b"mla", other)
    vs.create(b"gone", 8, "fp16")
    last = vs.snapshot(b"gone")
    vs.drop(b"gone")  # its snapshot goes with it; its id is still spent
    return keep, last


@pytest.mark.parametrize("via", ["log", "snapshot", "snapshot+log"])
def test_restart_keeps_snapshots_restores_and_ids(tmp_path: Path, via: str) -> None:
    data = tmp_path / "d"
    vs, p = open_store(data)
    if via == "snapshot+log":
        vs.create(b"early", 8, "int8")
        vs.snapshot(b"early")
        p.save(None)
    keep, last = _rollback_workload(vs)
    if via == "snapshot":
        p.save(None)
    expected = canonical(vs)
    p.close()
    vs2, p2 = open_store(data)
    assert canonical(vs2) == expected
    assert _tokens(vs2, b"u") == {0: 10}
    assert _tokens(vs2, b"mla") == {0: 6, 1: 0}
    assert vs2.describe(b"mla").layers[0].rope == 32
    assert vs2.snapshot_ids(b"u") == [keep]
    assert vs2.snapshot(b"u") == last + 1  # ids never go back, even for dropped sessions
    vs2.store(b"u", 0, 10, rows(4, 8, 6))
    vs2.restore(b"u", keep)
    assert _tokens(vs2, b"u") == {0: 10}
    p2.close()


@pytest.mark.parametrize("via", ["log", "snapshot"])
def test_restart_keeps_a_restore_over_sparse_runs(tmp_path: Path, via: str) -> None:
    """Held runs with holes between them, a draft across and above the recorded
    length, then V.RESTORE: after a restart (from the log, or from a snapshot file that
    holds only the held runs) the layer holds the same runs and the snapshot restores
    the same way again."""
    data = tmp_path / "d"
    vs, p = open_store(data)
    vs.create(b"h", 8, "int8")
    vs.store(b"h", 0, 0, rows(10, 8, 1))
    vs.store(b"h", 0, 100_000, rows(10, 8, 2))
    snap = vs.snapshot(b"h")
    vs.store(b"h", 0, 100_010, rows(5, 8, 3))
    vs.store(b"h", 0, 150_000, rows(5, 8, 4))
    vs.restore(b"h", snap)
    if via == "snapshot":
        p.save(None)
        assert snapshot_path(data, 0).stat().st_size < 2000  # no hole in the file
    expected = canonical(vs)
    p.close()
    vs2, p2 = open_store(data)
    assert canonical(vs2) == expected
    lay = vs2._sessions[b"h"].layers[0]
    assert [(r.lo, r.hi) for r in lay.runs] == [(0, 10), (100_000, 100_010)]
    vs2.store(b"h", 0, 100_010, rows(5, 8, 5))
    vs2.restore(b"h", snap)
    assert canonical(vs2) == expected
    p2.close()


def test_the_id_counter_survives_a_snapshot_without_live_snapshots(tmp_path: Path) -> None:
    data = tmp_path / "d"
    vs, p = open_store(data)
    vs.create(b"s", 8, "int8")
    ids = [vs.snapshot(b"s") for _ in range(5)]
    for snap in ids:
        vs.release(b"s", snap)
    vs.drop(b"s")
    p.save(None)  # the log is emptied; no session, no live snapshot holds the ids
    p.close()
    assert wal_path(data, 0).stat().st_size == WAL_HEADER_SIZE
    vs2, p2 = open_store(data)
    vs2.create(b"s", 8, "int8")
    assert vs2.snapshot(b"s") == ids[-1] + 1
    p2.close()


def test_reset_recipe_starts_empty_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "d"
    vs, p = open_store(data)
    vs.create(b"x", 8, "int8")
    vs.store(b"x", 0, 0, rows(3, 8))
    p.save(None)  # everything in the snapshot; the log holds no records
    p.close()
    snapshot_path(data, 0).unlink()
    with caplog.at_level(logging.WARNING, "pion.persistence"):
        vs2, p2 = open_store(data)
    assert len(vs2) == 0
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(str(snapshot_path(data, 0)) in m and "is missing" in m for m in warned), warned
    # The new log starts from scratch: what is written now survives a restart.
    vs2.create(b"y", 8, "int8")
    vs2.store(b"y", 0, 0, rows(2, 8))
    expected = canonical(vs2)
    p2.close()
    vs3, p3 = open_store(data)
    assert canonical(vs3) == expected
    p3.close()


def test_reset_recipe_beside_the_ssm_store_snapshot(tmp_path: Path) -> None:
    """SAVE also wrote pion.ssm.<w>, whose ``covered`` keeps the new log's numbering
    past 1: the V-store starts empty, the SSM state is kept, and what is written after
    the recipe survives the next restarts (its records do not read as needing the
    removed file); removing the snapshot again once the log holds records refuses."""
    data = tmp_path / "d"
    vs, ssm, p = open_stores_with_ssm(data)
    vs.create(b"x", 8, "int8")
    vs.store(b"x", 0, 0, rows(3, 8))
    ssm.store(b"x", 0, b"state")
    p.save(None)  # both stores covered at record 3; the log holds no records
    p.close()
    snapshot_path(data, 0).unlink()
    vs2, ssm2, p2 = open_stores_with_ssm(data)
    assert len(vs2) == 0 and ssm2.get(b"x", 0) == b"state"
    assert p2.recovered.started_empty == ["vstore"] and p2.recovered.replayed == 0
    assert p2.info()["wal_seq"] == 3
    vs2.create(b"y", 8, "int8")
    vs2.store(b"y", 0, 0, rows(2, 8))
    ssm2.store(b"y", 1, b"after")
    expected = canonical(vs2)
    p2.close()
    for _ in range(2):
        vs3, ssm3, p3 = open_stores_with_ssm(data)
        assert not p3.recovered.started_empty and p3.recovered.replayed == 3
        assert canonical(vs3) == expected
        assert ssm3.get(b"x", 0) == b"state" and ssm3.get(b"y", 1) == b"after"
        p3.close()
    snapshot_path(data, 0).unlink()
    with pytest.raises(RecoveryError, match="move both"):
        open_stores_with_ssm(data)


def test_reset_recipe_with_a_torn_first_record(tmp_path: Path) -> None:
    data = tmp_path / "d"
    vs, p = open_store(data)
    vs.create(b"x", 8, "int8")
    p.save(None)
    p.close()
    with open(wal_path(data, 0), "ab") as f:  # a record a crash cut: never acknowledged
        f.write(b"\x40\x00\x00\x00\x02\x03\x00")
    snapshot_path(data, 0).unlink()
    res = recover_sync(fresh_store(), snapshot_path(data, 0), wal_path(data, 0))
    assert res.replayed == 0 and res.wal_action == "reset" and res.last_seq == 0


def test_a_log_that_needs_the_missing_snapshot_refuses_to_start(tmp_path: Path) -> None:
    data = tmp_path / "d"
    vs, p = open_store(data)
    vs.create(b"x", 8, "int8")
    p.save(None)
    vs.store(b"x", 0, 0, rows(3, 8))  # a record that only makes sense on top of x
    p.close()
    snapshot_path(data, 0).unlink()
    with pytest.raises(RecoveryError) as info:
        recover_sync(fresh_store(), snapshot_path(data, 0), wal_path(data, 0))
    text = info.value.message
    assert str(wal_path(data, 0)) in text
    assert str(snapshot_path(data, 0)) in text
    assert "is missing" in text or "missing" in text
    assert "from a backup" in text and "move both" in text


# -- real servers, kill -9 -------------------------------------------------------------


def _spawn(spawn_server: Spawn) -> tuple[Any, redis.Redis]:
    srv = spawn_server("--appendfsync", "always")
    return srv, srv.client(retry=no_retry())


def _layer(r: redis.Redis, sid: str, rows_: int) -> bytes | None:
    raw: bytes | None = r.execute_command("V.FETCH", sid, 0, "RANGE", 0, rows_, "FMT", "NATIVE")
    return raw


def _tpl(r: redis.Redis, sid: str) -> int:
    m = re.search(rb"layer_0_tokens:(\d+)", r.execute_command("V.INFO", sid))
    return int(m.group(1)) if m else 0


def test_kill9_between_snapshot_storebatch_and_restore(spawn_server: Spawn) -> None:
    accepted = f16_rows(10, DIM, 1)
    draft = f16_rows(5, DIM, 2)
    # 1: write the accepted prefix, take a snapshot, die.
    srv, r = _spawn(spawn_server)
    r.execute_command("V.CREATE", "spec", DIM, "VQUANT", "fp16")
    r.execute_command("V.STOREBATCH", "spec", 0, 0, 10, accepted, "FMT", "F16")
    snap = r.execute_command("V.SNAPSHOT", "spec")
    srv.kill()
    # 2: the snapshot is there; write the draft, die.
    srv, r = _spawn(spawn_server)
    assert _tpl(r, "spec") == 10 and _layer(r, "spec", 10) == accepted
    r.execute_command("V.STOREBATCH", "spec", 0, 10, 5, draft, "FMT", "F16")
    srv.kill()
    assert "WAL replayed: 3 records" in srv.log()  # CREATE, STORE, VSNAP
    # 3: the draft is there (acknowledged); reject it, die.
    srv, r = _spawn(spawn_server)
    assert _tpl(r, "spec") == 15 and _layer(r, "spec", 15) == accepted + draft
    assert r.execute_command("V.RESTORE", "spec", snap) == b"OK"
    srv.kill()
    # 4: the restore held; the rejected rows are zeros; new ids are larger; release the
    # snapshot, take another, snapshot the store to a file, die.
    srv, r = _spawn(spawn_server)
    assert _tpl(r, "spec") == 10
    assert _layer(r, "spec", 15) == accepted + bytes(5 * DIM * 2)
    snap2 = r.execute_command("V.SNAPSHOT", "spec")
    assert snap2 > snap
    assert r.execute_command("V.COMMIT", "spec", snap) == 1
    assert r.execute_command("KV.PREFIX.SAVE") == b"OK"
    r.execute_command("V.STOREBATCH", "spec", 0, 10, 5, draft, "FMT", "F16")
    srv.kill()
    # 5: from the snapshot file and the log: snap released, snap2 live, ids go on.
    srv, r = _spawn(spawn_server)
    assert r.execute_command("V.COMMIT", "spec", snap) == 0
    assert _tpl(r, "spec") == 15
    assert r.execute_command("V.RESTORE", "spec", snap2) == b"OK"
    assert _tpl(r, "spec") == 10
    assert r.execute_command("V.SNAPSHOT", "spec") > snap2
    assert srv.stop(signal.SIGTERM) == 0
    assert "WAL replayed: 1 records" in srv.log()  # the STORE after the SAVE


def test_kill9_with_a_rope_layout(spawn_server: Spawn) -> None:
    srv, r = _spawn(spawn_server)
    spec = "fmt=bf16_rope_fp8_body,dim=96,rope=32"
    r.execute_command("V.CREATE", "mla", 0, "SCHEMA", 2, spec, "fmt=fp8,dim=64")
    x = rows(4, 96, 7)
    r.execute_command("V.STOREBATCH", "mla", 0, 0, 4, x.tobytes())
    before = r.execute_command("V.FETCH", "mla", 0, "RANGE", 0, 4)
    srv.kill()
    srv, r = _spawn(spawn_server)
    assert r.execute_command("V.FETCH", "mla", 0, "RANGE", 0, 4) == before
    assert b"layer_0_rope:32" in r.execute_command("V.INFO", "mla")
    srv.kill()


def test_reset_recipe_on_a_real_server(spawn_server: Spawn, tmp_path: Path) -> None:
    data = tmp_path / "data"
    srv, r = _spawn(spawn_server)
    r.execute_command("KV.PREFIX.REGISTER", "ns", DIM, "fp16")
    r.execute_command("V.STOREBATCH", "ns_pk", 0, 0, 2, f16_rows(2, DIM, 1), "FMT", "F16")
    assert r.execute_command("KV.PREFIX.SAVE") == b"OK"
    assert srv.stop() == 0
    snapshot_path(data, 0).unlink()  # the recipe: remove the snapshot after a SAVE
    srv, r = _spawn(spawn_server)
    assert r.execute_command("KV.PREFIX.LOOKUP", "ns") == b"MISS"
    assert r.execute_command("V.INFO").startswith(b"enabled:1\r\nsessions:0\r\n")
    r.execute_command("V.CREATE", "after", DIM)
    assert srv.stop() == 0
    err = srv.log()
    assert f"{snapshot_path(data, 0)} is missing" in err
    assert "WAL replayed: 0 records" in err
    # What was written after the recipe is kept.
    srv, r = _spawn(spawn_server)
    assert r.execute_command("V.INFO").startswith(b"enabled:1\r\nsessions:1\r\n")
    assert b"value_dim:16" in r.execute_command("V.INFO", "after")
    # A log that holds records needs the snapshot: the server refuses to start.
    assert r.execute_command("KV.PREFIX.SAVE") == b"OK"
    r.execute_command("V.CREATE", "more", DIM)
    assert srv.stop() == 0
    snapshot_path(data, 0).unlink()
    log = wal_path(data, 0).read_bytes()
    with pytest.raises(RuntimeError) as info:
        spawn_server("--appendfsync", "always")
    text = str(info.value)
    assert str(snapshot_path(data, 0)) in text and str(wal_path(data, 0)) in text
    assert "move both" in text
    assert wal_path(data, 0).read_bytes() == log  # the refused log is left as it was


# -- a randomized drafter against kill -9 ----------------------------------------------

ROW = DIM * 2  # fp16 rows, stored verbatim: state is compared byte for byte
MIN_ACKED = 8  # commands each round's drafter has answered before its kill


class Drafter:
    """Random V.SNAPSHOT / V.STOREBATCH / V.RESTORE / V.COMMIT on one fp16 session until
    the connection dies. ``layers`` (layer -> stored bytes) and ``snaps`` (id -> layer
    lengths) hold what was acknowledged; ``in_flight`` the unanswered command."""

    def __init__(self, r: redis.Redis, model: dict[str, Any], rng: np.random.Generator) -> None:
        self.r = r
        self.m = model
        self.rng = rng
        self.in_flight: tuple[str, Any] | None = None
        self.acked = 0
        # Set once this drafter had MIN_ACKED commands answered: the kill waits for it,
        # so a slow machine still writes (and snapshots) between the kills.
        self.progressed = threading.Event()

    def _op(self) -> tuple[str, list[Any], Any]:
        layers, snaps = self.m["layers"], self.m["snaps"]
        roll = self.rng.random()
        if roll < 0.2 and len(snaps) < 16:
            return "snapshot", ["V.SNAPSHOT", "d"], None
        if roll < 0.4 and snaps:
            snap = int(self.rng.choice(sorted(snaps)))
            return "restore", ["V.RESTORE", "d", snap], snap
        if roll < 0.55 and snaps:
            snap = int(self.rng.choice(sorted(snaps)))
            return "commit", ["V.COMMIT", "d", snap], snap
        layer = int(self.rng.integers(0, 3))
        tpl = len(layers.get(layer, b"")) // ROW
        start = int(self.rng.integers(0, tpl + 4))
        count = int(self.rng.integers(1, 7))
        blob = self.rng.bytes(count * ROW)
        return (
            "store",
            ["V.STOREBATCH", "d", layer, start, count, blob, "FMT", "F16"],
            (
                layer,
                start,
                blob,
            ),
        )

    def run(self) -> None:
        while True:
            kind, cmd, arg = self._op()
            self.in_flight = (kind, arg)
            try:
                reply = self.r.execute_command(*cmd)
            except redis.ConnectionError:
                return
            apply(self.m, kind, arg, reply)
            self.in_flight = None
            self.acked += 1
            if self.acked >= MIN_ACKED:
                self.progressed.set()


def apply(m: dict[str, Any], kind: str, arg: Any, reply: Any) -> None:
    layers: dict[int, bytes] = m["layers"]
    snaps: dict[int, dict[int, int]] = m["snaps"]
    if kind == "snapshot":
        assert reply == m["last"] + 1, (reply, m["last"])
        m["last"] = reply
        snaps[reply] = {i: len(b) // ROW for i, b in layers.items()}
    elif kind == "restore":
        assert reply == b"OK"
        recorded = snaps[arg]
        for i in list(layers):
            if i not in recorded:
                del layers[i]
            else:
                layers[i] = layers[i][: recorded[i] * ROW]
    elif kind == "commit":
        assert reply == 1
        del snaps[arg]
    else:
        assert reply == b"OK"
        layer, start, blob = arg
        old = layers.get(layer, b"")
        out = bytearray(max(len(old), start * ROW + len(blob)))
        out[: len(old)] = old
        out[start * ROW : start * ROW + len(blob)] = blob
        layers[layer] = bytes(out)


def observe(r: redis.Redis) -> dict[int, bytes]:
    info = r.execute_command("V.INFO", "d")
    out = {}
    for layer, tpl in re.findall(rb"layer_(\d+)_tokens:(\d+)", info):
        raw = r.execute_command("V.FETCH", "d", int(layer), "RANGE", 0, int(tpl), "FMT", "NATIVE")
        out[int(layer)] = raw
    return out


def _shapes(got: dict[int, bytes], before: dict[int, bytes], after: dict[int, bytes]) -> str:
    """Rows per layer of each state, and the rows where what was found differs from
    both (so a failure says what it saw: the reprs of the blobs are cut short)."""

    def rows(state: dict[int, bytes]) -> dict[int, int]:
        return {i: len(b) // ROW for i, b in sorted(state.items())}

    def differ(layer: int) -> list[int]:
        mine = got.get(layer, b"")
        return [
            k
            for k in range(len(mine) // ROW)
            if all(
                mine[k * ROW : (k + 1) * ROW] != s.get(layer, b"")[k * ROW : (k + 1) * ROW]
                for s in (before, after)
            )
        ]

    return (
        f"rows got {rows(got)}, before {rows(before)}, after {rows(after)}; rows unlike "
        f"both: { {i: differ(i) for i in got} }"
    )


def settle(r: redis.Redis, m: dict[str, Any], in_flight: tuple[str, Any] | None) -> None:
    """Decide whether the command cut by the kill was applied (wholly or not at all),
    using only the wire, and bring the model up to date."""
    if in_flight is None:
        return
    kind, arg = in_flight
    if kind == "commit":
        # Releasing it now answers 1 if the cut COMMIT never landed, 0 if it did.
        assert r.execute_command("V.COMMIT", "d", arg) in (0, 1)
        del m["snaps"][arg]
    elif kind == "snapshot":
        # A new snapshot tells: its id is one higher if the cut one landed (its id is
        # spent, and it is live), and there is no room for it if the cut one was the
        # 16th (the drafter only snapshots below 16).
        try:
            probe = r.execute_command("V.SNAPSHOT", "d")
        except redis.ResponseError as exc:
            assert "no free snapshot slot" in str(exc)
            assert len(m["snaps"]) == 15
            apply(m, "snapshot", None, m["last"] + 1)
            return
        assert probe in (m["last"] + 1, m["last"] + 2)
        if probe == m["last"] + 2:
            apply(m, "snapshot", None, m["last"] + 1)
        apply(m, "snapshot", None, probe)
    else:
        before = dict(m["layers"])
        after = dict(before)
        apply({"layers": after, "snaps": m["snaps"], "last": m["last"]}, kind, arg, b"OK")
        got = observe(r)
        assert got in (before, after), f"{kind} half-applied: {_shapes(got, before, after)}"
        m["layers"] = got


def test_kill9_drafter_loop(spawn_server: Spawn) -> None:
    rng = np.random.default_rng(20250601)
    model: dict[str, Any] = {"layers": {}, "snaps": {}, "last": 0}
    in_flight: tuple[str, Any] | None = None
    acked = 0
    for round_no in range(10):
        srv, r = _spawn(spawn_server)
        if round_no == 0:
            r.execute_command("V.CREATE", "d", DIM, "VQUANT", "fp16")
        settle(r, model, in_flight)
        assert observe(r) == model["layers"], f"round {round_no}: lost an acknowledged write"
        drafter = Drafter(r, model, rng)
        thread = threading.Thread(target=drafter.run)
        thread.start()
        assert drafter.progressed.wait(60), "the drafter made no progress"
        time.sleep(float(rng.uniform(0.0, 0.25)))
        srv.kill()
        thread.join(30)
        assert not thread.is_alive()
        in_flight = drafter.in_flight
        acked += drafter.acked
    srv, r = _spawn(spawn_server)
    settle(r, model, in_flight)
    assert observe(r) == model["layers"]
    # Every acknowledged snapshot is live and restores to exactly what it recorded,
    # newest first (each restore cuts further back).
    assert model["snaps"], "the drafter took no snapshot"
    for snap in sorted(model["snaps"], reverse=True):
        assert r.execute_command("V.RESTORE", "d", snap) == b"OK"
        apply(model, "restore", snap, b"OK")
        assert observe(r) == model["layers"]
    for snap in model["snaps"]:
        assert r.execute_command("V.COMMIT", "d", snap) == 1
    assert acked > 20  # the drafter really wrote between the kills
    srv.kill()
