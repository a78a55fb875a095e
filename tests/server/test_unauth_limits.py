"""What a client that does not know the password can make the server do: declare at
most 10 arguments and 16 KB bulks (Redis 7's limits and texts), refused as the header
arrives, so the server's own memory does not move. Measured on a real server process."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

from support import MiB, encode_command, read_reply_line, running_server

_HUGE_AUTH = b"*2\r\n$4\r\nAUTH\r\n$536870912\r\n"


def _push(sock: socket.socket, total: int, errors: list[BaseException]) -> None:
    """Send ``total`` bytes of a promised bulk; the server may hang up first."""
    block = b"x" * MiB
    try:
        for _ in range(total // MiB):
            sock.sendall(block)
    except OSError:
        pass  # refused and closed: what we want
    except BaseException as exc:  # re-raised by the test
        errors.append(exc)


def test_unauthenticated_huge_bulks_do_not_grow_the_server(tmp_path: Path) -> None:
    """The issue's reproduction: three connections promise a 512 MiB AUTH password and
    send 200 MiB each. Before the fix the server buffered all of it (+600 MiB)."""
    with running_server(tmp_path, "--no-wal", password="s3cret") as srv:
        base = srv.rss()
        socks = [srv.connect(timeout=30) for _ in range(3)]
        errors: list[BaseException] = []
        for s in socks:
            s.sendall(_HUGE_AUTH)
        pushers = [threading.Thread(target=_push, args=(s, 200 * MiB, errors)) for s in socks]
        for t in pushers:
            t.start()
        peak = base
        while any(t.is_alive() for t in pushers):
            peak = max(peak, srv.rss())
            time.sleep(0.05)
        for t in pushers:
            t.join()
        assert not errors
        peak = max(peak, srv.rss())
        assert peak - base < 40 * MiB, f"server grew {(peak - base) / MiB:.0f} MiB"
        for s in socks:
            reply = read_reply_line(s)
            assert reply == b"-ERR Protocol error: unauthenticated bulk length\r\n"
            s.close()
        assert srv.info("stats")["total_protocol_errors"] == 3
        # The right password still works, and then big bulks are fine.
        with srv.client() as r:
            assert r.echo(b"y" * 100_000) == b"y" * 100_000


def test_unauthenticated_multibulk_over_ten_is_refused(tmp_path: Path) -> None:
    with running_server(tmp_path, "--no-wal", password="s3cret") as srv:
        s = srv.connect()
        s.sendall(b"*11\r\n")
        assert read_reply_line(s) == b"-ERR Protocol error: unauthenticated multibulk length\r\n"
        assert s.recv(100) == b""  # closed
        s.close()
        # Ten arguments and a 16 KB bulk are still allowed before AUTH (and answered
        # -NOAUTH / -WRONGPASS as usual).
        with srv.connect() as s:
            s.sendall(encode_command("PING", *["a"] * 9))
            assert read_reply_line(s).startswith(b"-NOAUTH")
            s.sendall(encode_command("AUTH", b"p" * 16384))
            assert read_reply_line(s).startswith(b"-WRONGPASS")


def test_auth_then_big_command_in_one_packet(tmp_path: Path) -> None:
    """The budget ends with the AUTH that succeeds, even mid-pipeline."""
    with running_server(tmp_path, "--no-wal", password="s3cret") as srv:
        big = b"z" * (1 * MiB)
        with srv.connect() as s:
            s.sendall(encode_command("AUTH", "s3cret") + encode_command("ECHO", big))
            got = b""
            want = b"+OK\r\n$%d\r\n%s\r\n" % (len(big), big)
            while len(got) < len(want):
                chunk = s.recv(1 << 20)
                assert chunk
                got += chunk
            assert got == want


def test_no_password_means_no_budget(tmp_path: Path) -> None:
    """Without a password every connection is authenticated: the full limits apply."""
    with running_server(tmp_path, "--no-wal") as srv, srv.connect() as s:
        s.sendall(encode_command("PING", *["a"] * 20))
        assert read_reply_line(s) == b"-ERR wrong number of arguments for 'ping' command\r\n"
        big = b"w" * MiB
        s.sendall(encode_command("ECHO", big))
        want = b"$%d\r\n%s\r\n" % (len(big), big)
        got = b""
        while len(got) < len(want):
            chunk = s.recv(1 << 20)
            assert chunk
            got += chunk
        assert got == want
