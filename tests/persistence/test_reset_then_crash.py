"""A state the server starts from is a state it recovers from (issue 21): after a SAVE,
any of the worker's files is removed (the reset recipe for one store, a lost snapshot,
a lost log, or several at once); the server starts, acknowledges a write to every
store, is killed with SIGKILL, and must start again with every acknowledged write.
Before the fix, removing ``pion.vstore.0`` and the log made the second start refuse
("its records need the snapshot pion.vstore.0 ..., and that file is missing")."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

FILES = ("pion.vstore.0", "pion.keyspace.0", "pion.ssm.0", "pion.vstore.wal.0")
# Every non-empty combination of those files; the function libraries' snapshot alone,
# and with every other file (not in every combination: each costs a kill -9 cycle).
FUNCTIONS = "pion.functions.0"
COMBOS = [c for n in range(1, len(FILES) + 1) for c in itertools.combinations(FILES, n)]
COMBOS += [(FUNCTIONS,), (*FILES, FUNCTIONS)]


def _holds(r: redis.Redis, tag: str) -> dict[str, bool]:
    """Which store holds the data written under ``tag``."""
    return {
        "keyspace": r.get(f"k-{tag}") == tag.encode(),
        "vstore": r.execute_command("KV.PREFIX.LOOKUP", f"ns-{tag}") != b"MISS",
        "ssm": r.execute_command("SSM.PREFIX.FETCH", f"s-{tag}", 0) == tag.encode() * 100,
        "functions": r.function_list(library=f"lib_{tag}") != [],
    }


def _write(r: redis.Redis, tag: str) -> None:
    assert r.set(f"k-{tag}", tag)
    r.execute_command("KV.PREFIX.REGISTER", f"ns-{tag}", 64, "fp16")
    assert r.execute_command("SSM.PREFIX.STORE", f"s-{tag}", 0, tag.encode() * 100) == b"OK"
    code = f"#!lua name=lib_{tag}\nredis.register_function('f_{tag}', function() return 1 end)"
    assert r.function_load(code) == f"lib_{tag}".encode()


@pytest.mark.parametrize("removed", COMBOS, ids=lambda c: "+".join(f[5:] for f in c))
def test_reset_then_kill9_restarts_with_every_acknowledged_write(
    spawn_server: Callable[..., Any],
    server_factory: Callable[..., Any],
    tmp_path: Path,
    removed: tuple[str, ...],
) -> None:
    data = tmp_path / "data"
    args = ("--dir", str(data), "--appendfsync", "always")
    # The set-up needs no kill -9: an in-process server, stopped gracefully.
    first = server_factory(dir=data, appendfsync="always")
    r = redis.Redis(port=first.port)
    _write(r, "before")
    assert r.execute_command("KV.PREFIX.SAVE") == b"OK"
    first.stop()
    listed = sorted(p.name for p in data.glob("pion.*") if p.name != "pion.lock.0")
    assert listed == sorted((*FILES, FUNCTIONS))
    for name in removed:
        (data / name).unlink()

    # What a store keeps is what its snapshot held (the SAVE left the log empty).
    kept = {
        "keyspace": "pion.keyspace.0" not in removed,
        "vstore": "pion.vstore.0" not in removed,
        "ssm": "pion.ssm.0" not in removed,
        "functions": FUNCTIONS not in removed,
    }
    srv = spawn_server(*args)
    r = srv.client()
    assert _holds(r, "before") == kept
    _write(r, "after")  # acknowledged: each must survive what follows
    srv.kill()

    # The restart needs no process of its own: an in-process server on the same files.
    again = server_factory(dir=data, appendfsync="always")
    r = redis.Redis(port=again.port)
    assert _holds(r, "after") == {"keyspace": True, "vstore": True, "ssm": True, "functions": True}
    assert _holds(r, "before") == kept
