"""Function libraries are part of the dataset: FUNCTION LOAD, DELETE, FLUSH and RESTORE
survive a restart (from the log, and from a snapshot), a FUNCTION LOAD inside EXEC
is logged with the transaction, and an acknowledged FUNCTION LOAD survives kill -9.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pion.config import ServerConfig
from pion.persistence import registry
from pion.persistence.functions_format import OP_LIBRARIES, decode_libraries, encode_libraries
from pion.server.run import ServerThread
from support.keyspace import RawClient


def _lib(name: str, fn: str, value: int) -> str:
    return f"#!lua name={name}\nredis.register_function('{fn}', function() return {value} end)"


def _server(path: Path) -> ServerThread:
    return ServerThread(ServerConfig(port=0, dir=path, appendfsync="always")).start()


def _calls(server: ServerThread, *cmds: tuple[str | bytes, ...]) -> list[bytes]:
    c = RawClient(server.port)
    try:
        return [c.call(*cmd).raw for cmd in cmds]
    finally:
        c.close()


def test_libraries_survive_a_restart_from_the_log_and_a_snapshot(tmp_path: Path) -> None:
    server = _server(tmp_path)
    _calls(
        server,
        ("FUNCTION", "LOAD", _lib("a", "fa", 1)),
        ("FUNCTION", "LOAD", _lib("b", "fb", 2)),
        ("FUNCTION", "LOAD", "REPLACE", _lib("a", "fa2", 3)),
        ("FUNCTION", "DELETE", "b"),
    )
    server.stop()
    server = _server(tmp_path)
    assert _calls(server, ("FCALL", "fa2", "0"), ("FCALL", "fa", "0"), ("FCALL", "fb", "0")) == [
        b":3\r\n",
        b"-ERR Function not found\r\n",
        b"-ERR Function not found\r\n",
    ]
    payload = RawClient(server.port).call("FUNCTION", "DUMP").value
    assert isinstance(payload, bytes)
    # a snapshot holds them; the log after it, a FLUSH and a RESTORE
    assert _calls(server, ("KV.PREFIX.SAVE",)) == [b"+OK\r\n"]
    _calls(server, ("FUNCTION", "FLUSH"), ("FUNCTION", "RESTORE", payload))
    _calls(server, ("FUNCTION", "LOAD", _lib("c", "fc", 4)))
    server.stop()
    server = _server(tmp_path)
    assert _calls(server, ("FCALL", "fa2", "0"), ("FCALL", "fc", "0")) == [b":3\r\n", b":4\r\n"]
    _calls(server, ("FUNCTION", "DELETE", "a"), ("KV.PREFIX.SAVE",))
    server.stop()
    server = _server(tmp_path)  # from the snapshot alone (SAVE resets the log)
    assert _calls(server, ("FCALL", "fc", "0"), ("FUNCTION", "STATS")) == [
        b":4\r\n",
        b"*4\r\n$14\r\nrunning_script\r\n$-1\r\n$7\r\nengines\r\n*2\r\n$3\r\nLUA\r\n"
        b"*4\r\n$15\r\nlibraries_count\r\n:1\r\n$15\r\nfunctions_count\r\n:1\r\n",
    ]
    _calls(server, ("FUNCTION", "FLUSH"))
    server.stop()
    server = _server(tmp_path)  # the snapshot has one, the FLUSH after it empties
    assert _calls(server, ("FUNCTION", "LIST")) == [b"*0\r\n"]
    server.stop()


def test_a_function_load_inside_exec_is_logged_with_it(tmp_path: Path) -> None:
    server = _server(tmp_path)
    assert (
        _calls(
            server,
            ("MULTI",),
            ("SET", "k", "v"),
            ("FUNCTION", "LOAD", _lib("t", "ft", 7)),
            ("EXEC",),
        )[-1]
        == b"*2\r\n+OK\r\n$1\r\nt\r\n"
    )
    server.stop()
    server = _server(tmp_path)
    assert _calls(server, ("FCALL", "ft", "0"), ("GET", "k")) == [b":7\r\n", b"$1\r\nv\r\n"]
    server.stop()


def test_the_record_round_trips_and_is_named() -> None:
    codes = [b"#!lua name=a\n...", b""]
    payload = b"".join(bytes(p) for p in encode_libraries(codes))
    assert decode_libraries(OP_LIBRARIES, payload) == codes
    assert registry.describe(OP_LIBRARIES, payload) == "LIBRARIES(2)"


def test_an_acknowledged_load_survives_kill_9(spawn_server: Callable[..., Any]) -> None:
    srv = spawn_server("--appendfsync", "always")
    r = srv.client()
    for i in range(5):
        assert r.function_load(_lib(f"k{i}", f"f{i}", i)) == f"k{i}".encode()
    assert r.fcall("f4", 0) == 4
    srv.kill()
    srv = spawn_server("--appendfsync", "always")
    r = srv.client()
    assert [r.fcall(f"f{i}", 0) for i in range(5)] == list(range(5))
    srv.kill()
