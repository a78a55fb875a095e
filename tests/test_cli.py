"""pion.cli: every server flag is built from ServerConfig's (TierConfig's) field
metadata, so a flag's default is the field's and a parsed command line is the config."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from pion import cli
from pion.config import FLAG, ServerConfig, TierConfig

# Fields set by code or by options pion.cli reads itself, never by a flag of their own
# (hll_sparse_max_bytes: by CONFIG SET).
_UNFLAGGED_SERVER = {"requirepass", "worker_id", "protocol", "vstore", "tier"}
_UNFLAGGED_SERVER |= {"hll_sparse_max_bytes"}
_UNFLAGGED_TIER = {"sync_timeout", "queue_max_ops", "drain_timeout"}


def _parse(*argv: str) -> ServerConfig:
    """The config ``pion-server argv`` would run with (nothing is started)."""
    seen: list[ServerConfig] = []

    @click.command()
    @cli._server_options
    def probe(**opts: Any) -> None:
        seen.append(cli._build_config(opts))

    result = CliRunner().invoke(probe, list(argv), catch_exceptions=False)
    if result.exit_code != 0:
        raise click.UsageError(result.output)
    return seen[0]


def test_every_field_is_a_flag_or_named_internal() -> None:
    for cls, internal in ((ServerConfig, _UNFLAGGED_SERVER), (TierConfig, _UNFLAGGED_TIER)):
        for f in dataclasses.fields(cls):
            assert (FLAG in f.metadata) != (f.name in internal), f"{cls.__name__}.{f.name}"


def test_no_flags_is_the_default_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PION_EXPORT_DIR", raising=False)
    monkeypatch.delenv(cli.PASSWORD_ENV, raising=False)
    assert _parse() == ServerConfig()


def test_flags_set_their_fields(tmp_path: Path) -> None:
    config = _parse(
        "--port", "0", "--dir", str(tmp_path), "--maxmemory", "8gb", "--no-wal",
        "--attend-slots", "7", "--maxmemory-clients", "0", "-w", "2",
        "--independent-workers", "--appendfsync", "always", "--no-binary-lane",
        "--tier", "redis://127.0.0.1:7000", "--tier-write", "async",
        "--tier-queue-max", "1mb", "--tier-user", "u",
    )  # fmt: skip
    assert config == dataclasses.replace(
        ServerConfig(),
        port=0,
        dir=tmp_path,
        maxmemory=8 << 30,
        wal_enabled=False,
        attend_warm_slots=7,
        maxmemory_clients=0,
        workers=2,
        appendfsync="always",
        binary_lane=False,
        tier=TierConfig(
            url="redis://127.0.0.1:7000", write="async", queue_max_bytes=1 << 20, username="u"
        ),
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tier-write", "async"], "--tier-write needs --tier"),
        (["--tier-user", "u"], "--tier-user needs --tier"),
        (["--tier", "redis://127.0.0.1:7000", "--tier-queue-max", "0"], "at least 1 byte"),
        (["--maxmemory", "lots"], "lots"),
        (["--port", "70000"], "70000"),
        (["-w", "2"], "--independent-workers"),
    ],
)
def test_bad_flags_are_refused(argv: list[str], message: str) -> None:
    with pytest.raises(click.UsageError, match=message):
        _parse(*argv)


def test_help_lists_every_flag() -> None:
    text = CliRunner().invoke(cli.server_command, ["--help"], terminal_width=200).output
    for cls in (ServerConfig, TierConfig):
        for f in dataclasses.fields(cls):
            flag = f.metadata.get(FLAG)
            if flag is not None:
                prefix = "--tier-" if cls is TierConfig else "--"
                assert (flag.name or prefix + f.name.replace("_", "-")) in text
