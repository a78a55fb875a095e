"""Command-line entry points: ``pion-server`` and ``pion`` (with ``pion server``,
``pion stats``, ``pion check-wal`` and ``pion llama ...``).

Thin by design: parse flags, build a config, call library code.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args, get_origin, get_type_hints

import click

from pion import __version__
from pion.commands.config_cmd import parse_memory
from pion.config import FLAG, Flag, ServerConfig, TierConfig
from pion.errors import PionError

__all__ = ["main", "server_main"]

# The environment variable a password may come from (keeps it out of `ps` output).
PASSWORD_ENV = "PION_REQUIREPASS"

_EXISTING_FILE = click.Path(dir_okay=False, exists=True, path_type=Path)


def _parse_size(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return parse_memory(value)
    except PionError as exc:
        raise click.BadParameter(exc.message) from None


def _click_type(hint: Any, flag: Flag) -> Any:
    """The click type of a field annotated ``hint`` (``X | None`` reads as X)."""
    args = [a for a in get_args(hint) if a is not type(None)]
    if get_origin(hint) is not Literal and args and type(None) in get_args(hint):
        hint = args[0]
    if flag.choices:
        return click.Choice(flag.choices)
    if get_origin(hint) is Literal:
        return click.Choice([str(a) for a in get_args(hint)])
    if hint is int:
        lo, hi = (None if b is None else int(b) for b in (flag.lo, flag.hi))
        return click.IntRange(lo, hi) if (lo, hi) != (None, None) else int
    if hint is float:
        return click.FloatRange(flag.lo, flag.hi)
    if hint is Path:
        if flag.must_exist:
            return _EXISTING_FILE
        return click.Path(file_okay=False, path_type=Path)
    return str


def _flagged(cls: type, group: str) -> list[tuple[str, Any, Flag, Any]]:
    """(option dest, field default, Flag, annotation) for each flagged field of ``cls``;
    ``group`` prefixes the dest (``tier_``) so two configs' fields never collide."""
    hints = get_type_hints(cls)
    rows = []
    for f in dataclasses.fields(cls):
        flag = f.metadata.get(FLAG)
        if flag is None:
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        rows.append((group + f.name, default, flag, hints[f.name]))
    return rows


def _option(dest: str, default: Any, flag: Flag, hint: Any, *, group: str) -> Any:
    """A click option built from a field's :class:`Flag`. Sizes and the options of a
    group (``--tier-*``) take None as their click default, so that "not given" can be
    told; their help names the field's default instead."""
    name = flag.name or "--" + dest.replace("_", "-")
    decls = [d for d in (flag.short, name, dest) if d]
    if hint is bool:
        return click.option(*decls, is_flag=True, default=False, help=flag.help)
    has_default = default not in (None, dataclasses.MISSING)
    kw: dict[str, Any] = {"help": flag.help, "default": None}
    if flag.memory:
        kw["callback"] = _parse_size
        kw["metavar"] = "SIZE"
    else:
        kw["type"] = _click_type(hint, flag)
    if has_default and (flag.memory or group):
        shown = _size_text(int(default)) if flag.memory else default
        kw["help"] = f"{flag.help}  [default: {shown}]"
    elif has_default:
        kw["default"] = default
        kw["show_default"] = True
    if flag.env:
        kw["envvar"] = flag.env
    if flag.metavar:
        kw["metavar"] = flag.metavar
    return click.option(*decls, **kw)


def _size_text(n: int) -> str:
    for unit, size in (("gb", 1 << 30), ("mb", 1 << 20), ("kb", 1 << 10)):
        if n and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


_SERVER_FLAGS = _flagged(ServerConfig, "")
_TIER_FLAGS = _flagged(TierConfig, "tier_")

# Options that set no single field: the password's sources, the tier's password file,
# and two flags kept for what they say rather than what they set.
_EXTRA_OPTIONS = [
    click.option(
        "--requirepass",
        default=None,
        help=f"Password clients must AUTH with (or set {PASSWORD_ENV}); never empty.",
    ),
    click.option(
        "--requirepass-file",
        default=None,
        type=_EXISTING_FILE,
        help="Read the password from a file (first line).",
    ),
    click.option(
        "--independent-workers",
        is_flag=True,
        help="Required with -w N>1: each worker has its own store.",
    ),
    click.option(
        "--kvcache",
        is_flag=True,
        help="Accepted for compatibility with Pion; the V-store is always on.",
    ),
    click.option(
        "--tier-password-file",
        default=None,
        type=_EXISTING_FILE,
        help="Read the tier's password from a file (first line).",
    ),
]


def _server_options(fn: Any) -> Any:
    options = [
        *(_option(*row, group="") for row in _SERVER_FLAGS),
        *_EXTRA_OPTIONS,
        *(_option(*row, group="tier_") for row in _TIER_FLAGS),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _values(
    rows: list[tuple[str, Any, Flag, Any]], opts: dict[str, Any], group: str
) -> dict[str, Any]:
    """The config fields ``opts`` sets: a flag not given keeps the field's default."""
    values: dict[str, Any] = {}
    for dest, _default, flag, _hint in rows:
        value = opts[dest]
        if flag.negate:
            if value:
                values[dest.removeprefix(group)] = False
        elif value is not None and value is not False:
            if flag.memory and flag.lo is not None and value < flag.lo:
                name = flag.name or "--" + dest.replace("_", "-")
                raise click.UsageError(f"{name} must be at least {int(flag.lo)} byte(s)")
            values[dest.removeprefix(group)] = value
    return values


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
        **_values(_SERVER_FLAGS, opts, ""), requirepass=password, tier=_tier_config(opts)
    )


def _tier_config(opts: dict[str, Any]) -> TierConfig | None:
    values = _values(_TIER_FLAGS, opts, "tier_")
    url = values.pop("url", None)
    if url is None:
        given = [f"tier_{name}" for name in values]
        if opts["tier_password_file"] is not None:
            given.append("tier_password_file")
        if given:
            flag = next(
                (f.name for d, _, f, _ in _TIER_FLAGS if d == given[0] and f.name),
                "--" + given[0].replace("_", "-"),
            )
            raise click.UsageError(f"{flag} needs --tier")
        return None
    from pion.tier import KeyLayout, parse_tier_url

    if opts["tier_password_file"] is not None:
        lines = opts["tier_password_file"].read_text().splitlines()
        values["password"] = lines[0].strip() if lines else ""
        if not values["password"]:
            raise click.UsageError("--tier-password-file is empty")
    try:
        parse_tier_url(url)
        KeyLayout(values.get("prefix", TierConfig(url="").prefix))
    except PionError as exc:
        raise click.UsageError(exc.message) from None
    return TierConfig(url=url, **values)


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
