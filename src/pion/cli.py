"""Command-line entry points: ``pion-server`` and ``pion`` (with ``pion server``,
``pion stats``, ``pion check-wal`` and ``pion llama ...``).

Thin by design: parse flags, build a config, call library code.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Any, ClassVar

import click

from pion import __version__
from pion.commands.config_cmd import parse_memory
from pion.config import ServerConfig, TierConfig
from pion.errors import PionError

__all__ = ["main", "server_main"]

# Every default a flag shows is ServerConfig's (TierConfig's): one source for each.
_DEFAULTS = ServerConfig()
_TIER_DEFAULTS = TierConfig(url="")


# The environment variable a password may come from (keeps it out of `ps` output).
PASSWORD_ENV = "PION_REQUIREPASS"


def _memory(ctx: click.Context, param: click.Parameter, value: str | None) -> int:
    if value is None:
        return 0
    try:
        return parse_memory(value)
    except PionError as exc:
        raise click.BadParameter(exc.message) from None


def _maxmemory_clients(ctx: click.Context, param: click.Parameter, value: str | None) -> int:
    if value is None:
        return _DEFAULTS.maxmemory_clients
    return _memory(ctx, param, value)


def _export_max_bytes(ctx: click.Context, param: click.Parameter, value: str | None) -> int:
    if value is None:
        return _DEFAULTS.export_max_bytes
    return _memory(ctx, param, value)


# Pion's environment variable for the export directory.
EXPORT_DIR_ENV = "PION_EXPORT_DIR"


def _optional_memory(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    return None if value is None else _memory(ctx, param, value)


_EXISTING_FILE = click.Path(dir_okay=False, exists=True, path_type=Path)


def _server_options(fn: Any) -> Any:
    options = [
        click.option(
            "--port",
            default=_DEFAULTS.port,
            show_default=True,
            type=click.IntRange(0, 65535),
            help="RESP port (0 picks a free one).",
        ),
        click.option(
            "--bind",
            default=_DEFAULTS.bind,
            show_default=True,
            help="Address to listen on; non-loopback needs --requirepass.",
        ),
        click.option(
            "--dir",
            "data_dir",
            default=str(_DEFAULTS.dir),
            show_default=True,
            type=click.Path(file_okay=False, path_type=Path),
            help="Data directory (snapshots, write-ahead log).",
        ),
        click.option(
            "--requirepass",
            default=None,
            help=f"Password clients must AUTH with (or set {PASSWORD_ENV}); never empty.",
        ),
        click.option(
            "--requirepass-file",
            default=None,
            type=click.Path(dir_okay=False, exists=True, path_type=Path),
            help="Read the password from a file (first line).",
        ),
        click.option(
            "--maxclients",
            default=_DEFAULTS.maxclients,
            show_default=True,
            type=click.IntRange(1, 1_000_000),
            help="Connections served at once; the next is refused (Redis's default).",
        ),
        click.option(
            "--maxmemory-clients",
            "maxmemory_clients",
            default=None,
            callback=_maxmemory_clients,
            help="Bytes all client buffers may hold together before the largest holders "
            "are disconnected (default 2gb; 0 = no bound).",
        ),
        click.option(
            "--unsafe-no-auth", is_flag=True, help="Allow a non-loopback bind without a password."
        ),
        click.option(
            "--vstore-max-sessions",
            default=_DEFAULTS.vstore_max_sessions,
            show_default=True,
            type=click.IntRange(1, 1_000_000),
            help="V-store sessions before LRU namespaces are evicted.",
        ),
        click.option(
            "--maxmemory",
            default=None,
            callback=_memory,
            help="Byte budget for stored K/V and plain keys (e.g. 8gb); 0/unset = none.",
        ),
        click.option(
            "--appendfsync",
            default=_DEFAULTS.appendfsync,
            show_default=True,
            type=click.Choice(["always", "everysec", "no"]),
            help="When the write-ahead log is fsynced.",
        ),
        click.option("--no-wal", is_flag=True, help="Disable the write-ahead log."),
        click.option(
            "--export-dir",
            "export_dir",
            default=None,
            envvar=EXPORT_DIR_ENV,
            type=click.Path(file_okay=False, path_type=Path),
            help=f"Directory of V.EXPORT files (or ${EXPORT_DIR_ENV}); relative to --dir. "
            "[default: pion-export]",
        ),
        click.option(
            "--export-max-bytes",
            "export_max_bytes",
            default=None,
            callback=_export_max_bytes,
            help="Bytes all V.EXPORT files may use together (default 4gb).",
        ),
        click.option(
            "--no-export", is_flag=True, help="Refuse V.EXPORT (same-machine clients fetch by TCP)."
        ),
        click.option(
            "--save-interval",
            default=_DEFAULTS.save_interval,
            show_default=True,
            type=click.FloatRange(0),
            help="Seconds between automatic snapshots (0 = off).",
        ),
        click.option(
            "--fa-window",
            default=0,
            show_default=True,
            type=click.IntRange(0),
            help="Attention queries' default sliding window: the last N prefix tokens "
            "(0 = full attention).",
        ),
        click.option(
            "--attend-slots",
            default=256,
            show_default=True,
            type=click.IntRange(1, 1_000_000),
            help="WARM attention slots ((session, layer) K/V held for queries).",
        ),
        click.option(
            "--attend-cold-slots",
            default=1024,
            show_default=True,
            type=click.IntRange(0, 10_000_000),
            help="COLD registry entries (demoted slots KV.PREFIX.WARM can bring back).",
        ),
        click.option(
            "--attend-maxmemory",
            default=None,
            callback=_memory,
            help="Byte budget for K/V in WARM attention slots (e.g. 4gb); 0/unset = none.",
        ),
        click.option(
            "--ssm-maxmemory",
            default=None,
            callback=_memory,
            help="Byte budget for SSM.PREFIX state blobs; 0/unset = none.",
        ),
        click.option(
            "--binary-port",
            default=None,
            type=click.IntRange(0, 65535),
            help="Port of the binary lane (default: the RESP port + 1).",
        ),
        click.option("--no-binary-lane", is_flag=True, help="Do not open the binary lane."),
        click.option(
            "--log-level",
            default=_DEFAULTS.log_level,
            show_default=True,
            type=click.Choice(["debug", "info", "notice", "warning", "error"]),
        ),
        click.option(
            "--kvcache",
            is_flag=True,
            help="Accepted for compatibility with Pion; the V-store is always on.",
        ),
        click.option(
            "-w",
            "--workers",
            default=1,
            show_default=True,
            type=click.IntRange(1, 64),
            help="Worker processes.",
        ),
        click.option(
            "--independent-workers",
            is_flag=True,
            help="Required with -w N>1: each worker has its own store.",
        ),
        click.option(
            "--tier",
            "tier_url",
            default=None,
            metavar="URL",
            help="Shared second tier: redis://host:port[,host:port...] (Redis Cluster, "
            "Valkey or one redis-server; rediss:// for TLS). See docs/tier.md.",
        ),
        click.option(
            "--tier-write",
            default=_TIER_DEFAULTS.write,
            show_default=True,
            type=click.Choice(["sync", "async"]),
            help="sync: a write's reply waits for the tier while it is up; async: queued.",
        ),
        click.option("--tier-user", default=None, help="ACL user name for the tier."),
        click.option("--tier-password", default=None, help="Password for the tier."),
        click.option(
            "--tier-password-file",
            default=None,
            type=_EXISTING_FILE,
            help="Read the tier's password from a file (first line).",
        ),
        click.option("--tier-tls", is_flag=True, help="TLS to the tier (as rediss://)."),
        click.option("--tier-tls-ca", default=None, type=_EXISTING_FILE, help="CA bundle (PEM)."),
        click.option(
            "--tier-tls-cert", default=None, type=_EXISTING_FILE, help="Client certificate."
        ),
        click.option("--tier-tls-key", default=None, type=_EXISTING_FILE, help="Client key."),
        click.option(
            "--tier-prefix",
            default=_TIER_DEFAULTS.prefix,
            show_default=True,
            help="Key prefix in the tier (deployments sharing a cluster use their own).",
        ),
        click.option(
            "--tier-timeout",
            default=_TIER_DEFAULTS.timeout,
            show_default=True,
            type=click.FloatRange(0.01, 60),
            help="Seconds one tier round trip may take.",
        ),
        click.option(
            "--tier-queue-max",
            default=None,
            callback=_optional_memory,
            help="Bytes of writes queued for the tier (e.g. 256mb; default 256mb).",
        ),
        click.option(
            "--tls-cert",
            default=None,
            type=click.Path(dir_okay=False, exists=True, path_type=Path),
            help="PEM certificate chain: serve TLS on the RESP and affinity ports.",
        ),
        click.option(
            "--tls-key",
            default=None,
            type=click.Path(dir_okay=False, exists=True, path_type=Path),
            help="PEM private key of --tls-cert.",
        ),
        click.option(
            "--tls-ca",
            default=None,
            type=click.Path(dir_okay=False, exists=True, path_type=Path),
            help="PEM CA bundle: require client certificates signed by it.",
        ),
        click.option(
            "--metrics-port",
            default=None,
            type=click.IntRange(0, 65535),
            help="Serve Prometheus metrics on this port (0 picks a free one).",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


_EMPTY_PASSWORD = (
    "{source} is empty, and an empty password is no password: give a real one, or "
    "none at all (a loopback server then needs none; any other bind refuses to start "
    "without one unless --unsafe-no-auth is given)"
)


def _password(opts: dict[str, Any]) -> str | None:
    """The password from exactly one source: --requirepass, --requirepass-file, or
    else the environment. A source that is given but empty is refused, never read as
    "no password" nor accepted as the password ""."""
    flag: str | None = opts["requirepass"]
    path: Path | None = opts["requirepass_file"]
    if flag is not None and path is not None:
        raise click.UsageError("give --requirepass or --requirepass-file, not both")
    if path is not None:
        lines = path.read_text().splitlines()
        password, source = (lines[0].strip() if lines else ""), f"--requirepass-file {path}"
    elif flag is not None:
        password, source = flag, "--requirepass"
    elif PASSWORD_ENV in os.environ:
        password, source = os.environ[PASSWORD_ENV], PASSWORD_ENV
    else:
        return None
    if not password.strip():
        raise click.UsageError(_EMPTY_PASSWORD.format(source=source))
    return password


def _build_config(opts: dict[str, Any]) -> ServerConfig:
    password = _password(opts)
    if opts["workers"] > 1 and not opts["independent_workers"]:
        raise click.UsageError(
            "-w N needs --independent-workers: each worker process keeps its own V-store, "
            "write-ahead log and receipt, and a namespace lives on the worker that "
            "registered it (other workers answer LOOKUP from a shared directory and "
            "redirect V.FETCH/V.STOREBATCH with 'session lives on worker N'); pass "
            "--independent-workers to accept that"
        )
    if (opts["tls_cert"] is None) != (opts["tls_key"] is None):
        raise click.UsageError("TLS needs both --tls-cert and --tls-key")
    if opts["tls_ca"] is not None and opts["tls_cert"] is None:
        raise click.UsageError("--tls-ca (client certificates) needs --tls-cert and --tls-key")
    return ServerConfig(
        bind=opts["bind"],
        port=opts["port"],
        dir=opts["data_dir"],
        requirepass=password,
        unsafe_no_auth=opts["unsafe_no_auth"],
        maxclients=opts["maxclients"],
        maxmemory_clients=opts["maxmemory_clients"],
        vstore_max_sessions=opts["vstore_max_sessions"],
        maxmemory=opts["maxmemory"],
        log_level=opts["log_level"],
        appendfsync=opts["appendfsync"],
        wal_enabled=not opts["no_wal"],
        save_interval=opts["save_interval"],
        fa_window=opts["fa_window"],
        attend_warm_slots=opts["attend_slots"],
        attend_cold_slots=opts["attend_cold_slots"],
        attend_maxmemory=opts["attend_maxmemory"],
        ssm_maxmemory=opts["ssm_maxmemory"],
        binary_lane=not opts["no_binary_lane"],
        binary_port=opts["binary_port"],
        workers=opts["workers"],
        tls_cert=opts["tls_cert"],
        tls_key=opts["tls_key"],
        tls_ca=opts["tls_ca"],
        metrics_port=opts["metrics_port"],
        export_enabled=not opts["no_export"],
        export_dir=opts["export_dir"],
        export_max_bytes=opts["export_max_bytes"],
        tier=_tier_config(opts),
    )


_TIER_ONLY = (
    "tier_user",
    "tier_password",
    "tier_password_file",
    "tier_tls_ca",
    "tier_tls_cert",
    "tier_tls_key",
    "tier_queue_max",
)


def _tier_config(opts: dict[str, Any]) -> TierConfig | None:
    url = opts["tier_url"]
    if url is None:
        given = [name for name in _TIER_ONLY if opts[name] is not None] + (
            ["tier_tls"] if opts["tier_tls"] else []
        )
        if given:
            flag = "--" + given[0].replace("_", "-")
            raise click.UsageError(f"{flag} needs --tier")
        return None
    from pion.tier import KeyLayout, parse_tier_url

    password = opts["tier_password"]
    if opts["tier_password_file"] is not None:
        lines = opts["tier_password_file"].read_text().splitlines()
        password = lines[0].strip() if lines else ""
        if not password:
            raise click.UsageError("--tier-password-file is empty")
    try:
        parse_tier_url(url)
        KeyLayout(opts["tier_prefix"])
    except PionError as exc:
        raise click.UsageError(exc.message) from None
    queue = opts["tier_queue_max"]
    if queue is not None and queue < 1:
        raise click.UsageError("--tier-queue-max must be at least 1 byte")
    return TierConfig(
        url=url,
        write=opts["tier_write"],
        username=opts["tier_user"],
        password=password,
        tls=opts["tier_tls"],
        tls_ca_file=opts["tier_tls_ca"],
        tls_cert_file=opts["tier_tls_cert"],
        tls_key_file=opts["tier_tls_key"],
        prefix=opts["tier_prefix"],
        timeout=opts["tier_timeout"],
        queue_max_bytes=_TIER_DEFAULTS.queue_max_bytes if queue is None else queue,
    )


def _run_server(opts: dict[str, Any]) -> None:
    from pion.server.run import configure_logging, run

    config = _build_config(opts)
    configure_logging(config.log_level)
    try:
        if config.workers > 1:
            from pion.server.supervisor import supervise

            code = supervise(config)
        else:
            code = run(config)
    except PionError as exc:
        click.echo(f"pion-server: {exc.message}", err=True)
        sys.exit(1)
    except OSError as exc:
        click.echo(f"pion-server: {exc}", err=True)
        sys.exit(1)
    sys.exit(code)


@click.command(name="pion-server")
@click.version_option(__version__, prog_name="pion-server")
@_server_options
def server_command(**opts: Any) -> None:
    """Run the Pion K/V-cache server (Redis protocol)."""
    _run_server(opts)


class _LazyGroup(click.Group):
    """Imports a subcommand's module only when it runs, so ``pion server`` never
    depends on the llama proxy's or the repair tool's imports."""

    _lazy: ClassVar[dict[str, str]] = {
        "stats": "pion.client.cli:stats_command",
        "check-wal": "pion.persistence.cli:check_wal_command",
        "llama": "pion.llama.cli:llama_group",
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self._lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = self._lazy.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        module_name, attr = target.split(":")
        command = getattr(importlib.import_module(module_name), attr)
        assert isinstance(command, click.Command)
        return command


@click.group(cls=_LazyGroup)
@click.version_option(__version__, prog_name="pion")
def cli() -> None:
    """Pion: a prompt-prefix K/V cache for LLM serving."""


@cli.command(name="server")
@_server_options
def _server_subcommand(**opts: Any) -> None:
    """Run the Pion server (same flags as pion-server)."""
    _run_server(opts)


def main() -> None:
    cli()


def server_main() -> None:
    server_command()
