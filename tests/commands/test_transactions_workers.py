"""Under ``-w N`` a transaction that touches a session or namespace another worker
owns is refused before anything of it runs: at queuing (the command's redirect, and
EXEC then aborts), or at EXEC when the namespace moved there after queuing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pion.wire import affinity_port
from support import ServerProcess
from support.keyspace import RawClient


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    data: Path = tmp_path_factory.mktemp("txworkers")
    srv = ServerProcess(data.parent, ["-w", "2", "--independent-workers", "--dir", str(data)])
    yield srv
    srv.close()


def test_a_transaction_on_another_workers_namespace_is_refused(cluster: ServerProcess) -> None:
    w0 = RawClient(affinity_port(cluster.port, 0))
    w1 = RawClient(affinity_port(cluster.port, 1))
    assert w0.call("KV.PREFIX.REGISTER", "moved", 8, "fp16").raw == b"+OK\r\n"
    w1.call("MULTI")
    assert w1.call("SET", "a", "1").raw == b"+QUEUED\r\n"
    blob = bytes(4 * 8 * 4)
    assert w1.call("V.STOREBATCH", "moved_pk", 0, 0, 4, blob).raw == (
        b"-ERR session lives on worker 0 (this is worker 1); reconnect for V.STOREBATCH\r\n"
    )
    assert w1.call("EXEC").raw == (
        b"-EXECABORT Transaction discarded because of previous errors.\r\n"
    )
    assert w1.call("GET", "a").raw == b"$-1\r\n"
    # Queued while no worker owned it; worker 0 registers it before EXEC.
    w1.call("MULTI")
    assert w1.call("SET", "a", "1").raw == b"+QUEUED\r\n"
    assert w1.call("KV.PREFIX.DROP", "mine", "later").raw == b"+QUEUED\r\n"
    assert w0.call("KV.PREFIX.REGISTER", "later", 8, "fp16").raw == b"+OK\r\n"
    assert w1.call("EXEC").raw == (
        b"-EXECABORT Transaction discarded because of: "
        b"ERR KV.PREFIX.DROP session lives on worker 0\r\n"
    )
    assert w1.call("GET", "a").raw == b"$-1\r\n"
    assert w0.call("KV.PREFIX.OWNER", "later").raw == b"+0\r\n"
    # A transaction on this worker's own namespace runs.
    assert w1.call("KV.PREFIX.REGISTER", "here", 8, "fp16").raw == b"+OK\r\n"
    w1.call("MULTI")
    w1.call("V.STOREBATCH", "here_pk", 0, 0, 4, blob)
    w1.call("SET", "a", "2")
    assert w1.call("EXEC").raw == b"*2\r\n+OK\r\n+OK\r\n"
    w0.close()
    w1.close()
