"""``pion llama proxy --config FILE``: the proxy's flags in one TOML file, for a fleet
whose upstreams, slot dirs and store are easier to keep in a file than on a command
line. Keys are the long flag names without their dashes (``upstream``, ``slot-dir``,
``store``, ``slots``, ``persist``, ``port`` ...; ``slot_dir`` is accepted too); a
repeatable flag takes a list. A flag given on the command line wins over the file.
Checked before anything starts: an unreadable file, bad TOML or an unknown key is a
usage error naming it.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import click

__all__ = ["config_option"]


def _names(command: click.Command) -> dict[str, click.Option]:
    """Each long flag of ``command`` (``slot-dir``), and its underscore spelling."""
    out: dict[str, click.Option] = {}
    for param in command.params:
        if not isinstance(param, click.Option):
            continue
        for opt in (*param.opts, *param.secondary_opts):
            if opt.startswith("--") and opt != "--config":
                out[opt[2:]] = out[opt[2:].replace("-", "_")] = param
    return out


def _load(ctx: click.Context, _param: click.Parameter, value: Path | None) -> Path | None:
    if value is None:
        return None
    try:
        data = tomllib.loads(value.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise click.BadParameter(f"{value}: {exc}", param_hint="--config") from None
    names = _names(ctx.command)
    defaults: dict[str, Any] = dict(ctx.default_map or {})
    for key, raw in data.items():
        option = names.get(key)
        if option is None or option.name is None:
            known = ", ".join(sorted(k for k in names if "_" not in k))
            raise click.BadParameter(
                f"{value}: unknown setting {key!r} (known: {known})", param_hint="--config"
            )
        setting = [raw] if option.multiple and not isinstance(raw, list) else raw
        if "--" + key.replace("_", "-") in option.secondary_opts:
            setting = not setting  # no-x = true is x = false
        defaults[option.name] = setting
    ctx.default_map = defaults
    return value


def config_option(func: Any) -> Any:
    """Adds ``--config FILE`` (read first, so the other flags see its values)."""
    return click.option(
        "--config",
        type=click.Path(dir_okay=False, path_type=Path),
        is_eager=True,
        expose_value=False,
        callback=_load,
        help="TOML file of these flags (keys: flag names, lists for repeatable ones); "
        "flags on the command line win",
    )(func)
