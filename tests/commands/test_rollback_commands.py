"""V.SNAPSHOT / V.RESTORE / V.COMMIT on the wire (real TCP, redis-py RESP2 and RESP3,
redis-cli and the real pion-vllm-mlx client's raw wire helper): speculative-decoding
rollback as a drafter uses it, every error text, and hostile arguments."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import redis

from pion.codecs import FORMAT_NAMES, get_codec
from pion.server.run import ServerThread


def f32(n: int, dim: int, seed: int = 0, scale: float = 1.0) -> npt.NDArray[np.float32]:
    return (np.random.default_rng(seed).standard_normal((n, dim)) * scale).astype(np.float32)


def err(client: redis.Redis, *args: Any) -> str:
    with pytest.raises(redis.ResponseError) as info:
        client.execute_command(*args)
    return str(info.value)


def tokens(client: redis.Redis, sid: str) -> dict[int, int]:
    raw = client.execute_command("V.INFO", sid).decode()
    fields = dict(line.split(":", 1) for line in raw.split("\r\n") if line)
    return {
        int(k[len("layer_") : -len("_tokens")]): int(v)
        for k, v in fields.items()
        if k.endswith("_tokens") and k.startswith("layer_")
    }


def fetch(client: redis.Redis, sid: str, layer: int, rows: tuple[int, int], dim: int) -> Any:
    raw = client.execute_command("V.FETCH", sid, layer, "RANGE", *rows)
    return None if raw is None else np.frombuffer(raw, "<f4").reshape(-1, dim)


def store(client: redis.Redis, sid: str, layer: int, start: int, x: np.ndarray) -> None:
    reply = client.execute_command("V.STOREBATCH", sid, layer, start, len(x), x.tobytes())
    assert reply == b"OK"


def test_ids_are_positive_and_strictly_increasing(client: redis.Redis) -> None:
    client.execute_command("V.CREATE", "a", 128)
    client.execute_command("V.CREATE", "b", 128)
    ids = [client.execute_command("V.SNAPSHOT", sid) for sid in ("a", "b", "a", "a")]
    assert all(isinstance(i, int) and i > 0 for i in ids)
    assert ids == sorted(set(ids))
    assert client.execute_command("V.COMMIT", "a", ids[-1]) == 1
    assert client.execute_command("V.SNAPSHOT", "a") > ids[-1]  # also after a commit


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_draft_rejected_then_accepted(client: redis.Redis, fmt: str) -> None:
    """EAGLE-style: accept a prefix, draft, reject, write the accepted continuation."""
    dim = 128
    client.execute_command("V.CREATE", "s", dim, "VQUANT", fmt)
    codec = get_codec(fmt)
    committed = f32(50, dim, seed=1, scale=0.3)
    for layer in (0, 1):
        store(client, "s", layer, 0, committed)
    before = [fetch(client, "s", layer, (0, 50), dim) for layer in (0, 1)]
    snap = client.execute_command("V.SNAPSHOT", "s")
    rejected = f32(30, dim, seed=2, scale=5.0)  # a different distribution
    for layer in (0, 1):
        store(client, "s", layer, 50, rejected)
    store(client, "s", 2, 0, rejected)  # a layer the draft created
    assert tokens(client, "s") == {0: 80, 1: 80, 2: 30}
    assert client.execute_command("V.RESTORE", "s", snap) == b"OK"
    assert tokens(client, "s") == {0: 50, 1: 50}
    for layer in (0, 1):
        assert np.array_equal(fetch(client, "s", layer, (0, 50), dim), before[layer])
        assert fetch(client, "s", layer, (50, 80), dim) is None  # the rows are gone
    accepted = f32(20, dim, seed=3, scale=0.3)
    store(client, "s", 0, 50, accepted)
    got = fetch(client, "s", 0, (0, 80), dim)
    assert np.array_equal(got[:50], before[0])
    assert np.array_equal(got[50:70], codec.decode(codec.encode(accepted), dim))
    assert not got[70:].any()  # rows past tpl: zeros, nothing of the rejected draft
    ids = client.execute_command("V.FETCH", "s", 0, 55, 65, 75)
    assert np.array_equal(np.frombuffer(ids, "<f4").reshape(3, dim)[2], np.zeros(dim, np.float32))


def test_nested_snapshots_and_no_growth(client: redis.Redis) -> None:
    dim = 64
    client.execute_command("V.CREATE", "n", dim)
    store(client, "n", 0, 0, f32(20, dim))
    outer = client.execute_command("V.SNAPSHOT", "n")
    store(client, "n", 0, 20, f32(30, dim, seed=1))
    inner = client.execute_command("V.SNAPSHOT", "n")
    store(client, "n", 0, 50, f32(15, dim, seed=2))
    assert client.execute_command("V.RESTORE", "n", inner) == b"OK"
    assert tokens(client, "n") == {0: 50}
    assert client.execute_command("V.RESTORE", "n", outer) == b"OK"
    assert tokens(client, "n") == {0: 20}
    assert client.execute_command("V.RESTORE", "n", inner) == b"OK"  # above: no growth
    assert tokens(client, "n") == {0: 20}


def test_commit_releases(client: redis.Redis, client3: redis.Redis) -> None:
    client.execute_command("V.CREATE", "c", 64)
    snap = client.execute_command("V.SNAPSHOT", "c")
    assert client3.execute_command("V.COMMIT", "c", snap) == 1
    assert client3.execute_command("V.COMMIT", "c", snap) == 0  # idempotent
    assert "unknown snap_id" in err(client, "V.RESTORE", "c", snap)
    assert client.execute_command("V.COMMIT", "c", 10**12) == 0  # never issued: not live


def test_at_most_16_live_snapshots(client: redis.Redis) -> None:
    client.execute_command("V.CREATE", "m", 64)
    snaps = [client.execute_command("V.SNAPSHOT", "m") for _ in range(16)]
    assert "no free snapshot slot" in err(client, "V.SNAPSHOT", "m")
    assert client.execute_command("V.COMMIT", "m", snaps[0]) == 1
    assert client.execute_command("V.SNAPSHOT", "m") > snaps[-1]
    assert "no free snapshot slot" in err(client, "V.SNAPSHOT", "m")


def test_errors(client: redis.Redis) -> None:
    client.execute_command("V.CREATE", "e", 64)
    client.execute_command("V.CREATE", "other", 64)
    theirs = client.execute_command("V.SNAPSHOT", "other")
    for args in (("e", 0), ("e", -1), ("e", 999_999), ("e", theirs)):
        assert "unknown snap_id" in err(client, "V.RESTORE", *args)
    assert "unknown snap_id" in err(client, "V.COMMIT", "e", 0)
    assert "unknown snap_id" in err(client, "V.COMMIT", "e", -5)
    for args in (("V.SNAPSHOT", "nope"), ("V.RESTORE", "nope", 1), ("V.COMMIT", "nope", 1)):
        assert "session not found" in err(client, *args)
    # Unknown session wins over a bad id (Pion checks the session first).
    assert "session not found" in err(client, "V.RESTORE", "nope", 0)
    for bad in ("x", "1.5", " 1", "+1", "01", "", "99999999999999999999"):
        assert "value is not an integer" in err(client, "V.RESTORE", "e", bad)
        assert "value is not an integer" in err(client, "V.COMMIT", "e", bad)
    for args in (("V.SNAPSHOT",), ("V.SNAPSHOT", "e", 1), ("V.RESTORE", "e"), ("V.COMMIT",)):
        assert "wrong number of arguments" in err(client, *args)
    # Nothing above changed the session or issued an id.
    assert client.execute_command("V.SNAPSHOT", "e") == theirs + 1


def test_hostile_sid_bytes(client: redis.Redis) -> None:
    sid = bytes(range(256)) * 2
    client.execute_command("V.CREATE", sid, 8)
    snap = client.execute_command("V.SNAPSHOT", sid)
    assert client.execute_command("V.RESTORE", sid, snap) == b"OK"
    assert "session not found" in err(client, "V.SNAPSHOT", b"\xff" * 600)


def test_pipelined_draft_cycle(client: redis.Redis) -> None:
    dim = 32
    client.execute_command("V.CREATE", "p", dim, "VQUANT", "fp16")
    store(client, "p", 0, 0, f32(8, dim))
    pipe = client.pipeline(transaction=False)
    for step in range(10):
        pipe.execute_command("V.SNAPSHOT", "p")
        pipe.execute_command("V.STOREBATCH", "p", 0, 8, 4, f32(4, dim, seed=step).tobytes())
    replies = pipe.execute()
    snaps = replies[0::2]
    assert snaps == sorted(snaps) and len(set(snaps)) == 10
    assert "no free snapshot slot" not in str(replies)
    for snap in snaps:
        client.execute_command("V.RESTORE", "p", snap)
        assert client.execute_command("V.COMMIT", "p", snap) == 1
    assert tokens(client, "p") == {0: 8}


def test_commands_are_described_and_flagged_write(client: redis.Redis) -> None:
    arity = {"v.snapshot": 2, "v.restore": 3, "v.commit": 3}
    for name, want in arity.items():
        info = client.execute_command("COMMAND", "INFO", name)[name]
        assert info["arity"] == want
        assert "write" in info["flags"]


def test_redis_cli(server: ServerThread) -> None:
    cli = shutil.which("redis-cli")
    if cli is None:
        pytest.fail("redis-cli is not installed (Debian redis-tools)")

    def run(*args: str) -> str:
        out = subprocess.run(
            [cli, "-p", str(server.port), *args], capture_output=True, timeout=30, check=True
        )
        return out.stdout.decode().strip()

    assert run("V.CREATE", "cli", "16") == "0"
    snap = run("V.SNAPSHOT", "cli")
    assert int(snap) > 0
    assert run("V.RESTORE", "cli", snap) == "OK"
    assert run("V.COMMIT", "cli", snap) == "1"
    assert run("V.COMMIT", "cli", snap) == "0"
    assert "unknown snap_id" in run("V.RESTORE", "cli", snap)


# -- the real Pion client's wire helper, driving Pion's own rollback flow -------------

prompt_cache = pytest.importorskip("pion_vllm_mlx.prompt_cache")


@pytest.fixture
def resp(server: ServerThread) -> Iterator[Any]:
    cache = prompt_cache.PionPromptCache(model=None, host=server.host, port=server.port)
    yield cache.resp
    cache.resp.sock.close()


def _int(reply: bytes) -> int:
    assert reply.startswith(b":"), reply
    return int(reply[1:].strip())


def test_pion_client_wire(resp: Any) -> None:
    dim = 64
    assert resp.call("V.CREATE", "rb", str(dim)).startswith(b":")
    vals = f32(100, dim, seed=401, scale=0.3)
    assert resp.call("V.STOREBATCH", "rb", "0", "0", "100", vals.tobytes()) == b"+OK\r\n"
    snap = _int(resp.call("V.SNAPSHOT", "rb"))
    big = f32(50, dim, seed=402, scale=5.0)
    assert resp.call("V.STOREBATCH", "rb", "0", "100", "50", big.tobytes()) == b"+OK\r\n"
    assert resp.call("V.RESTORE", "rb", str(snap)) == b"+OK\r\n"
    raw = resp.call("V.FETCH", "rb", "0", "0", "50", "99")
    got = np.frombuffer(raw[raw.index(b"\r\n") + 2 : -2], "<f4").reshape(3, dim)
    for i, tid in enumerate((0, 50, 99)):
        cos = np.dot(vals[tid], got[i]) / (np.linalg.norm(vals[tid]) * np.linalg.norm(got[i]))
        assert cos > 0.99
    assert resp.call("V.COMMIT", "rb", str(snap)) == b":1\r\n"
    assert resp.call("V.COMMIT", "rb", str(snap)) == b":0\r\n"
    reply = resp.call("V.RESTORE", "rb", str(snap))
    assert reply.startswith(b"-ERR") and b"unknown snap_id" in reply
    reply = resp.call("V.SNAPSHOT", "nope_xyz")
    assert reply.startswith(b"-ERR") and b"session not found" in reply
