"""A tier fill never stalls the loop (issue 31): while a command's fill is reading its
rows (here held up by a relay in front of the tier), that command waits and every
other client goes on; once the rows come, the command answers as a fill done before
it would have. No wall-clock bound: the relay holds the rows until the test has seen
another client served."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pion_testing.redis_nodes import RedisNode

from support import rows, tier_info, wait_until

Start = Callable[..., Any]
LAYERS, TOKENS, DIM = 4, 600, 64


class _HoldingProxy:
    """A TCP relay in front of a redis-server that, while armed, holds the first reply
    larger than ``hold_over`` bytes (the rows of a fill) until :meth:`release`."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.hold_over: int | None = None
        self.holding = threading.Event()
        self._release = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, replies: bool) -> None:
        try:
            while data := src.recv(1 << 16):
                limit = self.hold_over
                if replies and limit is not None and len(data) > limit:
                    self.hold_over = None
                    self.holding.set()
                    self._release.wait(60)
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def release(self) -> None:
        self._release.set()

    def close(self) -> None:
        self._release.set()
        self.listener.close()


def test_other_clients_go_on_while_a_fill_reads(redis_node: RedisNode, tier_server: Start) -> None:
    proxy = _HoldingProxy(redis_node.port)
    try:
        a = tier_server(redis_node.url, "a")
        b = tier_server(f"redis://127.0.0.1:{proxy.port}", "b", "--tier-timeout", "30")
        ra = a.client()
        assert ra.execute_command("KV.PREFIX.REGISTER", "w", DIM, "fp16") == b"OK"
        for half, sid in enumerate(("w_pk", "w_pv")):
            for layer in range(LAYERS):
                blob = rows(TOKENS, DIM, 10 * half + layer).tobytes()
                ra.execute_command("V.STOREBATCH", sid, layer, 0, TOKENS, blob)
        want = ra.execute_command("V.FETCH", "w_pk", 2, 5, 7)
        wait_until(lambda: int(tier_info(ra)["tier_queue_depth"]) == 0, what="A's writes")
        rb, other = b.client(), b.client()
        assert other.ping()
        proxy.hold_over = 8 * 1024  # the rows' reply; the metadata's are smaller
        with ThreadPoolExecutor(1) as pool:
            missing = pool.submit(rb.execute_command, "V.FETCH", "w_pk", 2, 5, 7)
            assert proxy.holding.wait(30), "the fill never read its rows"
            # The fill is reading (held): another client is served meanwhile, and the
            # command that needs the rows has not answered.
            for _ in range(20):
                assert other.ping()
                assert other.execute_command("SET", "k", "v")
            assert not missing.done()
            assert int(tier_info(other)["tier_fills_in_flight"]) == 1
            proxy.release()
            assert missing.result(timeout=60) == want
        assert int(tier_info(other)["tier_hits"]) == 1
        assert other.execute_command("V.FETCH", "w_pv", 3, 0) == ra.execute_command(
            "V.FETCH", "w_pv", 3, 0
        )
    finally:
        proxy.close()


def test_a_fill_inside_exec_is_read_before_the_transaction_answers(
    redis_node: RedisNode, tier_server: Start
) -> None:
    """Inside EXEC nothing may run in between: the fill is read in place, and the
    transaction sees the filled session."""
    a = tier_server(redis_node.url, "a")
    b = tier_server(redis_node.url, "b")
    ra = a.client()
    assert ra.execute_command("KV.PREFIX.REGISTER", "x", DIM, "fp16") == b"OK"
    ra.execute_command("V.STOREBATCH", "x_pk", 0, 0, TOKENS, rows(TOKENS, DIM, 1).tobytes())
    ra.execute_command("V.STOREBATCH", "x_pv", 0, 0, TOKENS, rows(TOKENS, DIM, 2).tobytes())
    want = ra.execute_command("V.FETCH", "x_pk", 0, 1, 2)
    wait_until(lambda: int(tier_info(ra)["tier_queue_depth"]) == 0, what="A's writes")
    pipe = b.client().pipeline(transaction=True)
    pipe.execute_command("V.FETCH", "x_pk", 0, 1, 2)
    pipe.execute_command("PING")
    assert pipe.execute() == [want, True]
