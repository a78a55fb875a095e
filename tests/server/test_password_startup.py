"""An empty password is no password: ``--requirepass ""``, an empty password file and
an empty ``PION_REQUIREPASS`` are refused at startup with a clear message (so a public
bind without a real password still refuses to start), and ``AUTH ""`` never opens a
server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from support import encode_command, read_reply_line, running_server


def _start(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    environ = {k: v for k, v in os.environ.items() if k != "PION_REQUIREPASS"}
    data = str(tmp_path / "data")
    out = subprocess.run(
        [sys.executable, "-m", "pion", "server", "--port", "0", "--no-wal", "--dir", data, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**environ, **(env or {})},
    )
    return out.returncode, out.stderr


@pytest.mark.parametrize("bind", ["127.0.0.1", "0.0.0.0"])
@pytest.mark.parametrize("password", ["", " ", "\t"])
def test_empty_requirepass_refuses_to_start(tmp_path: Path, bind: str, password: str) -> None:
    code, err = _start(tmp_path, "--bind", bind, "--requirepass", password)
    assert code != 0
    assert "--requirepass is empty, and an empty password is no password" in err


@pytest.mark.parametrize("content", ["", "\n", "   \nsecond-line-ignored\n"])
def test_empty_password_file_refuses_to_start(tmp_path: Path, content: str) -> None:
    path = tmp_path / "pw"
    path.write_text(content)
    code, err = _start(tmp_path, "--bind", "0.0.0.0", "--requirepass-file", str(path))
    assert code != 0
    assert "is empty, and an empty password is no password" in err
    assert str(path) in err


def test_empty_password_environment_variable_refuses_to_start(tmp_path: Path) -> None:
    code, err = _start(tmp_path, "--bind", "0.0.0.0", env={"PION_REQUIREPASS": ""})
    assert code != 0
    assert "PION_REQUIREPASS is empty, and an empty password is no password" in err


def test_public_bind_without_password_still_refuses(tmp_path: Path) -> None:
    code, err = _start(tmp_path, "--bind", "0.0.0.0")
    assert code != 0
    assert "without a password" in err


def test_two_password_sources_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "pw"
    path.write_text("from-file\n")
    code, err = _start(tmp_path, "--requirepass", "a", "--requirepass-file", str(path))
    assert code != 0
    assert "not both" in err


def test_password_from_the_environment(tmp_path: Path) -> None:
    env = {"PION_REQUIREPASS": "from-env"}
    with running_server(tmp_path, "--no-wal", env=env) as srv:
        with srv.connect() as s:
            s.sendall(encode_command("PING"))
            assert read_reply_line(s).startswith(b"-NOAUTH")
            s.sendall(encode_command("AUTH", ""))
            assert read_reply_line(s).startswith(b"-WRONGPASS")
            s.sendall(encode_command("AUTH", "from-env"))
            assert read_reply_line(s) == b"+OK\r\n"
        with redis.Redis(port=srv.port, password="from-env") as r:
            assert r.ping()


def test_password_file_first_line(tmp_path: Path) -> None:
    path = tmp_path / "pw"
    path.write_text("  from-file  \nignored\n")
    args = ("--no-wal", "--requirepass-file", str(path))
    with (
        running_server(tmp_path, *args) as srv,
        redis.Redis(port=srv.port, password="from-file") as r,
    ):
        assert r.ping()


def test_auth_empty_on_a_server_without_password(tmp_path: Path) -> None:
    with running_server(tmp_path, "--no-wal") as srv, srv.connect() as s:
        s.sendall(encode_command("AUTH", ""))
        assert b"without any password configured" in read_reply_line(s)
