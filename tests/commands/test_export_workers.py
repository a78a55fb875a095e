"""V.EXPORT under `pion-server -w 2 --independent-workers`: a worker that does not hold
the sessions answers the V-store redirect; the owner writes the file; our client
follows the redirect and maps it; each worker keeps its own files in the shared
directory, and all of them go at shutdown."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis
from safetensors.numpy import load_file

from pion.client import PionPromptCache
from support import ServerProcess

N, DIM = 20, 16


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ServerProcess]:
    srv = ServerProcess(
        tmp_path, ["-w", "2", "--independent-workers", "--dir", str(tmp_path / "data")]
    )
    yield srv
    if srv.proc.poll() is None:
        srv.stop(signal.SIGTERM)
    srv.close()


def _store(r: redis.Redis, ns: str, seed: int) -> np.ndarray:
    rows = np.random.default_rng(seed).standard_normal((N, DIM)).astype(np.float32)
    assert r.execute_command("KV.PREFIX.REGISTER", ns, DIM, "fp16") == b"OK"
    for sid in (f"{ns}_pk", f"{ns}_pv"):
        r.execute_command("V.STOREBATCH", sid, 0, 0, N, rows.tobytes())
    return rows


def test_export_redirects_to_the_owner_and_the_client_follows(
    cluster: ServerProcess, tmp_path: Path
) -> None:
    owner, other = cluster.worker(0), cluster.worker(1)
    rows = _store(owner, "w0", 1)
    with pytest.raises(redis.ResponseError) as info:
        other.execute_command("V.EXPORT", "w0_pk", "w0_pv", 0, N, 1, 1, DIM)
    assert "session lives on worker 0 (this is worker 1); reconnect for V.EXPORT" in str(info.value)
    path = owner.execute_command("V.EXPORT", "w0_pk", "w0_pv", 0, N, 1, 1, DIM).decode()
    np.testing.assert_array_equal(load_file(path)["v.0"][0, 0], rows.astype(np.float16))

    _store(other, "w1", 2)
    second = other.execute_command("V.EXPORT", "w1_pk", "w1_pv", 0, N, 1, 1, DIM).decode()
    export_dir = tmp_path / "data" / "pion-export"
    files = sorted(p.name for p in export_dir.iterdir())
    assert sorted([Path(path).name, Path(second).name]) == files
    assert len({name.split("-")[1] for name in files}) == 2  # one per worker process

    # Our client on the main port: wherever it lands, it ends on the owner's file.
    with PionPromptCache("127.0.0.1", cluster.port) as pc:
        for _ in range(4):
            keys, _values = pc.fetch("w0")
            np.testing.assert_array_equal(keys[0], rows.astype(np.float16).astype(np.float32))
        assert pc.export_lane.used == 4 and pc.export_lane.enabled

    assert cluster.stop(signal.SIGTERM) == 0
    assert not os.path.exists(path) and not os.path.exists(second)
