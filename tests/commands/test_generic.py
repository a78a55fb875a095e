"""Connection commands where Redis 7's semantics are the contract (issue 10, item 9):
HELLO ... AUTH that errors does not authenticate, a failed AUTH keeps what the
connection had, CLIENT SETNAME/SETINFO refuse spaces and control bytes, CONFIG SET is
atomic; plus the V-store's format names and the turbo overflow message, end to end."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from pion.server.run import ServerThread
from support import encode_command, raw_exchange

PASSWORD = "s3cret"


def resp(*parts: bytes | str | int) -> bytes:
    out = [b"*%d\r\n" % len(parts)]
    for p in parts:
        b = p if isinstance(p, bytes) else str(p).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


class Raw:
    """One raw connection: send a command, read one reply line (or a whole map)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buf = b""

    def line(self, *parts: bytes | str | int) -> bytes:
        self.sock.sendall(resp(*parts))
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            assert chunk, "closed"
            self.buf += chunk
        head, _, self.buf = self.buf.partition(b"\r\n")
        return head

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def locked(server_factory: Callable[..., ServerThread]) -> ServerThread:
    return server_factory(requirepass=PASSWORD, wal_enabled=False)


def err(client: redis.Redis, *args: Any) -> str:
    with pytest.raises(redis.ResponseError) as info:
        client.execute_command(*args)
    return str(info.value)


# -- AUTH and HELLO ----------------------------------------------------------------


@pytest.mark.parametrize(
    "junk",
    [
        ("BOGUS",),
        ("SETNAME",),  # SETNAME without its argument
        ("SETNAME", "has space"),
        ("AUTH", "default"),  # a second AUTH missing its password
    ],
)
def test_hello_auth_with_junk_does_not_authenticate(locked: ServerThread, junk: tuple[str]) -> None:
    c = Raw(locked.port)
    reply = c.line("HELLO", "3", "AUTH", "default", PASSWORD, *junk)
    assert reply.startswith(b"-ERR"), reply
    # Still not authenticated, and still RESP2.
    assert c.line("PING").startswith(b"-NOAUTH")
    c.close()


def test_hello_auth_with_a_wrong_password_changes_nothing(locked: ServerThread) -> None:
    c = Raw(locked.port)
    assert c.line("HELLO", "3", "AUTH", "default", "nope", "SETNAME", "x").startswith(b"-WRONGPASS")
    assert c.line("AUTH", PASSWORD) == b"+OK"
    assert c.line("CLIENT", "GETNAME") == b"$-1"  # SETNAME was not applied
    assert c.line("PING") == b"+PONG"  # RESP2 still (RESP3 would be the same here)
    assert c.line("HELLO").startswith(b"*14")  # proto 2: a flat array of 7 pairs
    c.close()


def test_failed_auth_keeps_an_authenticated_connection(locked: ServerThread) -> None:
    c = Raw(locked.port)
    assert c.line("AUTH", PASSWORD) == b"+OK"
    assert c.line("AUTH", "wrong").startswith(b"-WRONGPASS")
    assert c.line("PING") == b"+PONG"
    assert c.line("AUTH", "someone", "wrong").startswith(b"-WRONGPASS")
    assert c.line("HELLO", "2", "AUTH", "default", "wrong").startswith(b"-WRONGPASS")
    assert c.line("PING") == b"+PONG"
    c.close()


def test_hello_auth_then_setname_applies_both(locked: ServerThread) -> None:
    r = redis.Redis(port=locked.port, protocol=3, password=PASSWORD)
    hello = r.execute_command("HELLO", "3", "AUTH", "default", PASSWORD, "SETNAME", "w1")
    fields = {k.decode() if isinstance(k, bytes) else k: v for k, v in hello.items()}
    assert fields["proto"] == 3
    assert r.client_getname() in ("w1", b"w1")
    r.close()


def test_empty_password_is_refused_by_the_library(tmp_path: Any) -> None:
    from pion.config import ServerConfig
    from pion.errors import PionError

    for empty in ("", "   "):
        with pytest.raises(PionError, match="empty password is no password"):
            ServerThread(ServerConfig(port=0, dir=tmp_path, requirepass=empty, wal_enabled=False))


# -- CLIENT SETNAME / SETINFO ------------------------------------------------------


@pytest.mark.parametrize(
    "value", [b"a b", b"tab\there", b"nl\n", b"\x00nul", b"del\x7f", b"caf\xc3\xa9", b"\x1b["]
)
def test_client_setname_and_setinfo_refuse_spaces_and_control_bytes(
    client: redis.Redis, value: bytes
) -> None:
    assert "Client names cannot contain spaces, newlines or special characters" in err(
        client, "CLIENT", "SETNAME", value
    )
    for attr in ("LIB-NAME", "lib-ver"):
        assert f"{attr} cannot contain spaces, newlines or special characters" in err(
            client, "CLIENT", "SETINFO", attr, value
        )
    info = client.execute_command("CLIENT", "INFO")
    text = info.decode() if isinstance(info, bytes) else info
    # Nothing was set: no name, and the lib-name/lib-ver redis-py sent on connect.
    assert " name= " in text
    assert "lib-name=redis-py lib-ver=" in text


def test_client_setinfo_accepts_printable_and_checks_the_attribute_first(
    client: redis.Redis,
) -> None:
    assert client.execute_command("CLIENT", "SETINFO", "LIB-NAME", "pion-vllm-mlx~1") == b"OK"
    assert client.execute_command("CLIENT", "SETINFO", "lib-ver", "0.1.6") == b"OK"
    assert client.execute_command("CLIENT", "SETNAME", "w!~") == b"OK"
    assert "Unrecognized option 'LIB-COLOR'" in err(client, "CLIENT", "SETINFO", "LIB-COLOR", "a b")
    text = client.execute_command("CLIENT", "INFO").decode()
    assert "lib-name=pion-vllm-mlx~1 lib-ver=0.1.6" in text
    assert "name=w!~ " in text


# -- CONFIG SET --------------------------------------------------------------------


def test_config_set_is_atomic(client: redis.Redis, server: ServerThread) -> None:
    before = client.config_get("*")
    message = err(client, "CONFIG", "SET", "maxmemory", "1mb", "vstore-max-sessions", "bad")
    assert message == (
        "CONFIG SET failed (possibly related to argument 'vstore-max-sessions') - "
        "argument must be an integer between 1 and 1000000"
    )
    message = err(client, "CONFIG", "SET", "loglevel", "debug", "maxmemory", "lots")
    assert "possibly related to argument 'maxmemory'" in message
    assert "Unknown option" in err(client, "CONFIG", "SET", "maxclients", "5", "nope", "1")
    assert "duplicate parameter" in err(
        client, "CONFIG", "SET", "maxclients", "5", "MAXCLIENTS", "6"
    )
    assert client.config_get("*") == before
    assert server.state.vstore.maxmemory == 0
    # All good: all applied.
    assert client.execute_command(
        "CONFIG", "SET", "maxmemory", "2mb", "maxclients", "77", "maxmemory-clients", "1gb"
    )
    got = client.config_get("*")
    assert got["maxmemory"] == str(2 * 1024 * 1024)
    assert got["maxclients"] == "77"
    assert got["maxmemory-clients"] == str(1024**3)
    assert server.state.vstore.maxmemory == 2 * 1024 * 1024


# -- format names and the turbo overflow message ------------------------------------


@pytest.mark.parametrize("name", ["fp16", "FP16", "Fp16", "MLX4G32", "Turbo4"])
def test_register_and_v_create_read_format_names_alike(client: redis.Redis, name: str) -> None:
    assert client.execute_command("KV.PREFIX.REGISTER", "ns", 64, name) == b"OK"
    client.execute_command("V.CREATE", "s", 64, "VQUANT", name)
    v_info = client.execute_command("V.INFO", "s").decode()
    assert f"v_format:{name.lower()}" in v_info
    k_info = client.execute_command("V.INFO", "ns_pk").decode()
    assert f"v_format:{name.lower()}" in k_info


@pytest.mark.parametrize("bad", ["fp_16", "int9", "fp16 ", "\u0131nt8", "f\u0440\u0031\u0036"])
def test_register_and_v_create_refuse_the_same_names(client: redis.Redis, bad: str) -> None:
    a = err(client, "KV.PREFIX.REGISTER", "ns", 64, bad)
    b = err(client, "V.CREATE", "s", 64, "VQUANT", bad)
    assert "unknown vquant" in a
    assert "unknown VQUANT format" in b
    assert "want int8|turbo4|turbo3|turbo2|fp16|fp8|mlx4g32" in a
    assert "want int8|turbo4|turbo3|turbo2|fp16|fp8|mlx4g32" in b


def test_turbo4_overflow_names_the_stored_value(client: redis.Redis) -> None:
    """A group whose norm fits fp16 (64000) but whose stored norm, norm / ||C[idx]||,
    does not: the error names the stored value, not the group norm."""
    client.execute_command("V.CREATE", "t", 128, "VQUANT", "turbo4")
    row = np.full((1, 128), 64000 / np.sqrt(128), np.float32)
    message = err(client, "V.STOREBATCH", "t", 0, 0, 1, row.tobytes())
    assert "stored norm" in message and "of group 0" in message
    assert "overflows the fp16 norm of turbo4" in message
    stored = float(message.split("stored norm ")[1].split()[0])
    assert stored > 65504
    assert "64000" not in message


def test_no_retry_client_sees_wrongpass(locked: ServerThread) -> None:
    r = redis.Redis(port=locked.port, password="bad", retry=Retry(NoBackoff(), 0))
    with pytest.raises(redis.AuthenticationError):
        r.ping()
    r.close()


@pytest.mark.parametrize("proto", [2, 3])
def test_command_introspection(server: ServerThread, proto: int) -> None:
    r = redis.Redis(port=server.port, protocol=proto)
    table = r.command()
    assert table["kv.prefix.lookup"]["arity"] == -2
    assert "write" in table["v.storebatch"]["flags"]
    assert r.command_count() == len(table)
    assert b"ping" in r.command_list()


def test_hello_errors(client: redis.Redis) -> None:
    with pytest.raises(redis.ResponseError, match="unsupported protocol"):
        client.execute_command("HELLO", 4)
    assert raw_exchange(
        client.connection_pool.connection_kwargs["port"], b"HELLO 4\r\n", read_until_close=False
    ) == (b"-NOPROTO unsupported protocol version\r\n")
    with pytest.raises(redis.ResponseError, match="not an integer"):
        client.execute_command("HELLO", "x")


def test_config_set_and_resetstat(client: redis.Redis, server: ServerThread) -> None:
    assert client.config_set("maxmemory", "1mb") is True
    assert client.config_get("maxmemory") == {"maxmemory": "1048576"}
    assert server.state.vstore.maxmemory == 1048576
    with pytest.raises(redis.ResponseError, match="Unknown option"):
        client.config_set("bind", "0.0.0.0")
    assert client.config_resetstat() is True


def test_client_list_and_kill(server: ServerThread) -> None:
    a = redis.Redis(port=server.port)
    a.client_setname("alpha")
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as b:
        b.sendall(b"CLIENT ID\r\n")
        b_id = int(b.recv(100)[1:-2])
        listing = a.client_list()
        assert any(c["name"] == "alpha" for c in listing)
        assert a.client_kill_filter(_id=b_id) == 1
        assert b.recv(100) == b""  # closed by the server
    assert a.ping()


def test_auth(server_factory: Callable[..., ServerThread]) -> None:
    srv = server_factory(requirepass="s3cret")
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    no_retry = Retry(NoBackoff(), 0)
    anon = redis.Redis(port=srv.port, retry=no_retry)
    with pytest.raises(redis.AuthenticationError):
        anon.ping()
    for cmd in (("CLIENT", "SETINFO", "LIB-NAME", "x"), ("KV.PREFIX.INFO",), ("HELLO", "3")):
        assert b"NOAUTH" in raw_exchange(srv.port, encode_command(*cmd), read_until_close=False)
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=srv.port, password="wrong", retry=no_retry).ping()
    good = redis.Redis(port=srv.port, password="s3cret")
    assert good.ping()
    good3 = redis.Redis(port=srv.port, password="s3cret", protocol=3)
    assert good3.ping()
    # HELLO with AUTH authenticates and switches protocol in one step.
    hello = raw_exchange(
        srv.port,
        encode_command("HELLO", "3", "AUTH", "default", "s3cret"),
        read_until_close=False,
    )
    assert hello.startswith(b"%7")
    assert b"WRONGPASS" in raw_exchange(
        srv.port, encode_command("AUTH", "nope"), read_until_close=False
    )


def test_quit_closes(server: ServerThread) -> None:
    reply = raw_exchange(server.port, b"QUIT\r\nPING\r\n")
    assert reply == b"+OK\r\n"


def test_shutdown_command(spawn_server: Callable[..., object]) -> None:
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    srv = spawn_server()
    r = srv.client(retry=Retry(NoBackoff(), 0))  # type: ignore[attr-defined]
    r.shutdown(nosave=True)
    assert srv.proc.wait(timeout=30) == 0  # type: ignore[attr-defined]
