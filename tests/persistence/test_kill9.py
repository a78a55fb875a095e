"""The kill -9 loop: a writer streams REGISTER / STOREBATCH / DROP (and the odd SAVE)
at a real server under ``--appendfsync always`` and records every acknowledged write;
the server is SIGKILLed at a random moment and restarted, round after round. After
every restart each acknowledged write is present bit-exact, dropped namespaces stay
dropped, and the one write in flight at the kill is either wholly there or wholly
absent (a STOREBATCH is one log record: never half-applied).

Rows are fp16 patterns sent with ``FMT F16`` into fp16 layers and read back with
``FMT NATIVE``: stored verbatim, so "bit-exact" is a byte comparison.
"""

from __future__ import annotations

import os
import random
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import redis

from support import no_retry

DIM = 16
ROW_BYTES = DIM * 2
LAYERS = 3
ROUNDS = int(os.environ.get("PION_KILL9_ROUNDS", "50"))

# A namespace as a client can observe it: the halves present, each half's layers
# (layer -> the stored bytes of rows 0..tpl) and the block table; None when absent.
NsState = dict[str, Any] | None


def observe(r: redis.Redis, ns: str) -> NsState:
    state: dict[str, Any] = {}
    for side in ("pk", "pv"):
        try:
            info = r.execute_command("V.INFO", f"{ns}_{side}")
        except redis.ResponseError as exc:
            assert "session not found" in str(exc)
            continue
        layers = {}
        for layer, tpl in re.findall(rb"layer_(\d+)_tokens:(\d+)", info):
            raw = r.execute_command(
                "V.FETCH", f"{ns}_{side}", int(layer), "RANGE", 0, int(tpl), "FMT", "NATIVE"
            )
            layers[int(layer)] = raw
        state[side] = layers
    if not state:
        return None
    blocks = r.execute_command("KV.PREFIX.BLOCKS", ns)
    state["blocks"] = None if blocks == b"UNKNOWN" else blocks
    return state


def _stored(old: bytes, start: int, blob: bytes) -> bytes:
    tpl = max(len(old), start * ROW_BYTES + len(blob))
    out = bytearray(tpl)
    out[: len(old)] = old
    out[start * ROW_BYTES : start * ROW_BYTES + len(blob)] = blob
    return bytes(out)


class Writer:
    """Sends random writes until the connection dies; the model holds what was
    acknowledged, ``in_flight`` the outcomes allowed for the unanswered write."""

    def __init__(self, r: redis.Redis, model: dict[str, NsState], rng: random.Random) -> None:
        self.r = r
        self.model = model
        self.rng = rng
        self.in_flight: tuple[str, list[NsState]] | None = None
        self.acked = 0
        self.counter = sum(1 for _ in model)

    def _op(self) -> tuple[str, list[Any], list[NsState]]:
        """(namespace, command, [state if applied, partial states...])."""
        live = sorted(ns for ns, s in self.model.items() if s is not None)
        roll = self.rng.random()
        if not live or (roll < 0.15 and len(live) < 12):
            self.counter += 1
            ns = f"n{self.counter}"
            full = {"pk": {}, "pv": {}, "blocks": None}
            return ns, ["KV.PREFIX.REGISTER", ns, DIM, "fp16"], [full, {"pk": {}, "blocks": None}]
        ns = self.rng.choice(live)
        cur = self.model[ns]
        assert cur is not None
        if roll < 0.25:
            return ns, ["KV.PREFIX.DROP", ns], [None, {"pv": cur["pv"], "blocks": None}]
        if roll < 0.32:
            n = self.rng.randrange(0, 6)
            hashes = np.array([self.rng.getrandbits(64) for _ in range(n)], dtype="<u8")
            blob = hashes.tobytes()
            cmd = ["KV.PREFIX.REGISTER", ns, DIM, "fp16", "BLOCKS", 4, n, blob]
            return ns, cmd, [{**cur, "blocks": b"".join([np.array([4, n], "<u4").tobytes(), blob])}]
        if roll < 0.34:
            return ns, ["KV.PREFIX.SAVE"], [cur]
        side = self.rng.choice(("pk", "pv"))
        layer = self.rng.randrange(LAYERS)
        start = self.rng.randrange(0, 24)
        count = self.rng.randrange(1, 9)
        blob = self.rng.randbytes(count * ROW_BYTES)
        layers = dict(cur[side])
        layers[layer] = _stored(layers.get(layer, b""), start, blob)
        cmd = ["V.STOREBATCH", f"{ns}_{side}", layer, start, count, blob, "FMT", "F16"]
        return ns, cmd, [{**cur, side: layers}]

    def run(self) -> None:
        while True:
            ns, cmd, outcomes = self._op()
            self.in_flight = (ns, outcomes)
            try:
                reply = self.r.execute_command(*cmd)
            except redis.ConnectionError:
                return
            assert reply in (b"OK", 1), (cmd[:2], reply)
            self.model[ns] = outcomes[0]
            self.in_flight = None
            self.acked += 1


@pytest.mark.slow
def test_kill9_loop(spawn_server: Callable[..., Any]) -> None:
    rng = random.Random(20240601)
    model: dict[str, NsState] = {}
    in_flight: tuple[str, list[NsState]] | None = None
    acked = 0
    for round_no in range(ROUNDS):
        srv = spawn_server("--appendfsync", "always", "--vstore-max-sessions", "1000")
        r = srv.client(retry=no_retry())
        if in_flight is not None:
            ns, outcomes = in_flight
            got = observe(r, ns)
            allowed = [model.get(ns), *outcomes]
            assert got in allowed, f"round {round_no}: {ns} half-applied: {got}"
            model[ns] = got
            if got is not None and ("pk" not in got or "pv" not in got):
                # A REGISTER or DROP cut between its two records: clean it up.
                assert r.execute_command("KV.PREFIX.DROP", ns) == 1
                model[ns] = None
        for ns, want in model.items():
            assert observe(r, ns) == want, f"round {round_no}: {ns} lost an acknowledged write"
        writer = Writer(r, model, rng)
        thread = threading.Thread(target=writer.run)
        thread.start()
        time.sleep(rng.uniform(0.02, 0.3))
        srv.kill()
        thread.join(30)
        assert not thread.is_alive()
        in_flight = writer.in_flight
        acked += writer.acked
    assert acked > ROUNDS * 5  # the writer really wrote between the kills
